// Attention of greedy-decoding steps over a key/value cache, for BLOOM (head-interleaved fused QKV,
// ALiBi) and Llama (q, k, v projections side by side, grouped-query heads, no positional bias here:
// rotary is applied to q and k before). kv_cache_write stores each row's key and value heads at
// (slot, position); decode_attention then gives each (row, query head) one block that walks the
// slot's cached positions 0..position (the last `window` of them with a sliding window) of its kv head
// with an online softmax in fp32: each warp takes
// every kWarps-th key and keeps its running (max, sum, weighted values), and the warps' states merge
// at the end, so no score row is stored and any cache length fits.
#include "decode_attention.hpp"
#include "dtype_cuda.cuh"

namespace shardlm::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxHeadDim = 256;  // head_dim / 32 elements of q, v and the output per lane

// Row r's key and value of kv head g to cache[slot, g, position].
template <typename T>
__global__ void kv_cache_write_kernel(const T* __restrict__ qkv, DecodeQkv l, const int32_t* __restrict__ slots,
                                      const int32_t* __restrict__ positions, long long n, int max_len,
                                      T* __restrict__ keys, T* __restrict__ values) {
  const int d = l.head_dim;
  const long long per_row = static_cast<long long>(l.kv_heads) * d;
  const long long total = n * per_row;
  for (long long e = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long r = e / per_row;
    const int g = static_cast<int>((e % per_row) / d), c = static_cast<int>(e % d);
    const T* row = qkv + r * l.row_stride + static_cast<long long>(g) * l.head_stride + c;
    const size_t at = ((static_cast<size_t>(slots[r]) * l.kv_heads + g) * max_len + positions[r]) * d + c;
    keys[at] = row[l.k_offset];
    values[at] = row[l.v_offset];
  }
}

// One block per (row, query head h): ctx = sum_j softmax_j(scale q.k_j + slope_h j) v_j over
// position - window < j <= position (window 0: every j <= position), keys and values of kv head h / group;
// slope 0 without ALiBi.
template <typename T, int PerLane>
__global__ void __launch_bounds__(kWarps * 32)
    decode_attention_kernel(const T* __restrict__ qkv, DecodeQkv l, const T* __restrict__ keys,
                            const T* __restrict__ values, const int32_t* __restrict__ slots,
                            const int32_t* __restrict__ positions, const float* __restrict__ slopes,
                            T* __restrict__ ctx, int max_len, float scale, int window) {
  __shared__ float shared_m[kWarps], shared_s[kWarps];
  __shared__ float shared_acc[kWarps][PerLane * 32];
  const long long r = blockIdx.x;
  const int h = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int d = l.head_dim, g = h / (l.heads / l.kv_heads);
  const T* q = qkv + r * l.row_stride + static_cast<long long>(h) * l.head_stride;
  float qr[PerLane], acc[PerLane];
#pragma unroll
  for (int k = 0; k < PerLane; ++k) {
    const int c = lane + 32 * k;
    qr[k] = c < d ? to_float(q[c]) : 0.0f;
    acc[k] = 0.0f;
  }
  const size_t base = (static_cast<size_t>(slots[r]) * l.kv_heads + g) * static_cast<size_t>(max_len) * d;
  const T* K = keys + base;
  const T* V = values + base;
  const int last = positions[r];
  const int first = window > 0 && last - window + 1 > 0 ? last - window + 1 : 0;
  const float slope = slopes != nullptr ? slopes[h] : 0.0f;
  float m = -INFINITY, s = 0.0f;
  for (int j = first + warp; j <= last; j += kWarps) {
    const T* kj = K + static_cast<size_t>(j) * d;
    float dot = 0.0f;
#pragma unroll
    for (int k = 0; k < PerLane; ++k) {
      const int c = lane + 32 * k;
      if (c < d) dot += qr[k] * to_float(kj[c]);
    }
    const float x = scale * warp_sum(dot) + slope * static_cast<float>(j);
    const float m_new = fmaxf(m, x);
    const float correction = m == -INFINITY ? 0.0f : expf(m - m_new);
    const float p = expf(x - m_new);
    s = s * correction + p;
    const T* vj = V + static_cast<size_t>(j) * d;
#pragma unroll
    for (int k = 0; k < PerLane; ++k) {
      const int c = lane + 32 * k;
      if (c < d) acc[k] = acc[k] * correction + p * to_float(vj[c]);
    }
    m = m_new;
  }
  if (lane == 0) shared_m[warp] = m, shared_s[warp] = s;
#pragma unroll
  for (int k = 0; k < PerLane; ++k) shared_acc[warp][lane + 32 * k] = acc[k];
  __syncthreads();
  // Warp 0 always holds the first key, so the largest max is finite; warps without keys weigh 0.
  float top = shared_m[0];
  for (int w = 1; w < kWarps; ++w) top = fmaxf(top, shared_m[w]);
  float weight[kWarps], total = 0.0f;
  for (int w = 0; w < kWarps; ++w) {
    weight[w] = shared_m[w] == -INFINITY ? 0.0f : expf(shared_m[w] - top);
    total += shared_s[w] * weight[w];
  }
  const float inv_total = 1.0f / total;
  T* out = ctx + r * static_cast<long long>(l.heads) * d + static_cast<long long>(h) * d;
  for (int c = threadIdx.x; c < d; c += blockDim.x) {
    float v = 0.0f;
    for (int w = 0; w < kWarps; ++w) v += shared_acc[w][c] * weight[w];
    out[c] = from_float<T>(v * inv_total);
  }
}

template <typename T, int PerLane>
void launch_decode_attention(const void* qkv, const DecodeQkv& l, const void* keys, const void* values,
                             const int32_t* slots, const int32_t* positions, int n, const float* slopes, void* ctx,
                             int max_len, int window, cudaStream_t stream) {
  const float scale = l.scale > 0 ? l.scale : 1.0f / sqrtf(static_cast<float>(l.head_dim));
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(l.heads));
  decode_attention_kernel<T, PerLane><<<grid, kWarps * 32, 0, stream>>>(
      static_cast<const T*>(qkv), l, static_cast<const T*>(keys), static_cast<const T*>(values), slots, positions,
      slopes, static_cast<T*>(ctx), max_len, scale, window);
  SHARDLM_CUDA_LAUNCH_CHECK();
}

// Every head of the layout lies inside its row, and the query heads split evenly over the kv heads.
void check_shape(const char* what, const DecodeQkv& l, int n, int max_len) {
  const long long d = l.head_dim, stride = l.head_stride, row = l.row_stride;
  SHARDLM_CHECK(n >= 0 && l.heads >= 1 && l.heads <= 65535 && l.kv_heads >= 1 && l.heads % l.kv_heads == 0 &&
                    d >= 1 && d <= kMaxHeadDim && max_len >= 1,
                what, ": bad shape n=", n, " heads=", l.heads, " kv_heads=", l.kv_heads, " head_dim=", d,
                " (at most ", kMaxHeadDim, ") max_len=", max_len);
  SHARDLM_CHECK(stride >= d && l.k_offset >= 0 && l.v_offset >= 0 && (l.heads - 1) * stride + d <= row &&
                    l.k_offset + (l.kv_heads - 1) * stride + d <= row &&
                    l.v_offset + (l.kv_heads - 1) * stride + d <= row,
                what, ": heads fall outside rows of ", row, " (head stride ", stride, ", key offset ", l.k_offset,
                ", value offset ", l.v_offset, ")");
}

}  // namespace

void kv_cache_write(const void* qkv, const DecodeQkv& layout, const int32_t* slots, const int32_t* positions, int n,
                    int max_len, void* keys, void* values, DType dt, cudaStream_t stream) {
  check_shape("kv_cache_write", layout, n, max_len);
  if (n == 0) return;
  dispatch_dtype(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const size_t items = static_cast<size_t>(n) * layout.kv_heads * layout.head_dim;
    kv_cache_write_kernel<T><<<grid_for(items), kBlockThreads, 0, stream>>>(
        static_cast<const T*>(qkv), layout, slots, positions, n, max_len, static_cast<T*>(keys),
        static_cast<T*>(values));
    SHARDLM_CUDA_LAUNCH_CHECK();
  });
}

void decode_attention(const void* qkv, const DecodeQkv& layout, const void* keys, const void* values,
                      const int32_t* slots, const int32_t* positions, int n, const float* slopes, void* ctx,
                      int max_len, DType dt, cudaStream_t stream, int window) {
  check_shape("decode_attention", layout, n, max_len);
  SHARDLM_CHECK(window >= 0, "decode_attention: window ", window, " < 0");
  if (n == 0) return;
  dispatch_dtype(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    // q, v and the output of a head take head_dim / 32 registers per lane, rounded up to a power of two.
    const int d = layout.head_dim;
    const auto launch = d <= 32    ? launch_decode_attention<T, 1>
                        : d <= 64  ? launch_decode_attention<T, 2>
                        : d <= 128 ? launch_decode_attention<T, 4>
                                   : launch_decode_attention<T, 8>;
    launch(qkv, layout, keys, values, slots, positions, n, slopes, ctx, max_len, window, stream);
  });
}

}  // namespace shardlm::cuda
