// RMSNorm forward and backward over rows (rmsnorm.cu).
// Launchers as everywhere in device/cuda: device pointers, asynchronous on `stream`, launch checked;
// `dt` the dtype of activations and gathered parameters, fp32 arithmetic, fp32 parameter gradients (+=).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "shardlm/core.hpp"

namespace shardlm::cuda {

// y = x * rstd * weight over rows of H, rstd = 1 / sqrt(mean(x^2) + eps); saves rstd (fp32, [n]). With
// weight_offset (Gemma's 1) the weight is weight_offset + weight, in fp32, in both directions. `amax_bits`, when
// not null: one word, zeroed, then given the bits of y's amax as stored, for the FP8 GEMM that reads y next
// (MatMul::fp8_forward_x_amax; as swiglu.hpp's).
void rmsnorm_forward(const void* x, const void* weight, void* y, float* rstd, int n, int H, float eps, DType dt,
                     cudaStream_t stream, float weight_offset = 0.0f, unsigned* amax_bits = nullptr);
// dx (+)= rstd * (g - xhat * mean(g * xhat)) with g = dy * weight, xhat = x * rstd (dx += when
// accumulate_dx, which adds the residual branch's gradient); dweight += sum_rows(dy * xhat) in fp32
// (null: a frozen weight, dx only).
void rmsnorm_backward(const void* dy, const void* x, const void* weight, const float* rstd, void* dx, float* dweight,
                      int n, int H, bool accumulate_dx, DType dt, cudaStream_t stream, float weight_offset = 0.0f);

}  // namespace shardlm::cuda
