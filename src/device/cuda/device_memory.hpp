// Device and pinned host buffers: allocated once when the run is planned, counted so the run can
// report exactly how much GPU memory its buffers hold (the high-water mark of cudaMalloc'd bytes).
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>

#include "cuda_check.hpp"
#include "device_memory_count.hpp"

namespace shardlm::cuda {

template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) { allocate(n); }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      p_ = o.p_, n_ = o.n_;
      o.p_ = nullptr, o.n_ = 0;
    }
    return *this;
  }
  void allocate(size_t n) {
    release();
    if (n == 0) return;
    void* p = nullptr;
    const cudaError_t rc = cudaMalloc(&p, n * sizeof(T));
    if (rc != cudaSuccess) {
      size_t free = 0, total = 0;
      cudaMemGetInfo(&free, &total);
      throw Error(concat("out of GPU memory: allocating ", n * sizeof(T), " bytes with ", free, " of ", total,
                         " free (lower train.micro_batch_size or data.max_length, or shard more)"));
    }
    p_ = static_cast<T*>(p);
    n_ = n;
    device_memory_add(static_cast<ptrdiff_t>(n * sizeof(T)));
  }
  void release() {
    if (!p_) return;
    cudaFree(p_);
    device_memory_add(-static_cast<ptrdiff_t>(n_ * sizeof(T)));
    p_ = nullptr;
    n_ = 0;
  }
  T* data() const { return p_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }
  void zero(cudaStream_t s) {
    if (n_) SHARDLM_CUDA_CHECK(cudaMemsetAsync(p_, 0, bytes(), s));
  }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

// Page-locked host memory (fast, asynchronous copies), for checkpoints.
template <typename T>
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() {
    if (p_) cudaFreeHost(p_);
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  PinnedBuffer(PinnedBuffer&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  void allocate(size_t n) {
    if (n == 0) return;
    void* p = nullptr;
    SHARDLM_CUDA_CHECK(cudaMallocHost(&p, n * sizeof(T)));
    p_ = static_cast<T*>(p);
    n_ = n;
  }
  T* data() const { return p_; }
  size_t size() const { return n_; }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace shardlm::cuda
