// LayerNorm forward and backward over rows (layernorm.cu).
// Launchers as everywhere in device/cuda: device pointers, asynchronous on `stream`, launch checked;
// `dt` the dtype of activations and gathered parameters, fp32 arithmetic, fp32 parameter gradients (+=).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "shardlm/core.hpp"

namespace shardlm::cuda {

// y = (x - mean) * rstd * gamma + beta over rows of H; saves mean and rstd (fp32, [n]) for backward.
void layernorm_forward(const void* x, const void* gamma, const void* beta, void* y, float* mean, float* rstd,
                       int n, int H, float eps, DType dt, cudaStream_t stream);
// dx = LN backward (dx += when accumulate_dx, which adds the residual branch's gradient);
// dgamma += sum_rows(dy * xhat), dbeta += sum_rows(dy) in fp32; both null: frozen, dx only.
void layernorm_backward(const void* dy, const void* x, const void* gamma, const float* mean, const float* rstd,
                        void* dx, float* dgamma, float* dbeta, int n, int H, bool accumulate_dx, DType dt,
                        cudaStream_t stream);

}  // namespace shardlm::cuda
