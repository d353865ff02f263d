// RMSNorm forward and backward (Llama): one warp per row with fp32 sums (the backward: one to eight warps a row,
// the row held in registers); the weight gradient by a
// second, column-parallel kernel (per-element atomics from row-parallel warps would serialise on
// the same columns). Rows move in 16-byte packs when H and every pointer allow, else one element
// at a time. Given a word, the forward also reduces the amax of what it writes (fp8_amax.cuh) for the FP8
// GEMM that reads it next.
#include "column_grad.cuh"
#include "fp8_amax.cuh"
#include "rmsnorm.hpp"
#include "warp_rows.cuh"

namespace shardlm::cuda {
namespace {

template <typename T, int N>
__global__ void __launch_bounds__(kRowThreads)
    rmsnorm_forward_kernel(const T* __restrict__ x, const T* __restrict__ weight, T* __restrict__ y,
                           float* __restrict__ rstd, int n, int H, float eps, float offset, unsigned* amax_bits) {
  const int lane = threadIdx.x % 32;
  const int packs = H / N;
  unsigned m = 0;
  for_warp_rows(n, [&](long long row) {
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
      for (int k = 0; k < N; ++k) v[k] = (v[k] * rs) * (offset + w[k]);  // xhat first, then the weight: as LlamaCpu
      store_floats<N>(yr + p * N, v);
      if (amax_bits) m = max_stored_abs_bits<T>(m, v);
    }
    if (lane == 0) rstd[row] = rs;
  });
  if (amax_bits) publish_amax(m, amax_bits);
}

// dx only; rmsnorm_weight_grad_kernel sums the weight gradient.
template <typename T, int N>
__global__ void __launch_bounds__(kRowThreads)
    rmsnorm_backward_kernel(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ weight,
                            const float* __restrict__ rstd, T* dx, int n, int H, bool accumulate_dx, float offset) {
  const int lane = threadIdx.x % 32;
  const int packs = H / N;
  for_warp_rows(n, [&](long long row) {
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
      for (int k = 0; k < N; ++k) sum_g_xhat += d[k] * (offset + w[k]) * (xv[k] * rs);
    }
    const float mean_g_xhat = warp_sum(sum_g_xhat) / H;
    for (int p = lane; p < packs; p += 32) {
      float d[N], xv[N], w[N], out[N];
      load_floats<N>(dyr + p * N, d);  // again: the row is still in L1
      load_floats<N>(xr + p * N, xv);
      load_floats<N>(weight + p * N, w);
      load_or_zero<N>(accumulate_dx, dxr + p * N, out);
#pragma unroll
      for (int k = 0; k < N; ++k) out[k] += rs * (d[k] * (offset + w[k]) - (xv[k] * rs) * mean_g_xhat);
      store_floats<N>(dxr + p * N, out);
    }
  });
}

// dx only, as rmsnorm_backward_kernel, with the row held in registers between its two passes: `G` warps a row
// (kRowWarps / G rows a block), each lane holding up to kHeldPacks packs of dy, x and (accumulating) dx, all loaded
// before the row's sum, so the row is read from memory once and in one round trip. (A warp a row, re-reading its
// row after the sum, found part of it evicted with many rows in flight: 1.5x the bytes on the 3B shape.) The G
// warps' sums meet in shared memory, in a fixed order. Few registers: four blocks an SM keep loads in flight.
constexpr int kHeldPacks = 2;
constexpr int kHeldBlocksPerSm = 4;  // the launch bounds' promise, and the grid's size

template <typename T, int N>
__global__ void __launch_bounds__(kRowThreads, kHeldBlocksPerSm)
    rmsnorm_backward_held_kernel(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ weight,
                                 const float* __restrict__ rstd, T* dx, int n, int H, bool accumulate_dx, float offset,
                                 int G) {
  __shared__ float partial[kRowWarps];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rows_per_block = kRowWarps / G, slot = warp / G, t = (warp % G) * 32 + lane, threads = G * 32;
  const int packs = H / N;
  const long long stride = static_cast<long long>(gridDim.x) * rows_per_block;
  // Every thread of the block runs the same iterations (base is the block's): the barriers below are safe.
  for (long long base = static_cast<long long>(blockIdx.x) * rows_per_block; base < n; base += stride) {
    const long long row = base + slot;
    const bool live = row < n;
    const float rs = live ? rstd[row] : 0.0f;
    T* dxr = dx + row * H;
    Pack<T, N> d[kHeldPacks], xv[kHeldPacks], old[kHeldPacks];
    float sum_g_xhat = 0.0f;
    if (live) {
#pragma unroll
      for (int j = 0; j < kHeldPacks; ++j) {
        const int p = t + j * threads;
        if (p >= packs) continue;
        d[j] = load_pack<N>(dy + row * H + p * N), xv[j] = load_pack<N>(x + row * H + p * N);
        if (accumulate_dx) old[j] = load_pack<N>(dxr + p * N);
      }
#pragma unroll
      for (int j = 0; j < kHeldPacks; ++j) {
        const int p = t + j * threads;
        if (p >= packs) continue;
        float w[N];
        load_floats<N>(weight + p * N, w);
#pragma unroll
        for (int k = 0; k < N; ++k) sum_g_xhat += to_float(d[j][k]) * (offset + w[k]) * (to_float(xv[j][k]) * rs);
      }
    }
    sum_g_xhat = warp_sum(sum_g_xhat);
    if (G > 1) {
      if (lane == 0) partial[warp] = sum_g_xhat;
      __syncthreads();
      sum_g_xhat = 0.0f;
      for (int i = 0; i < G; ++i) sum_g_xhat += partial[slot * G + i];
      __syncthreads();  // read before the next row's sums are written
    }
    if (!live) continue;
    const float mean_g_xhat = sum_g_xhat / H;
#pragma unroll
    for (int j = 0; j < kHeldPacks; ++j) {
      const int p = t + j * threads;
      if (p >= packs) continue;
      float w[N], out[N];
      load_floats<N>(weight + p * N, w);
#pragma unroll
      for (int k = 0; k < N; ++k)
        out[k] = (accumulate_dx ? to_float(old[j][k]) : 0.0f) +
                 rs * (to_float(d[j][k]) * (offset + w[k]) - (to_float(xv[j][k]) * rs) * mean_g_xhat);
      store_floats<N>(dxr + p * N, out);
    }
  }
}

template <typename T, int N>
void forward_with(const T* x, const T* weight, T* y, float* rstd, int n, int H, float eps, float offset,
                  unsigned* amax_bits, cudaStream_t stream) {
  rmsnorm_forward_kernel<T, N><<<warp_row_blocks(n), kRowThreads, 0, stream>>>(x, weight, y, rstd, n, H, eps, offset,
                                                                                amax_bits);
  SHARDLM_CUDA_LAUNCH_CHECK();
}

template <typename T, int N>
void backward_with(const T* dy, const T* x, const T* weight, const float* rstd, T* dx, float* dweight, int n, int H,
                   bool accumulate_dx, float offset, cudaStream_t stream) {
  // Rows of up to kRowWarps * 32 * kHeldPacks packs are held in registers (G warps a row, the fewest that hold it).
  const int packs = H / N;
  int G = 1;
  while (G < kRowWarps && packs > G * 32 * kHeldPacks) G *= 2;
  if (packs <= G * 32 * kHeldPacks) {
    const long long rows_per_block = kRowWarps / G;
    const long long blocks = std::min<long long>((n + rows_per_block - 1) / rows_per_block,
                                                    static_cast<long long>(kHeldBlocksPerSm) * sm_count());
    rmsnorm_backward_held_kernel<T, N><<<static_cast<unsigned>(blocks), kRowThreads, 0, stream>>>(
        dy, x, weight, rstd, dx, n, H, accumulate_dx, offset, G);
  } else {
    rmsnorm_backward_kernel<T, N><<<warp_row_blocks(n), kRowThreads, 0, stream>>>(dy, x, weight, rstd, dx, n, H,
                                                                                   accumulate_dx, offset);
  }
  SHARDLM_CUDA_LAUNCH_CHECK();
  // dweight[c] += sum_r dy[r,c] x[r,c] rstd[r], column by column; none for a frozen weight.
  if (dweight)
    launch_column_grad<ColumnGrad::kRmsNormWeight, T, N>(dy, x, nullptr, rstd, dweight, nullptr, n, H, stream);
}

}  // namespace

void rmsnorm_forward(const void* x, const void* weight, void* y, float* rstd, int n, int H, float eps, DType dt,
                     cudaStream_t stream, float weight_offset, unsigned* amax_bits) {
  if (amax_bits) clear_amax(amax_bits, stream);
  if (!check_rows("rmsnorm_forward", n, H)) return;
  dispatch_dtype_packed(dt, H, {x, weight, y}, [&](auto tag, auto width) {
    using T = typename decltype(tag)::type;
    forward_with<T, decltype(width)::value>(static_cast<const T*>(x), static_cast<const T*>(weight),
                                            static_cast<T*>(y), rstd, n, H, eps, weight_offset, amax_bits, stream);
  });
}

void rmsnorm_backward(const void* dy, const void* x, const void* weight, const float* rstd, void* dx, float* dweight,
                      int n, int H, bool accumulate_dx, DType dt, cudaStream_t stream, float weight_offset) {
  if (!check_rows("rmsnorm_backward", n, H)) return;
  dispatch_dtype_packed(dt, H, {dy, x, weight, dx}, [&](auto tag, auto width) {
    using T = typename decltype(tag)::type;
    backward_with<T, decltype(width)::value>(static_cast<const T*>(dy), static_cast<const T*>(x),
                                             static_cast<const T*>(weight), rstd, static_cast<T*>(dx), dweight, n,
                                             H, accumulate_dx, weight_offset, stream);
  });
}

}  // namespace shardlm::cuda
