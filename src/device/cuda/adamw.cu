// Fused AdamW on an fp32 shard: one pass reads param, grad and both moments, writes param and the
// moments, and (optionally) the updated parameter in the compute dtype for the next all-gather.
// Grid-stride over packs of 4 floats when every pointer allows, single elements otherwise.
#include <algorithm>
#include <cmath>

#include "adamw.hpp"
#include "dtype_cuda.cuh"

namespace shardlm::cuda {
namespace {

// Per-step scalars, derived once on the host.
struct AdamWScalars {
  float beta1, beta2;
  float one_minus_beta1, one_minus_beta2;
  float eps;
  float decay;            // 1 - lr * weight_decay
  float step_size;        // lr / bias_correction1
  float sqrt_correction2; // sqrt(bias_correction2)
  float grad_scale;
};

template <typename Out, bool kWriteOut, int N>
__device__ __forceinline__ void adamw_pack(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                                           Out* param_out, size_t i, const AdamWScalars& s) {
  float p[N], g[N], m[N], v[N];
  load_floats<N>(param + i, p);
  load_floats<N>(grad + i, g);
  load_floats<N>(exp_avg + i, m);
  load_floats<N>(exp_avg_sq + i, v);
#pragma unroll
  for (int k = 0; k < N; ++k) {
    // The order of torch.optim.AdamW (single-tensor path): decay, moments, then the step.
    const float gk = g[k] * s.grad_scale;
    p[k] *= s.decay;
    m[k] += s.one_minus_beta1 * (gk - m[k]);  // lerp(m, g, 1 - beta1)
    v[k] = v[k] * s.beta2 + s.one_minus_beta2 * gk * gk;
    const float denom = sqrtf(v[k]) / s.sqrt_correction2 + s.eps;
    p[k] -= s.step_size * (m[k] / denom);
  }
  store_floats<N>(param + i, p);
  store_floats<N>(exp_avg + i, m);
  store_floats<N>(exp_avg_sq + i, v);
  if constexpr (kWriteOut) store_floats<N>(param_out + i, p);
}

template <typename Out, bool kWriteOut, int N>
__global__ void adamw_kernel(float* __restrict__ param, const float* __restrict__ grad, float* __restrict__ exp_avg,
                             float* __restrict__ exp_avg_sq, Out* __restrict__ param_out, size_t n, AdamWScalars s) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t first = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t packs = n / N;
  for (size_t p = first; p < packs; p += stride)
    adamw_pack<Out, kWriteOut, N>(param, grad, exp_avg, exp_avg_sq, param_out, p * N, s);
  if constexpr (N > 1) {
    for (size_t i = packs * N + first; i < n; i += stride)
      adamw_pack<Out, kWriteOut, 1>(param, grad, exp_avg, exp_avg_sq, param_out, i, s);
  }
}

template <typename Out, bool kWriteOut>
void launch_adamw(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, Out* param_out, size_t n,
                  const AdamWScalars& s, cudaStream_t stream) {
  constexpr int N = 4;
  const bool vectorised = is_aligned(param, 16) && is_aligned(grad, 16) && is_aligned(exp_avg, 16) &&
                          is_aligned(exp_avg_sq, 16) && (!kWriteOut || is_aligned(param_out, N * sizeof(Out)));
  if (vectorised) {
    adamw_kernel<Out, kWriteOut, N><<<grid_for(std::max<size_t>(n / N, 1)), kBlockThreads, 0, stream>>>(
        param, grad, exp_avg, exp_avg_sq, param_out, n, s);
  } else {
    adamw_kernel<Out, kWriteOut, 1><<<grid_for(n), kBlockThreads, 0, stream>>>(param, grad, exp_avg, exp_avg_sq,
                                                                                param_out, n, s);
  }
  SHARDLM_CUDA_LAUNCH_CHECK();
}

}  // namespace

void adamw_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, size_t n, const AdamWArgs& args,
                void* param_out, DType out_dt, cudaStream_t stream) {
  SHARDLM_CHECK(args.bias_correction1 > 0 && args.bias_correction2 > 0, "adamw_step: bias corrections must be > 0 (got ",
                args.bias_correction1, ", ", args.bias_correction2, "); the step count starts at 1");
  if (n == 0) return;
  AdamWScalars s;
  s.beta1 = args.beta1;
  s.beta2 = args.beta2;
  s.one_minus_beta1 = 1.0f - args.beta1;
  s.one_minus_beta2 = 1.0f - args.beta2;
  s.eps = args.eps;
  s.decay = static_cast<float>(1.0 - static_cast<double>(args.lr) * args.weight_decay);
  s.step_size = static_cast<float>(static_cast<double>(args.lr) / args.bias_correction1);
  s.sqrt_correction2 = static_cast<float>(std::sqrt(static_cast<double>(args.bias_correction2)));
  s.grad_scale = args.grad_scale;
  if (param_out == nullptr) {
    launch_adamw<float, false>(param, grad, exp_avg, exp_avg_sq, nullptr, n, s, stream);
    return;
  }
  dispatch_dtype(out_dt, [&](auto tag) {
    using Out = typename decltype(tag)::type;
    launch_adamw<Out, true>(param, grad, exp_avg, exp_avg_sq, static_cast<Out*>(param_out), n, s, stream);
  });
}

}  // namespace shardlm::cuda
