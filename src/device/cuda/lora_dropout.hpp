// LoRA dropout of a layer's input and of its LoRA input gradient (lora_dropout.cu).
// Launchers as everywhere in device/cuda: device pointers, asynchronous on `stream`, launch checked;
// `dt` the dtype of activations and gathered parameters, fp32 arithmetic, fp32 parameter gradients (+=).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "../dropout_mask.hpp"
#include "shardlm/core.hpp"

namespace shardlm::cuda {

// out[r, c] = mask.factor(r / seq, r % seq, c) * x[r, c] over dense rows of `cols` (rows a multiple of
// seq): a layer's dropout(x); with accumulate out[r, c] += that, its LoRA input gradient into dx. fp32
// arithmetic, out rounded once to dt; the same values as the CPU models' apply_lora_dropout.
void lora_dropout(const void* x, void* out, int rows, int seq, int cols, const DropoutMask& mask, bool accumulate,
                  DType dt, cudaStream_t stream);

}  // namespace shardlm::cuda
