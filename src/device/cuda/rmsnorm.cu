// RMSNorm forward and backward (Llama): one warp per row with fp32 sums; the weight gradient by a
// second, column-parallel kernel (per-element atomics from row-parallel warps would serialise on
// the same columns). Rows move in 16-byte packs when H and every pointer allow, else one element
// at a time.
#include <algorithm>

#include "dtype_cuda.cuh"
#include "llama_kernels.hpp"

namespace shardlm::cuda {
namespace {

constexpr int kRowWarps = 8;  // rows in flight per block, one per warp
constexpr int kRowThreads = 32 * kRowWarps;
constexpr int kParamRowLanes = 8;  // threadIdx.y of the weight-gradient kernel

template <typename T, int N>
__global__ void __launch_bounds__(kRowThreads)
    rmsnorm_forward_kernel(const T* __restrict__ x, const T* __restrict__ weight, T* __restrict__ y,
                           float* __restrict__ rstd, int n, int H, float eps) {
  const int lane = threadIdx.x % 32;
  const int packs = H / N;
  const long long row_stride = static_cast<long long>(gridDim.x) * kRowWarps;
  for (long long row = static_cast<long long>(blockIdx.x) * kRowWarps + threadIdx.x / 32; row < n;
       row += row_stride) {
    const T* xr = x + row * H;
    T* yr = y + row * H;
    float squares = 0.0f;
    for (int p = lane; p < packs; p += 32) {
      float v[N];
      load_floats<N>(xr + p * N, v);
#pragma unroll
      for (int k = 0; k < N; ++k) squares += v[k] * v[k];
    }
    const float rs = 1.0f / sqrtf(warp_sum(squares) / H + eps);
    for (int p = lane; p < packs; p += 32) {
      float v[N], w[N];
      load_floats<N>(xr + p * N, v);
      load_floats<N>(weight + p * N, w);
#pragma unroll
      for (int k = 0; k < N; ++k) v[k] = (v[k] * rs) * w[k];  // xhat first, then the weight: as LlamaCpu
      store_floats<N>(yr + p * N, v);
    }
    if (lane == 0) rstd[row] = rs;
  }
}

// dx only; rmsnorm_weight_grad_kernel sums the weight gradient.
template <typename T, int N>
__global__ void __launch_bounds__(kRowThreads)
    rmsnorm_backward_kernel(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ weight,
                            const float* __restrict__ rstd, T* dx, int n, int H, bool accumulate_dx) {
  const int lane = threadIdx.x % 32;
  const int packs = H / N;
  const long long row_stride = static_cast<long long>(gridDim.x) * kRowWarps;
  for (long long row = static_cast<long long>(blockIdx.x) * kRowWarps + threadIdx.x / 32; row < n;
       row += row_stride) {
    const T* dyr = dy + row * H;
    const T* xr = x + row * H;
    T* dxr = dx + row * H;
    const float rs = rstd[row];
    float sum_g_xhat = 0.0f;
    for (int p = lane; p < packs; p += 32) {
      float d[N], xv[N], w[N];
      load_floats<N>(dyr + p * N, d);
      load_floats<N>(xr + p * N, xv);
      load_floats<N>(weight + p * N, w);
#pragma unroll
      for (int k = 0; k < N; ++k) sum_g_xhat += d[k] * w[k] * (xv[k] * rs);
    }
    const float mean_g_xhat = warp_sum(sum_g_xhat) / H;
    for (int p = lane; p < packs; p += 32) {
      float d[N], xv[N], w[N], out[N];
      load_floats<N>(dyr + p * N, d);  // again: the row is still in L1
      load_floats<N>(xr + p * N, xv);
      load_floats<N>(weight + p * N, w);
      if (accumulate_dx) {
        load_floats<N>(dxr + p * N, out);
      } else {
#pragma unroll
        for (int k = 0; k < N; ++k) out[k] = 0.0f;
      }
#pragma unroll
      for (int k = 0; k < N; ++k) out[k] += rs * (d[k] * w[k] - (xv[k] * rs) * mean_g_xhat);
      store_floats<N>(dxr + p * N, out);
    }
  }
}

// dweight[c] += sum_r dy[r,c] x[r,c] rstd[r]: lane x owns N consecutive columns of a 32 N-column
// tile, threadIdx.y and blockIdx.y split the rows; the block sums its rows in shared memory and
// adds one atomic per column.
template <typename T, int N>
__global__ void rmsnorm_weight_grad_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                           const float* __restrict__ rstd, float* __restrict__ dweight, int n, int H,
                                           int rows_per_block) {
  __shared__ float partial[kParamRowLanes][32 * N];
  const int tile = blockIdx.x * 32 * N;
  const int c0 = tile + threadIdx.x * N;
  const int r_begin = blockIdx.y * rows_per_block;
  const int r_end = min(n, r_begin + rows_per_block);
  float acc[N];
#pragma unroll
  for (int k = 0; k < N; ++k) acc[k] = 0.0f;
  if (c0 < H) {  // N > 1 only when H % N == 0, so a pack never straddles the last column
    for (int r = r_begin + threadIdx.y; r < r_end; r += kParamRowLanes) {
      float d[N], xv[N];
      load_floats<N>(dy + static_cast<size_t>(r) * H + c0, d);
      load_floats<N>(x + static_cast<size_t>(r) * H + c0, xv);
      const float rs = rstd[r];
#pragma unroll
      for (int k = 0; k < N; ++k) acc[k] += d[k] * (xv[k] * rs);
    }
  }
#pragma unroll
  for (int k = 0; k < N; ++k) partial[threadIdx.y][threadIdx.x * N + k] = acc[k];
  __syncthreads();
  for (int j = threadIdx.y * 32 + threadIdx.x; j < 32 * N; j += 32 * kParamRowLanes) {
    const int c = tile + j;
    if (c >= H) break;
    float sum = 0.0f;
#pragma unroll
    for (int y = 0; y < kParamRowLanes; ++y) sum += partial[y][j];
    atomicAdd(dweight + c, sum);
  }
}

int row_blocks(int n) {
  return static_cast<int>(std::min<long long>((n + kRowWarps - 1LL) / kRowWarps, 8LL * sm_count()));
}

template <typename T, int N>
void forward_with(const T* x, const T* weight, T* y, float* rstd, int n, int H, float eps, cudaStream_t stream) {
  rmsnorm_forward_kernel<T, N><<<row_blocks(n), kRowThreads, 0, stream>>>(x, weight, y, rstd, n, H, eps);
  SHARDLM_CUDA_LAUNCH_CHECK();
}

template <typename T, int N>
void backward_with(const T* dy, const T* x, const T* weight, const float* rstd, T* dx, float* dweight, int n, int H,
                   bool accumulate_dx, cudaStream_t stream) {
  rmsnorm_backward_kernel<T, N><<<row_blocks(n), kRowThreads, 0, stream>>>(dy, x, weight, rstd, dx, n, H,
                                                                            accumulate_dx);
  SHARDLM_CUDA_LAUNCH_CHECK();
  const int tiles = (H + 32 * N - 1) / (32 * N);
  // Enough row slices for about eight blocks per SM; at least kParamRowLanes rows per slice.
  const int max_slices = std::max(1, (n + kParamRowLanes - 1) / kParamRowLanes);
  int slices = std::min(max_slices, std::max(1, (8 * sm_count() + tiles - 1) / tiles));
  const int rows_per_block = (n + slices - 1) / slices;
  slices = (n + rows_per_block - 1) / rows_per_block;
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(slices));
  rmsnorm_weight_grad_kernel<T, N><<<grid, dim3(32, kParamRowLanes), 0, stream>>>(dy, x, rstd, dweight, n, H,
                                                                                  rows_per_block);
  SHARDLM_CUDA_LAUNCH_CHECK();
}

}  // namespace

void rmsnorm_forward(const void* x, const void* weight, void* y, float* rstd, int n, int H, float eps, DType dt,
                     cudaStream_t stream) {
  SHARDLM_CHECK(n >= 0, "rmsnorm_forward: negative row count ", n);
  if (n == 0) return;
  SHARDLM_CHECK(H > 0, "rmsnorm_forward: bad shape ", n, " x ", H);
  dispatch_dtype(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int N = vec_width<T>();
    const T* xs = static_cast<const T*>(x);
    const T* w = static_cast<const T*>(weight);
    T* ys = static_cast<T*>(y);
    if (H % N == 0 && is_aligned(x, 16) && is_aligned(weight, 16) && is_aligned(y, 16))
      forward_with<T, N>(xs, w, ys, rstd, n, H, eps, stream);
    else
      forward_with<T, 1>(xs, w, ys, rstd, n, H, eps, stream);
  });
}

void rmsnorm_backward(const void* dy, const void* x, const void* weight, const float* rstd, void* dx, float* dweight,
                      int n, int H, bool accumulate_dx, DType dt, cudaStream_t stream) {
  SHARDLM_CHECK(n >= 0, "rmsnorm_backward: negative row count ", n);
  if (n == 0) return;
  SHARDLM_CHECK(H > 0, "rmsnorm_backward: bad shape ", n, " x ", H);
  dispatch_dtype(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int N = vec_width<T>();
    const T* dys = static_cast<const T*>(dy);
    const T* xs = static_cast<const T*>(x);
    const T* w = static_cast<const T*>(weight);
    T* dxs = static_cast<T*>(dx);
    if (H % N == 0 && is_aligned(dy, 16) && is_aligned(x, 16) && is_aligned(weight, 16) && is_aligned(dx, 16))
      backward_with<T, N>(dys, xs, w, rstd, dxs, dweight, n, H, accumulate_dx, stream);
    else
      backward_with<T, 1>(dys, xs, w, rstd, dxs, dweight, n, H, accumulate_dx, stream);
  });
}

}  // namespace shardlm::cuda
