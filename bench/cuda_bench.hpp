// Helpers of the CUDA benchmarks (bench_attention, bench_adamw, bench_fp8_gemm): device buffers,
// CUDA-event timing that reports the median, the stream they run on, comma-separated int options.
#pragma once
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_check.hpp"
#include "shardlm/core.hpp"

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

// A stream for the benchmark, after one JSON line naming the GPU ({"gpu": "NVIDIA H200"}).
inline cudaStream_t open_bench_stream() {
  cudaDeviceProp prop{};
  SHARDLM_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("{\"gpu\": \"%s\"}\n", prop.name);
  cudaStream_t s;
  SHARDLM_CUDA_CHECK(cudaStreamCreate(&s));
  return s;
}

// argv's options in turn: for (BenchArgs a(argc, argv); a.next();) { if (a.option() == "--reps") reps =
// std::stoi(a.value()); ... }; value() takes the argument after the option (an error naming it if none).
class BenchArgs {
 public:
  BenchArgs(int argc, char** argv) : argc_(argc), argv_(argv) {}
  bool next() { return ++i_ < argc_; }
  std::string option() const { return argv_[i_]; }
  std::string value() {
    if (i_ + 1 >= argc_) throw Error(concat(argv_[i_], " needs a value"));
    return argv_[++i_];
  }

 private:
  int argc_;
  char** argv_;
  int i_ = 0;
};

// "2048,4096" as {2048, 4096}.
inline std::vector<int> int_list(const std::string& s) {
  std::vector<int> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) out.push_back(std::stoi(item));
  return out;
}

}  // namespace shardlm::bench
