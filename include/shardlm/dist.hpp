// dist: MPI world, node topology (real or emulated), process groups per sharding strategy, and the
// collective interface the FSDP engine talks to (an MPI implementation here; NCCL slots in beside it).
#pragma once

#include <mpi.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "shardlm/config.hpp"
#include "shardlm/core.hpp"

namespace shardlm {

enum class ReduceOp { Sum, Max };

// Collectives over one process group. Counts are elements of `dtype`; for all_gather and
// reduce_scatter `count` is the per-rank piece (recv / send hold size() * count elements).
// 16-bit dtypes are reduced in their own precision, as NCCL does.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual void all_gather(const void* send, void* recv, size_t count, DType dtype) = 0;
  virtual void reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) = 0;
  virtual void all_reduce(void* buf, size_t count, DType dtype, ReduceOp op) = 0;
  virtual void broadcast(void* buf, size_t count, DType dtype, int root) = 0;
};

class MpiCommunicator : public Communicator {
 public:
  // Takes ownership of `comm` (freed on destruction) unless it is MPI_COMM_WORLD or MPI_COMM_SELF.
  explicit MpiCommunicator(MPI_Comm comm);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  MPI_Comm comm() const { return comm_; }
  void all_gather(const void* send, void* recv, size_t count, DType dtype) override;
  void reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override;
  void all_reduce(void* buf, size_t count, DType dtype, ReduceOp op) override;
  void broadcast(void* buf, size_t count, DType dtype, int root) override;

 private:
  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
};

// Where a rank sits: its node and its place on the node.
struct Topology {
  int world_rank = 0;
  int world_size = 1;
  int node = 0;
  int num_nodes = 1;
  int local_rank = 0;
  int local_size = 1;
  bool emulated = false;  // nodes of --dist.ranks_per_node ranks rather than the real hosts
  int host_ranks = 1;     // ranks on this rank's real host (they share its cores and memory)
  int host_rank = 0;      // this rank's place among them (picks its GPU)
};

// ranks_per_node == 0: the real layout (MPI_Comm_split_type shared memory); K > 0: nodes of K
// consecutive ranks. Throws Error if nodes have unequal rank counts (HYBRID_SHARD needs equal).
Topology make_topology(MPI_Comm world, int ranks_per_node);

// The groups FSDP uses: parameters are sharded over `shard`, and the sharded gradients are
// all-reduced over `replicate` (size 1 unless NO_SHARD or HYBRID_SHARD).
struct ProcessGroups {
  std::unique_ptr<Communicator> world;
  std::unique_ptr<Communicator> shard;
  std::unique_ptr<Communicator> replicate;
};

ProcessGroups make_mpi_process_groups(MPI_Comm world, const Topology& topo, ShardingStrategy strategy);

// Host-side reductions of run statistics over the world (losses, counts, timings).
double mpi_sum(MPI_Comm comm, double v);
double mpi_max(MPI_Comm comm, double v);

// Runs `fn` on every rank and agrees on the outcome: if any rank throws, every rank throws an
// AgreedError carrying the message of the lowest failing rank (so one clear message, no hang).
void run_collectively(MPI_Comm comm, const std::function<void()>& fn);

}  // namespace shardlm
