// The token rows of a table's gradient (the FSDP engine's reduction of the embedding's part of the root):
// which rows a list of token ids names, those rows packed into one buffer, the packed rows added back
// into a slice, and the rows zeroed. One warp per listed id, grid-stride over the list; an id outside
// [0, rows) names row 0, as the embedding kernels read and write it.
#include "token_rows.hpp"
#include "warp_rows.cuh"

namespace shardlm::cuda {
namespace {

__device__ __forceinline__ long long row_of(int32_t id, size_t rows) {
  return (id >= 0 && static_cast<size_t>(id) < rows) ? id : 0;
}

// first[row] = max over k naming it of (m - k): the lowest k wins.
__global__ void mark_first_kernel(const int32_t* __restrict__ ids, size_t m, int32_t* __restrict__ first, size_t rows) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t k = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < m; k += stride)
    atomicMax(first + row_of(ids[k], rows), static_cast<int32_t>(m - k));
}

__device__ __forceinline__ bool is_first(const int32_t* first, const int32_t* ids, long long k, size_t m, size_t rows) {
  return first[row_of(ids[k], rows)] == static_cast<int32_t>(m - static_cast<size_t>(k));
}

__global__ void slots_kernel(const int32_t* __restrict__ ids, size_t n, const int32_t* __restrict__ first, size_t m,
                             size_t rows, int32_t* __restrict__ slots) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    slots[i] = static_cast<int32_t>(m) - first[row_of(ids[i], rows)];
}

template <typename Out>
__global__ void pack_kernel(const float* __restrict__ table, size_t width, const int32_t* __restrict__ ids,
                            const int32_t* __restrict__ first, size_t m, size_t rows, Out* __restrict__ out) {
  const int lane = threadIdx.x % 32;
  for_warp_rows(static_cast<int>(m), [&](long long k) {
    Out* dst = out + static_cast<size_t>(k) * width;
    if (is_first(first, ids, k, m, rows)) {
      const float* src = table + static_cast<size_t>(row_of(ids[k], rows)) * width;
      for (size_t c = lane; c < width; c += 32) dst[c] = from_float<Out>(src[c]);
    } else {
      for (size_t c = lane; c < width; c += 32) dst[c] = from_float<Out>(0.0f);
    }
  });
}

template <typename In>
__global__ void unpack_add_kernel(const In* __restrict__ in, size_t width, const int32_t* __restrict__ ids,
                                  const int32_t* __restrict__ first, size_t m, size_t rows, float* __restrict__ slice,
                                  long long pos, size_t count) {
  const int lane = threadIdx.x % 32;
  for_warp_rows(static_cast<int>(m), [&](long long k) {
    if (!is_first(first, ids, k, m, rows)) return;
    // The row's elements at slice index pos + row * width + c, where that is inside [0, count).
    const long long base = pos + row_of(ids[k], rows) * static_cast<long long>(width);
    const long long lo = base < 0 ? -base : 0;
    const long long hi = std::min<long long>(static_cast<long long>(width), static_cast<long long>(count) - base);
    const In* src = in + static_cast<size_t>(k) * width;
    for (long long c = lo + lane; c < hi; c += 32) slice[base + c] += to_float(src[c]);
  });
}

__global__ void zero_rows_kernel(float* __restrict__ table, size_t width, const int32_t* __restrict__ ids, size_t m,
                                 size_t rows) {
  const int lane = threadIdx.x % 32;
  for_warp_rows(static_cast<int>(m), [&](long long k) {
    float* dst = table + static_cast<size_t>(row_of(ids[k], rows)) * width;
    for (size_t c = lane; c < width; c += 32) dst[c] = 0.0f;
  });
}

// The squares of the table elements a slice holds, in the named rows (Named: one warp per first occurrence)
// or in the others (one warp per row of [row_lo, row_hi) that no id names). fp64 per thread and block, one
// atomic add a block.
template <bool Named>
__global__ void rows_squares_kernel(const float* __restrict__ slice, long long pos, size_t count, size_t width,
                                    const int32_t* __restrict__ ids, const int32_t* __restrict__ first, size_t m,
                                    size_t rows, long long row_lo, long long row_hi, double* sum) {
  const int lane = threadIdx.x % 32;
  double acc = 0.0;
  const int n = static_cast<int>(Named ? static_cast<long long>(m) : row_hi - row_lo);
  for_warp_rows(n, [&](long long k) {
    long long row;
    if constexpr (Named) {
      if (!is_first(first, ids, k, m, rows)) return;
      row = row_of(ids[k], rows);
    } else {
      row = row_lo + k;
      if (first[row] != 0) return;
    }
    const long long base = pos + row * static_cast<long long>(width);
    const long long lo = base < 0 ? -base : 0;
    const long long hi = std::min<long long>(static_cast<long long>(width), static_cast<long long>(count) - base);
    // Four loads in flight a lane.
    long long c = lo + lane;
    for (; c + 96 < hi; c += 128) {
      const float a = slice[base + c], b = slice[base + c + 32], d = slice[base + c + 64], e = slice[base + c + 96];
      acc += static_cast<double>(a * a + b * b) + static_cast<double>(d * d + e * e);
    }
    for (; c < hi; c += 32) acc += static_cast<double>(slice[base + c]) * slice[base + c];
  });
  block_sum_add(acc, sum);
}

}  // namespace

void rows_mark_first(const int32_t* ids, size_t m, int32_t* first, size_t rows, cudaStream_t stream) {
  if (m == 0) return;
  SHARDLM_CHECK(m < static_cast<size_t>(INT32_MAX) && rows > 0, "rows_mark_first: ", m, " ids of ", rows, " rows");
  mark_first_kernel<<<grid_for(m), kBlockThreads, 0, stream>>>(ids, m, first, rows);
  SHARDLM_CUDA_LAUNCH_CHECK();
}

void rows_slots(const int32_t* ids, size_t n, const int32_t* first, size_t m, size_t rows, int32_t* slots,
                cudaStream_t stream) {
  if (n == 0) return;
  SHARDLM_CHECK(m < static_cast<size_t>(INT32_MAX) && rows > 0, "rows_slots: ", m, " marked ids of ", rows, " rows");
  slots_kernel<<<grid_for(n), kBlockThreads, 0, stream>>>(ids, n, first, m, rows, slots);
  SHARDLM_CUDA_LAUNCH_CHECK();
}

void rows_pack(const float* table, size_t width, const int32_t* ids, const int32_t* first, size_t m, size_t rows,
               void* out, DType out_dt, cudaStream_t stream) {
  if (m == 0) return;
  SHARDLM_CHECK(m < static_cast<size_t>(INT32_MAX) && rows > 0, "rows_pack: ", m, " ids of ", rows, " rows");
  dispatch_dtype(out_dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    pack_kernel<T><<<warp_row_blocks(static_cast<int>(m)), kRowThreads, 0, stream>>>(table, width, ids, first, m, rows,
                                                                                    static_cast<T*>(out));
    SHARDLM_CUDA_LAUNCH_CHECK();
  });
}

void rows_unpack_add(const void* in, DType in_dt, size_t width, const int32_t* ids, const int32_t* first, size_t m,
                     size_t rows, float* slice, long long pos, size_t count, cudaStream_t stream) {
  if (m == 0 || count == 0) return;
  SHARDLM_CHECK(m < static_cast<size_t>(INT32_MAX) && rows > 0, "rows_unpack_add: ", m, " ids of ", rows, " rows");
  dispatch_dtype(in_dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    unpack_add_kernel<T><<<warp_row_blocks(static_cast<int>(m)), kRowThreads, 0, stream>>>(
        static_cast<const T*>(in), width, ids, first, m, rows, slice, pos, count);
    SHARDLM_CUDA_LAUNCH_CHECK();
  });
}

void rows_zero(float* table, size_t width, const int32_t* ids, size_t m, size_t rows, cudaStream_t stream) {
  if (m == 0) return;
  SHARDLM_CHECK(m < static_cast<size_t>(INT32_MAX) && rows > 0, "rows_zero: ", m, " ids of ", rows, " rows");
  zero_rows_kernel<<<warp_row_blocks(static_cast<int>(m)), kRowThreads, 0, stream>>>(table, width, ids, m, rows);
  SHARDLM_CUDA_LAUNCH_CHECK();
}

void rows_sum_squares(size_t width, const int32_t* ids, const int32_t* first, size_t m, size_t rows, const float* slice,
                      long long pos, size_t count, bool named, double* sum, cudaStream_t stream) {
  if (count == 0 || rows == 0 || width == 0) return;
  if (named) {
    if (m == 0) return;
    SHARDLM_CHECK(m < static_cast<size_t>(INT32_MAX), "rows_sum_squares: ", m, " ids of ", rows, " rows");
    rows_squares_kernel<true><<<warp_row_blocks(static_cast<int>(m)), kRowThreads, 0, stream>>>(
        slice, pos, count, width, ids, first, m, rows, 0, 0, sum);
    SHARDLM_CUDA_LAUNCH_CHECK();
    return;
  }
  // The rows with an element inside the slice: pos + row * width + width > 0 and pos + row * width < count.
  const long long w = static_cast<long long>(width), n = static_cast<long long>(count);
  const long long lo = std::max(0LL, pos >= 0 ? 0 : (-pos) / w);
  const long long hi = std::min(static_cast<long long>(rows), n - pos <= 0 ? 0 : (n - pos + w - 1) / w);
  if (hi <= lo) return;
  SHARDLM_CHECK(hi - lo < INT32_MAX, "rows_sum_squares: ", hi - lo, " rows");
  rows_squares_kernel<false><<<warp_row_blocks(static_cast<int>(hi - lo)), kRowThreads, 0, stream>>>(
      slice, pos, count, width, ids, first, m, rows, lo, hi, sum);
  SHARDLM_CUDA_LAUNCH_CHECK();
}

}  // namespace shardlm::cuda
