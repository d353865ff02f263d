// dist: MPI world, node topology (real or emulated), the sharding strategies and the process groups
// each makes, and the collective interface the FSDP engine talks to (MPI here; NCCL in src/dist/nccl).
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "shardlm/core.hpp"

namespace shardlm {

// PyTorch FSDP's sharding strategies, by its names (HYBRID_SHARD_ZERO2 is its _HYBRID_SHARD_ZERO2).
enum class ShardingStrategy { FullShard, ShardGradOp, HybridShard, HybridShardZero2, NoShard };
const char* strategy_name(ShardingStrategy s);          // "FULL_SHARD", ...
ShardingStrategy parse_strategy(const std::string& s);  // throws Error listing the valid names
// Every strategy, in the order of the enum (what `plan` lists, what the parser accepts).
const std::vector<ShardingStrategy>& all_strategies();
// FULL_SHARD and HYBRID_SHARD free a block's gathered parameters after its forward and gather them
// again for its backward; SHARD_GRAD_OP and HYBRID_SHARD_ZERO2 keep them from forward to backward.
bool reshards_after_forward(ShardingStrategy s);

enum class ReduceOp { Sum, Max };

// Collectives over one process group. Counts are elements of `dtype`; for all_gather and
// reduce_scatter `count` is the per-rank piece (recv / send hold size() * count elements). In place,
// as NCCL allows: all_gather when send is this rank's piece of recv (recv + rank() * count),
// reduce_scatter when recv is this rank's piece of send, reduce when send == recv on the root.
// 16-bit dtypes are reduced in their own precision, as NCCL does.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual void all_gather(const void* send, void* recv, size_t count, DType dtype) = 0;
  virtual void reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) = 0;
  virtual void all_reduce(void* buf, size_t count, DType dtype, ReduceOp op) = 0;
  // The group's sum of send into recv on rank `root` only (recv is not read or written elsewhere).
  virtual void reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, int root) = 0;
  virtual void broadcast(void* buf, size_t count, DType dtype, int root) = 0;
  // A reduce-scatter of unequal pieces, in place: piece q (elements [offsets[q], offsets[q] + counts[q]) of
  // buf, on every rank) summed over the group into that piece on rank q; pieces of no elements are skipped.
  // The reduces go as one group (group_begin / group_end): on NCCL they move at once (on two ranks the link both
  // ways, where one reduce uses it one way); on MPI one after another.
  void reduce_pieces(void* buf, const std::vector<size_t>& offsets, const std::vector<size_t>& counts, DType dtype,
                     ReduceOp op);
  // The collectives issued between group_begin and group_end go as one group (NCCL's ncclGroupStart /
  // ncclGroupEnd); here, nothing changes: each runs as issued.
  virtual void group_begin() {}
  virtual void group_end() {}
  // Elements [q * count, (q + 1) * count) of send to rank q, landing at recv + rank() * count there (send and
  // recv hold size() * count; not in place).
  virtual void all_to_all(const void* send, void* recv, size_t count, DType dtype) = 0;
  // Sum of a host double over the group's ranks (run statistics such as the gradient norm).
  virtual double host_sum(double v) const = 0;
  // Collective over the group (every rank, the same sizes in the same order): zeroed device memory that
  // this group's all-gathers move with the GPU's copy engines instead of its SMs, when both buffers of a
  // gather are such memory (NCCL symmetric windows on a communicator with the zero-CTA policy,
  // dist.gather_copy_engine). Null where the group has none to offer: allocate ordinary memory instead.
  virtual std::unique_ptr<DeviceMemory> allocate_window(size_t /*bytes*/) { return nullptr; }
  // The windows allocate_window has handed out that are still held.
  virtual int windows() const { return 0; }
};

// The MPI datatype and reduction of a dtype (16-bit floats: user ops reducing in their own precision).
MPI_Datatype mpi_datatype(DType t);
MPI_Op mpi_reduce_op(DType t, ReduceOp op);
// Throws Error "<what> failed: <MPI's message>" unless rc is MPI_SUCCESS.
void check_mpi(int rc, const std::string& what);

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
  void reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, int root) override;
  void broadcast(void* buf, size_t count, DType dtype, int root) override;
  void all_to_all(const void* send, void* recv, size_t count, DType dtype) override;
  double host_sum(double v) const override;

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
  // The fewest and most ranks on one node: unequal real nodes (a Slurm --ntasks spread 3 + 2) serve every
  // strategy but the hybrid ones, whose shard group is a node (group_layout refuses them).
  int min_node_ranks = 1, max_node_ranks = 1;
};

// ranks_per_node == 0: the real layout (MPI_Comm_split_type shared memory); K > 0: nodes of K
// consecutive ranks.
Topology make_topology(MPI_Comm world, int ranks_per_node);
// Rank `world_rank`'s place among nodes of `ranks_per_node` consecutive ranks, without MPI (what
// make_topology gives for dist.ranks_per_node = K, and what `plan` sizes with). Error if K does
// not divide world_size.
Topology consecutive_nodes(int world_size, int ranks_per_node, int world_rank = 0);

// The two groups a strategy makes: parameters are sharded over the shard group, and the sharded
// gradients are all-reduced over the replicate group. Colour and key are this rank's arguments to
// MPI_Comm_split and ncclCommSplit (the ranks of one colour form a group, ordered by key).
//
//   strategy                           shard group                replicate group
//   FULL_SHARD, SHARD_GRAD_OP          all ranks                  the rank alone
//   HYBRID_SHARD, HYBRID_SHARD_ZERO2   the ranks of its node      the same local rank on every node
//   NO_SHARD                           the rank alone             all ranks
struct GroupLayout {
  int shard_size = 1;
  int shard_color = 0;
  int shard_key = 0;
  int replicate_size = 1;
  int replicate_color = 0;
  int replicate_key = 0;
};
GroupLayout group_layout(ShardingStrategy strategy, const Topology& topo);

// The groups FSDP uses, as group_layout lays them out.
struct ProcessGroups {
  std::unique_ptr<Communicator> world;
  std::unique_ptr<Communicator> shard;
  std::unique_ptr<Communicator> replicate;
  // The replicate group again, enqueuing on a stream of its own (NCCL, dist.replicate_stream): the
  // blocks' all-reduces over the replicas run beside the shard group's collectives instead of after
  // them. Null where there is none (MPI, a replicate group of one, the key off).
  std::unique_ptr<Communicator> replicate_overlap;
  // The shard group again, enqueuing on a stream of its own (NCCL, dist.gather_stream): the units'
  // all-gathers, so that a gather never queues behind a reduction. Null where there is none (MPI, a
  // shard group of one, the key off).
  std::unique_ptr<Communicator> shard_gather;
  // The shard group once more, on its stream, with the zero-CTA policy (NCCL 2.28+, dist.copy_engine_reductions):
  // all-to-alls between its windows move each rank's pieces of the others' parts of a block's gradient to them
  // (the copy engines), and each adds them to its own, so that a block's reduce-scatter takes no SMs from the
  // backward beside it. Null where there is none (MPI, a shard group of one or across hosts, an older NCCL, the
  // key off).
  std::unique_ptr<Communicator> shard_exchange;
};

ProcessGroups make_mpi_process_groups(MPI_Comm world, const Topology& topo, ShardingStrategy strategy);

// dist.timeout's default, in seconds: SHARDLM_NCCL_TIMEOUT from the environment when it is set
// (Error for a value that is not a number > 0), else 600. The key, when given, wins over both.
double default_dist_timeout();

// ---- host values over the ranks (src/dist/rank_values.cpp): what train/ asks of every rank ----

// This rank's number in comm and comm's size.
int rank_of(MPI_Comm comm);
int size_of(MPI_Comm comm);
// Reductions of run statistics over the world (losses, counts, timings, flags).
double mpi_sum(MPI_Comm comm, double v);
double mpi_max(MPI_Comm comm, double v);
double mpi_min(MPI_Comm comm, double v);
uint64_t mpi_sum(MPI_Comm comm, uint64_t v);
uint64_t mpi_max(MPI_Comm comm, uint64_t v);
bool any_rank(MPI_Comm comm, bool mine);  // true on every rank when it is true on one
// Every rank gets rank 0's `text` (a run id, a prompt read from stdin).
void broadcast_string(std::string& text, MPI_Comm comm);
// Every rank gets rank 0's value (a step, a flag, a loss).
void broadcast_value(long& v, MPI_Comm comm);
void broadcast_value(double& v, MPI_Comm comm);
void broadcast_value(bool& v, MPI_Comm comm);
// Every rank's `mine` on rank 0, in rank order (empty on the other ranks).
std::vector<double> gather_on_root(MPI_Comm comm, double mine);
std::vector<std::string> gather_on_root(MPI_Comm comm, const std::string& mine);
// A record of named numbers per rank (memory sizes, a step's timings), gathered on rank 0 in rank
// order (empty elsewhere): the names travel with the values, so no caller indexes an array by position.
// Every rank gives the same names in the same order.
using NamedValues = std::vector<std::pair<std::string, double>>;
std::vector<NamedValues> gather_on_root(MPI_Comm comm, const NamedValues& mine);

// Runs `fn` on every rank and agrees on the outcome: if any rank throws, every rank throws an
// AgreedError carrying the message of the lowest failing rank (so one clear message, no hang).
void run_collectively(MPI_Comm comm, const std::function<void()>& fn);

// ---- collective benchmark (`shardlm comm-test`) ------------------------------------------------

enum class Collective { AllGather, ReduceScatter, AllReduce, Broadcast };
const char* collective_name(Collective c);            // "all_gather", "reduce_scatter", "all_reduce", "broadcast"
Collective parse_collective(const std::string& name);  // also "all-gather", "allgather"; throws Error listing them

// nccl-tests' bus-bandwidth factor for a group of n ranks (busbw = algbw * factor): all_reduce
// 2(n-1)/n, all_gather and reduce_scatter (n-1)/n, broadcast 1.
double bus_bandwidth_factor(Collective c, int ranks);

// One measurement at a nominal size, counted as nccl-tests counts it: `bytes` and `count` are the
// largest buffer (all_gather: the gathered output, reduce_scatter: its input), rounded down to
// whole elements per rank; `piece` is the count passed to the call (per rank for all_gather and
// reduce_scatter). piece == 0: the size is too small for this group.
struct CollectiveShape {
  size_t bytes = 0;
  size_t count = 0;
  size_t piece = 0;
};
CollectiveShape collective_shape(Collective c, size_t nominal_bytes, int ranks, DType dtype);

// Nominal sizes min, min * factor, min * factor^2, ... up to max.
std::vector<size_t> sweep_sizes(size_t min_bytes, size_t max_bytes, int factor);

// The data pattern of the check run. fill_collective_input writes elements [offset, offset + n)
// of what group rank `rank` of `ranks` sends (broadcast: non-roots get a poison value);
// count_collective_wrong counts the elements of [offset, offset + n) of its result that differ
// from what it must hold. Reductions are sums, exact while they fit the dtype's integers.
void fill_collective_input(Collective c, DType dtype, int rank, int ranks, int root, size_t offset, void* dst,
                           size_t n);
size_t count_collective_wrong(Collective c, DType dtype, int rank, int ranks, int root, size_t piece, size_t offset,
                              const void* got, size_t n);

// Where the check run's data lives: all_gather sends a rank's piece into the whole buffer,
// reduce_scatter the reverse, all_reduce and broadcast work in place in the whole buffer (whose
// output, being the input, is not poisoned first).
struct CollectiveCheckLayout {
  bool input_is_piece = false;
  bool output_is_piece = false;
  bool in_place = true;
  size_t in_count = 0;   // elements sent
  size_t out_count = 0;  // elements of the result
};
CollectiveCheckLayout collective_check_layout(Collective c, const CollectiveShape& shape);

struct CollectiveBenchSettings {
  DType dtype = DType::F32;
  int warmup = 5;
  int iters = 20;
  bool check = true;  // one run on the data pattern, verified, before the warmup
  int root = 0;       // of broadcast
  std::function<void(int done, int total)> progress;  // after each timed iteration (may be empty)
};

struct CollectiveTimes {
  std::vector<double> iteration_us;  // one per timed iteration
  size_t wrong = 0;                  // elements of the check run's result that were wrong
};

double median(std::vector<double> values);

// Runs one collective at one size on one process group, with buffers for sizes up to the
// max_bytes it was made for. The MPI bench (here) and the NCCL bench (src/dist/nccl) implement it.
class CollectiveBench {
 public:
  virtual ~CollectiveBench() = default;
  virtual CollectiveTimes run(Collective c, const CollectiveShape& shape, const CollectiveBenchSettings& s) = 0;
};

// Bytes of the buffers a bench for sizes up to max_bytes holds per rank in a group of `ranks`.
size_t collective_bench_buffer_bytes(size_t max_bytes, int ranks);

// MPI_Allgather, MPI_Reduce_scatter_block, MPI_Allreduce (in place), MPI_Bcast on group.comm(),
// timed with the host clock.
std::unique_ptr<CollectiveBench> make_mpi_collective_bench(const MpiCommunicator& group, size_t max_bytes);

}  // namespace shardlm
