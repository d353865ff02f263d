// Token embedding lookup and its gradient: one warp per token row, grid-stride over rows.
//
// The forward copies raw rows (no conversion) in 16-byte packs when H and the pointers allow. The
// backward scatter-adds into the fp32 table gradient with one atomic per element; a warp's atomics
// cover consecutive addresses so each instruction touches whole 128-byte lines.
#include "embedding.hpp"
#include "warp_rows.cuh"

namespace shardlm::cuda {
namespace {

// A bad id reads row 0 rather than out of bounds (the data module never produces one).
__device__ __forceinline__ long long clamp_token(int32_t token, int V) {
  return (token >= 0 && token < V) ? token : 0;
}

// W is a raw element word (unsigned short / unsigned int): the copy does not look at the values.
template <typename W, int N>
__global__ void embedding_forward_kernel(const int32_t* __restrict__ tokens, const W* __restrict__ table,
                                         W* __restrict__ out, int n, int H, int V) {
  const int lane = threadIdx.x % 32;
  const int packs = H / N;
  for_warp_rows(n, [&](long long row) {
    const W* src = table + clamp_token(tokens[row], V) * H;
    W* dst = out + row * H;
    for (int p = lane; p < packs; p += 32) store_pack<N>(dst + p * N, load_pack<N>(src + p * N));
  });
}

template <typename T>
__global__ void embedding_backward_kernel(const int32_t* __restrict__ tokens, const T* __restrict__ dout,
                                          float* __restrict__ dtable, int n, int H, int V) {
  const int lane = threadIdx.x % 32;
  for_warp_rows(n, [&](long long row) {
    float* dst = dtable + clamp_token(tokens[row], V) * H;
    const T* src = dout + row * H;
    // Unrolled by 4 so that each lane has several loads in flight before its atomics.
    int c = lane;
    for (; c + 96 < H; c += 128) {
      const float v0 = to_float(src[c]), v1 = to_float(src[c + 32]);
      const float v2 = to_float(src[c + 64]), v3 = to_float(src[c + 96]);
      atomicAdd(dst + c, v0);
      atomicAdd(dst + c + 32, v1);
      atomicAdd(dst + c + 64, v2);
      atomicAdd(dst + c + 96, v3);
    }
    for (; c < H; c += 32) atomicAdd(dst + c, to_float(src[c]));
  });
}

template <typename W>
void launch_forward(const int32_t* tokens, const void* table, void* out, int n, int H, int V, cudaStream_t stream) {
  constexpr int N = vec_width<W>();
  const W* src = static_cast<const W*>(table);
  W* dst = static_cast<W*>(out);
  if (H % N == 0 && is_aligned(table, 16) && is_aligned(out, 16))
    embedding_forward_kernel<W, N><<<warp_row_blocks(n), kRowThreads, 0, stream>>>(tokens, src, dst, n, H, V);
  else
    embedding_forward_kernel<W, 1><<<warp_row_blocks(n), kRowThreads, 0, stream>>>(tokens, src, dst, n, H, V);
  SHARDLM_CUDA_LAUNCH_CHECK();
}

}  // namespace

void embedding_forward(const int32_t* tokens, const void* table, void* out, int n, int H, int V, DType dt,
                       cudaStream_t stream) {
  SHARDLM_CHECK(n >= 0, "embedding_forward: negative token count ", n);
  if (n == 0) return;
  SHARDLM_CHECK(H > 0 && V > 0, "embedding_forward: bad shape n=", n, " H=", H, " V=", V);
  if (dtype_size(dt) == 4)
    launch_forward<unsigned int>(tokens, table, out, n, H, V, stream);
  else
    launch_forward<unsigned short>(tokens, table, out, n, H, V, stream);
}

void embedding_backward(const int32_t* tokens, const void* dout, float* dtable, int n, int H, int V, DType dt,
                        cudaStream_t stream) {
  SHARDLM_CHECK(n >= 0, "embedding_backward: negative token count ", n);
  if (n == 0) return;
  SHARDLM_CHECK(H > 0 && V > 0, "embedding_backward: bad shape n=", n, " H=", H, " V=", V);
  dispatch_dtype(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    embedding_backward_kernel<T><<<warp_row_blocks(n), kRowThreads, 0, stream>>>(
        tokens, static_cast<const T*>(dout), dtable, n, H, V);
    SHARDLM_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace shardlm::cuda
