// LayerNorm forward and backward: one warp per row, fp32 statistics, two-pass mean and variance.
//
// Lane l of a warp owns packs l, l + 32, l + 64, ... of its row (pack p = columns p*N .. p*N+N-1,
// N = 16 bytes of T when H and the pointers allow). Rows of up to 32 * kPacks packs take the fast
// path: loops unrolled; the forward holds the row in registers between its passes, the backward
// holds each lane's dgamma/dbeta partial sums across all the rows its warp handles and re-reads the
// row in its second pass. Longer rows take the generic path (kPacks = 0), whose passes re-read the
// row (still in L1/L2); its backward writes dx only, and a second, column-parallel kernel sums
// dgamma/dbeta (per-element atomics from row-parallel warps would serialise on the same columns).
#include "column_grad.cuh"
#include "layernorm.hpp"
#include "warp_rows.cuh"

namespace shardlm::cuda {
namespace {

// Fast-path limits on elements per lane: the forward keeps its share of the row in registers, the
// backward its share of the dgamma and dbeta partial sums, within 128 registers (two blocks per SM).
constexpr int kForwardMaxLaneElements = 64;
constexpr int kBackwardMaxLaneElements = 32;

// Calls f(slot, pack) for each pack of the row this lane owns; slot indexes per-lane register arrays
// on the fast path (a compile-time constant once unrolled) and is always 0 on the generic path.
template <int kPacks, typename F>
__device__ __forceinline__ void for_lane_packs(int lane, int packs, F&& f) {
  if constexpr (kPacks > 0) {
#pragma unroll
    for (int slot = 0; slot < kPacks; ++slot) {
      const int p = lane + 32 * slot;
      if (p < packs) f(slot, p);
    }
  } else {
    for (int p = lane; p < packs; p += 32) f(0, p);
  }
}

template <typename T, int N, int kPacks>
__global__ void __launch_bounds__(kRowThreads)
    layernorm_forward_kernel(const T* __restrict__ x, const T* __restrict__ gamma, const T* __restrict__ beta,
                             T* __restrict__ y, float* __restrict__ mean, float* __restrict__ rstd, int n, int H,
                             float eps) {
  constexpr int kSlots = kPacks > 0 ? kPacks : 1;
  const int lane = threadIdx.x % 32;
  const int packs = H / N;
  for_warp_rows(n, [&](long long row) {
    const T* xr = x + row * H;
    T* yr = y + row * H;
    [[maybe_unused]] Pack<T, N> cached[kSlots];  // the row's raw packs, fast path only
    auto load_x = [&](int slot, int p, float (&v)[N]) {
      if constexpr (kPacks > 0) {
#pragma unroll
        for (int k = 0; k < N; ++k) v[k] = to_float(cached[slot][k]);
      } else {
        load_floats<N>(xr + p * N, v);
      }
    };

    float sum = 0.0f;
    for_lane_packs<kPacks>(lane, packs, [&](int slot, int p) {
      if constexpr (kPacks > 0) cached[slot] = load_pack<N>(xr + p * N);
      float v[N];
      load_x(slot, p, v);
#pragma unroll
      for (int k = 0; k < N; ++k) sum += v[k];
    });
    const float mu = warp_sum(sum) / H;

    // Second pass around the mean: no cancellation on rows with a large common offset.
    float squares = 0.0f;
    for_lane_packs<kPacks>(lane, packs, [&](int slot, int p) {
      float v[N];
      load_x(slot, p, v);
#pragma unroll
      for (int k = 0; k < N; ++k) squares += (v[k] - mu) * (v[k] - mu);
    });
    const float rs = 1.0f / sqrtf(warp_sum(squares) / H + eps);

    for_lane_packs<kPacks>(lane, packs, [&](int slot, int p) {
      float v[N], g[N], b[N];
      load_x(slot, p, v);
      load_floats<N>(gamma + p * N, g);
      load_floats<N>(beta + p * N, b);
#pragma unroll
      for (int k = 0; k < N; ++k) v[k] = (v[k] - mu) * rs * g[k] + b[k];
      store_floats<N>(yr + p * N, v);
    });
    if (lane == 0) {
      mean[row] = mu;
      rstd[row] = rs;
    }
  });
}

// dx for each row; with kPacks > 0 also dgamma/dbeta: each lane keeps partial sums for its columns
// over all rows of its warp, the block adds its warps' partials in shared memory (no atomics there:
// every warp stores its own copy, then one thread per column sums them) and adds them to global
// memory with one atomic per column. With kPacks == 0 the kernel writes dx only, and
// column_grad_kernel (column_grad.cuh) computes dgamma/dbeta.
template <typename T, int N, int kPacks>
__global__ void __launch_bounds__(kRowThreads, 2)
    layernorm_backward_kernel(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ gamma,
                              const float* __restrict__ mean, const float* __restrict__ rstd, T* dx,
                              float* __restrict__ dgamma, float* __restrict__ dbeta, int n, int H,
                              bool accumulate_dx) {
  constexpr int kSlots = kPacks > 0 ? kPacks : 1;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int packs = H / N;

  [[maybe_unused]] float dgamma_acc[kSlots][N];
  [[maybe_unused]] float dbeta_acc[kSlots][N];
  if constexpr (kPacks > 0) {
#pragma unroll
    for (int s = 0; s < kSlots; ++s)
#pragma unroll
      for (int k = 0; k < N; ++k) dgamma_acc[s][k] = dbeta_acc[s][k] = 0.0f;
  }

  for_warp_rows(n, [&](long long row) {
    const T* dyr = dy + row * H;
    const T* xr = x + row * H;
    T* dxr = dx + row * H;
    const float mu = mean[row], rs = rstd[row];
    auto load_row = [&](int p, float (&d)[N], float (&xv)[N], float (&w)[N]) {
      load_floats<N>(dyr + p * N, d);
      load_floats<N>(xr + p * N, xv);
      load_floats<N>(gamma + p * N, w);
    };

    // Pass 1: the row sums of g = dy * gamma and of g * xhat.
    float sum_g = 0.0f, sum_g_xhat = 0.0f;
    for_lane_packs<kPacks>(lane, packs, [&](int, int p) {
      float d[N], xv[N], w[N];
      load_row(p, d, xv, w);
#pragma unroll
      for (int k = 0; k < N; ++k) {
        const float g = d[k] * w[k];
        sum_g += g;
        sum_g_xhat += g * ((xv[k] - mu) * rs);
      }
    });
    const float mean_g = warp_sum(sum_g) / H;
    const float mean_g_xhat = warp_sum(sum_g_xhat) / H;

    // Pass 2: dx = rstd * (g - mean(g) - xhat * mean(g * xhat)); dgamma += dy * xhat, dbeta += dy.
    for_lane_packs<kPacks>(lane, packs, [&](int slot, int p) {
      float d[N], xv[N], w[N], out[N];
      load_row(p, d, xv, w);  // again: the row is still in L1 (keeping it costs registers we lack)
      load_or_zero<N>(accumulate_dx, dxr + p * N, out);
#pragma unroll
      for (int k = 0; k < N; ++k) {
        const float xhat = (xv[k] - mu) * rs;
        out[k] += rs * (d[k] * w[k] - mean_g - xhat * mean_g_xhat);
        if constexpr (kPacks > 0) {
          dgamma_acc[slot][k] += d[k] * xhat;
          dbeta_acc[slot][k] += d[k];
        }
      }
      store_floats<N>(dxr + p * N, out);
    });
  });

  if constexpr (kPacks > 0) {
    static_assert(N % 4 == 0, "the fast path runs on 16-byte packs");
    // [kRowWarps][H] floats: one warp's partials per row, reused for dgamma and then dbeta.
    extern __shared__ float warp_partials[];
    float* mine = warp_partials + static_cast<size_t>(warp) * H;
    for (int which = 0; which < 2; ++which) {
      for_lane_packs<kPacks>(lane, packs, [&](int slot, int p) {
        // 16-byte stores: a warp's scalar stores at a stride of N floats would conflict on banks.
#pragma unroll
        for (int q = 0; q < N; q += 4) {
          Pack<float, 4> v;
#pragma unroll
          for (int k = 0; k < 4; ++k) v[k] = which == 0 ? dgamma_acc[slot][q + k] : dbeta_acc[slot][q + k];
          store_pack<4>(mine + p * N + q, v);
        }
      });
      __syncthreads();
      float* target = which == 0 ? dgamma : dbeta;
      for (int c = threadIdx.x; c < H; c += kRowThreads) {
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < kRowWarps; ++w) sum += warp_partials[static_cast<size_t>(w) * H + c];
        atomicAdd(target + c, sum);
      }
      __syncthreads();  // before the buffer is reused
    }
  }
}

// ---- host-side dispatch ---------------------------------------------------------------------------

// Smallest unrolled pack count per lane that covers `lane_packs` within the element limit, else 0.
template <int N>
int fast_path_packs(int lane_packs, int max_lane_elements) {
  for (int k = 1; k * N <= max_lane_elements; k *= 2)
    if (lane_packs <= k) return k;
  return 0;
}

// Calls f(PackWidth<kPacks>{}) with kPacks = fast_path_packs for rows of H elements in packs of N,
// or kPacks = 0 (the generic path) where that is 0 or N == 1 (the fast path runs on 16-byte packs).
template <int N, int kMaxLaneElements, typename F>
void dispatch_lane_packs(int H, F&& f) {
  if constexpr (N > 1) {
    const int lane_packs = (H / N + 31) / 32;
    switch (fast_path_packs<N>(lane_packs, kMaxLaneElements)) {
      case 1: f(PackWidth<1>{}); return;
      case 2: f(PackWidth<2>{}); return;
      case 4: f(PackWidth<4>{}); return;
      case 8:
        if constexpr (8 * N <= kMaxLaneElements) {
          f(PackWidth<8>{});
          return;
        }
        break;
      case 16:
        if constexpr (16 * N <= kMaxLaneElements) {
          f(PackWidth<16>{});
          return;
        }
        break;
      default: break;
    }
  }
  f(PackWidth<0>{});
}

template <typename T, int N, int kPacks>
void forward_with(const T* x, const T* gamma, const T* beta, T* y, float* mean, float* rstd, int n, int H,
                  float eps, cudaStream_t stream) {
  layernorm_forward_kernel<T, N, kPacks><<<warp_row_blocks(n), kRowThreads, 0, stream>>>(x, gamma, beta, y, mean,
                                                                                         rstd, n, H, eps);
  SHARDLM_CUDA_LAUNCH_CHECK();
}

template <typename T, int N, int kPacks>
void backward_with(const T* dy, const T* x, const T* gamma, const float* mean, const float* rstd, T* dx,
                   float* dgamma, float* dbeta, int n, int H, bool accumulate_dx, cudaStream_t stream) {
  // Fewer blocks than the forward when each flushes H atomics of dgamma/dbeta partials at its end.
  const unsigned blocks = warp_row_blocks(n, kPacks > 0 ? 2 : 8);
  const size_t shared_bytes = kPacks > 0 ? static_cast<size_t>(kRowWarps) * H * sizeof(float) : 0;
  layernorm_backward_kernel<T, N, kPacks><<<blocks, kRowThreads, shared_bytes, stream>>>(
      dy, x, gamma, mean, rstd, dx, dgamma, dbeta, n, H, accumulate_dx);
  SHARDLM_CUDA_LAUNCH_CHECK();
}

}  // namespace

void layernorm_forward(const void* x, const void* gamma, const void* beta, void* y, float* mean, float* rstd, int n,
                       int H, float eps, DType dt, cudaStream_t stream) {
  if (!check_rows("layernorm_forward", n, H)) return;
  dispatch_dtype_packed(dt, H, {x, gamma, beta, y}, [&](auto tag, auto width) {
    using T = typename decltype(tag)::type;
    constexpr int N = decltype(width)::value;
    dispatch_lane_packs<N, kForwardMaxLaneElements>(H, [&](auto lane_packs) {
      forward_with<T, N, decltype(lane_packs)::value>(static_cast<const T*>(x), static_cast<const T*>(gamma),
                                                      static_cast<const T*>(beta), static_cast<T*>(y), mean, rstd,
                                                      n, H, eps, stream);
    });
  });
}

void layernorm_backward(const void* dy, const void* x, const void* gamma, const float* mean, const float* rstd,
                        void* dx, float* dgamma, float* dbeta, int n, int H, bool accumulate_dx, DType dt,
                        cudaStream_t stream) {
  if (!check_rows("layernorm_backward", n, H)) return;
  SHARDLM_CHECK((dgamma == nullptr) == (dbeta == nullptr),
                "layernorm_backward: dgamma and dbeta must both be given or both be null");
  dispatch_dtype_packed(dt, H, {dy, x, gamma, dx}, [&](auto tag, auto width) {
    using T = typename decltype(tag)::type;
    constexpr int N = decltype(width)::value;
    const T* dys = static_cast<const T*>(dy);
    const T* xs = static_cast<const T*>(x);
    if (!dgamma) {  // frozen gamma and beta: dx alone, row by row
      backward_with<T, N, 0>(dys, xs, static_cast<const T*>(gamma), mean, rstd, static_cast<T*>(dx), nullptr, nullptr,
                             n, H, accumulate_dx, stream);
      return;
    }
    dispatch_lane_packs<N, kBackwardMaxLaneElements>(H, [&](auto lane_packs) {
      constexpr int kPacks = decltype(lane_packs)::value;
      backward_with<T, N, kPacks>(dys, xs, static_cast<const T*>(gamma), mean, rstd, static_cast<T*>(dx), dgamma,
                                  dbeta, n, H, accumulate_dx, stream);
      // The generic path's dx is row by row; dgamma/dbeta then go column by column (a second read of
      // dy and x).
      if constexpr (kPacks == 0)
        launch_column_grad<ColumnGrad::kLayerNormParams, T, N>(dys, xs, mean, rstd, dgamma, dbeta, n, H, stream);
    });
  });
}

}  // namespace shardlm::cuda
