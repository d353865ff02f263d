// Element-wise kernels (GELU, add, casts, scale, accumulate), the bias gradient, and the two
// reductions of the optimizer step (sum of squares, inf/NaN check).
//
// Element-wise ops are functors run by one grid-stride kernel: packs of N elements (16 bytes for the
// widest operand) when every pointer is aligned for it, single elements otherwise and for the tail.
#include <algorithm>

#include "column_grad.cuh"
#include "elementwise.hpp"
#include "gelu_tanh.cuh"

namespace shardlm::cuda {
namespace {

// ---- the element-wise driver ------------------------------------------------------------------

template <int N, typename Op>
__global__ void map_kernel(Op op, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t first = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t packs = n / N;
  for (size_t p = first; p < packs; p += stride) op.template apply<N>(p * N);
  if constexpr (N > 1) {
    for (size_t i = packs * N + first; i < n; i += stride) op.template apply<1>(i);
  }
}

// Runs op over [0, n) with packs of N when `vectorised` (every pointer aligned to its pack), else one
// element per step.
template <int N, typename Op>
void launch_map(const Op& op, size_t n, bool vectorised, cudaStream_t stream) {
  if (n == 0) return;
  if (vectorised && N > 1) {
    map_kernel<N><<<grid_for(std::max<size_t>(n / N, 1)), kBlockThreads, 0, stream>>>(op, n);
  } else {
    map_kernel<1><<<grid_for(n), kBlockThreads, 0, stream>>>(op, n);
  }
  SHARDLM_CUDA_LAUNCH_CHECK();
}

// ---- GELU -------------------------------------------------------------------------------------

struct Gelu {
  __device__ float operator()(float u) const { return gelu_value(u); }
};
struct GeluGrad {  // dy, x -> dx
  __device__ float operator()(float g, float u) const { return g * gelu_derivative(u); }
};

// ---- add, cast, scale, accumulate ---------------------------------------------------------------

struct Plus {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct Unchanged {  // a cast: 16-bit -> fp32 is exact, so 16 -> 16 bits rounds only once
  __device__ float operator()(float v) const { return v; }
};
struct Times {
  float factor;
  __device__ float operator()(float v) const { return v * factor; }
};

// The two shapes of element-wise op, computed in fp32: out = f(in), and out = f(a, b). The
// operands may alias: each element is read before it is written, by one thread.
template <typename In, typename Out, typename F>
struct UnaryOp {
  const In* in;
  Out* out;
  F f;
  template <int N>
  __device__ void apply(size_t i) const {
    float v[N];
    load_floats<N>(in + i, v);
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = f(v[k]);
    store_floats<N>(out + i, v);
  }
};

// b may be of another dtype than a and out (accumulate's 16-bit addend); the default is a's.
template <typename T, typename F, typename B = T>
struct BinaryOp {
  const T* a;
  const B* b;
  T* out;
  F f;
  template <int N>
  __device__ void apply(size_t i) const {
    float va[N], vb[N];
    load_floats<N>(a + i, va);
    load_floats<N>(b + i, vb);
#pragma unroll
    for (int k = 0; k < N; ++k) va[k] = f(va[k], vb[k]);
    store_floats<N>(out + i, va);
  }
};

// ---- sum of squares -----------------------------------------------------------------------------

template <int N>
__global__ void sum_squares_kernel(const float* __restrict__ x, size_t n, double* out) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t first = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t packs = n / N;
  // fp32 within a pack, double across a thread's packs: long grid-stride runs lose no digits.
  double acc = 0.0;
  for (size_t p = first; p < packs; p += stride) {
    float v[N];
    load_floats<N>(x + p * N, v);
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < N; ++k) s += v[k] * v[k];
    acc += s;
  }
  for (size_t i = packs * N + first; i < n; i += stride) acc += static_cast<double>(x[i]) * x[i];
  block_sum_add(acc, out);
}

// ---- inf / NaN check ----------------------------------------------------------------------------

// Works on the raw bits: a value is inf or NaN exactly when its exponent field is all ones.
template <typename W, int N>
__global__ void check_finite_kernel(const W* __restrict__ x, size_t n, W exponent_mask, int* flag) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t first = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t packs = n / N;
  bool bad = false;
  for (size_t p = first; p < packs; p += stride) {
    const Pack<W, N> v = load_pack<N>(x + p * N);
#pragma unroll
    for (int k = 0; k < N; ++k) bad |= (v[k] & exponent_mask) == exponent_mask;
  }
  for (size_t i = packs * N + first; i < n; i += stride) bad |= (x[i] & exponent_mask) == exponent_mask;
  if (__syncthreads_or(bad) && threadIdx.x == 0) *flag = 1;
}

template <typename W>
void launch_check_finite(const void* x, size_t n, W exponent_mask, int* flag, cudaStream_t stream) {
  constexpr int N = vec_width<W>();
  const W* words = static_cast<const W*>(x);
  if (is_aligned(x, 16)) {
    check_finite_kernel<W, N><<<grid_for(std::max<size_t>(n / N, 1)), kBlockThreads, 0, stream>>>(
        words, n, exponent_mask, flag);
  } else {
    check_finite_kernel<W, 1><<<grid_for(n), kBlockThreads, 0, stream>>>(words, n, exponent_mask, flag);
  }
  SHARDLM_CUDA_LAUNCH_CHECK();
}

}  // namespace

// ---- launchers ----------------------------------------------------------------------------------

void gelu_forward(const void* x, void* y, size_t n, DType dt, cudaStream_t stream) {
  dispatch_dtype(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int N = vec_width<T>();
    const UnaryOp<T, T, Gelu> op{static_cast<const T*>(x), static_cast<T*>(y), Gelu{}};
    launch_map<N>(op, n, is_aligned(x, 16) && is_aligned(y, 16), stream);
  });
}

void gelu_backward(const void* dy, const void* x, void* dx, size_t n, DType dt, cudaStream_t stream) {
  dispatch_dtype(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int N = vec_width<T>();
    const BinaryOp<T, GeluGrad> op{static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<T*>(dx),
                                   GeluGrad{}};
    launch_map<N>(op, n, is_aligned(dy, 16) && is_aligned(x, 16) && is_aligned(dx, 16), stream);
  });
}

void add(const void* a, const void* b, void* out, size_t n, DType dt, cudaStream_t stream) {
  dispatch_dtype(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int N = vec_width<T>();
    const BinaryOp<T, Plus> op{static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), Plus{}};
    launch_map<N>(op, n, is_aligned(a, 16) && is_aligned(b, 16) && is_aligned(out, 16), stream);
  });
}

void bias_grad(const void* dy, float* dbias, int n, int cols, DType dt, cudaStream_t stream) {
  SHARDLM_CHECK(n >= 0 && cols >= 0, "bias_grad: negative shape ", n, " x ", cols);
  if (n == 0 || cols == 0) return;
  // Packs need every row start aligned: a 16-byte aligned base and a row length of whole packs.
  dispatch_dtype_packed(dt, cols, {dy}, [&](auto tag, auto width) {
    using T = typename decltype(tag)::type;
    launch_column_grad<ColumnGrad::kBias, T, decltype(width)::value>(static_cast<const T*>(dy), nullptr, nullptr,
                                                                     nullptr, dbias, nullptr, n, cols, stream);
  });
}

void cast(const void* in, DType in_dt, void* out, DType out_dt, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  if (in_dt == out_dt) {
    if (in != out)
      SHARDLM_CUDA_CHECK(cudaMemcpyAsync(out, in, n * dtype_size(in_dt), cudaMemcpyDeviceToDevice, stream));
    return;
  }
  dispatch_dtype(in_dt, [&](auto in_tag) {
    using In = typename decltype(in_tag)::type;
    dispatch_dtype(out_dt, [&](auto out_tag) {
      using Out = typename decltype(out_tag)::type;
      // The wider operand moves 16 bytes per access, the narrower 8.
      constexpr int N = static_cast<int>(16 / std::max(sizeof(In), sizeof(Out)));
      const UnaryOp<In, Out, Unchanged> op{static_cast<const In*>(in), static_cast<Out*>(out), Unchanged{}};
      launch_map<N>(op, n, is_aligned(in, N * sizeof(In)) && is_aligned(out, N * sizeof(Out)), stream);
    });
  });
}

void scale(float* x, size_t n, float factor, cudaStream_t stream) {
  launch_map<4>(UnaryOp<float, float, Times>{x, x, Times{factor}}, n, is_aligned(x, 16), stream);
}

void scale_values(void* x, size_t n, float factor, DType dt, cudaStream_t stream) {
  dispatch_dtype(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int N = vec_width<T>();
    T* v = static_cast<T*>(x);
    launch_map<N>(UnaryOp<T, T, Times>{v, v, Times{factor}}, n, is_aligned(x, 16), stream);
  });
}

// x += y with y in any dtype: x moves 16 bytes per access, y as many elements (8 bytes when 16-bit).
void accumulate(float* x, const void* y, DType y_dt, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  dispatch_dtype(y_dt, [&](auto tag) {
    using In = typename decltype(tag)::type;
    const BinaryOp<float, Plus, In> op{x, static_cast<const In*>(y), x, Plus{}};
    launch_map<4>(op, n, is_aligned(x, 16) && is_aligned(y, 4 * sizeof(In)), stream);
  });
}

void sum_squares(const float* x, size_t n, double* out, cudaStream_t stream) {
  if (n == 0) return;
  if (is_aligned(x, 16)) {
    sum_squares_kernel<4><<<grid_for(std::max<size_t>(n / 4, 1)), kBlockThreads, 0, stream>>>(x, n, out);
  } else {
    sum_squares_kernel<1><<<grid_for(n), kBlockThreads, 0, stream>>>(x, n, out);
  }
  SHARDLM_CUDA_LAUNCH_CHECK();
}

void check_finite(const void* x, size_t n, DType dt, int* flag, cudaStream_t stream) {
  if (n == 0) return;
  switch (dt) {
    case DType::F32: launch_check_finite<unsigned int>(x, n, 0x7f800000u, flag, stream); return;
    case DType::BF16: launch_check_finite<unsigned short>(x, n, static_cast<unsigned short>(0x7f80), flag, stream); return;
    case DType::F16: launch_check_finite<unsigned short>(x, n, static_cast<unsigned short>(0x7c00), flag, stream); return;
  }
  throw Error(concat("check_finite: unknown dtype ", static_cast<int>(dt)));
}

}  // namespace shardlm::cuda
