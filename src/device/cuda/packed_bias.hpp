// The additive mask of packed rows for cuDNN's fused attention (packed_bias.cu).
// Launchers as everywhere in device/cuda: device pointers, asynchronous on `stream`, launch checked;
// `dt` the dtype of activations and gathered parameters, fp32 arithmetic, fp32 parameter gradients (+=).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "shardlm/core.hpp"

namespace shardlm::cuda {

// The [B, 1, T, T] additive mask (bf16/fp16) of packed rows for cuDNN's fused attention
// (packed_bias.cu): 0 where key j is in query i's sample (j >= starts[b, i]) and, with a sliding window
// (window > 0), inside it (j > i - window), a huge negative value elsewhere; `starts` is device [B*T].
void packed_attention_bias(const int32_t* starts, int B, int T, int window, void* bias, DType dt, cudaStream_t stream);

}  // namespace shardlm::cuda
