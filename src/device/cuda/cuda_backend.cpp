// The CUDA backend: device memory through the planned-buffer accounting, a compute, three
// communication (the reductions', the gathers', the replicate group's) and two copy streams (CPU offload) with events between them, and the element-wise kernels
// (elementwise.hpp), the token rows (token_rows.hpp) and AdamW (adamw.hpp).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>

#include "adamw.hpp"
#include "adamw_8bit.hpp"
#include "device_memory.hpp"
#include "device_setup.hpp"
#include "elementwise.hpp"
#include "token_rows.hpp"
#include "shardlm/device.hpp"

namespace shardlm {
namespace {

cudaStream_t as_cuda(Stream s) { return static_cast<cudaStream_t>(s); }

class CudaMemory final : public DeviceMemory {
 public:
  explicit CudaMemory(size_t bytes) : buffer_(bytes) {
    data_ = buffer_.data();
    bytes_ = buffer_.bytes();
  }

 private:
  cuda::DeviceBuffer<char> buffer_;
};

class CudaEvent final : public BackendEvent {
 public:
  // Timing costs a little on every record: only the step timeline's events take it.
  // blocking: a host thread waiting for it sleeps instead of spinning (CudaBackend's blocking waits).
  explicit CudaEvent(bool timing = false, bool blocking = false) {
    const unsigned flags = (timing ? cudaEventDefault : cudaEventDisableTiming) | (blocking ? cudaEventBlockingSync : 0);
    SHARDLM_CUDA_CHECK(cudaEventCreateWithFlags(&e_, flags));
  }
  ~CudaEvent() override { cudaEventDestroy(e_); }
  void record(Stream s) override { SHARDLM_CUDA_CHECK(cudaEventRecord(e_, as_cuda(s))); }
  void wait_on(Stream s) override { SHARDLM_CUDA_CHECK(cudaStreamWaitEvent(as_cuda(s), e_, 0)); }
  void synchronize() override { SHARDLM_CUDA_CHECK(cudaEventSynchronize(e_)); }
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(bool blocking_waits) : blocking_(blocking_waits) {
    SHARDLM_CUDA_CHECK(cudaGetDevice(&device_));
    if (blocking_) {
      // Stream and device synchronizations sleep instead of spinning (the device's flags, restored at
      // the end); so do waits for this backend's events (their flag).
      // A driver that refuses to change an initialized device's flags leaves them (waits then spin).
      if (cudaGetDeviceFlags(&saved_flags_) != cudaSuccess ||
          cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync | (saved_flags_ & cudaDeviceMapHost)) != cudaSuccess) {
        cudaGetLastError();
        saved_flags_ = kUnchanged;
      }
    }
    SHARDLM_CUDA_CHECK(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
    // The collectives' stream at the highest priority: their blocks are scheduled as soon as the
    // compute stream's kernels free an SM, so a reduction overlapping a backward finishes early
    // instead of trickling through it (as PyTorch FSDP's streams do).
    int least = 0, greatest = 0;
    SHARDLM_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    SHARDLM_CUDA_CHECK(cudaStreamCreateWithPriority(&comm_, cudaStreamNonBlocking, greatest));
    SHARDLM_CUDA_CHECK(cudaStreamCreateWithPriority(&replicate_, cudaStreamNonBlocking, greatest));
    SHARDLM_CUDA_CHECK(cudaStreamCreateWithPriority(&gather_, cudaStreamNonBlocking, greatest));
    SHARDLM_CUDA_CHECK(cudaStreamCreateWithFlags(&download_, cudaStreamNonBlocking));
    SHARDLM_CUDA_CHECK(cudaStreamCreateWithFlags(&upload_, cudaStreamNonBlocking));
    // peak_bytes() is this backend's (its engine's, its run's) peak: an earlier run in the process (a
    // test's, a benchmark's) freed its memory, and its peak is not this one's.
    cuda::DeviceMemoryStats& stats = cuda::device_memory_stats();
    stats.peak = stats.current;
  }
  ~CudaBackend() override {
    cudaDeviceSynchronize();
    cudaStreamDestroy(compute_);
    cudaStreamDestroy(comm_);
    cudaStreamDestroy(replicate_);
    cudaStreamDestroy(gather_);
    cudaStreamDestroy(download_);
    cudaStreamDestroy(upload_);
    if (blocking_ && saved_flags_ != kUnchanged) {
      cudaSetDeviceFlags(saved_flags_ & (cudaDeviceScheduleMask | cudaDeviceMapHost));
      cudaGetLastError();
    }
  }

  BackendKind kind() const override { return BackendKind::Cuda; }
  bool host_memory() const override { return false; }
  bool asynchronous() const override { return true; }
  DType compute_dtype(DType param_dtype) const override { return param_dtype; }
  std::string device_name() const override {
    int device = 0;
    cudaDeviceProp prop{};
    SHARDLM_CUDA_CHECK(cudaGetDevice(&device));
    SHARDLM_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    return prop.name;
  }

  DeviceArray allocate(size_t bytes, MemKind) override {
    DeviceArray a{std::make_unique<CudaMemory>(bytes)};
    cuda::zero_device_memory(a.data(), bytes);  // zero for every stream before it is returned
    return a;
  }
  size_t allocated_bytes() const override { return cuda::device_memory_stats().current; }
  size_t peak_bytes() const override { return cuda::device_memory_stats().peak; }
  size_t available_bytes() const override {
    size_t free = 0, total = 0;
    SHARDLM_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    return free;
  }
  void pin_host(void* p, size_t bytes) override {
    if (bytes == 0) return;
    const cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterDefault);
    SHARDLM_CHECK(e == cudaSuccess, "fsdp.cpu_offload: cannot page-lock ", bytes, " bytes of host memory (",
                  cudaGetErrorString(e), "); raise the locked-memory limit (ulimit -l) or turn offload off");
  }
  void unpin_host(void* p) override { cudaHostUnregister(p); }

  Stream compute_stream() const override { return compute_; }
  Stream comm_stream() const override { return comm_; }
  Stream replicate_stream() const override { return replicate_; }
  Stream gather_stream() const override { return gather_; }
  Stream copy_stream(CopyKind direction) const override {
    return direction == CopyKind::DeviceToHost ? download_ : upload_;
  }
  std::unique_ptr<BackendEvent> make_event() override { return std::make_unique<CudaEvent>(false, blocking_); }
  std::unique_ptr<BackendEvent> make_timing_event() override { return std::make_unique<CudaEvent>(true, blocking_); }
  double elapsed_ms(BackendEvent& from, BackendEvent& to) override {
    float ms = 0;
    SHARDLM_CUDA_CHECK(cudaEventElapsedTime(&ms, dynamic_cast<CudaEvent&>(from).get(), dynamic_cast<CudaEvent&>(to).get()));
    return ms;
  }
  void synchronize(Stream s) override { SHARDLM_CUDA_CHECK(cudaStreamSynchronize(as_cuda(s))); }
  void bind_thread() override { SHARDLM_CUDA_CHECK(cudaSetDevice(device_)); }
  int host_threads() const override { return 1; }

  void zero(void* p, size_t bytes, Stream s) override {
    if (bytes) SHARDLM_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, as_cuda(s)));
  }
  void copy(void* dst, const void* src, size_t bytes, CopyKind kind, Stream s) override {
    if (bytes == 0) return;
    SHARDLM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes,
                                       kind == CopyKind::HostToDevice ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost,
                                       as_cuda(s)));
  }
  void cast(const void* in, DType in_dtype, void* out, DType out_dtype, size_t n, Stream s) override {
    cuda::cast(in, in_dtype, out, out_dtype, n, as_cuda(s));
  }
  void accumulate(float* x, const void* y, DType y_dtype, size_t n, Stream s) override {
    cuda::accumulate(x, y, y_dtype, n, as_cuda(s));
  }
  void sum_squares(const float* x, size_t n, double* sum, Stream s) override {
    cuda::sum_squares(x, n, sum, as_cuda(s));
  }
  void rows_mark_first(const int32_t* ids, size_t m, int32_t* first, size_t rows, Stream s) override {
    cuda::rows_mark_first(ids, m, first, rows, as_cuda(s));
  }
  void rows_slots(const int32_t* ids, size_t n, const int32_t* first, size_t m, size_t rows, int32_t* slots,
                  Stream s) override {
    cuda::rows_slots(ids, n, first, m, rows, slots, as_cuda(s));
  }
  void rows_pack(const float* table, size_t width, const int32_t* ids, const int32_t* first, size_t m, size_t rows,
                 void* out, DType out_dtype, Stream s) override {
    cuda::rows_pack(table, width, ids, first, m, rows, out, out_dtype, as_cuda(s));
  }
  void rows_unpack_add(const void* in, DType in_dtype, size_t width, const int32_t* ids, const int32_t* first, size_t m,
                       size_t rows, float* slice, long long pos, size_t count, Stream s) override {
    cuda::rows_unpack_add(in, in_dtype, width, ids, first, m, rows, slice, pos, count, as_cuda(s));
  }
  void rows_sum_squares(size_t width, const int32_t* ids, const int32_t* first, size_t m, size_t rows, const float* slice,
                        long long pos, size_t count, bool named, double* sum, Stream s) override {
    cuda::rows_sum_squares(width, ids, first, m, rows, slice, pos, count, named, sum, as_cuda(s));
  }
  void rows_zero(float* table, size_t width, const int32_t* ids, size_t m, size_t rows, Stream s) override {
    cuda::rows_zero(table, width, ids, m, rows, as_cuda(s));
  }
  void adamw(const std::vector<AdamWRange>& ranges, const AdamWHyper& h, Stream s) override {
    cuda::AdamWArgs a;
    a.lr = static_cast<float>(h.lr);
    a.beta1 = static_cast<float>(h.beta1);
    a.beta2 = static_cast<float>(h.beta2);
    a.eps = static_cast<float>(h.eps);
    a.bias_correction1 = static_cast<float>(1.0 - std::pow(h.beta1, static_cast<double>(h.step)));
    a.bias_correction2 = static_cast<float>(1.0 - std::pow(h.beta2, static_cast<double>(h.step)));
    a.grad_scale = h.grad_scale;
    for (const AdamWRange& r : ranges) {
      if (r.numel == 0) continue;
      a.weight_decay = static_cast<float>(r.weight_decay);
      cuda::adamw_step(r.param, r.grad, r.exp_avg, r.exp_avg_sq, r.numel, a, r.param_out, h.out_dtype, as_cuda(s));
    }
  }
  void adamw_8bit(const std::vector<AdamW8bitRange>& ranges, const AdamWHyper& h, Stream s) override {
    for (const AdamW8bitRange& r : ranges) cuda::adamw_8bit_step(r, h, as_cuda(s));
  }

 private:
  int device_ = 0;
  bool blocking_ = false;
  static constexpr unsigned kUnchanged = ~0u;
  unsigned saved_flags_ = kUnchanged;  // the device's flags before blocking waits set theirs
  cudaStream_t compute_ = nullptr, comm_ = nullptr, replicate_ = nullptr, gather_ = nullptr, download_ = nullptr, upload_ = nullptr;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(bool blocking_waits) { return std::make_unique<CudaBackend>(blocking_waits); }

}  // namespace shardlm
