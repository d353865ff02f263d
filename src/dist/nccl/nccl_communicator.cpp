// NcclCommunicator: MPI bootstrap, checked collectives, waits with asynchronous-error polling and
// a timeout, and the FSDP process groups.
#include "nccl_communicator.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <exception>
#include <thread>

#include "cuda_check.hpp"
#include "device_memory_count.hpp"
#include "device_setup.hpp"
#include "../nccl_environment.hpp"

namespace shardlm::cuda {
namespace {

// Calls done() until it returns true: yielding through the first `spin`, then sleeping with a back-off
// from 50 us to 1 ms. Returns 0 once done() is true, or the seconds waited when it gave up after timeout_s.
template <class Done>
double poll_until(std::chrono::milliseconds spin, double timeout_s, Done done) {
  const auto start = std::chrono::steady_clock::now();
  auto pause = std::chrono::microseconds(50);
  for (;;) {
    if (done()) return 0.0;
    const auto elapsed = std::chrono::steady_clock::now() - start;
    if (elapsed < spin) {
      std::this_thread::yield();
      continue;
    }
    const double waited = std::chrono::duration<double>(elapsed).count();
    if (waited > timeout_s) return waited;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

ncclDataType_t nccl_type(DType dtype) { return by_dtype(dtype, ncclFloat32, ncclBfloat16, ncclFloat16); }

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::Sum ? ncclSum : ncclMax; }

std::string host_name() {
  char name[256] = {0};
  gethostname(name, sizeof name - 1);
  return name;
}

// The thread blocks (one an SM each) a collective's kernel may use: NCCL_MAX_CTAS when set, else 32.
// On an H200 pair (8B shape, 2048 x 2) 32 took 0.6 ms more from the GEMMs a step than 16 but exposed
// 1.9 ms less communication (the last reduce-scatters ran up to twice as fast): 95.5% scaling against
// 94.3%; 24 fell between, 8 was far slower (docs/history/performance-log.md).
int comm_max_ctas() {
  const char* env = std::getenv("NCCL_MAX_CTAS");
  const int n = env ? std::atoi(env) : 0;
  return n > 0 ? n : 32;
}

#if NCCL_VERSION_CODE >= 21400
// Nonblocking communicators: no NCCL call blocks the host (a collective's first use of a connection
// sets it up with the peer, which hangs with a hung peer under a blocking communicator); calls
// return ncclInProgress and NcclCommunicator::settle polls them under the timeout.
// zero_cta: NCCL_CTA_POLICY_ZERO, under which all-gathers between symmetric windows run on the copy
// engines (NcclCommunicator::allocate_window).
ncclConfig_t nonblocking_config(bool zero_cta = false) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
#if NCCL_VERSION_CODE >= 21700
  config.maxCTAs = comm_max_ctas();
#endif
#if NCCL_VERSION_CODE >= 22800
  if (zero_cta) config.CTAPolicy = NCCL_CTA_POLICY_ZERO;
#else
  (void)zero_cta;
#endif
  return config;
}
#endif

// The NCCL library the process runs with (it may be newer or older than the headers built against).
int nccl_runtime_version() {
  int v = 0;
  ncclGetVersion(&v);
  return v;
}

// Whether every rank of `comm` runs on one host (collective over it).
bool on_one_host(MPI_Comm comm) {
  MPI_Comm local;
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
  int local_size = 0, size = 0, all = 0;
  MPI_Comm_size(local, &local_size);
  MPI_Comm_size(comm, &size);
  MPI_Comm_free(&local);
  const int here = local_size == size ? 1 : 0;
  MPI_Allreduce(&here, &all, 1, MPI_INT, MPI_MIN, comm);
  return all == 1;
}

int world_rank_of_job() {
  int rank = 0, initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

}  // namespace

bool copy_engine_gathers_available() {
#if NCCL_VERSION_CODE >= 22800
  // Not with ranks sharing GPUs (SHARDLM_SHARE_GPUS), which NCCL sees as hosts of their own.
  return nccl_runtime_version() >= 22800 && !gpus_shared();
#else
  return false;
#endif
}

#if NCCL_VERSION_CODE >= 22800
// Device memory from ncclMemAlloc registered as a symmetric window of one communicator; deregistered
// (collectively, as it was registered) and freed when it goes.
class NcclWindowMemory final : public DeviceMemory {
 public:
  NcclWindowMemory(NcclCommunicator& owner, void* p, size_t bytes, ncclWindow_t window)
      : owner_(owner), window_(window) {
    data_ = p;
    bytes_ = bytes;
    device_memory_add(static_cast<ptrdiff_t>(bytes));
  }
  ~NcclWindowMemory() override {
    // Unwinding from an error, the peers may never deregister theirs: the memory goes with the process.
    if (std::uncaught_exceptions() == 0) {
      owner_.release_window(window_);
      ncclMemFree(data_);
    }
    device_memory_add(-static_cast<ptrdiff_t>(bytes_));
  }

 private:
  NcclCommunicator& owner_;
  ncclWindow_t window_;
};
#endif

GpuPlacement select_device(const Topology& topo) {
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  SHARDLM_CHECK(rc == cudaSuccess && count > 0, "rank ", topo.world_rank, " on ", host_name(),
                ": no CUDA device (", cudaGetErrorString(rc), "); run.backend = cuda needs one GPU per rank");
  const GpuPlacement p =
      place_rank_on_gpu(topo.host_rank, topo.host_ranks, count, gpu_sharing_requested(), host_name());
  if (p.shared) nccl_host_per_rank(host_name(), topo.world_rank);  // before NCCL's first communicator
  record_gpu_placement(p);
  SHARDLM_CUDA_CHECK(cudaSetDevice(p.device));
  return p;
}

NcclCommunicator::NcclCommunicator(MPI_Comm comm, cudaStream_t stream, double timeout_s, std::string name)
    : stream_(stream), timeout_s_(timeout_s), name_(std::move(name)) {
  MPI_Comm_dup(comm, &mpi_comm_);
  MPI_Comm_rank(mpi_comm_, &rank_);
  MPI_Comm_size(mpi_comm_, &size_);
  default_nccl_socket_parallelism();  // before NCCL reads its environment (its first call in the process)
  ncclUniqueId id;
  if (rank_ == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, mpi_comm_);
  last_ = "ncclCommInitRank";
#if NCCL_VERSION_CODE >= 21400
  ncclConfig_t config = nonblocking_config();
  check(ncclCommInitRankConfig(&comm_, size_, id, rank_, &config), "ncclCommInitRankConfig");
#else
  check(ncclCommInitRank(&comm_, size_, id, rank_), "ncclCommInitRank");
#endif
}

NcclCommunicator::NcclCommunicator(ncclComm_t comm, MPI_Comm mpi_comm, cudaStream_t stream, double timeout_s,
                                   std::string name, bool zero_cta, bool windows)
    : comm_(comm), mpi_comm_(mpi_comm), stream_(stream), timeout_s_(timeout_s), name_(std::move(name)),
      windows_offered_(zero_cta || windows), zero_cta_(zero_cta) {
  MPI_Comm_rank(mpi_comm_, &rank_);
  MPI_Comm_size(mpi_comm_, &size_);
}

NcclCommunicator::~NcclCommunicator() {
#if NCCL_VERSION_CODE < 21400
  if (comm_) ncclCommDestroy(comm_);
#else
  if (comm_) {
    // Finalize flushes what is still queued (polled under the timeout: a hung peer must not hang
    // the exit either); a communicator that does not finalize in time is aborted instead.
    ncclResult_t rc = ncclCommFinalize(comm_);
    const auto start = std::chrono::steady_clock::now();
    while (rc == ncclInProgress &&
           std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < timeout_s_) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      ncclCommGetAsyncError(comm_, &rc);
    }
    if (rc == ncclSuccess) ncclCommDestroy(comm_);
    else ncclCommAbort(comm_);
  }
#endif
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && mpi_comm_ != MPI_COMM_NULL) MPI_Comm_free(&mpi_comm_);
}

void NcclCommunicator::fail(const std::string& why) {
  const std::string message = concat("rank ", world_rank_of_job(), " on ", host_name(), ", NCCL group ", name_,
                                     " (rank ", rank_, " of ", size_, "), last collective ", last_, ": ", why);
  std::fprintf(stderr, "shardlm: error: %s; aborting the job\n", message.c_str());
  std::fflush(stderr);
  if (comm_) ncclCommAbort(comm_);
  comm_ = nullptr;
  MPI_Abort(MPI_COMM_WORLD, 1);
  throw Error(message);  // not reached: MPI_Abort ends the process
}

void NcclCommunicator::check(ncclResult_t rc, const char* what) {
  // A nonblocking call is done (a collective enqueued on the stream, so that waits and events after
  // it cover it) only once the communicator's state has left ncclInProgress: poll it even after a
  // ncclSuccess (one load when nothing is pending).
  if (comm_ && (rc == ncclSuccess || rc == ncclInProgress)) rc = settle(comm_, what);
  if (rc == ncclSuccess) return;
  fail(concat(what, " failed: ", ncclGetErrorString(rc), " (", ncclGetLastError(comm_), ")"));
}

ncclResult_t NcclCommunicator::settle(ncclComm_t comm, const char* what) {
  // A collective on a connected communicator settles within microseconds: poll without sleeping
  // for the first 2 ms (a sleep, however short, costs the kernel's timer slack, ~50-60 us, per
  // call: every collective of a step paid it, 170 us an NCCL call in comm-test on 4 H200), then
  // back off for a connection being set up or a peer that is late or hung.
  ncclResult_t result = ncclSuccess;
  const double waited = poll_until(std::chrono::milliseconds(2), timeout_s_, [&] {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t rc = ncclCommGetAsyncError(comm, &state);
    result = rc != ncclSuccess ? rc : state;
    return result != ncclInProgress;
  });
  if (waited > 0)
    fail(concat(what, ": no progress for ", waited, " s (dist.timeout = ", timeout_s_,
                " s): a peer rank is hung or dead"));
  return result;
}

void NcclCommunicator::all_gather(const void* send, void* recv, size_t count, DType dtype) {
  last_ = concat("all-gather of ", count, " x ", size_, " elements");
  check(ncclAllGather(send, recv, count, nccl_type(dtype), comm_, stream_), "ncclAllGather");
}

void NcclCommunicator::reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) {
  last_ = concat("reduce-scatter of ", count, " x ", size_, " elements");
  check(ncclReduceScatter(send, recv, count, nccl_type(dtype), nccl_op(op), comm_, stream_), "ncclReduceScatter");
}

void NcclCommunicator::all_reduce(void* buf, size_t count, DType dtype, ReduceOp op) {
  last_ = concat("all-reduce of ", count, " elements");
  check(ncclAllReduce(buf, buf, count, nccl_type(dtype), nccl_op(op), comm_, stream_), "ncclAllReduce");
}

void NcclCommunicator::reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, int root) {
  last_ = concat("reduce of ", count, " elements to ", root);
  check(ncclReduce(send, recv, count, nccl_type(dtype), nccl_op(op), root, comm_, stream_), "ncclReduce");
}

void NcclCommunicator::group_begin() { check(ncclGroupStart(), "ncclGroupStart"); }

void NcclCommunicator::group_end() { check(ncclGroupEnd(), "ncclGroupEnd"); }

void NcclCommunicator::broadcast(void* buf, size_t count, DType dtype, int root) {
  last_ = concat("broadcast of ", count, " elements from ", root);
  check(ncclBroadcast(buf, buf, count, nccl_type(dtype), root, comm_, stream_), "ncclBroadcast");
}

void NcclCommunicator::all_to_all(const void* send, void* recv, size_t count, DType dtype) {
  last_ = concat("all-to-all of ", count, " x ", size_, " elements");
#if NCCL_VERSION_CODE >= 22800
  check(ncclAlltoAll(send, recv, count, nccl_type(dtype), comm_, stream_), "ncclAlltoAll");
#else
  const size_t bytes = count * dtype_size(dtype);
  check(ncclGroupStart(), "ncclGroupStart");
  for (int q = 0; q < size_; ++q) {
    check(ncclSend(static_cast<const char*>(send) + q * bytes, count, nccl_type(dtype), q, comm_, stream_), "ncclSend");
    check(ncclRecv(static_cast<char*>(recv) + q * bytes, count, nccl_type(dtype), q, comm_, stream_), "ncclRecv");
  }
  check(ncclGroupEnd(), "ncclGroupEnd");
#endif
}

void NcclCommunicator::wait() {
  // As settle, spinning through the first 1 ms (most waits end within it).
  const double waited = poll_until(std::chrono::milliseconds(1), timeout_s_, [&] {
    const cudaError_t rc = cudaStreamQuery(stream_);
    if (rc == cudaSuccess) return true;
    if (rc != cudaErrorNotReady) fail(concat("CUDA error on the stream: ", cudaGetErrorString(rc)));
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm_, &async);
    if (async != ncclSuccess && async != ncclInProgress)
      fail(concat("asynchronous NCCL error: ", ncclGetErrorString(async), " (a peer rank may have died)"));
    return false;
  });
  if (waited > 0)
    fail(concat("no progress for ", waited, " s (dist.timeout = ", timeout_s_, " s): a peer rank is hung or dead"));
}

void NcclCommunicator::connect() {
  if (size_ < 2 || zero_cta_) return;
  // 64 floats a rank: small, yet enough for NCCL's first use of its algorithms (measured: the SQuAD deck's first
  // step on 2 H200 took 0.32 s after this, 0.47 s before).
  constexpr size_t kCount = 64;
  void* buf = nullptr;
  SHARDLM_CUDA_CHECK(cudaMalloc(&buf, size_ * kCount * sizeof(float)));
  SHARDLM_CUDA_CHECK(cudaMemsetAsync(buf, 0, size_ * kCount * sizeof(float), stream_));
  float* mine = static_cast<float*>(buf) + rank_ * kCount;
  all_reduce(buf, kCount, DType::F32, ReduceOp::Sum);
  reduce(buf, buf, kCount, DType::F32, ReduceOp::Sum, 0);
  all_gather(mine, buf, kCount, DType::F32);
  reduce_scatter(buf, mine, kCount, DType::F32, ReduceOp::Sum);
  last_ = "connection of the group (a small all-reduce, reduce, all-gather and reduce-scatter)";
  wait();
  SHARDLM_CUDA_CHECK(cudaFree(buf));
}

std::unique_ptr<DeviceMemory> NcclCommunicator::allocate_window(size_t bytes) {
#if NCCL_VERSION_CODE >= 22800
  if (!windows_offered_ || bytes == 0) return nullptr;
  void* p = nullptr;
  // Every rank registers, or none: where one cannot allocate (no CUDA VMM under this NCCL, or short of
  // memory), the group stops offering windows and the caller allocates ordinary memory (which says if
  // memory is short).
  const int here = ncclMemAlloc(&p, bytes) == ncclSuccess ? 1 : 0;
  int all = 0;
  MPI_Allreduce(&here, &all, 1, MPI_INT, MPI_MIN, mpi_comm_);
  if (!all) {
    if (here) ncclMemFree(p);
    windows_offered_ = false;
    return nullptr;
  }
  zero_device_memory(p, bytes);
  ncclWindow_t window = nullptr;
  last_ = concat("ncclCommWindowRegister of ", bytes, " bytes");
  check(ncclCommWindowRegister(comm_, p, bytes, &window, NCCL_WIN_COLL_SYMMETRIC), "ncclCommWindowRegister");
  ++windows_;
  return std::make_unique<NcclWindowMemory>(*this, p, bytes, window);
#else
  (void)bytes;
  return nullptr;
#endif
}

#if NCCL_VERSION_CODE >= 22800
void NcclCommunicator::release_window(ncclWindow_t window) {
  last_ = "ncclCommWindowDeregister";
  check(ncclCommWindowDeregister(comm_, window), "ncclCommWindowDeregister");
  --windows_;
}
#endif

double NcclCommunicator::host_sum(double v) const {
  double out = 0;
  MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_SUM, mpi_comm_);
  return out;
}

std::unique_ptr<NcclCommunicator> NcclCommunicator::split(int color, int key, std::string name, cudaStream_t stream,
                                                         bool zero_cta, bool windows) {
  if (!stream) stream = stream_;
  MPI_Comm sub;
  MPI_Comm_split(mpi_comm_, color, key, &sub);
  int sub_size = 1;
  MPI_Comm_size(sub, &sub_size);
  // NCCL's symmetric windows (and so the copy-engine gathers) need the group on one host; all its ranks agree.
  if ((zero_cta || windows) && !(sub_size > 1 && copy_engine_gathers_available() && on_one_host(sub)))
    zero_cta = windows = false;
#if NCCL_VERSION_CODE >= 21800
  ncclComm_t child = nullptr;
  last_ = "ncclCommSplit";
  ncclConfig_t config = nonblocking_config(zero_cta);
  ncclResult_t rc = ncclCommSplit(comm_, color, key, &child, &config);
  // Nonblocking, the split is done when both the child and the parent have settled.
  if (rc == ncclInProgress && child) rc = settle(child, "ncclCommSplit");
  if (rc == ncclSuccess || rc == ncclInProgress) rc = settle(comm_, "ncclCommSplit");
  check(rc, "ncclCommSplit");
  return std::make_unique<NcclCommunicator>(child, sub, stream, timeout_s_, std::move(name), zero_cta, windows);
#else
  auto made = std::make_unique<NcclCommunicator>(sub, stream, timeout_s_, std::move(name));
  MPI_Comm_free(&sub);
  return made;
#endif
}

ProcessGroups make_nccl_process_groups(MPI_Comm world, const Topology& topo, ShardingStrategy strategy,
                                       cudaStream_t stream, double timeout_s, cudaStream_t replicate_stream,
                                       cudaStream_t gather_stream, bool copy_engine_gathers, bool symmetric_reductions,
                                       bool copy_engine_reductions) {
  const GroupLayout layout = group_layout(strategy, topo);
  auto w = std::make_unique<NcclCommunicator>(world, stream, timeout_s, "world");
  ProcessGroups g;
  // The groups the engine's own collectives use, connected now (a split group of one connects nothing).
  auto connected = [](std::unique_ptr<NcclCommunicator> c) {
    c->connect();
    return c;
  };
  g.shard = connected(w->split(layout.shard_color, layout.shard_key, "shard", nullptr, false, symmetric_reductions));
  g.replicate = connected(w->split(layout.replicate_color, layout.replicate_key, "replicate"));
  // (Every rank's groups have the same sizes: all split, or none.)
  if (replicate_stream && layout.replicate_size > 1)
    g.replicate_overlap =
        connected(w->split(layout.replicate_color, layout.replicate_key, "replicate (overlap)", replicate_stream));
  if (gather_stream && layout.shard_size > 1)
    g.shard_gather = w->split(layout.shard_color, layout.shard_key, "shard (gathers)", gather_stream,
                              copy_engine_gathers);
  if (copy_engine_reductions && layout.shard_size >= 2) {
    auto x = w->split(layout.shard_color, layout.shard_key, "shard (exchanges)", nullptr, true);
    // (split agrees over the group whether it offers windows: every rank keeps it, or none.)
    if (x->copy_engines()) g.shard_exchange = std::move(x);
  }
  g.world = std::move(w);
  return g;
}

}  // namespace shardlm::cuda
