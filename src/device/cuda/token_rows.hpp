// The token rows of a table's gradient (token_rows.cu; Backend::rows_*: the embedding's part of the
// root's gradient reduction): the rows a list of ids names, packed, added back into a slice, zeroed.
// Launchers as everywhere in device/cuda: device pointers, asynchronous on `stream`, launch checked;
// `dt` the dtype of activations and gathered parameters, fp32 arithmetic, fp32 parameter gradients (+=).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "shardlm/core.hpp"

namespace shardlm::cuda {

void rows_mark_first(const int32_t* ids, size_t m, int32_t* first, size_t rows, cudaStream_t stream);
// slots[i] = m - first[row of ids[i]]: the first occurrence of that row among the m marked ids.
void rows_slots(const int32_t* ids, size_t n, const int32_t* first, size_t m, size_t rows, int32_t* slots,
                cudaStream_t stream);
void rows_pack(const float* table, size_t width, const int32_t* ids, const int32_t* first, size_t m, size_t rows,
               void* out, DType out_dt, cudaStream_t stream);
void rows_unpack_add(const void* in, DType in_dt, size_t width, const int32_t* ids, const int32_t* first, size_t m,
                     size_t rows, float* slice, long long pos, size_t count, cudaStream_t stream);
// Squares (fp64, added to *sum) of the table elements in the slice: the named rows' or the others'.
void rows_sum_squares(size_t width, const int32_t* ids, const int32_t* first, size_t m, size_t rows, const float* slice,
                      long long pos, size_t count, bool named, double* sum, cudaStream_t stream);
void rows_zero(float* table, size_t width, const int32_t* ids, size_t m, size_t rows, cudaStream_t stream);

}  // namespace shardlm::cuda
