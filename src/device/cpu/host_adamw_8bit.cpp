// The host 8-bit AdamW (train.optim = adamw_8bit): AdamW's update in fp32 on each block of kQuantBlock
// elements, its moments kept between steps as one byte per element and one fp32 scale per block. The CUDA
// kernel (src/device/cuda/adamw_8bit.cu) runs the same IEEE fp32 operations in the same order, so both give
// the same bits, and tests/test_optim_8bit.cpp checks this file against a plain reference.
//
// The maps are power laws, not linear: a code step near zero is finer than near the block's largest value,
// so the small moments of a block that also holds large ones keep a value (a linear map would round them
// to zero and, for exp_avg_sq, divide by eps alone):
//   exp_avg     code = round(127 sign(m) sqrt(|m| / scale))   m = sign scale (|code| / 127)^2
//   exp_avg_sq  code = round(255 (v / scale)^(1/4))            v = scale (code / 255)^4
// with scale the block's largest |m| (largest v), rounding to nearest even. The largest element maps to
// code 127 (255) and back to the scale exactly, so dequantising and quantising again gives the same codes
// and scales: checkpoints keep the fp32 values and a resume continues with the same bits.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "adamw_scalars.hpp"
#include "host_pool.hpp"
#include "shardlm/device.hpp"

namespace shardlm {

void quantise_exp_avg(const float* m, size_t n, int8_t* codes, float* scale) {
  float largest = 0.0f;
  for (size_t i = 0; i < n; ++i) largest = std::max(largest, std::fabs(m[i]));
  *scale = largest;
  for (size_t i = 0; i < n; ++i) {
    if (!(largest > 0.0f)) {
      codes[i] = 0;
      continue;
    }
    const float q = std::nearbyint(std::sqrt(std::fabs(m[i]) / largest) * 127.0f);
    codes[i] = static_cast<int8_t>(m[i] < 0.0f ? -q : q);
  }
}

void quantise_exp_avg_sq(const float* v, size_t n, uint8_t* codes, float* scale) {
  float largest = 0.0f;
  for (size_t i = 0; i < n; ++i) largest = std::max(largest, v[i]);
  *scale = largest;
  for (size_t i = 0; i < n; ++i)
    codes[i] = largest > 0.0f ? static_cast<uint8_t>(std::nearbyint(std::sqrt(std::sqrt(v[i] / largest)) * 255.0f)) : 0;
}

void dequantise_exp_avg(const int8_t* codes, float scale, size_t n, float* m) {
  for (size_t i = 0; i < n; ++i) {
    const float t = static_cast<float>(codes[i] < 0 ? -codes[i] : codes[i]) / 127.0f;
    const float value = scale * (t * t);
    m[i] = codes[i] < 0 ? -value : value;
  }
}

void dequantise_exp_avg_sq(const uint8_t* codes, float scale, size_t n, float* v) {
  for (size_t i = 0; i < n; ++i) {
    const float t = static_cast<float>(codes[i]) / 255.0f;
    const float t2 = t * t;
    v[i] = scale * (t2 * t2);
  }
}

namespace {

using Scalars = AdamWScalars;
inline Scalars scalars_of(const AdamWHyper& h, double weight_decay) { return adamw_scalars(h, weight_decay); }

// The decay factor of each element of [begin, begin + n) of the range: 1 inside a no-decay range.
void decay_factors(const AdamW8bitRange& r, size_t begin, size_t n, float decay, float* out) {
  std::fill(out, out + n, decay);
  const size_t lo = r.position + begin, hi = lo + n;
  for (size_t j = 0; j < r.no_decay_count; ++j) {
    const size_t a = std::max<size_t>(r.no_decay[2 * j], lo), b = std::min<size_t>(r.no_decay[2 * j + 1], hi);
    for (size_t k = a; k < b; ++k) out[k - lo] = 1.0f;
  }
}

void update_block(const AdamW8bitRange& r, size_t block, const Scalars& s, DType out_dtype) {
  const size_t begin = block * kQuantBlock, n = std::min(kQuantBlock, r.numel - begin);
  float m[kQuantBlock], v[kQuantBlock], decay[kQuantBlock];
  dequantise_exp_avg(r.exp_avg + begin, r.exp_avg_scale[block], n, m);
  dequantise_exp_avg_sq(r.exp_avg_sq + begin, r.exp_avg_sq_scale[block], n, v);
  decay_factors(r, begin, n, s.decay, decay);
  float* p = r.param + begin;
  const float* g = r.grad + begin;
  // AdamW's element in the kernel's order (host_adamw.cpp's update_one): decay, the moments, the step.
  for (size_t i = 0; i < n; ++i) {
    const float gk = g[i] * s.grad_scale;
    p[i] *= decay[i];
    m[i] += s.one_minus_beta1 * (gk - m[i]);
    v[i] = v[i] * s.beta2 + s.one_minus_beta2 * gk * gk;
    const float denom = std::sqrt(v[i]) / s.sqrt_correction2 + s.eps;
    p[i] -= s.step_size * (m[i] / denom);
  }
  quantise_exp_avg(m, n, r.exp_avg + begin, r.exp_avg_scale + block);
  quantise_exp_avg_sq(v, n, r.exp_avg_sq + begin, r.exp_avg_sq_scale + block);
  if (!r.param_out) return;
  if (out_dtype == DType::F32)
    std::memcpy(static_cast<float*>(r.param_out) + begin, p, n * sizeof(float));
  else
    pack16(out_dtype, p, static_cast<uint16_t*>(r.param_out) + begin, n);
}

}  // namespace

void host_adamw_8bit(const std::vector<AdamW8bitRange>& ranges, const AdamWHyper& h, int threads) {
  SHARDLM_CHECK(h.step >= 1, "host 8-bit AdamW: the step count starts at 1 (got ", h.step, ")");
  // Pieces of whole blocks, kHostAdamWPiece elements at most, as host_adamw spreads its work.
  constexpr size_t kBlocksPerPiece = kHostAdamWPiece / kQuantBlock;
  struct Piece {
    size_t range, first, last;  // blocks [first, last)
  };
  std::vector<Piece> pieces;
  std::vector<Scalars> scalars;
  for (size_t r = 0; r < ranges.size(); ++r) {
    scalars.push_back(scalars_of(h, ranges[r].weight_decay));
    const size_t blocks = (ranges[r].numel + kQuantBlock - 1) / kQuantBlock;
    for (size_t b = 0; b < blocks; b += kBlocksPerPiece) pieces.push_back({r, b, std::min(blocks, b + kBlocksPerPiece)});
  }
  host_parallel_for(pieces.size(), threads, [&](size_t i) {
    const Piece& p = pieces[i];
    for (size_t b = p.first; b < p.last; ++b) update_block(ranges[p.range], b, scalars[p.range], h.out_dtype);
  });
}

}  // namespace shardlm
