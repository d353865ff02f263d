#define BOOST_TEST_MODULE test_cuda_decode
#include <boost/test/unit_test.hpp>
// Tests of the greedy-decoding kernels (label gpu): the key/value cache write and the attention of a
// step's rows over their slots' cached positions (several slots of different lengths, rows of one slot
// attending to each other, stale cache entries past a row's position) against a double-precision host
// reference of BLOOM's ALiBi attention; the row gather; and the argmax of logits rows (ties go to the
// lowest id, also across threads and warps of the kernel).

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "cuda_test_support.hpp"
#include "kernels.hpp"
#include "shardlm/core.hpp"
#include "shardlm/model.hpp"

using namespace shardlm;

namespace {

using namespace cuda_test;

std::vector<float> random_values(size_t n, std::mt19937& rng, DType dt, float scale = 1.0f) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = round_to(dt, normal(rng));
  return v;
}

// A step: rows (slot, position); the cache holds `slots` x `max_len` positions per head.
struct Step {
  int heads, d, slots, max_len;
  std::vector<std::pair<int, int>> rows;
  int H() const { return heads * d; }
  int n() const { return static_cast<int>(rows.size()); }
  size_t cache_size() const { return static_cast<size_t>(slots) * heads * max_len * d; }
  size_t cache_at(int slot, int h, int j, int c) const {
    return ((static_cast<size_t>(slot) * heads + h) * max_len + j) * d + c;
  }
  // Element c of part (0 q, 1 k, 2 v) of head h in row r of qkv [n, 3H].
  size_t qkv_at(int r, int h, int part, int c) const {
    return static_cast<size_t>(r) * 3 * H() + static_cast<size_t>(h) * 3 * d + static_cast<size_t>(part) * d + c;
  }
};

// The cache after the step's writes, and ctx [n, H] in double (bloom_cpu.cpp's attention, one query row).
void reference(const Step& s, const std::vector<float>& slopes, const std::vector<float>& qkv,
               std::vector<float>& keys, std::vector<float>& values, std::vector<double>& ctx) {
  for (int r = 0; r < s.n(); ++r)
    for (int h = 0; h < s.heads; ++h)
      for (int c = 0; c < s.d; ++c) {
        keys[s.cache_at(s.rows[r].first, h, s.rows[r].second, c)] = qkv[s.qkv_at(r, h, 1, c)];
        values[s.cache_at(s.rows[r].first, h, s.rows[r].second, c)] = qkv[s.qkv_at(r, h, 2, c)];
      }
  ctx.assign(static_cast<size_t>(s.n()) * s.H(), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.d));
  for (int r = 0; r < s.n(); ++r) {
    const int slot = s.rows[r].first, last = s.rows[r].second;
    for (int h = 0; h < s.heads; ++h) {
      std::vector<double> score(last + 1);
      double top = -INFINITY;
      for (int j = 0; j <= last; ++j) {
        double dot = 0.0;
        for (int c = 0; c < s.d; ++c)
          dot += static_cast<double>(qkv[s.qkv_at(r, h, 0, c)]) * keys[s.cache_at(slot, h, j, c)];
        score[j] = scale * dot + static_cast<double>(slopes[h]) * j;
        top = std::max(top, score[j]);
      }
      double total = 0.0;
      for (double& x : score) total += (x = std::exp(x - top));
      for (int j = 0; j <= last; ++j)
        for (int c = 0; c < s.d; ++c)
          ctx[static_cast<size_t>(r) * s.H() + static_cast<size_t>(h) * s.d + c] +=
              score[j] / total * values[s.cache_at(slot, h, j, c)];
    }
  }
}

void check_step(const Step& s, DType dt, double tol, unsigned seed) {
  BOOST_TEST_CONTEXT("heads " << s.heads << ", head_dim " << s.d << ", " << s.n() << " rows, " << dtype_name(dt)) {
    std::mt19937 rng(seed);
    const std::vector<float> slopes = alibi_slopes(s.heads);
    const std::vector<float> qkv = random_values(static_cast<size_t>(s.n()) * 3 * s.H(), rng, dt);
    // Every cache entry holds a value, stale ones past a row's position included: the mask must skip them.
    std::vector<float> keys = random_values(s.cache_size(), rng, dt), values = random_values(s.cache_size(), rng, dt);
    std::vector<int32_t> slots, positions;
    for (const auto& [slot, position] : s.rows) slots.push_back(slot), positions.push_back(position);

    DeviceBuffer d_qkv = to_device(qkv, dt), d_keys = to_device(keys, dt), d_values = to_device(values, dt);
    DeviceBuffer d_slots = to_device_raw(slots), d_positions = to_device_raw(positions);
    DeviceBuffer d_slopes = to_device(slopes, DType::F32);
    DeviceBuffer d_ctx(std::max<size_t>(1, static_cast<size_t>(s.n()) * s.H()) * dtype_size(dt));
    cuda::kv_cache_write(d_qkv.get(), d_slots.as<int32_t>(), d_positions.as<int32_t>(), s.n(), s.heads, s.d,
                         s.max_len, d_keys.get(), d_values.get(), dt, nullptr);
    cuda::decode_attention(d_qkv.get(), d_keys.get(), d_values.get(), d_slots.as<int32_t>(),
                           d_positions.as<int32_t>(), s.n(), d_slopes.as<float>(), d_ctx.get(), s.heads, s.d,
                           s.max_len, dt, nullptr);

    std::vector<double> want;
    reference(s, slopes, qkv, keys, values, want);
    // The cache write is a copy: bit-exact, and nothing else changed.
    BOOST_TEST(download(d_keys.get(), keys.size(), dt) == keys, boost::test_tools::per_element());
    BOOST_TEST(download(d_values.get(), values.size(), dt) == values, boost::test_tools::per_element());
    const std::vector<float> got = download(d_ctx.get(), want.size(), dt);
    double worst = 0.0, largest = 0.0;
    for (size_t i = 0; i < want.size(); ++i) {
      worst = std::max(worst, std::abs(got[i] - want[i]));
      largest = std::max(largest, std::abs(want[i]));
    }
    BOOST_TEST(worst <= tol * std::max(largest, 1e-20));
  }
}

// Slot 2 prefills positions 0..6 in one step (each row sees the earlier rows of this step), slot 0
// continues at 9 over its cached 0..8, slot 1 sits at the last position of the cache, slot 3 at 0.
Step mixed_step(int heads, int d, int max_len) {
  Step s{heads, d, 4, max_len, {}};
  for (int j = 0; j < 7; ++j) s.rows.push_back({2, j});
  s.rows.push_back({0, 9});
  s.rows.push_back({1, max_len - 1});
  s.rows.push_back({3, 0});
  return s;
}

// The argmax the kernel must return: the first largest (NaN never wins; a row of NaN gives 0).
std::vector<int32_t> host_argmax(const std::vector<float>& x, int rows, int cols) {
  std::vector<int32_t> out(rows, 0);
  for (int r = 0; r < rows; ++r) {
    float best = -INFINITY;
    int id = -1;
    for (int j = 0; j < cols; ++j) {
      const float v = x[static_cast<size_t>(r) * cols + j];
      if (v > best || (v == best && id < 0)) best = v, id = j;
    }
    out[r] = id < 0 ? 0 : id;
  }
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(device_present) { require_device("test_cuda_decode"); }

BOOST_AUTO_TEST_CASE(decode_attention_matches_reference_fp32) {
  require_device("test_cuda_decode");
  check_step(mixed_step(3, 8, 20), DType::F32, 1e-5, 1);
  check_step(mixed_step(2, 64, 300), DType::F32, 1e-5, 2);   // many keys per warp
  check_step(mixed_step(2, 5, 12), DType::F32, 1e-5, 3);     // odd head_dim: lanes left idle
  check_step(mixed_step(1, 96, 40), DType::F32, 1e-5, 4);    // 3 of 4 registers per lane used
  check_step(mixed_step(2, 160, 33), DType::F32, 1e-5, 5);   // the widest register path
  check_step(Step{4, 16, 1, 1, {{0, 0}}}, DType::F32, 1e-5, 6);  // one row at position 0
}

BOOST_AUTO_TEST_CASE(decode_attention_matches_reference_16bit) {
  require_device("test_cuda_decode");
  // Inputs are representable in the dtype; only the output is rounded (the softmax is fp32).
  check_step(mixed_step(3, 8, 20), DType::BF16, 1e-2, 11);
  check_step(mixed_step(2, 64, 300), DType::BF16, 1e-2, 12);
  check_step(mixed_step(3, 8, 20), DType::F16, 2e-3, 13);
  check_step(mixed_step(2, 128, 50), DType::F16, 2e-3, 14);
}

BOOST_AUTO_TEST_CASE(decode_kernels_reject_bad_shapes_and_launch_nothing_for_no_rows) {
  require_device("test_cuda_decode");
  BOOST_CHECK_THROW(cuda::decode_attention(nullptr, nullptr, nullptr, nullptr, nullptr, 1, nullptr, nullptr, 2, 257,
                                           8, DType::F32, nullptr),
                    Error);  // head_dim above 256
  BOOST_CHECK_THROW(cuda::kv_cache_write(nullptr, nullptr, nullptr, -1, 2, 8, 8, nullptr, nullptr, DType::F32, nullptr),
                    Error);
  BOOST_CHECK_THROW(cuda::argmax_rows(nullptr, 1, 0, nullptr, nullptr), Error);
  // n == 0: nothing is read or written (null pointers would fault otherwise).
  cuda::kv_cache_write(nullptr, nullptr, nullptr, 0, 2, 8, 8, nullptr, nullptr, DType::BF16, nullptr);
  cuda::decode_attention(nullptr, nullptr, nullptr, nullptr, nullptr, 0, nullptr, nullptr, 2, 8, 8, DType::BF16,
                         nullptr);
  cuda::gather_rows(nullptr, nullptr, 0, 8, nullptr, DType::F32, nullptr);
  cuda::argmax_rows(nullptr, 0, 8, nullptr, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
}

BOOST_AUTO_TEST_CASE(gather_rows_copies_the_listed_rows) {
  require_device("test_cuda_decode");
  for (DType dt : {DType::F32, DType::BF16}) {
    std::mt19937 rng(21);
    const int n = 7, H = 13;
    const std::vector<float> src = random_values(static_cast<size_t>(n) * H, rng, dt);
    const std::vector<int32_t> rows = {6, 0, 3, 3};
    DeviceBuffer d_src = to_device(src, dt), d_rows = to_device_raw(rows);
    DeviceBuffer d_dst(rows.size() * H * dtype_size(dt));
    cuda::gather_rows(d_src.get(), d_rows.as<int32_t>(), static_cast<int>(rows.size()), H, d_dst.get(), dt, nullptr);
    std::vector<float> want;
    for (int32_t r : rows) want.insert(want.end(), src.begin() + r * H, src.begin() + (r + 1) * H);
    BOOST_TEST(download(d_dst.get(), want.size(), dt) == want, boost::test_tools::per_element());
  }
}

BOOST_AUTO_TEST_CASE(argmax_takes_the_lowest_id_on_ties) {
  require_device("test_cuda_decode");
  std::mt19937 rng(31);
  const int V = 1000, rows = 8;
  std::vector<float> x = random_values(static_cast<size_t>(rows) * V, rng, DType::F32);
  auto row = [&](int r) { return x.begin() + static_cast<size_t>(r) * V; };
  // Row 0: random. Row 1: a tie within one thread's stride (300, 556), row 2: across warps (37, 900),
  // row 3: across lanes of a warp (40, 41) and a later copy. Row 4: all equal. Row 5: all -inf.
  // Row 6: NaN at 0 and 1, the maximum later. Row 7: NaN only.
  for (int r : {1, 2, 3}) std::fill(row(r), row(r) + V, -1.0f);
  row(1)[556] = row(1)[300] = 5.0f;
  row(2)[900] = row(2)[37] = 5.0f;
  row(3)[41] = row(3)[40] = row(3)[999] = 5.0f;
  std::fill(row(4), row(4) + V, 0.25f);
  std::fill(row(5), row(5) + V, -INFINITY);
  row(6)[0] = row(6)[1] = std::numeric_limits<float>::quiet_NaN();
  row(6)[777] = 100.0f;
  std::fill(row(7), row(7) + V, std::numeric_limits<float>::quiet_NaN());
  const std::vector<int32_t> want = host_argmax(x, rows, V);
  BOOST_TEST_REQUIRE(want[1] == 300);
  BOOST_TEST_REQUIRE(want[2] == 37);
  BOOST_TEST_REQUIRE(want[3] == 40);
  BOOST_TEST_REQUIRE(want[4] == 0);
  BOOST_TEST_REQUIRE(want[6] == 777);
  DeviceBuffer d_x = to_device(x, DType::F32), d_out(rows * sizeof(int32_t));
  cuda::argmax_rows(d_x.as<float>(), rows, V, d_out.as<int32_t>(), nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  BOOST_TEST(from_device_raw<int32_t>(d_out.get(), rows) == want, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(argmax_over_the_bloom_vocabulary) {
  require_device("test_cuda_decode");
  std::mt19937 rng(41);
  const int V = 250880, rows = 3;
  std::vector<float> x = random_values(static_cast<size_t>(rows) * V, rng, DType::F32);
  x[static_cast<size_t>(2) * V + V - 1] = 50.0f;  // the last id
  x[static_cast<size_t>(1) * V + 123456] = x[static_cast<size_t>(1) * V + 200001] = 50.0f;
  const std::vector<int32_t> want = host_argmax(x, rows, V);
  BOOST_TEST_REQUIRE(want[1] == 123456);
  DeviceBuffer d_x = to_device(x, DType::F32), d_out(rows * sizeof(int32_t));
  cuda::argmax_rows(d_x.as<float>(), rows, V, d_out.as<int32_t>(), nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  BOOST_TEST(from_device_raw<int32_t>(d_out.get(), rows) == want, boost::test_tools::per_element());
}
