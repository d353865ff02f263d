// bench_fp8_gemm: where the time of model.fp8_linear goes, one linear layer at a time, on one GPU.
// For each layer shape (out x in) and token count n it times, as medians of CUDA-event-timed calls:
//   bf16    the three GEMMs of the bf16 path (forward y = x W^T, dgrad dx = dy W, wgrad dW += dy^T x
//           into fp32), as MatMul runs them;
//   gemm    the same three in FP8 on operands already quantized (cuBLASLt's TN form), the forward with
//           and without fast accumulation;
//   quant   each fp8_quantize the FP8 path runs (x, W, dy plain; W, dy, x transposed; dy both at once);
//   fp8     run_fp8_gemm end to end per form (quantization + GEMM), as model.fp8_linear runs today.
// One JSON line per measurement, then one per shape with the totals and the ratios bf16 / fp8.
//
//   bench_fp8_gemm [--tokens 4096,8192] [--shapes 6144x4096,4096x4096,28672x4096,4096x14336]
//                  [--reps 20] [--warmup 5]
//
// The default shapes are Llama-3.1-8B's q|k|v, o, gate|up and down projections (out x in).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_bench.hpp"
#include "fp8_cast.hpp"
#include "fp8_gemm.hpp"
#include "gemm.hpp"
#include "shardlm/core.hpp"
#include "workspace_sizes.hpp"

using namespace shardlm;
using namespace shardlm::cuda;
using shardlm::bench::GpuBuffer;
using shardlm::bench::int_list;
using shardlm::bench::median_ms;

namespace {

struct Shape {
  int out, in;
};

std::vector<Shape> shapes_of(const std::string& list) {
  std::vector<Shape> v;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');) {
    const size_t x = item.find('x');
    if (x == std::string::npos) throw Error(concat("bench_fp8_gemm: a shape is OUTxIN, not '", item, "'"));
    v.push_back({std::stoi(item.substr(0, x)), std::stoi(item.substr(x + 1))});
  }
  return v;
}

// bf16 values of a normal distribution (std 1), the same 1M repeated over the buffer.
void fill_bf16(void* p, size_t n, unsigned seed, cudaStream_t s) {
  const size_t chunk = std::min<size_t>(n, size_t(1) << 20);
  std::vector<uint16_t> host(chunk);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto& h : host) {
    const float f = normal(rng);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    h = static_cast<uint16_t>(bits >> 16);
  }
  auto* dst = static_cast<uint16_t*>(p);
  for (size_t at = 0; at < n; at += chunk)
    SHARDLM_CUDA_CHECK(
        cudaMemcpyAsync(dst + at, host.data(), std::min(chunk, n - at) * 2, cudaMemcpyHostToDevice, s));
  SHARDLM_CUDA_CHECK(cudaStreamSynchronize(s));
}

GemmDesc desc(bool ta, bool tb, int M, int N, int K, const void* A, int lda, const void* B, int ldb, void* C, int ldc,
              DType c, float beta) {
  GemmDesc d;
  d.trans_a = ta, d.trans_b = tb, d.M = M, d.N = N, d.K = K;
  d.A = A, d.lda = lda, d.B = B, d.ldb = ldb, d.C = C, d.ldc = ldc;
  d.ab_dtype = DType::BF16, d.c_dtype = c, d.beta = beta;
  return d;
}

// The FP8 form of d on operands already quantized into w (A [M, K], B [N, K]).
GemmDesc fp8_form(GemmDesc d, const Fp8Scratch& w, bool fast) {
  d.fp8 = true, d.fast_accum = fast;
  d.trans_a = false, d.trans_b = true;
  d.A = w.a, d.lda = d.K, d.B = w.b, d.ldb = d.K;
  d.a_scale = w.a_scale, d.b_scale = w.b_scale;
  return d;
}

double tflops(const GemmDesc& d, double ms) { return 2.0 * d.M * d.N * d.K / (ms * 1e-3) / 1e12; }

}  // namespace

int main(int argc, char** argv) try {
  std::vector<int> tokens = {4096, 8192};
  std::vector<Shape> shapes = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}};
  int reps = 20, warmup = 5;
  for (shardlm::bench::BenchArgs args(argc, argv); args.next();) {
    const std::string a = args.option();
    if (a == "--tokens")
      tokens = int_list(args.value());
    else if (a == "--shapes")
      shapes = shapes_of(args.value());
    else if (a == "--reps")
      reps = std::stoi(args.value());
    else if (a == "--warmup")
      warmup = std::stoi(args.value());
    else
      throw Error(concat("bench_fp8_gemm: unknown option ", a, " (--tokens, --shapes, --reps, --warmup)"));
  }
  if (reps < 1 || warmup < 0) throw Error("bench_fp8_gemm: --reps must be at least 1 and --warmup at least 0");
  cudaStream_t s = shardlm::bench::open_bench_stream();
  Gemm gemm;
  for (int n : tokens)
    for (const Shape sh : shapes) {
      const size_t nx = size_t(n) * sh.in, ny = size_t(n) * sh.out, nw = size_t(sh.out) * sh.in;
      GpuBuffer x(nx * 2), dy(ny * 2), W(nw * 2), y(ny * 2), dx(nx * 2), dW(nw * 4), dyt(std::max({nx, ny, nw}));
      fill_bf16(x.p, nx, 1, s), fill_bf16(dy.p, ny, 2, s), fill_bf16(W.p, nw, 3, s);
      SHARDLM_CUDA_CHECK(cudaMemsetAsync(dW.p, 0, nw * 4, s));
      const size_t a_max = std::max({nx, ny, nw}), b_max = a_max;
      GpuBuffer scratch(fp8_scratch_bytes(a_max, b_max));
      const Fp8Scratch w = Fp8Scratch::at(scratch.p, a_max, b_max);
      const GemmDesc fwd = desc(false, true, n, sh.out, sh.in, x.p, sh.in, W.p, sh.in, y.p, sh.out, DType::BF16, 0);
      const GemmDesc dgrad =
          desc(false, false, n, sh.in, sh.out, dy.p, sh.out, W.p, sh.in, dx.p, sh.in, DType::BF16, 0);
      const GemmDesc wgrad = desc(true, false, sh.out, sh.in, n, dy.p, sh.out, x.p, sh.in, dW.p, sh.in, DType::F32, 1);
      auto line = [&](const char* what, const char* form, double ms, double tf) {
        std::printf("{\"tokens\": %d, \"out\": %d, \"in\": %d, \"what\": \"%s\", \"form\": \"%s\", \"ms\": %.4f", n,
                    sh.out, sh.in, what, form, ms);
        if (tf > 0) std::printf(", \"tflops\": %.1f", tf);
        std::printf("}\n");
        std::fflush(stdout);
        return ms;
      };
      auto time = [&](auto&& f) { return median_ms(f, warmup, reps, s); };
      double bf16 = 0, fp8_now = 0, gemm_only = 0, fast_gain = 0;
      for (const auto& [form, d] : {std::pair{"forward", fwd}, {"dgrad", dgrad}, {"wgrad", wgrad}}) {
        const double t = time([&] { gemm.run(d, s); });
        bf16 += line("bf16", form, t, tflops(d, t));
        const double e = time([&] { run_fp8_gemm(gemm, d, w, s); });
        fp8_now += line("fp8", form, e, tflops(d, e));
        const GemmDesc q = fp8_form(d, w, false);
        const double g = time([&] { gemm.run(q, s); });
        gemm_only += line("gemm", form, g, tflops(d, g));
        const GemmDesc qf = fp8_form(d, w, true);
        const double gf = time([&] { gemm.run(qf, s); });
        line("gemm_fast_accum", form, gf, tflops(d, gf));
        if (d.trans_b) fast_gain = g - gf;  // the forward
      }
      // Each quantization the three forms run (bytes: 2 read for the amax, 2 read + 1 written per copy).
      auto* u = static_cast<uint8_t*>(dyt.p);
      auto quant = [&](const char* form, const void* src, int rows, int cols, bool plain, bool transposed) {
        const double t = time([&] {
          fp8_quantize(src, rows, cols, cols, DType::BF16, plain ? w.a : nullptr, transposed ? u : nullptr, w.a_scale,
                       w.amax, s);
        });
        const double bytes = double(rows) * cols * (4 + (plain ? 1 : 0) + (transposed ? 1 : 0));
        std::printf("{\"tokens\": %d, \"out\": %d, \"in\": %d, \"what\": \"quant\", \"form\": \"%s\", \"ms\": %.4f, "
                    "\"gb_per_s\": %.0f}\n",
                    n, sh.out, sh.in, form, t, bytes / (t * 1e-3) / 1e9);
        return t;
      };
      quant("x", x.p, n, sh.in, true, false);
      quant("W", W.p, sh.out, sh.in, true, false);
      quant("W_t", W.p, sh.out, sh.in, false, true);
      quant("dy", dy.p, n, sh.out, true, false);
      quant("dy_t", dy.p, n, sh.out, false, true);
      quant("x_t", x.p, n, sh.in, false, true);
      quant("dy_both", dy.p, n, sh.out, true, true);
      std::printf("{\"tokens\": %d, \"out\": %d, \"in\": %d, \"what\": \"total\", \"bf16_ms\": %.4f, \"fp8_ms\": %.4f, "
                  "\"fp8_gemm_only_ms\": %.4f, \"fp8_gemm_fast_forward_ms\": %.4f, \"bf16_over_fp8\": %.3f, "
                  "\"bf16_over_gemm_only\": %.3f}\n",
                  n, sh.out, sh.in, bf16, fp8_now, gemm_only, gemm_only - fast_gain, bf16 / fp8_now, bf16 / gemm_only);
      std::fflush(stdout);
    }
  SHARDLM_CUDA_CHECK(cudaStreamDestroy(s));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
