// 8-bit AdamW on an fp32 shard (train.optim = adamw_8bit): one thread block per kQuantBlock elements
// dequantises the block's moment codes, runs AdamW's update in fp32, takes the block's new largest
// moments and quantises against them. Every operation is an explicit IEEE round-to-nearest intrinsic (no
// contraction), in host_adamw_8bit.cpp's order, so the GPU gives the host's bits.
#include <cmath>

#include "dtype_cuda.cuh"
#include "../cpu/adamw_scalars.hpp"
#include "adamw_8bit.hpp"

namespace shardlm::cuda {
namespace {

static_assert(kQuantBlock == kBlockThreads, "one thread per element of a quantisation block");

// Per-step scalars, derived on the host as host_adamw_8bit.cpp derives them (one derivation for both).
using Scalars = AdamWScalars;

// The largest x over the thread block (exact: max does not depend on the order).
__device__ __forceinline__ float block_max(float x, float* shared) {
  for (int offset = 16; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = x;
  __syncthreads();
  x = shared[0];
  for (int w = 1; w < kBlockThreads / 32; ++w) x = fmaxf(x, shared[w]);
  __syncthreads();  // shared is written again by the next call
  return x;
}

__device__ __forceinline__ float dequantise_m(int8_t code, float scale) {
  const float t = __fdiv_rn(static_cast<float>(code < 0 ? -code : code), 127.0f);
  const float value = __fmul_rn(scale, __fmul_rn(t, t));
  return code < 0 ? -value : value;
}

__device__ __forceinline__ float dequantise_v(uint8_t code, float scale) {
  const float t = __fdiv_rn(static_cast<float>(code), 255.0f);
  const float t2 = __fmul_rn(t, t);
  return __fmul_rn(scale, __fmul_rn(t2, t2));
}

// No-decay ranges a launch carries by value (the range's own list is host memory).
constexpr int kLaunchNoDecay = 16;

// One launch's stretch: AdamW8bitRange's device arrays, and its no-decay ranges relative to element 0.
struct Stretch {
  float* param;
  const float* grad;
  int8_t* exp_avg;
  uint8_t* exp_avg_sq;
  float* exp_avg_scale;
  float* exp_avg_sq_scale;
  void* param_out;
  size_t numel;
  long long no_decay[kLaunchNoDecay][2];
  int no_decay_count;
};

__device__ __forceinline__ float decay_of(const Stretch& r, size_t i, float decay) {
  const long long at = static_cast<long long>(i);
  for (int j = 0; j < r.no_decay_count; ++j)
    if (at >= r.no_decay[j][0] && at < r.no_decay[j][1]) return 1.0f;
  return decay;
}

template <typename Out, bool kWriteOut>
__global__ void __launch_bounds__(kBlockThreads) adamw_8bit_kernel(Stretch r, Scalars s) {
  __shared__ float shared[kBlockThreads / 32];
  const size_t blocks = (r.numel + kQuantBlock - 1) / kQuantBlock;
  for (size_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const size_t i = b * kQuantBlock + threadIdx.x;
    const bool live = i < r.numel;
    float m = 0.0f, v = 0.0f;
    if (live) {
      m = dequantise_m(r.exp_avg[i], r.exp_avg_scale[b]);
      v = dequantise_v(r.exp_avg_sq[i], r.exp_avg_sq_scale[b]);
      const float gk = __fmul_rn(r.grad[i], s.grad_scale);
      float p = __fmul_rn(r.param[i], decay_of(r, i, s.decay));
      m = __fadd_rn(m, __fmul_rn(s.one_minus_beta1, __fsub_rn(gk, m)));
      v = __fadd_rn(__fmul_rn(v, s.beta2), __fmul_rn(__fmul_rn(s.one_minus_beta2, gk), gk));
      const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), s.sqrt_correction2), s.eps);
      p = __fsub_rn(p, __fmul_rn(s.step_size, __fdiv_rn(m, denom)));
      r.param[i] = p;
      if constexpr (kWriteOut) static_cast<Out*>(r.param_out)[i] = from_float<Out>(p);
    }
    const float largest_m = block_max(fabsf(m), shared), largest_v = block_max(v, shared);
    if (threadIdx.x == 0) r.exp_avg_scale[b] = largest_m, r.exp_avg_sq_scale[b] = largest_v;
    if (!live) continue;
    float q = 0.0f;
    if (largest_m > 0.0f) q = rintf(__fmul_rn(__fsqrt_rn(__fdiv_rn(fabsf(m), largest_m)), 127.0f));
    r.exp_avg[i] = static_cast<int8_t>(m < 0.0f ? -q : q);
    q = 0.0f;
    if (largest_v > 0.0f) q = rintf(__fmul_rn(__fsqrt_rn(__fsqrt_rn(__fdiv_rn(v, largest_v))), 255.0f));
    r.exp_avg_sq[i] = static_cast<uint8_t>(q);
  }
}


void launch(const Stretch& r, const Scalars& s, DType out_dtype, cudaStream_t stream) {
  const unsigned grid = grid_for(r.numel);
  if (r.param_out == nullptr) {
    adamw_8bit_kernel<float, false><<<grid, kBlockThreads, 0, stream>>>(r, s);
  } else {
    dispatch_dtype(out_dtype, [&](auto tag) {
      using Out = typename decltype(tag)::type;
      adamw_8bit_kernel<Out, true><<<grid, kBlockThreads, 0, stream>>>(r, s);
    });
  }
  SHARDLM_CUDA_LAUNCH_CHECK();
}

// Stretch [at, end) of r (at on a block boundary) with the no-decay ranges that meet it, relative to at.
Stretch stretch_of(const AdamW8bitRange& r, size_t at, size_t end, DType out_dtype) {
  Stretch t{};
  t.param = r.param + at;
  t.grad = r.grad + at;
  t.exp_avg = r.exp_avg + at;
  t.exp_avg_sq = r.exp_avg_sq + at;
  t.exp_avg_scale = r.exp_avg_scale + at / kQuantBlock;
  t.exp_avg_sq_scale = r.exp_avg_sq_scale + at / kQuantBlock;
  t.param_out = r.param_out ? static_cast<char*>(r.param_out) + at * dtype_size(out_dtype) : nullptr;
  t.numel = end - at;
  const long long from = static_cast<long long>(r.position + at);
  for (size_t j = 0; j < r.no_decay_count; ++j) {
    const long long lo = static_cast<long long>(r.no_decay[2 * j]) - from;
    const long long hi = static_cast<long long>(r.no_decay[2 * j + 1]) - from;
    if (hi <= 0 || lo >= static_cast<long long>(t.numel)) continue;
    t.no_decay[t.no_decay_count][0] = lo, t.no_decay[t.no_decay_count][1] = hi;
    ++t.no_decay_count;
  }
  return t;
}

}  // namespace

void adamw_8bit_step(const AdamW8bitRange& r, const AdamWHyper& h, cudaStream_t stream) {
  SHARDLM_CHECK(h.step >= 1, "adamw_8bit_step: the step count starts at 1 (got ", h.step, ")");
  const Scalars s = adamw_scalars(h, r.weight_decay);
  // Launches of whole blocks, each meeting at most kLaunchNoDecay no-decay ranges (one for a unit's slice
  // in practice: a block has a few norms and biases).
  size_t at = 0;
  while (at < r.numel) {
    size_t end = r.numel, met = 0;
    for (size_t j = 0; j < r.no_decay_count; ++j) {
      if (r.no_decay[2 * j + 1] <= r.position + at) continue;
      if (r.no_decay[2 * j] >= r.position + end) break;
      if (++met > static_cast<size_t>(kLaunchNoDecay)) {
        end = (r.no_decay[2 * j] - r.position) / kQuantBlock * kQuantBlock;
        break;
      }
    }
    SHARDLM_CHECK(end > at, "adamw_8bit_step: more than ", kLaunchNoDecay, " no-decay ranges in one block of ",
                  kQuantBlock, " elements");
    launch(stretch_of(r, at, end, h.out_dtype), s, h.out_dtype, stream);
    at = end;
  }
}

}  // namespace shardlm::cuda
