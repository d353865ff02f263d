// E4M3 copies of 16-bit matrices with per-tensor current scaling, for the FP8 GEMMs (fp8_cast.cu).
// Launchers as everywhere in device/cuda: device pointers, asynchronous on `stream`, launch checked.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "shardlm/core.hpp"

namespace shardlm::cuda {

// E4M3's largest finite value: a tensor's amax is scaled onto it.
constexpr float kFp8E4M3Max = 448.0f;

// The row-major [rows, cols] matrix x (row stride ld elements, dtype dt: BF16 or F16) in E4M3 with one
// scale for the whole tensor from its current amax = max |x|: q = sat(x * 448 / amax) (scale 1 when
// amax is 0; an inf or NaN in x makes amax inf or NaN, and the copy then holds NaN, so the step's
// non-finite check sees it). Writes `out` [rows, cols] and/or `out_t` [cols, rows] (the transpose;
// either may be null) and *inv_scale = amax / 448 (1 when amax is 0), the factor the GEMM multiplies
// back. `amax_bits` is one unsigned of scratch (the bits of |x| reduced with atomicMax); with `amax_known`
// it already holds the bits of x's amax (one taken earlier from the same bits of x) and is only read:
// no reduction, the same copy.
void fp8_quantize(const void* x, int rows, int cols, int ld, DType dt, uint8_t* out, uint8_t* out_t, float* inv_scale,
                  unsigned* amax_bits, cudaStream_t stream, bool amax_known = false);

// The value of an E4M3 byte (for tests and the host reference).
float fp8_e4m3_to_float(uint8_t v);

}  // namespace shardlm::cuda
