#define BOOST_TEST_MODULE test_cuda_decode
#include <boost/test/unit_test.hpp>
// Tests of the greedy-decoding kernels (label gpu): the key/value cache write and the attention of a
// step's rows over their slots' cached positions (several slots of different lengths, rows of one slot
// attending to each other, stale cache entries past a row's position) against a double-precision host
// reference, for BLOOM (interleaved heads, ALiBi) and Llama (rotary at each row's own position, then
// grouped-query heads without ALiBi), Mistral's sliding window over the cached positions; the row gather; and the argmax of logits rows (ties go to the
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
#include "decode_attention.hpp"
#include "decode_head.hpp"
#include "rotary.hpp"
#include "shardlm/core.hpp"
#include "shardlm/model.hpp"

using namespace shardlm;

namespace {

using namespace cuda_test;

// A step: rows (slot, position) over a q|k|v layout; the cache holds `slots` x `max_len` positions
// per kv head.
struct Step {
  cuda::DecodeQkv l;
  int slots, max_len;
  std::vector<std::pair<int, int>> rows;
  int window = 0;  // a sliding window (Mistral): keys j > position - window only; 0: none
  int n() const { return static_cast<int>(rows.size()); }
  int d() const { return l.head_dim; }
  int width() const { return l.heads * l.head_dim; }  // of a ctx row
  size_t qkv_size() const { return static_cast<size_t>(n()) * l.row_stride; }
  size_t cache_size() const { return static_cast<size_t>(slots) * l.kv_heads * max_len * d(); }
  size_t cache_at(int slot, int g, int j, int c) const {
    return ((static_cast<size_t>(slot) * l.kv_heads + g) * max_len + j) * d() + c;
  }
  // Element c of query head h, key head g, value head g of row r in qkv.
  size_t q_at(int r, int h, int c) const {
    return static_cast<size_t>(r) * l.row_stride + static_cast<size_t>(h) * l.head_stride + c;
  }
  size_t k_at(int r, int g, int c) const { return q_at(r, g, c) + l.k_offset; }
  size_t v_at(int r, int g, int c) const { return q_at(r, g, c) + l.v_offset; }
};

// The cache after the step's writes, and ctx [n, heads d] in double (bloom_cpu.cpp's and
// kv_cache.cpp's attention, one query row); query head h reads kv head h / (heads / kv_heads).
// No slopes: no ALiBi. With s.window the keys last - window < j <= last only.
void reference(const Step& s, const std::vector<float>& slopes, const std::vector<float>& qkv,
               std::vector<float>& keys, std::vector<float>& values, std::vector<double>& ctx) {
  const int d = s.d(), group = s.l.heads / s.l.kv_heads;
  for (int r = 0; r < s.n(); ++r)
    for (int g = 0; g < s.l.kv_heads; ++g)
      for (int c = 0; c < d; ++c) {
        keys[s.cache_at(s.rows[r].first, g, s.rows[r].second, c)] = qkv[s.k_at(r, g, c)];
        values[s.cache_at(s.rows[r].first, g, s.rows[r].second, c)] = qkv[s.v_at(r, g, c)];
      }
  ctx.assign(static_cast<size_t>(s.n()) * s.width(), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  for (int r = 0; r < s.n(); ++r) {
    const int slot = s.rows[r].first, last = s.rows[r].second;
    for (int h = 0; h < s.l.heads; ++h) {
      const int g = h / group;
      const double slope = slopes.empty() ? 0.0 : slopes[h];
      const int first = s.window > 0 ? std::max(0, last - s.window + 1) : 0;
      std::vector<double> score(last + 1, 0.0);
      double top = -INFINITY;
      for (int j = first; j <= last; ++j) {
        double dot = 0.0;
        for (int c = 0; c < d; ++c) dot += static_cast<double>(qkv[s.q_at(r, h, c)]) * keys[s.cache_at(slot, g, j, c)];
        score[j] = scale * dot + slope * j;
        top = std::max(top, score[j]);
      }
      double total = 0.0;
      for (int j = first; j <= last; ++j) total += (score[j] = std::exp(score[j] - top));
      for (int j = first; j <= last; ++j)
        for (int c = 0; c < d; ++c)
          ctx[static_cast<size_t>(r) * s.width() + static_cast<size_t>(h) * d + c] +=
              score[j] / total * values[s.cache_at(slot, g, j, c)];
    }
  }
}

// The step's attention on the GPU (cache write, then attention over the cache) against the
// reference: the cache bit-exact, ctx within tol of the largest output.
void check_attention(const Step& s, const std::vector<float>& slopes, const std::vector<float>& qkv,
                     std::vector<float> keys, std::vector<float> values, DType dt, double tol) {
  std::vector<int32_t> slots, positions;
  for (const auto& [slot, position] : s.rows) slots.push_back(slot), positions.push_back(position);
  DeviceBuffer d_qkv = to_device(qkv, dt), d_keys = to_device(keys, dt), d_values = to_device(values, dt);
  DeviceBuffer d_slots = to_device_raw(slots), d_positions = to_device_raw(positions);
  DeviceBuffer d_slopes = to_device(slopes, DType::F32);
  DeviceBuffer d_ctx(std::max<size_t>(1, static_cast<size_t>(s.n()) * s.width()) * dtype_size(dt));
  cuda::kv_cache_write(d_qkv.get(), s.l, d_slots.as<int32_t>(), d_positions.as<int32_t>(), s.n(), s.max_len,
                       d_keys.get(), d_values.get(), dt, nullptr);
  cuda::decode_attention(d_qkv.get(), s.l, d_keys.get(), d_values.get(), d_slots.as<int32_t>(),
                         d_positions.as<int32_t>(), s.n(), slopes.empty() ? nullptr : d_slopes.as<float>(),
                         d_ctx.get(), s.max_len, dt, nullptr, s.window);

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

// BLOOM: interleaved heads, ALiBi.
void check_step(const Step& s, DType dt, double tol, unsigned seed) {
  BOOST_TEST_CONTEXT("heads " << s.l.heads << ", head_dim " << s.d() << ", " << s.n() << " rows, " << dtype_name(dt)) {
    std::mt19937 rng(seed);
    const std::vector<float> qkv = random_values(s.qkv_size(), rng, dt);
    // Every cache entry holds a value, stale ones past a row's position included: the mask must skip them.
    const std::vector<float> keys = random_values(s.cache_size(), rng, dt);
    const std::vector<float> values = random_values(s.cache_size(), rng, dt);
    check_attention(s, alibi_slopes(s.l.heads), qkv, keys, values, dt, tol);
  }
}

// Slot 2 prefills positions 0..6 in one step (each row sees the earlier rows of this step), slot 0
// continues at 9 over its cached 0..8, slot 1 sits at the last position of the cache, slot 3 at 0.
Step mixed_step(const cuda::DecodeQkv& l, int max_len) {
  Step s{l, 4, max_len, {}};
  for (int j = 0; j < 7; ++j) s.rows.push_back({2, j});
  s.rows.push_back({0, 9});
  s.rows.push_back({1, max_len - 1});
  s.rows.push_back({3, 0});
  return s;
}

Step bloom_step(int heads, int d, int max_len) { return mixed_step(cuda::interleaved_qkv(heads, d), max_len); }

// ---- Llama: rotary at each row's position, then grouped-query attention without ALiBi ----------

// The q and k heads of each row rotated at its position (llama_cpu.cpp's block_decode: the angle
// in fp32, its cos and sin in double), in double; the value heads unchanged.
std::vector<double> rotary_ref(const Step& s, const std::vector<float>& qkv, const std::vector<float>& inv_freq) {
  std::vector<double> out(qkv.begin(), qkv.end());
  const int half = s.d() / 2, rotated = s.l.heads + s.l.kv_heads;
  for (int r = 0; r < s.n(); ++r)
    for (int i = 0; i < half; ++i) {
      const float angle = static_cast<float>(s.rows[r].second) * inv_freq[i];
      const double c = std::cos(static_cast<double>(angle)), sn = std::sin(static_cast<double>(angle));
      for (int h = 0; h < rotated; ++h) {
        const size_t at = s.q_at(r, h, 0);  // k heads follow the q heads at the same stride
        const double x1 = qkv[at + i], x2 = qkv[at + i + half];
        out[at + i] = x1 * c - x2 * sn;
        out[at + i + half] = x2 * c + x1 * sn;
      }
    }
  return out;
}

// Llama's decoding attention: rotary_apply_at on the q and k heads (against rotary_ref, the value
// heads left alone bit for bit), then the cache write and attention on the rotated q|k|v that the
// GPU produced (exact in dt), against the reference without ALiBi.
void check_llama_step(const Step& s, const ModelConfig& rope, DType dt, double tol, unsigned seed) {
  BOOST_TEST_CONTEXT("heads " << s.l.heads << " over " << s.l.kv_heads << " kv heads, head_dim " << s.d() << ", "
                              << s.n() << " rows, max_len " << s.max_len << ", rope factor "
                              << rope.rope_scaling.factor << ", " << dtype_name(dt)) {
    BOOST_TEST_REQUIRE(rope.head_dim() == s.d());
    BOOST_TEST_REQUIRE((s.l.head_stride == s.d() && s.l.k_offset == s.l.heads * s.d()));  // rotary_ref's layout
    std::mt19937 rng(seed);
    const std::vector<float> qkv = random_values(s.qkv_size(), rng, dt);
    const std::vector<float> keys = random_values(s.cache_size(), rng, dt);
    const std::vector<float> values = random_values(s.cache_size(), rng, dt);
    const std::vector<float> inv_freq = rope_inv_freq(rope);
    std::vector<int32_t> positions;
    for (const auto& row : s.rows) positions.push_back(row.second);
    DeviceBuffer d_qkv = to_device(qkv, dt), d_positions = to_device_raw(positions);
    DeviceBuffer d_freq = to_device(inv_freq, DType::F32);
    cuda::rotary_apply_at(d_qkv.get(), s.n(), d_positions.as<int32_t>(), s.l.heads + s.l.kv_heads, s.d(),
                          s.l.row_stride, d_freq.as<float>(), dt, nullptr);
    const std::vector<float> rotated = download(d_qkv.get(), qkv.size(), dt);
    const std::vector<double> want = rotary_ref(s, qkv, inv_freq);
    double worst = 0.0, largest = 0.0;
    for (size_t i = 0; i < want.size(); ++i) {
      worst = std::max(worst, std::abs(rotated[i] - want[i]));
      largest = std::max(largest, std::abs(want[i]));
    }
    BOOST_TEST(worst <= (dt == DType::F32 ? 1e-5 : tol) * largest, "rotary at the rows' positions");
    size_t changed = 0;
    for (int r = 0; r < s.n(); ++r)
      for (int g = 0; g < s.l.kv_heads; ++g)
        for (int c = 0; c < s.d(); ++c) changed += rotated[s.v_at(r, g, c)] != qkv[s.v_at(r, g, c)];
    BOOST_TEST(changed == 0u, "value heads changed by rotary");
    check_attention(s, {}, rotated, keys, values, dt, tol);
  }
}

Step llama_step(int heads, int kv_heads, int d, int max_len) {
  return mixed_step(cuda::grouped_qkv(heads, kv_heads, d), max_len);
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
  check_step(bloom_step(3, 8, 20), DType::F32, 1e-5, 1);
  check_step(bloom_step(2, 64, 300), DType::F32, 1e-5, 2);   // many keys per warp
  check_step(bloom_step(2, 5, 12), DType::F32, 1e-5, 3);     // odd head_dim: lanes left idle
  check_step(bloom_step(1, 96, 40), DType::F32, 1e-5, 4);    // 3 of 4 registers per lane used
  check_step(bloom_step(2, 160, 33), DType::F32, 1e-5, 5);   // the widest register path
  check_step(Step{cuda::interleaved_qkv(4, 16), 1, 1, {{0, 0}}}, DType::F32, 1e-5, 6);  // one row at position 0
}

BOOST_AUTO_TEST_CASE(decode_attention_matches_reference_16bit) {
  require_device("test_cuda_decode");
  // Inputs are representable in the dtype; only the output is rounded (the softmax is fp32).
  check_step(bloom_step(3, 8, 20), DType::BF16, 1e-2, 11);
  check_step(bloom_step(2, 64, 300), DType::BF16, 1e-2, 12);
  check_step(bloom_step(3, 8, 20), DType::F16, 2e-3, 13);
  check_step(bloom_step(2, 128, 50), DType::F16, 2e-3, 14);
}

// Llama: grouped-query heads (query head h reads kv head h / group), no ALiBi, rotary at positions
// far apart in one step (up to 2,099 with Llama-3.1-8B's scaled table).
BOOST_AUTO_TEST_CASE(grouped_decode_attention_with_rotary_matches_reference_fp32) {
  require_device("test_cuda_decode");
  const ModelConfig plain16 = rope_config(16, 10000.0f, 0, 8192);
  const ModelConfig short_context = rope_config(32, 10000.0f, 4, 64);  // every band of the scaling
  const ModelConfig llama31 = rope_config(128, 500000.0f, 8, 8192);    // Llama-3.1-8B's table
  check_llama_step(llama_step(4, 2, 16, 20), plain16, DType::F32, 1e-5, 21);
  check_llama_step(llama_step(8, 2, 32, 300), short_context, DType::F32, 1e-5, 22);  // groups of 4
  check_llama_step(llama_step(4, 1, 32, 40), short_context, DType::F32, 1e-5, 23);   // one kv head for all
  check_llama_step(llama_step(2, 2, 16, 12), plain16, DType::F32, 1e-5, 24);         // no grouping
  check_llama_step(llama_step(4, 1, 128, 2100), llama31, DType::F32, 1e-5, 25);      // 8B's head_dim, long cache
  check_llama_step(Step{cuda::grouped_qkv(6, 3, 16), 1, 1, {{0, 0}}}, plain16, DType::F32, 1e-5, 26);
}

BOOST_AUTO_TEST_CASE(grouped_decode_attention_with_rotary_matches_reference_16bit) {
  require_device("test_cuda_decode");
  const ModelConfig plain16 = rope_config(16, 10000.0f, 0, 8192);
  const ModelConfig llama31 = rope_config(128, 500000.0f, 8, 8192);
  // The rotated q and k are rounded to the dtype; the attention reference takes them as rounded.
  check_llama_step(llama_step(4, 2, 16, 20), plain16, DType::BF16, 1.5e-2, 31);
  check_llama_step(llama_step(8, 2, 128, 700), llama31, DType::BF16, 1.5e-2, 32);
  check_llama_step(llama_step(4, 2, 16, 20), plain16, DType::F16, 3e-3, 33);
  check_llama_step(llama_step(8, 2, 128, 700), llama31, DType::F16, 3e-3, 34);
}

// Mistral's sliding window: each row attends its slot's last `window` positions only (windows 1, 4 and
// one longer than the cache), grouped heads, fp32 and bf16; stale cache entries before the window hold
// values the kernel must skip.
BOOST_AUTO_TEST_CASE(decode_attention_keeps_the_sliding_window) {
  require_device("test_cuda_decode");
  unsigned seed = 41;
  for (const DType dt : {DType::F32, DType::BF16})
    for (const int window : {1, 4, 500}) {
      Step s = llama_step(8, 2, 64, 20);
      s.window = window;
      BOOST_TEST_CONTEXT(dtype_name(dt) << " window " << window) {
        std::mt19937 rng(seed++);
        const std::vector<float> qkv = random_values(s.qkv_size(), rng, dt);
        const std::vector<float> keys = random_values(s.cache_size(), rng, dt);
        const std::vector<float> values = random_values(s.cache_size(), rng, dt);
        check_attention(s, {}, qkv, keys, values, dt, dt == DType::F32 ? 1e-5 : 1e-2);
      }
    }
  BOOST_CHECK_THROW(cuda::decode_attention(nullptr, cuda::grouped_qkv(4, 2, 8), nullptr, nullptr, nullptr, nullptr, 1,
                                           nullptr, nullptr, 8, DType::BF16, nullptr, -1),
                    Error);
}

BOOST_AUTO_TEST_CASE(decode_kernels_reject_bad_shapes_and_launch_nothing_for_no_rows) {
  require_device("test_cuda_decode");
  BOOST_CHECK_THROW(cuda::decode_attention(nullptr, cuda::interleaved_qkv(2, 257), nullptr, nullptr, nullptr, nullptr,
                                           1, nullptr, nullptr, 8, DType::F32, nullptr),
                    Error);  // head_dim above 256
  BOOST_CHECK_THROW(cuda::decode_attention(nullptr, cuda::grouped_qkv(6, 4, 8), nullptr, nullptr, nullptr, nullptr, 1,
                                           nullptr, nullptr, 8, DType::F32, nullptr),
                    Error);  // 6 query heads do not split over 4 kv heads
  cuda::DecodeQkv narrow = cuda::grouped_qkv(4, 2, 8);
  narrow.row_stride -= 1;  // the last value head would reach past its row
  BOOST_CHECK_THROW(cuda::kv_cache_write(nullptr, narrow, nullptr, nullptr, 1, 8, nullptr, nullptr, DType::F32, nullptr),
                    Error);
  BOOST_CHECK_THROW(cuda::kv_cache_write(nullptr, cuda::interleaved_qkv(2, 8), nullptr, nullptr, -1, 8, nullptr,
                                         nullptr, DType::F32, nullptr),
                    Error);
  BOOST_CHECK_THROW(cuda::rotary_apply_at(nullptr, 1, nullptr, 2, 7, 14, nullptr, DType::F32, nullptr), Error);
  BOOST_CHECK_THROW(cuda::argmax_rows(nullptr, 1, 0, nullptr, nullptr), Error);
  // n == 0: nothing is read or written (null pointers would fault otherwise).
  for (const cuda::DecodeQkv& l : {cuda::interleaved_qkv(2, 8), cuda::grouped_qkv(4, 2, 8)}) {
    cuda::kv_cache_write(nullptr, l, nullptr, nullptr, 0, 8, nullptr, nullptr, DType::BF16, nullptr);
    cuda::decode_attention(nullptr, l, nullptr, nullptr, nullptr, nullptr, 0, nullptr, nullptr, 8, DType::BF16,
                           nullptr);
  }
  cuda::rotary_apply_at(nullptr, 0, nullptr, 6, 8, 64, nullptr, DType::F16, nullptr);
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
