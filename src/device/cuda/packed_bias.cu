// The additive mask cuDNN's fused attention takes for packed rows (data.packing): bias[b, i, j] = 0
// where key j lies in query i's sample (j >= starts[b, i]; the causal mask handles j > i) and in its
// sliding window if any (j > i - window: the window is folded in here, as cuDNN's graphs with a bias
// take no window of their own), the dtype's lowest finite value elsewhere, so the softmax gives those
// keys exactly 0.
#include "dtype_cuda.cuh"
#include "packed_bias.hpp"

namespace shardlm::cuda {
namespace {

template <typename T>
__global__ void packed_attention_bias_kernel(const int32_t* __restrict__ starts, T* bias, long long rows, int seq,
                                             int window, float masked) {
  const long long items = rows * seq;
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long e = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; e < items; e += stride) {
    const long long row = e / seq;  // b * seq + i
    const int i = static_cast<int>(row % seq), j = static_cast<int>(e % seq);
    const bool kept = j >= starts[row] && (window <= 0 || j > i - window);
    bias[e] = from_float<T>(kept ? 0.0f : masked);
  }
}

}  // namespace

void packed_attention_bias(const int32_t* starts, int B, int T, int window, void* bias, DType dt, cudaStream_t stream) {
  SHARDLM_CHECK(B >= 0 && T >= 0 && window >= 0 && dt != DType::F32, "packed_attention_bias: B=", B, " T=", T,
                " window=", window, " in ", dtype_name(dt), " (bf16 or fp16)");
  if (B == 0 || T == 0) return;
  const long long rows = static_cast<long long>(B) * T;
  const size_t items = static_cast<size_t>(rows) * T;
  dispatch_dtype(dt, [&](auto tag) {
    using E = typename decltype(tag)::type;
    // bf16 holds fp32's range; fp16's lowest finite value is -65504.
    const float masked = dt == DType::BF16 ? -3.0e38f : -65504.0f;
    packed_attention_bias_kernel<E><<<grid_for(items), kBlockThreads, 0, stream>>>(starts, static_cast<E*>(bias), rows,
                                                                                   T, window, masked);
  });
  SHARDLM_CUDA_LAUNCH_CHECK();
}

}  // namespace shardlm::cuda
