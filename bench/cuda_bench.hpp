// Helpers of the CUDA benchmarks (bench_attention, bench_adamw): device buffers and CUDA-event
// timing that reports the median.
#pragma once
#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "cuda_check.hpp"

namespace shardlm::bench {

struct GpuBuffer {
  void* p = nullptr;
  explicit GpuBuffer(size_t bytes) { SHARDLM_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 256))); }
  ~GpuBuffer() { cudaFree(p); }
  GpuBuffer(const GpuBuffer&) = delete;
  GpuBuffer& operator=(const GpuBuffer&) = delete;
};

// Median milliseconds of `reps` calls of f (after `warmup`), each timed by its own events.
template <typename F>
double median_ms(F&& f, int warmup, int reps, cudaStream_t s) {
  for (int i = 0; i < warmup; ++i) f();
  cudaEvent_t a, b;
  SHARDLM_CUDA_CHECK(cudaEventCreate(&a));
  SHARDLM_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    SHARDLM_CUDA_CHECK(cudaEventRecord(a, s));
    f();
    SHARDLM_CUDA_CHECK(cudaEventRecord(b, s));
    SHARDLM_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    SHARDLM_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace shardlm::bench
