// The CPU backend: host memory counted by MemKind, synchronous "streams", casts and the
// element-wise updates (gradient accumulation, sums of squares, AdamW over the host's threads).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <thread>

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
};

void adamw_range(const AdamWRange& r, size_t begin, size_t end, const AdamWHyper& h, float step_size,
                 float bias2_sqrt) {
  const float b1 = static_cast<float>(h.beta1), b2 = static_cast<float>(h.beta2), eps = static_cast<float>(h.eps);
  const float decay = static_cast<float>(1.0 - h.lr * r.weight_decay);
  float *p = r.param, *m = r.exp_avg, *v = r.exp_avg_sq;
  for (size_t i = begin; i < end; ++i) {
    const float g = h.grad_scale == 1.0f ? r.grad[i] : r.grad[i] * h.grad_scale;
    p[i] *= decay;
    m[i] = b1 * m[i] + (1.0f - b1) * g;
    v[i] = b2 * v[i] + (1.0f - b2) * g * g;
    const float denom = std::sqrt(v[i]) / bias2_sqrt + eps;
    p[i] -= step_size * m[i] / denom;
  }
  if (!r.param_out || end <= begin) return;
  if (h.out_dtype == DType::F32)
    std::memcpy(static_cast<float*>(r.param_out) + begin, p + begin, (end - begin) * sizeof(float));
  else
    pack16(h.out_dtype, p + begin, static_cast<uint16_t*>(r.param_out) + begin, end - begin);
}

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
  std::unique_ptr<BackendEvent> make_event() override { return std::make_unique<NoEvent>(); }
  void synchronize(Stream) override {}

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
    const double bias1 = 1.0 - std::pow(h.beta1, static_cast<double>(h.step));
    const double bias2 = 1.0 - std::pow(h.beta2, static_cast<double>(h.step));
    const float step_size = static_cast<float>(h.lr / bias1);
    const float bias2_sqrt = static_cast<float>(std::sqrt(bias2));
    // Work items of at most 1 M elements, so that threads share even a single large range.
    struct Piece {
      size_t range, begin, end;
    };
    constexpr size_t kPiece = 1u << 20;
    std::vector<Piece> pieces;
    for (size_t r = 0; r < ranges.size(); ++r)
      for (size_t b = 0; b < ranges[r].numel; b += kPiece) pieces.push_back({r, b, std::min(ranges[r].numel, b + kPiece)});
    std::atomic<size_t> next{0};
    auto work = [&] {
      for (size_t i = next++; i < pieces.size(); i = next++)
        adamw_range(ranges[pieces[i].range], pieces[i].begin, pieces[i].end, h, step_size, bias2_sqrt);
    };
    const int helpers = static_cast<int>(std::min<size_t>(static_cast<size_t>(threads_), pieces.size())) - 1;
    std::vector<std::thread> pool;
    for (int t = 0; t < helpers; ++t) pool.emplace_back(work);
    work();
    for (std::thread& t : pool) t.join();
  }

 private:
  int threads_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int threads) { return std::make_unique<CpuBackend>(threads); }

}  // namespace shardlm
