// SwiGLU (Llama's MLP activation) and GeGLU with tanh GELU (Gemma's) forward and backward over the fused
// gate|up projection rows:
// grid-stride loops over the [n, F] output, packs of 16 bytes when F and every pointer allow. Given a word,
// each also reduces the amax of what it writes (fp8_amax.cuh) for the FP8 GEMM that reads it next. The
// backward can also write the forward's output again, in place over its input gradient.
#include "dtype_cuda.cuh"
#include "fp8_amax.cuh"
#include "gelu_tanh.cuh"
#include "swiglu.hpp"

namespace shardlm::cuda {
namespace {

__device__ __forceinline__ float sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

// Calls f(e, at) for each pack of N output elements this thread owns: e indexes the [n, F] output,
// at the gate element of the [n, 2F] gate|up rows (its up element is at + F).
template <int N, typename Body>
__device__ __forceinline__ void for_swiglu_packs(long long n, int F, Body&& f) {
  const long long packs = n * F / N;
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long p = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; p < packs; p += stride) {
    const long long e = p * N, row = e / F;
    f(e, row * 2 * F + (e - row * F));  // F % N == 0: a pack stays in its row
  }
}

// The gated activations of the fused gate|up rows: out = act(gate) * up and its two derivatives.
struct Silu {  // SwiGLU: silu(g) = g * sigmoid(g)
  __device__ float forward(float g, float u) const { return g * sigmoid(g) * u; }  // as LlamaCpu: (g * s) * u
  __device__ float up_grad(float d, float g) const { return d * g * sigmoid(g); }  // d(up) = dout * silu(gate)
  __device__ float gate_grad(float d, float g, float u) const {
    const float s = sigmoid(g);
    return d * u * s * (1.0f + g * (1.0f - s));  // silu'(g) = s (1 + g (1 - s))
  }
};
struct GeluTanh {  // GeGLU (Gemma): gelu_tanh(g) * up
  __device__ float forward(float g, float u) const { return gelu_value(g) * u; }
  __device__ float up_grad(float d, float g) const { return d * gelu_value(g); }
  __device__ float gate_grad(float d, float g, float u) const { return d * u * gelu_derivative(g); }
};

template <typename Act, typename T, int N>
__global__ void gated_forward_kernel(const T* __restrict__ gate_up, T* __restrict__ out, long long n, int F,
                                     unsigned* amax_bits) {
  unsigned m = 0;
  for_swiglu_packs<N>(n, F, [&](long long e, long long at) {
    float g[N], u[N];
    load_floats<N>(gate_up + at, g);
    load_floats<N>(gate_up + at + F, u);
#pragma unroll
    for (int k = 0; k < N; ++k) g[k] = Act{}.forward(g[k], u[k]);
    store_floats<N>(out + e, g);
    if (amax_bits) m = max_stored_abs_bits<T>(m, g);
  });
  if (amax_bits) publish_amax(m, amax_bits);
}

// With act_out, also act_out = act(gate) * up as gated_forward_kernel writes it (the same functor on the same
// floats): the backward that needs the activation after its gradient reads gate|up once. act_out may be dout
// (neither is __restrict__): each thread reads its pack of dout before it writes act_out's.
template <typename Act, typename T, int N>
__global__ void gated_backward_kernel(const T* dout, const T* __restrict__ gate_up, T* __restrict__ dgate_up,
                                      T* act_out, long long n, int F, unsigned* amax_bits) {
  unsigned m = 0;
  for_swiglu_packs<N>(n, F, [&](long long e, long long at) {
    float d[N], g[N], u[N], dg[N], du[N];
    load_floats<N>(dout + e, d);
    load_floats<N>(gate_up + at, g);
    load_floats<N>(gate_up + at + F, u);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      du[k] = Act{}.up_grad(d[k], g[k]);
      dg[k] = Act{}.gate_grad(d[k], g[k], u[k]);
    }
    store_floats<N>(dgate_up + at, dg);
    store_floats<N>(dgate_up + at + F, du);
    if (amax_bits) m = max_stored_abs_bits<T>(max_stored_abs_bits<T>(m, dg), du);
    if (act_out) {
#pragma unroll
      for (int k = 0; k < N; ++k) g[k] = Act{}.forward(g[k], u[k]);
      store_floats<N>(act_out + e, g);
    }
  });
  if (amax_bits) publish_amax(m, amax_bits);
}

// Checks the shape and zeroes the amax word, if any; false when there are no rows (nothing to launch).
bool check_shape(const char* what, int n, int F, unsigned* amax_bits, cudaStream_t stream) {
  SHARDLM_CHECK(n >= 0 && F >= 1, what, ": bad shape n=", n, " F=", F);
  if (amax_bits) clear_amax(amax_bits, stream);
  return n > 0;
}

template <typename Act>
void gated_forward(const char* what, const void* gate_up, void* out, int n, int F, DType dt, cudaStream_t stream,
                   unsigned* amax_bits) {
  if (!check_shape(what, n, F, amax_bits, stream)) return;
  const size_t items = static_cast<size_t>(n) * F;
  dispatch_dtype_packed(dt, F, {gate_up, out}, [&](auto tag, auto width) {
    using T = typename decltype(tag)::type;
    constexpr int N = decltype(width)::value;
    gated_forward_kernel<Act, T, N><<<grid_for(items / N), kBlockThreads, 0, stream>>>(
        static_cast<const T*>(gate_up), static_cast<T*>(out), n, F, amax_bits);
  });
  SHARDLM_CUDA_LAUNCH_CHECK();
}

template <typename Act>
void gated_backward(const char* what, const void* dout, const void* gate_up, void* dgate_up, int n, int F, DType dt,
                    cudaStream_t stream, unsigned* amax_bits, void* act_out) {
  if (!check_shape(what, n, F, amax_bits, stream)) return;
  const size_t items = static_cast<size_t>(n) * F;
  dispatch_dtype_packed(dt, F, {dout, gate_up, dgate_up, act_out ? act_out : dout}, [&](auto tag, auto width) {
    using T = typename decltype(tag)::type;
    constexpr int N = decltype(width)::value;
    gated_backward_kernel<Act, T, N><<<grid_for(items / N), kBlockThreads, 0, stream>>>(
        static_cast<const T*>(dout), static_cast<const T*>(gate_up), static_cast<T*>(dgate_up),
        static_cast<T*>(act_out), n, F, amax_bits);
  });
  SHARDLM_CUDA_LAUNCH_CHECK();
}

}  // namespace

void swiglu_forward(const void* gate_up, void* out, int n, int F, DType dt, cudaStream_t stream, unsigned* amax_bits) {
  gated_forward<Silu>("swiglu_forward", gate_up, out, n, F, dt, stream, amax_bits);
}

void swiglu_backward(const void* dout, const void* gate_up, void* dgate_up, int n, int F, DType dt, cudaStream_t stream,
                     unsigned* amax_bits, void* act_out) {
  gated_backward<Silu>("swiglu_backward", dout, gate_up, dgate_up, n, F, dt, stream, amax_bits, act_out);
}

void geglu_tanh_forward(const void* gate_up, void* out, int n, int F, DType dt, cudaStream_t stream,
                        unsigned* amax_bits) {
  gated_forward<GeluTanh>("geglu_tanh_forward", gate_up, out, n, F, dt, stream, amax_bits);
}

void geglu_tanh_backward(const void* dout, const void* gate_up, void* dgate_up, int n, int F, DType dt,
                         cudaStream_t stream, unsigned* amax_bits, void* act_out) {
  gated_backward<GeluTanh>("geglu_tanh_backward", dout, gate_up, dgate_up, n, F, dt, stream, amax_bits, act_out);
}

}  // namespace shardlm::cuda
