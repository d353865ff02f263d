// LoRA dropout on the GPU (dropout_mask.hpp's masks, the CPU models' apply_lora_dropout): a layer's
// dropout(x) written in the compute dtype before its x A^T, and, in the backward, its LoRA input
// gradient masked and added into dx. One block walks whole rows, so a row's sequence and position
// are divided out once; each element's keep decision is one SplitMix64 hash of its coordinates.
#include <algorithm>

#include "dtype_cuda.cuh"
#include "lora_dropout.hpp"

namespace shardlm::cuda {
namespace {

// out[r, c] (= or += with Accumulate) mask.factor(r / seq, r % seq, c) * x[r, c], fp32 arithmetic,
// N elements per access (cols a multiple of N and the pointers aligned when N > 1).
template <typename T, int N, bool Accumulate>
__global__ void lora_dropout_kernel(const T* __restrict__ x, T* out, int rows, int seq, int cols, DropoutMask mask) {
  for (int row = blockIdx.x; row < rows; row += gridDim.x) {
    const uint32_t b = static_cast<uint32_t>(row / seq), t = static_cast<uint32_t>(row % seq);
    const size_t at = static_cast<size_t>(row) * cols;
    for (int c = threadIdx.x * N; c < cols; c += blockDim.x * N) {
      float v[N];
      load_floats<N>(x + at + c, v);
      float o[N] = {};
      if constexpr (Accumulate) load_floats<N>(out + at + c, o);
#pragma unroll
      for (int k = 0; k < N; ++k) {
        // A product then a sum, never contracted to an FMA: the CPU models' values bit for bit in fp32.
        const float dropped = __fmul_rn(v[k], mask.factor(b, t, static_cast<uint32_t>(c + k)));
        if constexpr (Accumulate)
          o[k] = __fadd_rn(o[k], dropped);
        else
          o[k] = dropped;
      }
      store_floats<N>(out + at + c, o);
    }
  }
}

}  // namespace

void lora_dropout(const void* x, void* out, int rows, int seq, int cols, const DropoutMask& mask, bool accumulate,
                  DType dt, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  SHARDLM_CHECK(rows > 0 && seq > 0 && cols > 0 && rows % seq == 0, "lora_dropout: ", rows, " rows of ", cols,
                " columns are not whole sequences of ", seq);
  const unsigned blocks = static_cast<unsigned>(std::min<long long>(rows, static_cast<long long>(sm_count()) * 16));
  dispatch_dtype_packed(dt, cols, {x, out}, [&](auto tag, auto width) {
    using T = typename decltype(tag)::type;
    constexpr int N = decltype(width)::value;
    const T* in = static_cast<const T*>(x);
    T* o = static_cast<T*>(out);
    if (accumulate)
      lora_dropout_kernel<T, N, true><<<blocks, kBlockThreads, 0, stream>>>(in, o, rows, seq, cols, mask);
    else
      lora_dropout_kernel<T, N, false><<<blocks, kBlockThreads, 0, stream>>>(in, o, rows, seq, cols, mask);
  });
  SHARDLM_CUDA_LAUNCH_CHECK();
}

}  // namespace shardlm::cuda
