// bench_cross_entropy: the LM head's cross-entropy rows (src/device/cuda/cross_entropy_rows.cu) on one GPU,
// both kernels, against the GPU's plain copy. Each call computes the loss of `--rows` rows of fp32 logits
// [rows, V] and writes the bf16 gradient in place, as a training step's head chunk does. One JSON line per
// vocabulary and kernel: median milliseconds over --reps timed calls after --warmup, the bytes the kernel
// moves (two-pass: the row read twice, 8 bytes a logit, and 2 written; cluster: 4 read, 2 written), its
// GB/s, and the GB/s of the 6 bytes a logit that any kernel must move, as a share of the copy's.
//
//   bench_cross_entropy [--rows 2048] [--vocab 32000,128256,151936,250880] [--reps 20] [--warmup 5]
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "cross_entropy_rows.hpp"
#include "cuda_bench.hpp"
#include "shardlm/core.hpp"

using namespace shardlm;
using shardlm::bench::GpuBuffer;
using shardlm::bench::median_ms;

int main(int argc, char** argv) try {
  int rows = 2048, reps = 20, warmup = 5;
  std::vector<int> vocabs = {32000, 128256, 151936, 250880};
  for (shardlm::bench::BenchArgs args(argc, argv); args.next();) {
    const std::string a = args.option();
    if (a == "--rows") {
      rows = std::stoi(args.value());
    } else if (a == "--vocab") {
      vocabs = shardlm::bench::int_list(args.value());
    } else if (a == "--reps") {
      reps = std::stoi(args.value());
    } else if (a == "--warmup") {
      warmup = std::stoi(args.value());
    } else {
      throw Error(concat("bench_cross_entropy: unknown option ", a, " (--rows, --vocab, --reps, --warmup)"));
    }
  }
  if (rows < 1 || reps < 1 || warmup < 0) throw Error("bench_cross_entropy: --rows and --reps at least 1, --warmup at least 0");
  cudaStream_t s = shardlm::bench::open_bench_stream();
  for (int V : vocabs) {
    if (V < 2) throw Error(concat("bench_cross_entropy: a vocabulary of ", V));
    const size_t n = static_cast<size_t>(rows) * V;
    GpuBuffer logits(n * 4), targets(rows * 4), loss(rows * 4), has(rows * 4), src(n * 3), dst(n * 3);
    SHARDLM_CUDA_CHECK(cudaMemsetAsync(logits.p, 0, n * 4, s));
    SHARDLM_CUDA_CHECK(cudaMemsetAsync(src.p, 0, n * 3, s));
    std::vector<int32_t> t(rows);
    for (int r = 0; r < rows; ++r) t[r] = static_cast<int32_t>((static_cast<long long>(r) * 7919) % V);
    SHARDLM_CUDA_CHECK(cudaMemcpy(targets.p, t.data(), rows * 4, cudaMemcpyHostToDevice));
    // The copy moves 6 bytes a logit (3 read, 3 written): what a one-read kernel must move.
    const double copy = median_ms(
        [&] { SHARDLM_CUDA_CHECK(cudaMemcpyAsync(dst.p, src.p, n * 3, cudaMemcpyDeviceToDevice, s)); }, warmup, reps, s);
    const double need = 6.0 * n, copy_gbs = need / (copy * 1e-3) / 1e9;
    std::printf("{\"path\": \"copy\", \"rows\": %d, \"vocab\": %d, \"ms\": %.4f, \"gb_per_s\": %.1f}\n", rows, V, copy,
                copy_gbs);
    for (auto path : {cuda::CrossEntropyPath::kTwoPass, cuda::CrossEntropyPath::kCluster}) {
      const bool cluster = path == cuda::CrossEntropyPath::kCluster;
      if (cluster && cuda::cross_entropy_auto_path(V) != path) {
        std::printf("{\"path\": \"cluster\", \"rows\": %d, \"vocab\": %d, \"skipped\": \"not available here\"}\n", rows, V);
        continue;
      }
      const double ms = median_ms(
          [&] {
            cuda::cross_entropy_rows(static_cast<float*>(logits.p), rows, V, static_cast<const int32_t*>(targets.p),
                                     1.0f / rows, true, static_cast<float*>(loss.p), static_cast<int*>(has.p),
                                     DType::BF16, s, path);
          },
          warmup, reps, s);
      const double moved = (cluster ? 6.0 : 10.0) * n;
      std::printf(
          "{\"path\": \"%s\", \"rows\": %d, \"vocab\": %d, \"ms\": %.4f, \"bytes\": %.0f, \"gb_per_s\": %.1f, "
          "\"needed_gb_per_s\": %.1f, \"of_copy\": %.3f}\n",
          cluster ? "cluster" : "two_pass", rows, V, ms, moved, moved / (ms * 1e-3) / 1e9, need / (ms * 1e-3) / 1e9,
          need / (ms * 1e-3) / 1e9 / copy_gbs);
      std::fflush(stdout);
    }
  }
  SHARDLM_CUDA_CHECK(cudaStreamDestroy(s));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
