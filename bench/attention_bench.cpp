// bench_attention: shardlm's causal attention paths on one GPU, forward and forward + backward, as
// the models call them (q, k, v read in place from the projection's output). Prints one JSON line
// per path and shape: median milliseconds over --reps timed calls after --warmup, and TFLOP/s counted
// as flash-attention does (forward 4 B H T^2 d / 2 for causal, forward + backward 3.5 times that).
// bench/attention_compare.sh runs it beside PyTorch's scaled_dot_product_attention.
//
//   bench_attention --T 2048,8192 --heads 32 --kv-heads 8 --head-dim 128 [--batch B | --tokens N] [--dtype bf16]
//                   [--alibi] [--paths cudnn,native] [--reps 20] [--warmup 5] [--native-limit-gib 24]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "alibi_attention.hpp"
#include "cuda_bench.hpp"
#include "cuda_check.hpp"
#include "gemm.hpp"
#include "gqa_attention.hpp"
#include "workspace_sizes.hpp"
#include "shardlm/core.hpp"
#include "shardlm/model.hpp"
#ifdef SHARDLM_HAVE_CUDNN
#include "cudnn_attention.hpp"
#endif

using namespace shardlm;
using shardlm::bench::GpuBuffer;
using shardlm::bench::median_ms;
using shardlm::bench::int_list;

namespace {

// A random fill in dt (values of order one).
void fill(void* p, size_t n, DType dt, unsigned seed) {
  std::vector<float> v(n);
  unsigned x = seed * 2654435761u + 1;
  for (float& f : v) {
    x = x * 1664525u + 1013904223u;
    f = (static_cast<float>(x >> 8) / 16777216.0f - 0.5f) * 3.0f;
  }
  std::vector<uint16_t> h(n);
  if (dt == DType::F32) {
    SHARDLM_CUDA_CHECK(cudaMemcpy(p, v.data(), n * 4, cudaMemcpyHostToDevice));
  } else {
    pack16(dt, v.data(), h.data(), n);
    SHARDLM_CUDA_CHECK(cudaMemcpy(p, h.data(), n * 2, cudaMemcpyHostToDevice));
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> Ts = {2048};
  int heads = 32, kv_heads = 8, d = 128, batch = 0, tokens = 0, reps = 20, warmup = 5;
  double native_limit_gib = 24;
  bool alibi = false;
  std::string dtype = "bf16", paths = "cudnn,native";
  for (shardlm::bench::BenchArgs args(argc, argv); args.next();) {
    const std::string a = args.option();
    if (a == "--T")
      Ts = int_list(args.value());
    else if (a == "--heads")
      heads = std::stoi(args.value());
    else if (a == "--kv-heads")
      kv_heads = std::stoi(args.value());
    else if (a == "--head-dim")
      d = std::stoi(args.value());
    else if (a == "--batch")
      batch = std::stoi(args.value());
    else if (a == "--tokens")
      tokens = std::stoi(args.value());
    else if (a == "--dtype")
      dtype = args.value();
    else if (a == "--alibi")
      alibi = true;
    else if (a == "--paths")
      paths = args.value();
    else if (a == "--reps")
      reps = std::stoi(args.value());
    else if (a == "--warmup")
      warmup = std::stoi(args.value());
    else if (a == "--native-limit-gib")
      native_limit_gib = std::stod(args.value());
    else {
      std::cerr << "bench_attention: unknown option " << a << "\n";
      return 2;
    }
  }
  if (alibi) kv_heads = heads;
  const DType dt = parse_dtype(dtype);
  const size_t es = dtype_size(dt);
  cudaStream_t s;
  SHARDLM_CUDA_CHECK(cudaStreamCreate(&s));
  cuda::Gemm gemm;
#ifdef SHARDLM_HAVE_CUDNN
  std::unique_ptr<cuda::CudnnAttention> cudnn;
  if (cuda::CudnnAttention::unavailable_reason().empty()) cudnn = std::make_unique<cuda::CudnnAttention>();
#endif
  const std::vector<float> slopes_host = alibi_slopes(heads);
  for (const int T : Ts) {
    // --batch sequences, or as many as make --tokens tokens (at least one), or one.
    const int B = batch > 0 ? batch : (tokens > 0 ? std::max(1, tokens / T) : 1);
    const size_t n = static_cast<size_t>(B) * T;
    const size_t row = alibi ? 3 * heads * d : (heads + 2 * kv_heads) * d, out_row = static_cast<size_t>(heads) * d;
    GpuBuffer qkv(n * row * es), dqkv(n * row * es), ctx(n * out_row * es), dctx(n * out_row * es);
    GpuBuffer lse(static_cast<size_t>(B) * heads * T * 4), slopes(heads * 4);
    fill(qkv.p, n * row, dt, 1);
    fill(dctx.p, n * out_row, dt, 2);
    SHARDLM_CUDA_CHECK(cudaMemcpy(slopes.p, slopes_host.data(), heads * 4, cudaMemcpyHostToDevice));
    const double fwd_flop = 4.0 * B * heads * static_cast<double>(T) * T * d / 2;
    size_t workspace = 0;     // the path's scratch for this shape
    double prepare_ms = 0;    // building the cuDNN plans of this shape
    auto report = [&](const std::string& path, double fwd_ms, double both_ms, const std::string& note) {
      std::printf(
          "{\"impl\": \"shardlm-%s\", \"T\": %d, \"batch\": %d, \"heads\": %d, \"kv_heads\": %d, \"head_dim\": %d, "
          "\"dtype\": \"%s\", \"alibi\": %s, \"workspace_bytes\": %zu, \"prepare_ms\": %.1f, \"fwd_ms\": %.4f, \"fwdbwd_ms\": %.4f, "
          "\"fwd_tflops\": %.1f, \"fwdbwd_tflops\": %.1f, \"note\": \"%s\"}\n",
          path.c_str(), T, B, heads, kv_heads, d, dtype.c_str(), alibi ? "true" : "false", workspace, prepare_ms, fwd_ms, both_ms,
          fwd_ms > 0 ? fwd_flop / fwd_ms / 1e9 : 0.0, both_ms > 0 ? 3.5 * fwd_flop / both_ms / 1e9 : 0.0, note.c_str());
      std::fflush(stdout);
    };
#ifdef SHARDLM_HAVE_CUDNN
    if (paths.find("cudnn") != std::string::npos) {
      if (!cudnn) {
        report("cudnn", 0, 0, cuda::CudnnAttention::unavailable_reason());
      } else {
        const cuda::AttentionLayout l = alibi ? cuda::AttentionLayout::interleaved_alibi(B, T, heads, d, dt)
                                              : cuda::AttentionLayout::grouped(B, T, heads, kv_heads, d, dt);
        const auto t0 = std::chrono::steady_clock::now();
        const std::string refused = cudnn->prepare(l);
        prepare_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        if (!refused.empty()) {
          report("cudnn", 0, 0, refused);
        } else {
          workspace = cudnn->workspace_bytes(l);
          GpuBuffer work(workspace);
          auto fwd = [&] {
            cudnn->forward(l, qkv.p, ctx.p, static_cast<float*>(lse.p), static_cast<float*>(slopes.p), nullptr, work.p,
                           s);
          };
          auto both = [&] {
            fwd();
            cudnn->backward(l, dctx.p, qkv.p, ctx.p, static_cast<float*>(lse.p), dqkv.p, static_cast<float*>(slopes.p),
                            nullptr, work.p, s);
          };
          report("cudnn", median_ms(fwd, warmup, reps, s), median_ms(both, warmup, reps, s), "");
        }
      }
    }
#endif
    if (paths.find("native") != std::string::npos) {
      const size_t work_bytes = alibi ? cuda::alibi_attention_workspace_bytes(B, T, heads, d, dt)
                                      : cuda::gqa_attention_workspace_bytes(T, heads, kv_heads, d, dt);
      const size_t probs_bytes = alibi ? static_cast<size_t>(B) * heads * T * T * es : 0;
      const double gib = static_cast<double>(work_bytes + probs_bytes) / (1 << 30);
      if (gib > native_limit_gib) {
        report("native", 0, 0,
               concat("skipped: needs ", static_cast<int>(gib), " GiB of scratch (limit ", native_limit_gib, ")"));
        continue;
      }
      workspace = work_bytes;
      GpuBuffer work(work_bytes), probs(probs_bytes);
      auto fwd = [&] {
        if (alibi)
          cuda::alibi_attention_forward(gemm, qkv.p, ctx.p, probs.p, static_cast<float*>(slopes.p), B, T, heads, d, dt,
                                        work.p, s);
        else
          cuda::gqa_attention_forward(gemm, qkv.p, ctx.p, static_cast<float*>(lse.p), B, T, heads, kv_heads, d, dt,
                                      work.p, s);
      };
      auto both = [&] {
        fwd();
        if (alibi)
          cuda::alibi_attention_backward(gemm, dctx.p, qkv.p, probs.p, dqkv.p, static_cast<float*>(slopes.p), B, T,
                                         heads, d, dt, work.p, s);
        else
          cuda::gqa_attention_backward(gemm, dctx.p, qkv.p, static_cast<float*>(lse.p), dqkv.p, B, T, heads, kv_heads,
                                       d, dt, work.p, s);
      };
      report("native", median_ms(fwd, warmup, reps, s), median_ms(both, warmup, reps, s), "");
    }
  }
  cudaStreamDestroy(s);
  return 0;
}
