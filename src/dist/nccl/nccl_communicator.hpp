// NCCL collectives behind the Communicator interface: communicators bootstrapped through MPI
// (rank 0's unique id broadcast), sub-groups split from the world, every call checked, and waits
// that poll NCCL's asynchronous errors with a timeout so that a failing or hanging rank ends the
// job with a message naming it instead of hanging. The communicators are nonblocking (NCCL 2.14+),
// so that a call that must meet a peer on the host side (initialisation, a split, a collective's
// first use of a connection) is under the same timeout.
#pragma once

#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>

#include <memory>
#include <string>

#include "shardlm/dist.hpp"
#include "../nccl_environment.hpp"

namespace shardlm::cuda {

// The GPU of this rank: its place among the ranks of its host (one GPU per rank). Error if the
// host has fewer GPUs than ranks, naming both counts, unless SHARDLM_SHARE_GPUS=1 lets ranks share
// them (place_rank_on_gpu; NCCL then sees each rank as a host of its own). Calls cudaSetDevice.
GpuPlacement select_device(const Topology& topo);

class NcclCommunicator : public Communicator {
 public:
  // Collective over `comm`: rank 0 makes the unique id and broadcasts it over MPI. The
  // communicator enqueues its collectives on `stream` (the caller's communication stream).
  NcclCommunicator(MPI_Comm comm, cudaStream_t stream, double timeout_s, std::string name);
  // Takes an existing NCCL communicator (from ncclCommSplit); zero_cta: it was made with NCCL's
  // zero-CTA policy; windows: allocate_window hands out symmetric windows (zero_cta implies it).
  NcclCommunicator(ncclComm_t comm, MPI_Comm mpi_comm, cudaStream_t stream, double timeout_s, std::string name,
                   bool zero_cta = false, bool windows = false);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // Asynchronous on stream(): buffers are device memory and must stay valid until the stream
  // passes the collective.
  void all_gather(const void* send, void* recv, size_t count, DType dtype) override;
  void reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override;
  void all_reduce(void* buf, size_t count, DType dtype, ReduceOp op) override;
  void reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, int root) override;
  void broadcast(void* buf, size_t count, DType dtype, int root) override;
  // ncclGroupStart / ncclGroupEnd (Communicator::reduce_pieces' reduces, the grouped block gathers).
  void group_begin() override;
  void group_end() override;
  // ncclAlltoAll (NCCL 2.28+; grouped sends and receives before); between windows of a zero-CTA group, the
  // copy engines move it.
  void all_to_all(const void* send, void* recv, size_t count, DType dtype) override;
  // On a communicator split with zero_cta or windows (NCCL 2.28+): ncclMemAlloc'd memory registered as a
  // symmetric window, so that an all-gather between two such buffers runs on the copy engines (zero-CTA)
  // and a reduce-scatter in one runs NCCL's symmetric kernels (fewer SMs); else null. Collective: where a
  // rank cannot allocate one, none does, and the group offers no more.
  std::unique_ptr<DeviceMemory> allocate_window(size_t bytes) override;
  int windows() const override { return windows_; }
  // Split with the zero-CTA policy and handing out windows: all-gathers and all-to-alls between its windows
  // run on the copy engines (NCCL 2.28+).
  bool copy_engines() const { return zero_cta_ && windows_offered_; }
#if NCCL_VERSION_CODE >= 22800
  // Deregisters a window of allocate_window's (collective, in the order they were registered).
  void release_window(ncclWindow_t window);
#endif

  cudaStream_t stream() const { return stream_; }
  // Splits this communicator (collective over it): ranks with the same color form a group,
  // ordered by key, enqueuing on `stream` (null: this one's). Uses ncclCommSplit where NCCL has it,
  // else a fresh MPI bootstrap. zero_cta: the new group takes NCCL's zero-CTA policy and hands out
  // symmetric windows; windows: it hands out symmetric windows. Either only where NCCL has them
  // (copy_engine_gathers_available) and the group has several ranks, all on one host; else ignored.
  std::unique_ptr<NcclCommunicator> split(int color, int key, std::string name, cudaStream_t stream = nullptr,
                                          bool zero_cta = false, bool windows = false);
  // Sets up the group's connections now instead of at its first collectives (NCCL connects lazily: on two
  // H200 the first step of a run waited 0.13 s in its first reduce), with one small all-reduce, reduce,
  // all-gather and reduce-scatter and a wait. Collective over the group. Nothing on a group of one or on a
  // zero-CTA group (its collectives between windows run on the copy engines and need no connection that a
  // small collective would make: it would only hold buffers the run never uses).
  void connect();
  // Blocks until everything enqueued on stream() has finished, polling NCCL's asynchronous error
  // state; on an error or after the timeout, aborts the communicator and the MPI job with a
  // message naming this rank, the group and the last collective.
  void wait();
  // Sum of a host double over the group's ranks (through MPI: exact, and no device round trip).
  double host_sum(double v) const override;

 private:
  [[noreturn]] void fail(const std::string& why);
  // Fails unless rc is success; ncclInProgress (a nonblocking communicator's call still running on
  // the host side, e.g. a connection being set up with a peer) is first settled.
  void check(ncclResult_t rc, const char* what);
  // Polls comm's asynchronous state until the pending call finishes (its result), failing after the
  // timeout with a message naming `what`.
  ncclResult_t settle(ncclComm_t comm, const char* what);

  ncclComm_t comm_ = nullptr;
  MPI_Comm mpi_comm_ = MPI_COMM_NULL;  // a duplicate, for the bootstrap of splits and for errors
  cudaStream_t stream_ = nullptr;
  double timeout_s_ = 600;
  std::string name_;
  std::string last_;  // the last collective enqueued, for error messages
  int rank_ = 0;
  int size_ = 1;
  bool windows_offered_ = false;  // allocate_window hands out windows
  bool zero_cta_ = false;         // split with NCCL's zero-CTA policy
  int windows_ = 0;
};

// Whether the NCCL the process runs with (2.28 or later, as built against) moves all-gathers between
// symmetric windows with the copy engines: not where ranks share GPUs (SHARDLM_SHARE_GPUS).
bool copy_engine_gathers_available();

// The FSDP process groups on NCCL, shaped as make_mpi_process_groups's: world, shard and replicate.
// All three enqueue on `stream`. With `replicate_stream` and a replicate group of several ranks, the
// replicate group once more on that stream (ProcessGroups::replicate_overlap); with `gather_stream` and
// a shard group of several, the shard group once more on it (ProcessGroups::shard_gather), with the
// zero-CTA policy when copy_engine_gathers (dist.gather_copy_engine). symmetric_reductions
// (dist.symmetric_reductions): the shard group hands out symmetric windows. copy_engine_reductions
// (dist.copy_engine_reductions): a shard group of several on one host once more, zero-CTA, on `stream`
// (ProcessGroups::shard_exchange), where NCCL offers its windows. timeout_s bounds every wait (dist.timeout
// in the deck). Before it returns, the groups the engine's collectives use (shard, replicate and the replicate
// group's second communicator) are connected (NcclCommunicator::connect), so that no step pays it.
ProcessGroups make_nccl_process_groups(MPI_Comm world, const Topology& topo, ShardingStrategy strategy,
                                       cudaStream_t stream, double timeout_s, cudaStream_t replicate_stream = nullptr,
                                       cudaStream_t gather_stream = nullptr, bool copy_engine_gathers = false,
                                       bool symmetric_reductions = false, bool copy_engine_reductions = false);

}  // namespace shardlm::cuda
