// Element-wise ops (GELU, add, casts, scale, accumulate), the bias gradient and the two reductions of
// the optimizer step (elementwise.cu).
// Launchers as everywhere in device/cuda: device pointers, asynchronous on `stream`, launch checked;
// `dt` the dtype of activations and gathered parameters, fp32 arithmetic, fp32 parameter gradients (+=).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "shardlm/core.hpp"

namespace shardlm::cuda {

// GELU in the tanh approximation (BLOOM's): y = 0.5 x (1 + tanh(0.79788456 x (1 + 0.044715 x^2))).
void gelu_forward(const void* x, void* y, size_t n, DType dt, cudaStream_t stream);
// dx = dy * gelu'(x).
void gelu_backward(const void* dy, const void* x, void* dx, size_t n, DType dt, cudaStream_t stream);
// out = a + b (out may alias a or b).
void add(const void* a, const void* b, void* out, size_t n, DType dt, cudaStream_t stream);
// dbias[c] += sum over rows r < n of dy[r, c], fp32.
void bias_grad(const void* dy, float* dbias, int n, int cols, DType dt, cudaStream_t stream);
// out[i] = (out_dt) in[i]; in and out may be any of F32, BF16, F16 (round to nearest even).
void cast(const void* in, DType in_dt, void* out, DType out_dt, size_t n, cudaStream_t stream);
// x[i] *= factor (fp32).
void scale(float* x, size_t n, float factor, cudaStream_t stream);
// x[i] = (dt) (x[i] * factor), the product in fp32 (Gemma's embedding scale; factor rounded by the caller).
void scale_values(void* x, size_t n, float factor, DType dt, cudaStream_t stream);
// x[i] += y[i], y in y_dt (F32, BF16 or F16; 16-bit values widen exactly), one fp32 add.
void accumulate(float* x, const void* y, DType y_dt, size_t n, cudaStream_t stream);

// The reductions of the optimizer step.

// *out += sum of x[i]^2 over i < n, in double (fp32 partial sums per block, one atomic per block).
void sum_squares(const float* x, size_t n, double* out, cudaStream_t stream);
// *flag = 1 if any x[i] is inf or NaN (never cleared here).
void check_finite(const void* x, size_t n, DType dt, int* flag, cudaStream_t stream);

}  // namespace shardlm::cuda
