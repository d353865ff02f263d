// Dtype names and the fp32 <-> bf16 / fp16 conversions the mixed-precision paths rely on.
#include <cmath>

#include "shardlm/core.hpp"

namespace shardlm {

const char* dtype_name(DType t) { return by_dtype(t, "fp32", "bf16", "fp16"); }

DType parse_dtype(const std::string& name) {
  if (name == "fp32" || name == "float32") return DType::F32;
  if (name == "bf16" || name == "bfloat16") return DType::BF16;
  if (name == "fp16" || name == "float16") return DType::F16;
  throw Error(concat("unknown dtype '", name, "' (expected fp32, bf16 or fp16)"));
}

size_t dtype_size(DType t) { return by_dtype<size_t>(t, 4, 2, 2); }

static uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
static float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t float_to_bf16(float f) {
  uint32_t u = bits_of(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

float bf16_to_float(uint16_t h) { return float_of(static_cast<uint32_t>(h) << 16); }

uint16_t float_to_fp16(float f) {
  uint32_t u = bits_of(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t mag = u & 0x7fffffffu;
  if (mag > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (mag >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (mag < 0x38800000u) {
    // Subnormal or zero in fp16: scale to an integer count of 2^-24 and round to nearest even.
    float a = float_of(mag);
    float scaled = a * 16777216.0f;  // 2^24
    float r = std::nearbyint(scaled);  // default rounding mode is nearest-even
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(r));
  }
  uint32_t exp = ((mag >> 23) - 112u) << 10;  // rebias 127 -> 15
  uint32_t mant = mag & 0x7fffffu;
  uint32_t h = exp | (mant >> 13);
  uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h += 1;  // carry may bump the exponent
  return static_cast<uint16_t>(sign | h);
}

float fp16_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    float v = static_cast<float>(mant) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  if (exp == 31) return float_of(sign | 0x7f800000u | (mant << 13));
  return float_of(sign | ((exp + 112u) << 23) | (mant << 13));
}

float round_to(DType t, float f) {
  switch (t) {
    case DType::F32: return f;
    case DType::BF16: return bf16_to_float(float_to_bf16(f));
    case DType::F16: return fp16_to_float(float_to_fp16(f));
  }
  return f;
}

void round_to(DType t, float* data, size_t n) {
  if (t == DType::F32) return;
  for (size_t i = 0; i < n; ++i) data[i] = round_to(t, data[i]);
}

// dst[i] = convert(src[i]) for i < n with t's conversion, kBf16 or kFp16.
template <auto kBf16, auto kFp16, typename Src, typename Dst>
static void convert16(DType t, const char* caller, const Src* src, Dst* dst, size_t n) {
  SHARDLM_CHECK(t != DType::F32, caller, " needs a 16-bit dtype");
  if (t == DType::BF16)
    for (size_t i = 0; i < n; ++i) dst[i] = kBf16(src[i]);
  else
    for (size_t i = 0; i < n; ++i) dst[i] = kFp16(src[i]);
}

void pack16(DType t, const float* src, uint16_t* dst, size_t n) {
  convert16<float_to_bf16, float_to_fp16>(t, "pack16", src, dst, n);
}

void unpack16(DType t, const uint16_t* src, float* dst, size_t n) {
  convert16<bf16_to_float, fp16_to_float>(t, "unpack16", src, dst, n);
}

}  // namespace shardlm
