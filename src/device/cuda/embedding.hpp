// Token embedding lookup and its gradient (embedding.cu).
// Launchers as everywhere in device/cuda: device pointers, asynchronous on `stream`, launch checked;
// `dt` the dtype of activations and gathered parameters, fp32 arithmetic, fp32 parameter gradients (+=).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "shardlm/core.hpp"

namespace shardlm::cuda {

// out[i, :] = table[tokens[i], :] for i < n; table is [V, H] in dt. Token ids outside [0, V) are
// clamped to 0 (the data module never produces them; this keeps a bad id from reading out of bounds).
void embedding_forward(const int32_t* tokens, const void* table, void* out, int n, int H, int V, DType dt,
                       cudaStream_t stream);
// dtable[tokens[i], :] += dout[i, :] (fp32, atomic: repeated tokens add up).
void embedding_backward(const int32_t* tokens, const void* dout, float* dtable, int n, int H, int V, DType dt,
                        cudaStream_t stream);

}  // namespace shardlm::cuda
