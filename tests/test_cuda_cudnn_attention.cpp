#define BOOST_TEST_MODULE test_cuda_cudnn_attention
#include <boost/test/unit_test.hpp>
// Tests of cuDNN's fused attention wrapper (label gpu): forward (context and log-sum-exp) and backward
// (dq, dk, dv) against a double-precision host reference that reads q, k and v through the same
// AttentionLayout (Llama's grouped heads; BLOOM's interleaved heads with ALiBi), at odd lengths, length
// 1 and group ratios 1, 4, 8 and 32, head dims 64, 80, 96 and 128, bf16 and fp16; against the native
// kernels (gqa_attention.cu, alibi_attention.cu, themselves checked by finite differences) at a medium
// length; packed rows (several samples per row, 1-token samples) on both paths; Mistral's sliding
// window on both paths (the graph's band mask; in packed rows, the bias that holds it); the plan cache;
// and the shapes cuDNN's fused engine does not take (fp32, odd head dims, a window beside a bias).

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "alibi_attention.hpp"
#include "cuda_test_support.hpp"
#include "cudnn_attention.hpp"
#include "gemm.hpp"
#include "gqa_attention.hpp"
#include "packed_bias.hpp"
#include "workspace_sizes.hpp"
#include "shardlm/core.hpp"
#include "shardlm/model.hpp"

using namespace shardlm;
using shardlm::cuda::AttentionLayout;
using shardlm::cuda::CudnnAttention;

namespace {

using namespace cuda_test;

size_t rows(const AttentionLayout& l) { return static_cast<size_t>(l.B) * l.T; }
size_t qkv_size(const AttentionLayout& l) { return rows(l) * l.row; }
size_t ctx_size(const AttentionLayout& l) { return rows(l) * l.out_row; }
size_t lse_size(const AttentionLayout& l) { return static_cast<size_t>(l.B) * l.heads * l.T; }

// Element e of query head n (part 0), key or value head g (parts 1, 2) at token t of sequence b.
size_t at(const AttentionLayout& l, int part, int b, int t, int head, int e) {
  const long long base = part == 0 ? l.q : (part == 1 ? l.k : l.v);
  return (static_cast<size_t>(b) * l.T + t) * l.row + base + static_cast<size_t>(head) * l.head + e;
}
size_t ctx_at(const AttentionLayout& l, int b, int t, int n, int e) {
  return (static_cast<size_t>(b) * l.T + t) * l.out_row + static_cast<size_t>(n) * l.head_dim + e;
}

struct Reference {
  std::vector<double> ctx, lse, dqkv;
};

// Causal softmax attention in double: s_ij = q_i k_j / sqrt(d) (+ slope_n (j - i)), lo_i <= j <= i,
// lo_i = starts[b T + i] for packed rows (starts non-empty), else 0, and with a sliding window (> 0)
// at least i - window + 1 (transformers' i - window < j).
Reference reference(const AttentionLayout& l, const std::vector<float>& qkv, const std::vector<float>& dctx,
                    const std::vector<float>& slopes, const std::vector<int32_t>& starts = {}, int window = 0) {
  Reference r;
  r.ctx.assign(ctx_size(l), 0.0);
  r.lse.assign(lse_size(l), 0.0);
  r.dqkv.assign(qkv_size(l), 0.0);
  const int G = l.heads / l.kv_heads, d = l.head_dim;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<double> p(l.T), dp(l.T);
  for (int b = 0; b < l.B; ++b)
    for (int n = 0; n < l.heads; ++n) {
      const int g = n / G;
      for (int i = 0; i < l.T; ++i) {
        int lo = starts.empty() ? 0 : starts[static_cast<size_t>(b) * l.T + i];
        if (window > 0) lo = std::max(lo, i - window + 1);
        double m = -INFINITY;
        for (int j = lo; j <= i; ++j) {
          double s = 0.0;
          for (int e = 0; e < d; ++e) s += static_cast<double>(qkv[at(l, 0, b, i, n, e)]) * qkv[at(l, 1, b, j, g, e)];
          s = s * scale + (l.alibi ? slopes[n] * static_cast<double>(j - i) : 0.0);
          p[j] = s;
          m = std::max(m, s);
        }
        double sum = 0.0;
        for (int j = lo; j <= i; ++j) sum += std::exp(p[j] - m);
        const double lse = m + std::log(sum);
        r.lse[(static_cast<size_t>(b) * l.heads + n) * l.T + i] = lse;
        for (int j = lo; j <= i; ++j) p[j] = std::exp(p[j] - lse);
        for (int e = 0; e < d; ++e) {
          double c = 0.0;
          for (int j = lo; j <= i; ++j) c += p[j] * qkv[at(l, 2, b, j, g, e)];
          r.ctx[ctx_at(l, b, i, n, e)] = c;
        }
        // Backward of row i: dp_j = dctx_i . v_j; ds_j = p_j (dp_j - sum_k p_k dp_k) * scale.
        double centre = 0.0;
        for (int j = lo; j <= i; ++j) {
          double s = 0.0;
          for (int e = 0; e < d; ++e) s += static_cast<double>(dctx[ctx_at(l, b, i, n, e)]) * qkv[at(l, 2, b, j, g, e)];
          dp[j] = s;
          centre += p[j] * s;
        }
        for (int j = lo; j <= i; ++j) {
          const double ds = p[j] * (dp[j] - centre) * scale;
          for (int e = 0; e < d; ++e) {
            r.dqkv[at(l, 2, b, j, g, e)] += p[j] * dctx[ctx_at(l, b, i, n, e)];
            r.dqkv[at(l, 0, b, i, n, e)] += ds * qkv[at(l, 1, b, j, g, e)];
            r.dqkv[at(l, 1, b, j, g, e)] += ds * qkv[at(l, 0, b, i, n, e)];
          }
        }
      }
    }
  return r;
}

struct Result {
  std::vector<float> ctx, lse, dqkv;
};

// cuDNN's forward and backward on device copies of qkv and dctx; outputs start as garbage.
// Packed rows (starts non-empty, l.bias): the bias the models build (packed_attention_bias) is passed,
// holding the sliding window `window` (> 0) as AttentionPath folds it in; without packed rows the
// window is the layout's own (l.window).
Result run_cudnn(CudnnAttention& attn, const AttentionLayout& l, const std::vector<float>& qkv,
                 const std::vector<float>& dctx, const std::vector<float>& slopes,
                 const std::vector<int32_t>& starts = {}, int window = 0) {
  BOOST_REQUIRE(l.bias == !starts.empty());
  const std::string refused = attn.prepare(l);
  BOOST_REQUIRE_MESSAGE(refused.empty(), "cuDNN refused the shape: " << refused);
  const size_t es = dtype_size(l.dt);
  DeviceBuffer d_qkv = to_device(qkv, l.dt), d_dctx = to_device(dctx, l.dt), d_slopes = to_device(slopes, DType::F32);
  DeviceBuffer d_ctx(ctx_size(l) * es), d_lse(lse_size(l) * sizeof(float)), d_dqkv(qkv_size(l) * es);
  DeviceBuffer d_work(std::max<size_t>(attn.workspace_bytes(l), 1));
  CUDA_OK(cudaMemset(d_ctx.get(), 0x7f, d_ctx.bytes()));
  CUDA_OK(cudaMemset(d_lse.get(), 0x7f, d_lse.bytes()));
  CUDA_OK(cudaMemset(d_dqkv.get(), 0x7f, d_dqkv.bytes()));
  CUDA_OK(cudaMemset(d_work.get(), 0x7f, d_work.bytes()));
  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreate(&stream));
  DeviceBuffer d_starts(std::max<size_t>(starts.size() * sizeof(int32_t), 1));
  DeviceBuffer d_bias(std::max<size_t>(cuda::packed_attention_bias_bytes(l.B, l.T), 1));
  const void* bias = nullptr;
  if (!starts.empty()) {
    CUDA_OK(cudaMemcpy(d_starts.get(), starts.data(), starts.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    cuda::packed_attention_bias(d_starts.as<int32_t>(), l.B, l.T, window, d_bias.get(), l.dt, stream);
    bias = d_bias.get();
  }
  BOOST_REQUIRE_NO_THROW(attn.forward(l, d_qkv.get(), d_ctx.get(), d_lse.as<float>(), d_slopes.as<float>(), bias,
                                      d_work.get(), stream));
  CUDA_OK(cudaMemsetAsync(d_work.get(), 0x7f, d_work.bytes(), stream));
  BOOST_REQUIRE_NO_THROW(attn.backward(l, d_dctx.get(), d_qkv.get(), d_ctx.get(), d_lse.as<float>(), d_dqkv.get(),
                                       d_slopes.as<float>(), bias, d_work.get(), stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  CUDA_OK(cudaStreamDestroy(stream));
  Result r;
  r.ctx = download(d_ctx.get(), ctx_size(l), l.dt);
  r.lse = download(d_lse.get(), lse_size(l), DType::F32);
  r.dqkv = download(d_dqkv.get(), qkv_size(l), l.dt);
  return r;
}

struct Inputs {
  std::vector<float> qkv, dctx, slopes;
};

Inputs make_inputs(const AttentionLayout& l, unsigned seed) {
  std::mt19937 rng(seed);
  Inputs in;
  in.qkv = random_values(qkv_size(l), rng, l.dt, 1.0f);
  in.dctx = random_values(ctx_size(l), rng, l.dt, 1.0f);
  in.slopes = alibi_slopes(l.heads);
  return in;
}

// bf16 keeps 8 significant bits, fp16 11: the outputs are rounded once, the gradients after sums.
double tolerance(DType dt, bool gradient) {
  if (dt == DType::BF16) return gradient ? 3e-2 : 1.6e-2;
  return gradient ? 6e-3 : 3e-3;
}

void check_against_reference(CudnnAttention& attn, const AttentionLayout& l, unsigned seed) {
  BOOST_TEST_CONTEXT("B " << l.B << " T " << l.T << " heads " << l.heads << "/" << l.kv_heads << " d " << l.head_dim
                          << " " << dtype_name(l.dt) << (l.alibi ? " alibi" : "")) {
    const Inputs in = make_inputs(l, seed);
    const Reference ref = reference(l, in.qkv, in.dctx, in.slopes);
    const Result got = run_cudnn(attn, l, in.qkv, in.dctx, in.slopes);
    BOOST_TEST(relative_error(got.ctx, ref.ctx) <= tolerance(l.dt, false));
    BOOST_TEST(relative_error(got.dqkv, ref.dqkv) <= tolerance(l.dt, true));
    // The saved statistics are each row's log-sum-exp (the native kernels save the same, without ALiBi).
    if (!l.alibi) {
      double worst = 0.0;
      for (size_t i = 0; i < ref.lse.size(); ++i) worst = std::max(worst, std::abs(got.lse[i] - ref.lse[i]));
      BOOST_TEST(worst <= 2e-2);
    }
  }
}

struct Device {
  Device() { require_device("test_cuda_cudnn_attention"); }
};

}  // namespace

BOOST_AUTO_TEST_CASE(device_present) { require_device("test_cuda_cudnn_attention"); }

BOOST_AUTO_TEST_CASE(available_on_this_gpu) {
  Device dev;
  const std::string why = CudnnAttention::unavailable_reason();
  BOOST_TEST_MESSAGE("cuDNN " << CudnnAttention::version() << (why.empty() ? "" : ": " + why));
  BOOST_TEST(why.empty());
}

BOOST_AUTO_TEST_CASE(grouped_query_matches_reference) {
  Device dev;
  CudnnAttention attn;
  unsigned seed = 11;
  for (const DType dt : {DType::BF16, DType::F16}) {
    check_against_reference(attn, AttentionLayout::grouped(2, 37, 8, 2, 64, dt), seed++);   // ratio 4, odd length
    check_against_reference(attn, AttentionLayout::grouped(1, 1, 4, 4, 64, dt), seed++);    // length 1, MHA
    check_against_reference(attn, AttentionLayout::grouped(2, 19, 8, 8, 128, dt), seed++);  // ratio 1
    check_against_reference(attn, AttentionLayout::grouped(1, 24, 8, 1, 64, dt), seed++);   // ratio 8 (MQA)
    check_against_reference(attn, AttentionLayout::grouped(1, 9, 32, 1, 64, dt), seed++);   // ratio 32
  }
}

BOOST_AUTO_TEST_CASE(head_dims_64_80_96_128) {
  Device dev;
  CudnnAttention attn;
  unsigned seed = 31;
  for (const int d : {64, 80, 96, 128})
    check_against_reference(attn, AttentionLayout::grouped(1, 29, 4, 2, d, DType::BF16), seed++);
}

BOOST_AUTO_TEST_CASE(bloom_alibi_matches_reference) {
  Device dev;
  CudnnAttention attn;
  check_against_reference(attn, AttentionLayout::interleaved_alibi(2, 33, 4, 64, DType::BF16), 41);
  check_against_reference(attn, AttentionLayout::interleaved_alibi(1, 17, 16, 64, DType::F16), 42);
  check_against_reference(attn, AttentionLayout::interleaved_alibi(1, 1, 4, 64, DType::BF16), 43);
}

// The native kernels (alibi_attention.cu for BLOOM's layout, gqa_attention.cu for grouped heads) on the
// same inputs, packed rows through `starts` (empty: none), a sliding window through `window` (grouped only).
Result run_native(cuda::Gemm& gemm, const AttentionLayout& l, const Inputs& in, const std::vector<int32_t>& starts,
                  int window = 0) {
  const DType dt = l.dt;
  const size_t es = dtype_size(dt);
  DeviceBuffer d_qkv = to_device(in.qkv, dt), d_dctx = to_device(in.dctx, dt), d_slopes = to_device(in.slopes, DType::F32);
  DeviceBuffer d_ctx(ctx_size(l) * es), d_dqkv(qkv_size(l) * es), d_lse(lse_size(l) * sizeof(float));
  DeviceBuffer d_starts(std::max<size_t>(starts.size() * sizeof(int32_t), 1));
  const int32_t* dev_starts = nullptr;
  if (!starts.empty()) {
    CUDA_OK(cudaMemcpy(d_starts.get(), starts.data(), starts.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    dev_starts = d_starts.as<int32_t>();
  }
  if (l.alibi) {
    DeviceBuffer d_probs(static_cast<size_t>(l.B) * l.heads * l.T * l.T * es);
    DeviceBuffer d_work(cuda::alibi_attention_workspace_bytes(l.B, l.T, l.heads, l.head_dim, dt));
    cuda::alibi_attention_forward(gemm, d_qkv.get(), d_ctx.get(), d_probs.get(), d_slopes.as<float>(), l.B, l.T,
                                  l.heads, l.head_dim, dt, d_work.get(), nullptr, dev_starts);
    cuda::alibi_attention_backward(gemm, d_dctx.get(), d_qkv.get(), d_probs.get(), d_dqkv.get(), d_slopes.as<float>(),
                                   l.B, l.T, l.heads, l.head_dim, dt, d_work.get(), nullptr);
  } else {
    DeviceBuffer d_work(cuda::gqa_attention_workspace_bytes(l.T, l.heads, l.kv_heads, l.head_dim, dt));
    cuda::gqa_attention_forward(gemm, d_qkv.get(), d_ctx.get(), d_lse.as<float>(), l.B, l.T, l.heads, l.kv_heads,
                                l.head_dim, dt, d_work.get(), nullptr, dev_starts, window);
    cuda::gqa_attention_backward(gemm, d_dctx.get(), d_qkv.get(), d_lse.as<float>(), d_dqkv.get(), l.B, l.T, l.heads,
                                 l.kv_heads, l.head_dim, dt, d_work.get(), nullptr, dev_starts, window);
  }
  CUDA_OK(cudaDeviceSynchronize());
  Result r;
  r.ctx = download(d_ctx.get(), ctx_size(l), dt);
  r.lse = download(d_lse.get(), lse_size(l), DType::F32);
  r.dqkv = download(d_dqkv.get(), qkv_size(l), dt);
  return r;
}

std::vector<double> widen(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

// A medium length against the native kernels (fp32 inside, the same dtype outside).
BOOST_AUTO_TEST_CASE(medium_length_matches_native_kernels) {
  Device dev;
  CudnnAttention attn;
  cuda::Gemm gemm;
  for (const bool bloom : {false, true}) {
    const DType dt = DType::BF16;
    const AttentionLayout l =
        bloom ? AttentionLayout::interleaved_alibi(2, 384, 8, 64, dt) : AttentionLayout::grouped(2, 512, 8, 2, 128, dt);
    BOOST_TEST_CONTEXT((bloom ? "BLOOM" : "Llama") << " T " << l.T) {
      const Inputs in = make_inputs(l, bloom ? 51 : 52);
      const Result got = run_cudnn(attn, l, in.qkv, in.dctx, in.slopes);
      const Result native = run_native(gemm, l, in, {});
      BOOST_TEST(relative_error(got.ctx, widen(native.ctx)) <= 2 * tolerance(dt, false));
      BOOST_TEST(relative_error(got.dqkv, widen(native.dqkv)) <= 2 * tolerance(dt, true));
    }
  }
}

// Packed rows (data.packing): sample starts per position, as make_packed_micro_batch writes them, for
// rows holding the given sample lengths end to end, the rest of each row padding (a sample of its own).
std::vector<int32_t> packed_starts(const std::vector<std::vector<int>>& rows, int T) {
  std::vector<int32_t> starts;
  for (const std::vector<int>& lengths : rows) {
    int at = 0;
    for (const int n : lengths) {
      for (int t = 0; t < n; ++t) starts.push_back(at);
      at += n;
    }
    for (int t = at; t < T; ++t) starts.push_back(at);
  }
  return starts;
}

// Packed rows with 1-token samples, a row that is one sample and a row that is mostly padding: cuDNN
// (through the bias) and the native kernels (through the starts) against the double reference.
BOOST_AUTO_TEST_CASE(packed_rows_match_reference_on_both_paths) {
  Device dev;
  CudnnAttention attn;
  cuda::Gemm gemm;
  const int T = 40;
  const std::vector<int32_t> starts = packed_starts({{1, 12, 1, 9, 17}, {40}, {3, 1}}, T);
  unsigned seed = 61;
  for (const DType dt : {DType::BF16, DType::F16})
    for (const bool bloom : {false, true}) {
      AttentionLayout l =
          bloom ? AttentionLayout::interleaved_alibi(3, T, 4, 64, dt) : AttentionLayout::grouped(3, T, 8, 2, 64, dt);
      BOOST_TEST_CONTEXT((bloom ? "BLOOM" : "Llama") << " " << dtype_name(dt)) {
        const Inputs in = make_inputs(l, seed++);
        const Reference ref = reference(l, in.qkv, in.dctx, in.slopes, starts);
        const Result native = run_native(gemm, l, in, starts);
        BOOST_TEST(relative_error(native.ctx, ref.ctx) <= tolerance(dt, false));
        BOOST_TEST(relative_error(native.dqkv, ref.dqkv) <= tolerance(dt, true));
        l.bias = true;
        const Result fused = run_cudnn(attn, l, in.qkv, in.dctx, in.slopes, starts);
        BOOST_TEST(relative_error(fused.ctx, ref.ctx) <= tolerance(dt, false));
        BOOST_TEST(relative_error(fused.dqkv, ref.dqkv) <= tolerance(dt, true));
      }
    }
}

// Mistral's sliding window, windows 1 (each query its own key), 4 and 16 against rows of 37 and of 64:
// the native kernels (the window in their softmax rows) and cuDNN (the band mask in its graph) against
// the double reference, forward, log-sum-exp and backward; then packed rows with a window, where cuDNN
// reads the window from the bias packed_attention_bias builds.
BOOST_AUTO_TEST_CASE(sliding_window_matches_reference_on_both_paths) {
  Device dev;
  CudnnAttention attn;
  cuda::Gemm gemm;
  unsigned seed = 71;
  for (const DType dt : {DType::BF16, DType::F16})
    for (const int T : {37, 64})
      for (const int window : {1, 4, 16}) {
        AttentionLayout l = AttentionLayout::grouped(2, T, 8, 2, 64, dt);
        BOOST_TEST_CONTEXT(dtype_name(dt) << " T " << T << " window " << window) {
          const Inputs in = make_inputs(l, seed++);
          const Reference ref = reference(l, in.qkv, in.dctx, in.slopes, {}, window);
          const Reference full = reference(l, in.qkv, in.dctx, in.slopes);
          double moved = 0.0, scale = 0.0;  // the window matters at these lengths
          for (size_t i = 0; i < ref.ctx.size(); ++i)
            moved = std::max(moved, std::abs(ref.ctx[i] - full.ctx[i])), scale = std::max(scale, std::abs(full.ctx[i]));
          BOOST_TEST(moved > 0.05 * scale);
          const Result native = run_native(gemm, l, in, {}, window);
          BOOST_TEST(relative_error(native.ctx, ref.ctx) <= tolerance(dt, false));
          BOOST_TEST(relative_error(native.dqkv, ref.dqkv) <= tolerance(dt, true));
          l.window = window;
          const Result fused = run_cudnn(attn, l, in.qkv, in.dctx, in.slopes);
          BOOST_TEST(relative_error(fused.ctx, ref.ctx) <= tolerance(dt, false));
          BOOST_TEST(relative_error(fused.dqkv, ref.dqkv) <= tolerance(dt, true));
          double worst = 0.0;
          for (size_t i = 0; i < ref.lse.size(); ++i) worst = std::max(worst, std::abs(fused.lse[i] - ref.lse[i]));
          BOOST_TEST(worst <= 2e-2);
        }
      }
  const int T = 40;
  const std::vector<int32_t> starts = packed_starts({{1, 12, 1, 9, 17}, {40}, {3, 1}}, T);
  for (const DType dt : {DType::BF16, DType::F16}) {
    AttentionLayout l = AttentionLayout::grouped(3, T, 8, 2, 64, dt);
    BOOST_TEST_CONTEXT("packed " << dtype_name(dt)) {
      const int window = 5;
      const Inputs in = make_inputs(l, seed++);
      const Reference ref = reference(l, in.qkv, in.dctx, in.slopes, starts, window);
      const Result native = run_native(gemm, l, in, starts, window);
      BOOST_TEST(relative_error(native.ctx, ref.ctx) <= tolerance(dt, false));
      BOOST_TEST(relative_error(native.dqkv, ref.dqkv) <= tolerance(dt, true));
      l.bias = true;
      const Result fused = run_cudnn(attn, l, in.qkv, in.dctx, in.slopes, starts, window);
      BOOST_TEST(relative_error(fused.ctx, ref.ctx) <= tolerance(dt, false));
      BOOST_TEST(relative_error(fused.dqkv, ref.dqkv) <= tolerance(dt, true));
    }
  }
}

// prepare() builds a layout's plans once; workspace_bytes() covers the backward's own scratch.
BOOST_AUTO_TEST_CASE(plans_are_cached_per_shape) {
  Device dev;
  CudnnAttention attn;
  const AttentionLayout l = AttentionLayout::grouped(1, 64, 4, 2, 64, DType::BF16);
  BOOST_TEST(attn.prepare(l).empty());
  BOOST_TEST(attn.workspace_bytes(l) >= cuda::cudnn_attention_own_bytes(l.B, l.T, l.heads, l.head_dim));
  BOOST_TEST(attn.prepare(l).empty());
}

// Shapes the fused engine does not take are refused with a reason, never run.
BOOST_AUTO_TEST_CASE(unsupported_shapes_are_refused_with_a_reason) {
  Device dev;
  CudnnAttention attn;
  const std::string fp32 = attn.prepare(AttentionLayout::grouped(1, 16, 4, 2, 64, DType::F32));
  BOOST_TEST(fp32.find("fp32") != std::string::npos);
  const std::string odd = attn.prepare(AttentionLayout::grouped(1, 16, 4, 2, 20, DType::BF16));
  BOOST_TEST(odd.find("head dimension 20") != std::string::npos);
  const std::string groups = attn.prepare(AttentionLayout::grouped(1, 16, 6, 4, 64, DType::BF16));
  BOOST_TEST(!groups.empty());
  AttentionLayout biased_window = AttentionLayout::grouped(1, 16, 4, 2, 64, DType::BF16);
  biased_window.bias = true, biased_window.window = 4;
  BOOST_TEST(attn.prepare(biased_window).find("folds it into the bias") != std::string::npos);
  BOOST_CHECK_THROW(attn.forward(AttentionLayout::grouped(1, 16, 4, 2, 20, DType::BF16), nullptr, nullptr, nullptr,
                                 nullptr, nullptr, nullptr, nullptr),
                    Error);
}
