// SwiGLU (Llama's MLP activation) forward and backward over the fused gate|up projection rows:
// grid-stride loops over the [n, F] output, packs of 16 bytes when F and every pointer allow.
#include "dtype_cuda.cuh"
#include "llama_kernels.hpp"

namespace shardlm::cuda {
namespace {

__device__ __forceinline__ float sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

template <typename T, int N>
__global__ void swiglu_forward_kernel(const T* __restrict__ gate_up, T* __restrict__ out, long long n, int F) {
  const long long packs = n * F / N;
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long p = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; p < packs; p += stride) {
    const long long e = p * N, row = e / F;
    const T* gate = gate_up + row * 2 * F + (e - row * F);  // F % N == 0: a pack stays in its row
    float g[N], u[N];
    load_floats<N>(gate, g);
    load_floats<N>(gate + F, u);
#pragma unroll
    for (int k = 0; k < N; ++k) g[k] = g[k] * sigmoid(g[k]) * u[k];  // as LlamaCpu: (g * s) * u
    store_floats<N>(out + e, g);
  }
}

template <typename T, int N>
__global__ void swiglu_backward_kernel(const T* __restrict__ dout, const T* __restrict__ gate_up,
                                       T* __restrict__ dgate_up, long long n, int F) {
  const long long packs = n * F / N;
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long p = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; p < packs; p += stride) {
    const long long e = p * N, row = e / F;
    const long long at = row * 2 * F + (e - row * F);
    float d[N], g[N], u[N], dg[N], du[N];
    load_floats<N>(dout + e, d);
    load_floats<N>(gate_up + at, g);
    load_floats<N>(gate_up + at + F, u);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const float s = sigmoid(g[k]);
      du[k] = d[k] * g[k] * s;                             // d(up) = dout * silu(gate)
      dg[k] = d[k] * u[k] * s * (1.0f + g[k] * (1.0f - s));  // silu'(g) = s (1 + g (1 - s))
    }
    store_floats<N>(dgate_up + at, dg);
    store_floats<N>(dgate_up + at + F, du);
  }
}

void check_shape(const char* what, int n, int F) {
  SHARDLM_CHECK(n >= 0 && F >= 1, what, ": bad shape n=", n, " F=", F);
}

}  // namespace

void swiglu_forward(const void* gate_up, void* out, int n, int F, DType dt, cudaStream_t stream) {
  check_shape("swiglu_forward", n, F);
  if (n == 0) return;
  const size_t items = static_cast<size_t>(n) * F;
  dispatch_dtype(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int N = vec_width<T>();
    const T* gu = static_cast<const T*>(gate_up);
    T* o = static_cast<T*>(out);
    if (F % N == 0 && is_aligned(gate_up, 16) && is_aligned(out, 16))
      swiglu_forward_kernel<T, N><<<grid_for(items / N), kBlockThreads, 0, stream>>>(gu, o, n, F);
    else
      swiglu_forward_kernel<T, 1><<<grid_for(items), kBlockThreads, 0, stream>>>(gu, o, n, F);
  });
  SHARDLM_CUDA_LAUNCH_CHECK();
}

void swiglu_backward(const void* dout, const void* gate_up, void* dgate_up, int n, int F, DType dt,
                     cudaStream_t stream) {
  check_shape("swiglu_backward", n, F);
  if (n == 0) return;
  const size_t items = static_cast<size_t>(n) * F;
  dispatch_dtype(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int N = vec_width<T>();
    const T* d = static_cast<const T*>(dout);
    const T* gu = static_cast<const T*>(gate_up);
    T* dgu = static_cast<T*>(dgate_up);
    if (F % N == 0 && is_aligned(dout, 16) && is_aligned(gate_up, 16) && is_aligned(dgate_up, 16))
      swiglu_backward_kernel<T, N><<<grid_for(items / N), kBlockThreads, 0, stream>>>(d, gu, dgu, n, F);
    else
      swiglu_backward_kernel<T, 1><<<grid_for(items), kBlockThreads, 0, stream>>>(d, gu, dgu, n, F);
  });
  SHARDLM_CUDA_LAUNCH_CHECK();
}

}  // namespace shardlm::cuda
