// bench_adamw: the fused AdamW kernel (src/device/cuda/adamw.cu) against the GPU's plain copy, on one
// GPU, as the optimizer runs it over a rank's shard: fp32 master, gradient and both moments, the
// updated parameter also written in bf16 for the next all-gather. One JSON line per size and path:
// median milliseconds over --reps timed calls after --warmup, bytes moved, GB/s, and AdamW's GB/s as
// a share of the copy's (cudaMemcpyAsync device to device of 16 bytes an element: 32 bytes moved).
//
//   bench_adamw [--elements 64M,256M,700M] [--reps 20] [--warmup 5]
//
// AdamW moves 30 bytes an element with the bf16 copy (reads param, grad, exp_avg, exp_avg_sq; writes
// param, both moments and the bf16 parameter), 28 without it.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "adamw.hpp"
#include "cuda_bench.hpp"
#include "shardlm/core.hpp"

using namespace shardlm;
using shardlm::bench::GpuBuffer;
using shardlm::bench::median_ms;

namespace {

// "64M" = 64 x 2^20, "1G" = 2^30, a plain number as written.
size_t count_of(const std::string& s) {
  if (s.empty()) throw Error("bench_adamw: an empty size in --elements");
  const char unit = s.back();
  const double mult = unit == 'K' ? 1024.0 : unit == 'M' ? 1048576.0 : unit == 'G' ? 1073741824.0 : 1.0;
  const std::string digits = mult == 1.0 ? s : s.substr(0, s.size() - 1);
  size_t used = 0;
  const double v = std::stod(digits, &used);
  if (used != digits.size() || v <= 0) throw Error(concat("bench_adamw: bad size '", s, "' in --elements"));
  return static_cast<size_t>(v * mult);
}

void report(const char* path, size_t n, double ms, double bytes, double copy_gbs) {
  const double gbs = bytes / (ms * 1e-3) / 1e9;
  std::printf("{\"path\": \"%s\", \"elements\": %zu, \"ms\": %.4f, \"bytes\": %.0f, \"gb_per_s\": %.1f", path, n, ms,
              bytes, gbs);
  if (copy_gbs > 0) std::printf(", \"of_copy\": %.3f", gbs / copy_gbs);
  std::printf("}\n");
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) try {
  std::vector<size_t> sizes = {size_t(64) << 20, size_t(256) << 20, size_t(700) << 20};
  int reps = 20, warmup = 5;
  for (shardlm::bench::BenchArgs args(argc, argv); args.next();) {
    const std::string a = args.option();
    if (a == "--elements") {
      sizes.clear();
      std::stringstream in(args.value());
      for (std::string item; std::getline(in, item, ',');) sizes.push_back(count_of(item));
    } else if (a == "--reps") {
      reps = std::stoi(args.value());
    } else if (a == "--warmup") {
      warmup = std::stoi(args.value());
    } else {
      throw Error(concat("bench_adamw: unknown option ", a, " (--elements, --reps, --warmup)"));
    }
  }
  if (reps < 1 || warmup < 0) throw Error("bench_adamw: --reps must be at least 1 and --warmup at least 0");
  cudaStream_t s = shardlm::bench::open_bench_stream();
  for (size_t n : sizes) {
    GpuBuffer param(n * 4), grad(n * 4), m(n * 4), v(n * 4), out(n * 2), src(n * 16), dst(n * 16);
    for (void* p : {param.p, grad.p, m.p, v.p, src.p}) SHARDLM_CUDA_CHECK(cudaMemsetAsync(p, 0, n * 4, s));
    cuda::AdamWArgs args;
    args.lr = 1e-5f, args.weight_decay = 0.01f, args.bias_correction1 = 0.1f, args.bias_correction2 = 0.001f;
    const double copy = median_ms(
        [&] { SHARDLM_CUDA_CHECK(cudaMemcpyAsync(dst.p, src.p, n * 16, cudaMemcpyDeviceToDevice, s)); }, warmup, reps, s);
    const double copy_gbs = 32.0 * n / (copy * 1e-3) / 1e9;
    report("copy", n, copy, 32.0 * n, 0);
    const float* g = static_cast<const float*>(grad.p);
    auto* pp = static_cast<float*>(param.p);
    auto* mm = static_cast<float*>(m.p);
    auto* vv = static_cast<float*>(v.p);
    report("adamw_bf16_out", n,
           median_ms([&] { cuda::adamw_step(pp, g, mm, vv, n, args, out.p, DType::BF16, s); }, warmup, reps, s),
           30.0 * n, copy_gbs);
    report("adamw", n, median_ms([&] { cuda::adamw_step(pp, g, mm, vv, n, args, nullptr, DType::BF16, s); }, warmup, reps, s),
           28.0 * n, copy_gbs);
  }
  SHARDLM_CUDA_CHECK(cudaStreamDestroy(s));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
