// Rotary position embeddings (Llama), applied in place to the query and key heads at the start of
// each row, at position row % T (training) or at each row's own position (decoding). One thread per
// (row, frequency): it forms cos and sin of its angle once and rotates that pair of every head of the row.
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
template <typename T>
__global__ void rotary_kernel(T* x, long long n, int seq, const int32_t* __restrict__ positions,
                              const int32_t* __restrict__ starts, int heads, int head_dim, int ld,
                              const float* __restrict__ inv_freq, float sign, int rot, float scale,
                              const float* __restrict__ long_inv_freq, const int32_t* __restrict__ slots,
                              int original_max) {
  const int half = rot / 2;
  const long long items = n * half;
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long item = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; item < items;
       item += stride) {
    const long long row = item / half;
    const int i = static_cast<int>(item % half);
    const long long pos = positions != nullptr ? positions[row] : row % seq - (starts != nullptr ? starts[row] : 0);
    const float* freq = inv_freq;
    if (long_inv_freq != nullptr) {
      int max_position = positions[row];
      for (long long j = 0; j < n; ++j)
        if (slots[j] == slots[row] && positions[j] > max_position) max_position = positions[j];
      if (max_position + 1 > original_max) freq = long_inv_freq;
    }
    const float angle = static_cast<float>(pos) * freq[i];
    double s = 0.0, c = 0.0;
    sincos(static_cast<double>(angle), &s, &c);
    const float cs = static_cast<float>(c) * scale, sn = sign * (static_cast<float>(s) * scale);
    T* r = x + row * ld;
    for (int h = 0; h < heads; ++h) {
      T* head = r + static_cast<long long>(h) * head_dim;
      const float x1 = to_float(head[i]), x2 = to_float(head[i + half]);
      head[i] = from_float<T>(x1 * cs - x2 * sn);
      head[i + half] = from_float<T>(x2 * cs + x1 * sn);
    }
  }
}

template <typename E>
void launch_rotary(void* x, int n, int T, const int32_t* positions, const int32_t* starts, int heads, int head_dim,
                   int ld, const float* inv_freq, float sign, const RotaryOptions& o, cudaStream_t stream) {
  const int rot = o.rotary_dim > 0 ? o.rotary_dim : head_dim;
  SHARDLM_CHECK(rot >= 2 && rot % 2 == 0 && rot <= head_dim && (o.long_inv_freq == nullptr || o.slots != nullptr),
                "rotary: bad options rotary_dim=", o.rotary_dim, " of head_dim ", head_dim);
  const size_t items = static_cast<size_t>(n) * (rot / 2);
  rotary_kernel<E><<<grid_for(items), kBlockThreads, 0, stream>>>(static_cast<E*>(x), n, T, positions, starts, heads,
                                                                   head_dim, ld, inv_freq, sign, rot, o.scale,
                                                                   o.long_inv_freq, o.slots, o.original_max);
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
