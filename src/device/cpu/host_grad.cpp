// Offload's host gradients: a reduced slice (fp32, or 16-bit as it left the GPU) summed into the fp32
// accumulation in host memory, with the sum of squares of the result in the same pass, over fixed
// pieces shared by the threads so that any thread count gives the same bits.
#include <algorithm>
#include <cstring>
#include <vector>

#include "host_pool.hpp"
#include "shardlm/device.hpp"

namespace shardlm {
namespace {

// Lanes of the per-piece sum of squares: independent fp64 partial sums the compiler can vectorise,
// added in a fixed order at the end of the piece.
constexpr int kLanes = 8;

double lanes_total(const double* s) {
  double t = 0.0;
  for (int k = 0; k < kLanes; ++k) t += s[k];
  return t;
}

// acc[0, n) (+)= the fp32 values of `in` (already converted), squares summed when asked.
template <bool Overwrite, bool Squares>
double add_fp32(float* acc, const float* in, size_t n) {
  double s[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int k = 0; k < kLanes; ++k) {
      const float v = Overwrite ? 0.0f + in[i + k] : acc[i + k] + in[i + k];
      acc[i + k] = v;
      if (Squares) s[k] += static_cast<double>(v) * v;
    }
  for (; i < n; ++i) {
    const float v = Overwrite ? 0.0f + in[i] : acc[i] + in[i];
    acc[i] = v;
    if (Squares) s[0] += static_cast<double>(v) * v;
  }
  return Squares ? lanes_total(s) : 0.0;
}

template <bool Overwrite, bool Squares>
double add_bf16(float* acc, const uint16_t* in, size_t n) {
  double s[kLanes] = {};
  auto value = [](uint16_t h) {
    const uint32_t u = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &u, sizeof(f));
    return f;
  };
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int k = 0; k < kLanes; ++k) {
      const float v = Overwrite ? 0.0f + value(in[i + k]) : acc[i + k] + value(in[i + k]);
      acc[i + k] = v;
      if (Squares) s[k] += static_cast<double>(v) * v;
    }
  for (; i < n; ++i) {
    const float v = Overwrite ? 0.0f + value(in[i]) : acc[i] + value(in[i]);
    acc[i] = v;
    if (Squares) s[0] += static_cast<double>(v) * v;
  }
  return Squares ? lanes_total(s) : 0.0;
}

// One piece [begin, end): fp16 goes through a converted copy (unpack16), the others in place.
double accumulate_piece(float* acc, const void* in, DType dtype, size_t begin, size_t end, bool overwrite,
                        bool squares, std::vector<float>& scratch) {
  const size_t n = end - begin;
  float* a = acc + begin;
  const float* f32 = nullptr;
  if (dtype == DType::BF16) {
    const uint16_t* h = static_cast<const uint16_t*>(in) + begin;
    if (overwrite) return squares ? add_bf16<true, true>(a, h, n) : add_bf16<true, false>(a, h, n);
    return squares ? add_bf16<false, true>(a, h, n) : add_bf16<false, false>(a, h, n);
  }
  if (dtype == DType::F16) {
    scratch.resize(n);
    unpack16(dtype, static_cast<const uint16_t*>(in) + begin, scratch.data(), n);
    f32 = scratch.data();
  } else {
    f32 = static_cast<const float*>(in) + begin;
  }
  if (overwrite) return squares ? add_fp32<true, true>(a, f32, n) : add_fp32<true, false>(a, f32, n);
  return squares ? add_fp32<false, true>(a, f32, n) : add_fp32<false, false>(a, f32, n);
}

// Runs piece(i, scratch) for every piece index over `threads` threads (the caller's among them).
// `scratch` is the running thread's own (16-bit slices are widened into it), kept between calls.
template <typename Piece>
void over_pieces(size_t pieces, int threads, Piece piece) {
  host_parallel_for(pieces, threads, [&](size_t i) {
    thread_local std::vector<float> scratch;
    piece(i, scratch);
  });
}

}  // namespace

void host_accumulate_grad(float* acc, const void* in, DType dtype, size_t n, bool overwrite, double* sum_squares,
                          int threads) {
  SHARDLM_CHECK(dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16,
                "host_accumulate_grad: no path for ", dtype_name(dtype));
  const size_t pieces = (n + kHostAdamWPiece - 1) / kHostAdamWPiece;
  std::vector<double> sums(pieces, 0.0);
  const bool squares = sum_squares != nullptr;
  over_pieces(pieces, threads, [&](size_t i, std::vector<float>& scratch) {
    const size_t begin = i * kHostAdamWPiece, end = std::min(n, begin + kHostAdamWPiece);
    sums[i] = accumulate_piece(acc, in, dtype, begin, end, overwrite, squares, scratch);
  });
  if (!squares) return;
  double total = 0.0;
  for (double s : sums) total += s;
  *sum_squares = total;
}

double host_sum_squares(const float* x, size_t n, int threads) {
  const size_t pieces = (n + kHostAdamWPiece - 1) / kHostAdamWPiece;
  std::vector<double> sums(pieces, 0.0);
  over_pieces(pieces, threads, [&](size_t i, std::vector<float>&) {
    const size_t begin = i * kHostAdamWPiece, end = std::min(n, begin + kHostAdamWPiece);
    double s[kLanes] = {};
    size_t j = begin;
    for (; j + kLanes <= end; j += kLanes)
      for (int k = 0; k < kLanes; ++k) s[k] += static_cast<double>(x[j + k]) * x[j + k];
    for (; j < end; ++j) s[0] += static_cast<double>(x[j]) * x[j];
    sums[i] = lanes_total(s);
  });
  double total = 0.0;
  for (double s : sums) total += s;
  return total;
}

}  // namespace shardlm
