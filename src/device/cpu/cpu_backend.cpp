// The CPU backend: host memory counted by MemKind, synchronous "streams", casts and the
// element-wise updates (gradient accumulation, sums of squares, AdamW over the host's threads).
#include <chrono>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <string>

#include "shardlm/device.hpp"

namespace shardlm {
namespace {

// Backend::rows_*: an id outside [0, rows) names row 0 (as the embedding reads it).
size_t row_of(int32_t id, size_t rows) { return id >= 0 && static_cast<size_t>(id) < rows ? static_cast<size_t>(id) : 0; }
bool is_first(const int32_t* ids, const int32_t* first, size_t k, size_t m, size_t rows) {
  return first[row_of(ids[k], rows)] == static_cast<int32_t>(m - k);
}


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

// An array in a memory-mapped file of `dir` (fsdp.offload_dir): created, unlinked at once (the mapping
// keeps it; nothing stays behind after the run, even a killed one), sized to `bytes` (reads as zeros).
// Not counted as host memory: the kernel pages it in and out of the page cache.
class MappedMemory final : public DeviceMemory {
 public:
  MappedMemory(const std::string& dir, size_t bytes) {
    if (bytes == 0) return;
    std::string path = dir + "/shardlm-moments-XXXXXX";
    const int fd = mkstemp(path.data());
    SHARDLM_CHECK(fd >= 0, "fsdp.offload_dir = '", dir, "': cannot create a file there (", std::strerror(errno),
                  "); give a writable directory on a local disk, or leave it empty");
    unlink(path.c_str());
    if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      const int e = errno;
      close(fd);
      throw Error(concat("fsdp.offload_dir = '", dir, "': cannot size a file of ", format_bytes(bytes), " (",
                         std::strerror(e), ")"));
    }
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int e = errno;
    close(fd);
    SHARDLM_CHECK(p != MAP_FAILED, "fsdp.offload_dir = '", dir, "': cannot map ", format_bytes(bytes), " (",
                  std::strerror(e), ")");
    data_ = p;
    bytes_ = bytes;
  }
  ~MappedMemory() override {
    if (data_) munmap(data_, bytes_);
  }
};

class NoEvent final : public BackendEvent {
 public:
  void record(Stream) override {}
  void wait_on(Stream) override {}
  void synchronize() override {}
};

// Work is done when it returns: the time of the record is the time the point was reached.
class TimedEvent final : public BackendEvent {
 public:
  void record(Stream) override { at = std::chrono::steady_clock::now(); }
  void wait_on(Stream) override {}
  void synchronize() override {}
  std::chrono::steady_clock::time_point at;
};

class CpuBackend final : public Backend {
 public:
  CpuBackend(int threads, std::string moments_dir) : threads_(std::max(1, threads)), moments_dir_(std::move(moments_dir)) {}
  BackendKind kind() const override { return BackendKind::Cpu; }
  bool host_memory() const override { return true; }
  bool asynchronous() const override { return false; }
  DType compute_dtype(DType) const override { return DType::F32; }
  std::string device_name() const override { return "cpu"; }

  DeviceArray allocate(size_t bytes, MemKind kind) override {
    if (kind == MemKind::Optimizer && !moments_dir_.empty()) return {std::make_unique<MappedMemory>(moments_dir_, bytes)};
    return {std::make_unique<HostMemory>(bytes, kind)};
  }
  size_t allocated_bytes() const override { return memory_stats().total_current; }
  size_t peak_bytes() const override { return memory_stats().total_peak; }
  size_t available_bytes() const override { return host_available_bytes(); }
  void pin_host(void*, size_t) override {}
  void unpin_host(void*) override {}

  Stream compute_stream() const override { return nullptr; }
  Stream comm_stream() const override { return nullptr; }
  Stream copy_stream(CopyKind) const override { return nullptr; }
  std::unique_ptr<BackendEvent> make_event() override { return std::make_unique<NoEvent>(); }
  std::unique_ptr<BackendEvent> make_timing_event() override { return std::make_unique<TimedEvent>(); }
  double elapsed_ms(BackendEvent& from, BackendEvent& to) override {
    return std::chrono::duration<double, std::milli>(dynamic_cast<TimedEvent&>(to).at -
                                                     dynamic_cast<TimedEvent&>(from).at).count();
  }
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
  void accumulate(float* x, const void* y, DType y_dtype, size_t n, Stream) override {
    host_accumulate_grad(x, y, y_dtype, n, /*overwrite=*/false, nullptr, 1);
  }
  void sum_squares(const float* x, size_t n, double* sum, Stream) override {
    double s = 0.0;
    for (size_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
    *sum += s;
  }

  void adamw(const std::vector<AdamWRange>& ranges, const AdamWHyper& h, Stream) override {
    host_adamw(ranges, h, threads_, simd_);
  }
  void adamw_8bit(const std::vector<AdamW8bitRange>& ranges, const AdamWHyper& h, Stream) override {
    host_adamw_8bit(ranges, h, threads_);
  }

  void rows_mark_first(const int32_t* ids, size_t m, int32_t* first, size_t rows, Stream) override {
    for (size_t k = m; k-- > 0;) first[row_of(ids[k], rows)] = static_cast<int32_t>(m - k);  // the lowest k last
  }
  void rows_slots(const int32_t* ids, size_t n, const int32_t* first, size_t m, size_t rows, int32_t* slots,
                  Stream) override {
    for (size_t i = 0; i < n; ++i) slots[i] = static_cast<int32_t>(m) - first[row_of(ids[i], rows)];
  }
  void rows_pack(const float* table, size_t width, const int32_t* ids, const int32_t* first, size_t m, size_t rows,
                 void* out, DType out_dtype, Stream s) override {
    const size_t bytes = width * dtype_size(out_dtype);
    for (size_t k = 0; k < m; ++k) {
      char* dst = static_cast<char*>(out) + k * bytes;
      if (is_first(ids, first, k, m, rows)) cast(table + row_of(ids[k], rows) * width, DType::F32, dst, out_dtype, width, s);
      else std::memset(dst, 0, bytes);
    }
  }
  void rows_unpack_add(const void* in, DType in_dtype, size_t width, const int32_t* ids, const int32_t* first, size_t m,
                       size_t rows, float* slice, long long pos, size_t count, Stream s) override {
    const size_t bytes = width * dtype_size(in_dtype);
    for (size_t k = 0; k < m; ++k) {
      if (!is_first(ids, first, k, m, rows)) continue;
      // The row's columns [lo, hi) fall inside the slice.
      const long long base = pos + static_cast<long long>(row_of(ids[k], rows) * width);
      const long long lo = std::max(0LL, -base), hi = std::min<long long>(width, static_cast<long long>(count) - base);
      if (lo >= hi) continue;
      const char* src = static_cast<const char*>(in) + k * bytes + static_cast<size_t>(lo) * dtype_size(in_dtype);
      accumulate(slice + base + lo, src, in_dtype, static_cast<size_t>(hi - lo), s);
    }
  }
  void rows_sum_squares(size_t width, const int32_t* ids, const int32_t* first, size_t m, size_t rows, const float* slice,
                        long long pos, size_t count, bool named, double* sum, Stream) override {
    const auto add_row = [&](size_t row) {
      const long long base = pos + static_cast<long long>(row * width);
      const long long lo = std::max(0LL, -base), hi = std::min<long long>(width, static_cast<long long>(count) - base);
      for (long long c = lo; c < hi; ++c) *sum += static_cast<double>(slice[base + c]) * slice[base + c];
    };
    if (named) {
      for (size_t k = 0; k < m; ++k)
        if (is_first(ids, first, k, m, rows)) add_row(row_of(ids[k], rows));
    } else {
      for (size_t row = 0; row < rows; ++row)
        if (first[row] == 0) add_row(row);
    }
  }
  void rows_zero(float* table, size_t width, const int32_t* ids, size_t m, size_t rows, Stream) override {
    for (size_t k = 0; k < m; ++k) std::memset(table + row_of(ids[k], rows) * width, 0, width * sizeof(float));
  }

 private:
  int threads_;
  std::string moments_dir_;  // fsdp.offload_dir: AdamW's moments in mapped files there
  HostSimd simd_ = host_simd_best();
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int threads, const std::string& moments_dir) {
  return std::make_unique<CpuBackend>(threads, moments_dir);
}

}  // namespace shardlm
