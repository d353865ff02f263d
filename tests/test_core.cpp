// Tests of core: 16-bit conversions against their definitions, buffer accounting, input-file checks.
#define BOOST_TEST_MODULE test_core
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include "shardlm/core.hpp"

using namespace shardlm;

BOOST_AUTO_TEST_CASE(bf16_rounds_to_nearest_even) {
  BOOST_TEST(float_to_bf16(1.0f) == 0x3f80);
  BOOST_TEST(bf16_to_float(0x3f80) == 1.0f);
  // 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  BOOST_TEST(bf16_to_float(float_to_bf16(1.0f + std::ldexp(1.0f, -8))) == 1.0f);
  // 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even): rounds up to 1 + 2^-6.
  BOOST_TEST(bf16_to_float(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8))) == 1.0f + std::ldexp(1.0f, -6));
  BOOST_TEST(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  BOOST_TEST(std::isinf(bf16_to_float(float_to_bf16(std::numeric_limits<float>::infinity()))));
  // bf16 keeps 8 significant bits: the relative rounding error is at most 2^-8.
  for (float x = -1000.f; x < 1000.f; x += 0.37f) {
    float r = round_to(DType::BF16, x);
    BOOST_TEST(std::fabs(r - x) <= std::fabs(x) * std::ldexp(1.0f, -8) + 1e-30f);
  }
}

BOOST_AUTO_TEST_CASE(fp16_matches_ieee_half) {
  BOOST_TEST(float_to_fp16(1.0f) == 0x3c00);
  BOOST_TEST(float_to_fp16(-2.0f) == 0xc000);
  BOOST_TEST(float_to_fp16(65504.0f) == 0x7bff);          // largest finite half
  BOOST_TEST(float_to_fp16(65520.0f) == 0x7c00);          // rounds to inf
  BOOST_TEST(float_to_fp16(std::ldexp(1.0f, -24)) == 0x0001);  // smallest subnormal
  BOOST_TEST(float_to_fp16(std::ldexp(1.0f, -26)) == 0x0000);  // underflows to zero
  BOOST_TEST(fp16_to_float(0x0001) == std::ldexp(1.0f, -24));
  BOOST_TEST(fp16_to_float(0x3555) == 0.333251953125f);
  BOOST_TEST(std::isnan(fp16_to_float(float_to_fp16(std::numeric_limits<float>::quiet_NaN()))));
  // Every finite half value survives the round trip exactly.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    uint16_t v = static_cast<uint16_t>(h);
    if (((v >> 10) & 0x1f) == 0x1f) continue;
    BOOST_TEST_REQUIRE(float_to_fp16(fp16_to_float(v)) == v);
  }
  // Ties to even: 1 + 2^-11 lies halfway between 1 and 1 + 2^-10.
  BOOST_TEST(fp16_to_float(float_to_fp16(1.0f + std::ldexp(1.0f, -11))) == 1.0f);
}

BOOST_AUTO_TEST_CASE(pack_and_unpack) {
  float src[4] = {0.1f, -3.5f, 1e-3f, 7.0f};
  uint16_t packed[4];
  float back[4];
  pack16(DType::BF16, src, packed, 4);
  unpack16(DType::BF16, packed, back, 4);
  for (int i = 0; i < 4; ++i) BOOST_TEST(back[i] == round_to(DType::BF16, src[i]));
  BOOST_CHECK_THROW(parse_dtype("fp8"), Error);
  BOOST_TEST(dtype_name(parse_dtype("bf16")) == std::string("bf16"));
}

BOOST_AUTO_TEST_CASE(buffers_are_accounted) {
  const size_t before = memory_stats().total_current;
  memory_reset_peak();
  {
    Buffer<float> a(1000, MemKind::Params);
    Buffer<float> b(500, MemKind::Grads);
    BOOST_TEST(memory_stats().total_current == before + 6000);
    BOOST_TEST(a[999] == 0.0f);  // zero-initialised
    Buffer<float> c(std::move(a));
    BOOST_TEST(memory_stats().total_current == before + 6000);
    BOOST_TEST(a.size() == 0u);
  }
  BOOST_TEST(memory_stats().total_current == before);
  BOOST_TEST(memory_stats().total_peak == before + 6000);
  BOOST_TEST(format_bytes(1536) == "1.50 KiB");
}

// Input files: regular files under a limit, refused by name otherwise; long values clipped in messages.
BOOST_AUTO_TEST_CASE(input_files_are_checked_before_reading) {
  auto error_of = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "<no error>";
  };
  const std::string dir = std::filesystem::temp_directory_path() / ("shardlm_core_files_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string file = dir + "/deck.ini";
  { std::ofstream(file) << "[train]\nlr = 1\n"; }
  BOOST_TEST(read_input_file(file, "input deck", kMaxDeckBytes) == "[train]\nlr = 1\n");
  BOOST_TEST(error_of([&] { read_input_file(dir + "/none.ini", "input deck", 100); }) ==
             "cannot open input deck '" + dir + "/none.ini'");
  BOOST_TEST(error_of([&] { read_input_file(dir, "input deck", 100); }).find("it is a directory") != std::string::npos);
  BOOST_TEST(error_of([&] { read_input_file("/dev/zero", "data file", 100); }).find("not a regular file") !=
             std::string::npos);
  BOOST_TEST(error_of([&] { read_input_file(file, "input deck", 4); }).find("more than the limit of 4 bytes") !=
             std::string::npos);
  std::filesystem::remove_all(dir);

  BOOST_TEST(clip_for_message("short") == "short");
  const std::string clipped = clip_for_message(std::string(5000, 'x'));
  BOOST_TEST(clipped == std::string(200, 'x') + "... (5000 characters)");
  BOOST_TEST(clip_for_message(std::string(12, 'y'), 10) == std::string(10, 'y') + "... (12 characters)");
}
