// The CPU backend: host memory counted by MemKind, synchronous "streams", casts and the
// element-wise updates (gradient accumulation, sums of squares, AdamW over the host's threads).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "shardlm/device.hpp"

namespace shardlm {
namespace {

class HostMemory final : public DeviceMemory {
 public:
  HostMemory(size_t bytes, MemKind kind) : kind_(kind) {
    if (bytes == 0) return;
    data_ = aligned_zero_alloc(bytes);
    bytes_ = bytes;
    memory_track_alloc(kind_, bytes_);
  }
  ~HostMemory() override {
    if (!data_) return;
    memory_track_free(kind_, bytes_);
    aligned_free(data_);
  }

 private:
  MemKind kind_;
};

class NoEvent final : public BackendEvent {
 public:
  void record(Stream) override {}
  void wait_on(Stream) override {}
  void synchronize() override {}
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads) : threads_(std::max(1, threads)) {}
  BackendKind kind() const override { return BackendKind::Cpu; }
  bool host_memory() const override { return true; }
  bool asynchronous() const override { return false; }
  DType compute_dtype(DType) const override { return DType::F32; }
  std::string device_name() const override { return "cpu"; }

  DeviceArray allocate(size_t bytes, MemKind kind) override { return {std::make_unique<HostMemory>(bytes, kind)}; }
  size_t allocated_bytes() const override { return memory_stats().total_current; }
  size_t peak_bytes() const override { return memory_stats().total_peak; }
  size_t available_bytes() const override { return host_available_bytes(); }
  void pin_host(void*, size_t) override {}
  void unpin_host(void*) override {}

  Stream compute_stream() const override { return nullptr; }
  Stream comm_stream() const override { return nullptr; }
  Stream copy_stream(CopyKind) const override { return nullptr; }
  std::unique_ptr<BackendEvent> make_event() override { return std::make_unique<NoEvent>(); }
  void synchronize(Stream) override {}
  void bind_thread() override {}
  int host_threads() const override { return threads_; }

  void zero(void* p, size_t bytes, Stream) override {
    if (bytes) std::memset(p, 0, bytes);
  }
  void copy(void* dst, const void* src, size_t bytes, CopyKind, Stream) override {
    if (bytes && dst != src) std::memcpy(dst, src, bytes);
  }
  void cast(const void* in, DType in_dtype, void* out, DType out_dtype, size_t n, Stream) override {
    if (in_dtype == out_dtype) {
      if (n && in != out) std::memcpy(out, in, n * dtype_size(in_dtype));
    } else if (in_dtype == DType::F32) {
      pack16(out_dtype, static_cast<const float*>(in), static_cast<uint16_t*>(out), n);
    } else if (out_dtype == DType::F32) {
      unpack16(in_dtype, static_cast<const uint16_t*>(in), static_cast<float*>(out), n);
    } else {
      throw Error(concat("cast from ", dtype_name(in_dtype), " to ", dtype_name(out_dtype), " goes through fp32"));
    }
  }
  void accumulate(float* x, const float* y, size_t n, Stream) override {
    for (size_t i = 0; i < n; ++i) x[i] += y[i];
  }
  void sum_squares(const float* x, size_t n, double* sum, Stream) override {
    double s = 0.0;
    for (size_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
    *sum += s;
  }

  void adamw(const std::vector<AdamWRange>& ranges, const AdamWHyper& h, Stream) override {
    host_adamw(ranges, h, threads_, simd_);
  }

 private:
  int threads_;
  HostSimd simd_ = host_simd_best();
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int threads) { return std::make_unique<CpuBackend>(threads); }

}  // namespace shardlm
