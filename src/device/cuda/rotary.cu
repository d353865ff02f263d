// Rotary position embeddings (Llama), applied in place to the query and key heads at the start of
// each row, at position row % T (training) or at each row's own position (decoding). One thread per
// (row, V consecutive frequencies): it forms their cos and sin once and rotates those pairs of every head of
// the row, moving V elements an access and loading several heads before writing any back.
#include "dtype_cuda.cuh"
#include "rotary.hpp"

namespace shardlm::cuda {
namespace {

// The angle is rounded to fp32 (pos * inv_freq in fp32, as transformers and LlamaCpu form it);
// its cos and sin are taken in double and rounded, so the table equals LlamaCpu's. Row r sits at
// positions[r], or at r % seq (minus starts[r] in packed rows) when positions is null.
// Options (RotaryOptions): only the first `rot` dimensions of each head rotate; cos and sin are scaled
// (rounded to fp32 first, as transformers scales them); with long_inv_freq a decoding row whose slot's
// largest position in the step reaches past original_max takes its frequencies from there.
template <typename T, int V>
__global__ void rotary_kernel(T* __restrict__ x, long long n, int seq, const int32_t* __restrict__ positions,
                              const int32_t* __restrict__ starts, int heads, int head_dim, int ld,
                              const float* __restrict__ inv_freq, float sign, int rot, float scale,
                              const float* __restrict__ long_inv_freq, const int32_t* __restrict__ slots,
                              int original_max) {
  constexpr int kBatch = 8;  // heads loaded before any is written back: loads in flight
  const int half = rot / 2;
  const int groups = half / V;  // (V divides half: launch_rotary)
  const long long items = n * groups;
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long item = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; item < items;
       item += stride) {
    const long long row = item / groups;
    const int i0 = static_cast<int>(item % groups) * V;
    const long long pos = positions != nullptr ? positions[row] : row % seq - (starts != nullptr ? starts[row] : 0);
    const float* freq = inv_freq;
    if (long_inv_freq != nullptr) {
      int max_position = positions[row];
      for (long long j = 0; j < n; ++j)
        if (slots[j] == slots[row] && positions[j] > max_position) max_position = positions[j];
      if (max_position + 1 > original_max) freq = long_inv_freq;
    }
    float cs[V], sn[V];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float angle = static_cast<float>(pos) * freq[i0 + k];
      double s = 0.0, c = 0.0;
      sincos(static_cast<double>(angle), &s, &c);
      cs[k] = static_cast<float>(c) * scale, sn[k] = sign * (static_cast<float>(s) * scale);
    }
    T* r = x + row * ld + i0;
    for (int h0 = 0; h0 < heads; h0 += kBatch) {
      Pack<T, V> a[kBatch], b[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j)
        if (h0 + j < heads) {
          a[j] = load_pack<V>(r + static_cast<long long>(h0 + j) * head_dim);
          b[j] = load_pack<V>(r + static_cast<long long>(h0 + j) * head_dim + half);
        }
#pragma unroll
      for (int j = 0; j < kBatch; ++j)
        if (h0 + j < heads) {
#pragma unroll
          for (int k = 0; k < V; ++k) {
            const float x1 = to_float(a[j][k]), x2 = to_float(b[j][k]);
            a[j][k] = from_float<T>(x1 * cs[k] - x2 * sn[k]);
            b[j][k] = from_float<T>(x2 * cs[k] + x1 * sn[k]);
          }
          store_pack<V>(r + static_cast<long long>(h0 + j) * head_dim, a[j]);
          store_pack<V>(r + static_cast<long long>(h0 + j) * head_dim + half, b[j]);
        }
    }
  }
}

template <typename E>
void launch_rotary(void* x, int n, int T, const int32_t* positions, const int32_t* starts, int heads, int head_dim,
                   int ld, const float* inv_freq, float sign, const RotaryOptions& o, cudaStream_t stream) {
  const int rot = o.rotary_dim > 0 ? o.rotary_dim : head_dim;
  SHARDLM_CHECK(rot >= 2 && rot % 2 == 0 && rot <= head_dim && (o.long_inv_freq == nullptr || o.slots != nullptr),
                "rotary: bad options rotary_dim=", o.rotary_dim, " of head_dim ", head_dim);
  const int half = rot / 2;
  // V frequencies a thread, their elements moved V at a time: where V divides the half, the head and the row
  // stride and x is aligned to V elements, every access is.
  const auto fits = [&](int v) {
    return half % v == 0 && head_dim % v == 0 && ld % v == 0 && is_aligned(x, static_cast<size_t>(v) * sizeof(E));
  };
  const auto launch = [&](auto width) {
    constexpr int V = decltype(width)::value;
    const size_t items = static_cast<size_t>(n) * (half / V);
    rotary_kernel<E, V><<<grid_for(items), kBlockThreads, 0, stream>>>(static_cast<E*>(x), n, T, positions, starts,
                                                                       heads, head_dim, ld, inv_freq, sign, rot,
                                                                       o.scale, o.long_inv_freq, o.slots,
                                                                       o.original_max);
  };
  if (fits(4)) launch(PackWidth<4>{});
  else if (fits(2)) launch(PackWidth<2>{});
  else launch(PackWidth<1>{});
  SHARDLM_CUDA_LAUNCH_CHECK();
}

}  // namespace

void rotary_apply(void* x, int n, int T, int heads, int head_dim, int ld, const float* inv_freq, bool inverse,
                  DType dt, cudaStream_t stream, const int32_t* starts, const RotaryOptions& options) {
  SHARDLM_CHECK(n >= 0 && T >= 1 && heads >= 0 && head_dim >= 2 && head_dim % 2 == 0 && ld >= heads * head_dim,
                "rotary_apply: bad shape n=", n, " T=", T, " heads=", heads, " head_dim=", head_dim, " ld=", ld);
  if (n == 0 || heads == 0) return;
  const float sign = inverse ? -1.0f : 1.0f;
  dispatch_dtype(dt, [&](auto tag) {
    using E = typename decltype(tag)::type;
    RotaryOptions training = options;
    training.long_inv_freq = nullptr;  // the caller picks the table of the whole forward
    launch_rotary<E>(x, n, T, nullptr, starts, heads, head_dim, ld, inv_freq, sign, training, stream);
  });
}

void rotary_apply_at(void* x, int n, const int32_t* positions, int heads, int head_dim, int ld,
                     const float* inv_freq, DType dt, cudaStream_t stream, const RotaryOptions& options) {
  SHARDLM_CHECK(n >= 0 && heads >= 0 && head_dim >= 2 && head_dim % 2 == 0 && ld >= heads * head_dim,
                "rotary_apply_at: bad shape n=", n, " heads=", heads, " head_dim=", head_dim, " ld=", ld);
  if (n == 0 || heads == 0) return;
  dispatch_dtype(dt, [&](auto tag) {
    using E = typename decltype(tag)::type;
    launch_rotary<E>(x, n, 1, positions, nullptr, heads, head_dim, ld, inv_freq, 1.0f, options, stream);
  });
}

}  // namespace shardlm::cuda
