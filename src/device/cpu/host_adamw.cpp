// The host AdamW (the optimizer of CPU-offloaded runs and of the CPU backend): the GPU kernel's
// formula (src/device/cuda/adamw.cu) with its float scalars derived the same way, in a scalar,
// an AVX2 and an AVX-512 path chosen at run time, over fixed pieces shared by the threads.
//
// Every path rounds the same IEEE operations in the same order (no FMA: this file is compiled
// with -ffp-contract=off), so the paths and any thread count give the same bits. The scalar path is
// plain C++ that the compiler vectorises for the build's baseline (SSE4.2 with -march=x86-64-v2).
#include <immintrin.h>

#include <algorithm>
#include <iterator>
#include <cmath>
#include <cstring>

#include "adamw_scalars.hpp"
#include "host_pool.hpp"
#include "shardlm/device.hpp"

// GCC 12 warns about the deliberately undefined vectors inside its own AVX-512 intrinsics.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace shardlm {
namespace {

using Scalars = AdamWScalars;
inline Scalars scalars_of(const AdamWHyper& h, double weight_decay) { return adamw_scalars(h, weight_decay); }

// One element, in the kernel's order: decay, the moments (the first as a lerp), then the step.
inline void update_one(float& p, float g, float& m, float& v, const Scalars& s) {
  const float gk = g * s.grad_scale;
  p *= s.decay;
  m += s.one_minus_beta1 * (gk - m);
  v = v * s.beta2 + s.one_minus_beta2 * gk * gk;
  const float denom = std::sqrt(v) / s.sqrt_correction2 + s.eps;
  p -= s.step_size * (m / denom);
}

// The compute-dtype copy of p[begin, end) (the kernel's param_out).
void write_out(const AdamWRange& r, DType out, size_t begin, size_t end) {
  if (!r.param_out || end <= begin) return;
  if (out == DType::F32)
    std::memcpy(static_cast<float*>(r.param_out) + begin, r.param + begin, (end - begin) * sizeof(float));
  else
    pack16(out, r.param + begin, static_cast<uint16_t*>(r.param_out) + begin, end - begin);
}

void update_scalar(const AdamWRange& r, size_t begin, size_t end, const Scalars& s, DType out) {
  for (size_t i = begin; i < end; ++i) update_one(r.param[i], r.grad[i], r.exp_avg[i], r.exp_avg_sq[i], s);
  write_out(r, out, begin, end);
}

// ---- AVX2 (8 floats) ------------------------------------------------------------------------

__attribute__((target("avx2,f16c"))) inline __m256 update8(float* p, const float* g, float* m, float* v,
                                                            const Scalars& s) {
  const __m256 gk = _mm256_mul_ps(_mm256_loadu_ps(g), _mm256_set1_ps(s.grad_scale));
  __m256 pk = _mm256_mul_ps(_mm256_loadu_ps(p), _mm256_set1_ps(s.decay));
  __m256 mk = _mm256_loadu_ps(m);
  mk = _mm256_add_ps(mk, _mm256_mul_ps(_mm256_set1_ps(s.one_minus_beta1), _mm256_sub_ps(gk, mk)));
  __m256 vk = _mm256_loadu_ps(v);
  vk = _mm256_add_ps(_mm256_mul_ps(vk, _mm256_set1_ps(s.beta2)),
                     _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(s.one_minus_beta2), gk), gk));
  const __m256 denom =
      _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vk), _mm256_set1_ps(s.sqrt_correction2)), _mm256_set1_ps(s.eps));
  pk = _mm256_sub_ps(pk, _mm256_mul_ps(_mm256_set1_ps(s.step_size), _mm256_div_ps(mk, denom)));
  _mm256_storeu_ps(p, pk);
  _mm256_storeu_ps(m, mk);
  _mm256_storeu_ps(v, vk);
  return pk;
}

// float_to_bf16 on 8 lanes: round to nearest even, NaN kept quiet.
__attribute__((target("avx2"))) inline __m128i bf16x8(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd)), 16);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                         _mm256_set1_epi32(0x7f800000));
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  const __m256i h = _mm256_blendv_epi8(rounded, quiet, nan);
  // Pack the 32-bit lanes (each < 2^16) to 16 bits; packus works per 128-bit half.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(h, h), 0x08);
  return _mm256_castsi256_si128(packed);
}

__attribute__((target("avx2,f16c"))) void update_avx2(const AdamWRange& r, size_t begin, size_t end,
                                                       const Scalars& s, DType out) {
  size_t i = begin;
  for (; i + 8 <= end; i += 8) {
    const __m256 p = update8(r.param + i, r.grad + i, r.exp_avg + i, r.exp_avg_sq + i, s);
    if (!r.param_out) continue;
    if (out == DType::F32)
      _mm256_storeu_ps(static_cast<float*>(r.param_out) + i, p);
    else if (out == DType::BF16)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(r.param_out) + i), bf16x8(p));
    else
      _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(r.param_out) + i),
                       _mm256_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  update_scalar(r, i, end, s, out);
}

// ---- AVX-512 (16 floats) --------------------------------------------------------------------

__attribute__((target("avx512f"))) void update_avx512(const AdamWRange& r, size_t begin, size_t end,
                                                       const Scalars& s, DType out) {
  const __m512 grad_scale = _mm512_set1_ps(s.grad_scale), decay = _mm512_set1_ps(s.decay);
  const __m512 omb1 = _mm512_set1_ps(s.one_minus_beta1), omb2 = _mm512_set1_ps(s.one_minus_beta2);
  const __m512 beta2 = _mm512_set1_ps(s.beta2), sqrt_c2 = _mm512_set1_ps(s.sqrt_correction2);
  const __m512 eps = _mm512_set1_ps(s.eps), step = _mm512_set1_ps(s.step_size);
  size_t i = begin;
  for (; i + 16 <= end; i += 16) {
    float *p = r.param + i, *m = r.exp_avg + i, *v = r.exp_avg_sq + i;
    const __m512 gk = _mm512_mul_ps(_mm512_loadu_ps(r.grad + i), grad_scale);
    __m512 pk = _mm512_mul_ps(_mm512_loadu_ps(p), decay);
    __m512 mk = _mm512_loadu_ps(m);
    mk = _mm512_add_ps(mk, _mm512_mul_ps(omb1, _mm512_sub_ps(gk, mk)));
    __m512 vk = _mm512_loadu_ps(v);
    vk = _mm512_add_ps(_mm512_mul_ps(vk, beta2), _mm512_mul_ps(_mm512_mul_ps(omb2, gk), gk));
    const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vk), sqrt_c2), eps);
    pk = _mm512_sub_ps(pk, _mm512_mul_ps(step, _mm512_div_ps(mk, denom)));
    _mm512_storeu_ps(p, pk);
    _mm512_storeu_ps(m, mk);
    _mm512_storeu_ps(v, vk);
    if (!r.param_out) continue;
    uint16_t* out16 = static_cast<uint16_t*>(r.param_out) + i;
    if (out == DType::F32) {
      _mm512_storeu_ps(static_cast<float*>(r.param_out) + i, pk);
    } else if (out == DType::BF16) {
      const __m512i u = _mm512_castps_si512(pk);
      const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
      __m512i h = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd)), 16);
      const __mmask16 nan =
          _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
      h = _mm512_mask_mov_epi32(h, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out16), _mm512_cvtepi32_epi16(h));
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out16),
                          _mm512_cvtps_ph(pk, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
  }
  update_scalar(r, i, end, s, out);
}

void update_piece(HostSimd simd, const AdamWRange& r, size_t begin, size_t end, const Scalars& s, DType out) {
  switch (simd) {
    case HostSimd::Avx512: return update_avx512(r, begin, end, s, out);
    case HostSimd::Avx2: return update_avx2(r, begin, end, s, out);
    case HostSimd::Scalar: return update_scalar(r, begin, end, s, out);
  }
}

}  // namespace

const char* host_simd_name(HostSimd simd) {
  static const char* const kNames[] = {"scalar", "avx2", "avx512"};  // in HostSimd's order
  const auto i = static_cast<size_t>(simd);
  return i < std::size(kNames) ? kNames[i] : "?";
}

bool host_simd_available(HostSimd simd) {
  __builtin_cpu_init();
  switch (simd) {
    case HostSimd::Scalar: return true;
    case HostSimd::Avx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
    case HostSimd::Avx512: return __builtin_cpu_supports("avx512f");
  }
  return false;
}

HostSimd host_simd_best() {
  for (HostSimd simd : {HostSimd::Avx512, HostSimd::Avx2})
    if (host_simd_available(simd)) return simd;
  return HostSimd::Scalar;
}

void host_adamw(const std::vector<AdamWRange>& ranges, const AdamWHyper& h, int threads, HostSimd simd) {
  SHARDLM_CHECK(host_simd_available(simd), "host AdamW: this CPU has no ", host_simd_name(simd));
  SHARDLM_CHECK(h.step >= 1, "host AdamW: the step count starts at 1 (got ", h.step, ")");
  std::vector<Scalars> scalars;
  for (const AdamWRange& r : ranges) scalars.push_back(scalars_of(h, r.weight_decay));
  // Pieces of a fixed size (not one per thread), so that threads share a single large range, balance
  // uneven ones, and any thread count updates the same elements with the same instructions.
  struct Piece {
    size_t range, begin, end;
  };
  std::vector<Piece> pieces;
  for (size_t r = 0; r < ranges.size(); ++r)
    for (size_t b = 0; b < ranges[r].numel; b += kHostAdamWPiece)
      pieces.push_back({r, b, std::min(ranges[r].numel, b + kHostAdamWPiece)});
  host_parallel_for(pieces.size(), threads, [&](size_t i) {
    const Piece& p = pieces[i];
    update_piece(simd, ranges[p.range], p.begin, p.end, scalars[p.range], h.out_dtype);
  });
}

}  // namespace shardlm
