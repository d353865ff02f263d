// The decoding head: rows gathered, their logits, each row's argmax (decode_head.cu).
// Launchers as everywhere in device/cuda: device pointers, asynchronous on `stream`, launch checked;
// `dt` the dtype of activations and gathered parameters, fp32 arithmetic, fp32 parameter gradients (+=).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "gemm.hpp"
#include "shardlm/core.hpp"

namespace shardlm::cuda {

// dst[i, :] = src[rows[i], :] for i < m (rows of H elements in dt).
void gather_rows(const void* src, const int32_t* rows, int m, int H, void* dst, DType dt, cudaStream_t stream);
// out[r] = the index of the largest of x[r, 0..cols) (fp32, row stride cols); the lowest index wins
// ties; NaN never wins (a row of NaN only gives 0).
void argmax_rows(const float* x, int rows, int cols, int32_t* out, cudaStream_t stream);
// The decoding head on m rows of x [m, H] over a [V, H] table (both in dt): logits[i, v] = x[i, :] .
// table[v, :] in fp32. With `logits_out` ([m, V], device) they are written there in one GEMM; else they
// go `chunk` rows at a time through the workspace [chunk, V]. With `next`, next[i] = argmax_v of row i.
void decode_head_rows(Gemm& gemm, const void* x, int m, int H, const void* table, int V, int chunk, float* workspace,
                      int32_t* next, float* logits_out, DType dt, cudaStream_t stream);

}  // namespace shardlm::cuda
