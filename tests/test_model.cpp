#define BOOST_TEST_MODULE test_model
#include <boost/test/unit_test.hpp>
// Tests of the model module: cpu_gemm, BLOOM's layout, init and ALiBi slopes, the forward against a
// naive double-precision reference, gradients against finite differences, causality, head chunking;
// the shared CPU attention with a sliding window (and packed rows) against a double reference, its
// backward against finite differences, and the cached decoding attention with a window.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "shardlm/core.hpp"
#include "shardlm/device.hpp"
#include "shardlm/model.hpp"
#include "bloom/bloom_layout.hpp"
#include "cpu_attention.hpp"
#include "cpu_model_test_support.hpp"
#include "fp8_linear_note.hpp"
#include "model_checks.hpp"

using namespace shardlm;
using namespace model_test;

namespace {

// Helpers, the tiny model and the checks every family passes: tests/cpu_model_test_support.hpp,
// tests/model_checks.hpp.

// init_std larger than BLOOM's 0.02 so attention is far from uniform and every path carries signal.
ModelConfig tiny_config() { return model_shape("bloom", 11, 8, 2, 2, 0.3f); }

// ---- naive double-precision reference of the same model --------------------------------------

Rows reference_layer_norm(const Rows& x, int rows, int H, const float* weight, const float* bias, double eps) {
  Rows y(x.size());
  for (int r = 0; r < rows; ++r) {
    double mean = 0.0, var = 0.0;
    for (int c = 0; c < H; ++c) mean += x[r * H + c] / H;
    for (int c = 0; c < H; ++c) var += (x[r * H + c] - mean) * (x[r * H + c] - mean) / H;
    for (int c = 0; c < H; ++c) y[r * H + c] = (x[r * H + c] - mean) / std::sqrt(var + eps) * weight[c] + bias[c];
  }
  return y;
}

double reference_gelu(double u) { return u * 0.5 * (1.0 + std::tanh(0.79788456 * u * (1.0 + 0.044715 * u * u))); }

Rows reference_embed(const TinyModel& m, const Batch& b) {
  const UnitLayout& root = m.layout[0];
  const float* p = m.params[0].data();
  const int H = m.cfg.hidden_size, N = b.batch * b.seq;
  Rows rows(static_cast<size_t>(N) * H);
  const float* embeddings = p + find_tensor(root, "word_embeddings.weight").offset;
  for (int r = 0; r < N; ++r)
    for (int c = 0; c < H; ++c) rows[r * H + c] = embeddings[b.tokens[r] * H + c];
  return reference_layer_norm(rows, N, H, p + find_tensor(root, "word_embeddings_layernorm.weight").offset,
                              p + find_tensor(root, "word_embeddings_layernorm.bias").offset,
                              m.cfg.layer_norm_eps);
}

Rows reference_block(const TinyModel& m, int layer, const Rows& h_in, int B, int T) {
  const UnitLayout& unit = m.layout[1 + layer];
  const float* p = m.params[1 + layer].data();
  auto tensor = [&](const char* name) { return p + find_tensor(unit, name).offset; };
  const int H = m.cfg.hidden_size, heads = m.cfg.num_heads, d = H / heads, N = B * T;
  const double eps = m.cfg.layer_norm_eps;
  const std::vector<float> slopes = alibi_slopes(heads);

  Rows ln1 =
      reference_layer_norm(h_in, N, H, tensor("input_layernorm.weight"), tensor("input_layernorm.bias"), eps);
  Rows qkv = reference_linear(ln1, N, H, tensor("query_key_value.weight"), tensor("query_key_value.bias"), 3 * H);
  Rows context(static_cast<size_t>(N) * H, 0.0);
  for (int b = 0; b < B; ++b)
    for (int n = 0; n < heads; ++n)
      for (int i = 0; i < T; ++i) {
        // Head n's q, k, v of token t sit at columns n*3d, n*3d + d, n*3d + 2d of the fused output.
        auto at = [&](int t, int part, int c) { return qkv[(b * T + t) * 3 * H + n * 3 * d + part * d + c]; };
        std::vector<double> weights(i + 1);
        double max_score = -1e300, total = 0.0;
        for (int j = 0; j <= i; ++j) {
          double dot = 0.0;
          for (int c = 0; c < d; ++c) dot += at(i, 0, c) * at(j, 1, c);
          weights[j] = dot / std::sqrt(static_cast<double>(d)) + slopes[n] * static_cast<double>(j);
          max_score = std::max(max_score, weights[j]);
        }
        for (int j = 0; j <= i; ++j) total += (weights[j] = std::exp(weights[j] - max_score));
        for (int c = 0; c < d; ++c) {
          double sum = 0.0;
          for (int j = 0; j <= i; ++j) sum += weights[j] / total * at(j, 2, c);
          context[(b * T + i) * H + n * d + c] = sum;
        }
      }
  Rows h_mid = reference_linear(context, N, H, tensor("dense.weight"), tensor("dense.bias"), H);
  for (size_t i = 0; i < h_mid.size(); ++i) h_mid[i] += h_in[i];
  Rows ln2 = reference_layer_norm(h_mid, N, H, tensor("post_attention_layernorm.weight"),
                                  tensor("post_attention_layernorm.bias"), eps);
  Rows mlp = reference_linear(ln2, N, H, tensor("dense_h_to_4h.weight"), tensor("dense_h_to_4h.bias"), 4 * H);
  for (double& u : mlp) u = reference_gelu(u);
  Rows out = reference_linear(mlp, N, 4 * H, tensor("dense_4h_to_h.weight"), tensor("dense_4h_to_h.bias"), H);
  for (size_t i = 0; i < out.size(); ++i) out[i] += h_mid[i];
  return out;
}

double reference_head_loss(const TinyModel& m, const Rows& h, const std::vector<int32_t>& targets,
                           int64_t* count) {
  const int H = m.cfg.hidden_size, N = static_cast<int>(targets.size());
  const Rows hf = reference_layer_norm(h, N, H, m.tensor(0, "ln_f.weight"), m.tensor(0, "ln_f.bias"),
                                       m.cfg.layer_norm_eps);
  return reference_cross_entropy(hf, m.tensor(0, "word_embeddings.weight"), H, m.cfg.vocab_size, targets, count);
}

}  // namespace

// ---- cpu_gemm -------------------------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(gemm)

BOOST_AUTO_TEST_CASE(matches_naive_product_for_all_transposes) {
  std::mt19937 rng(1);
  const int sizes[][3] = {{7, 5, 3}, {13, 11, 9}, {1, 17, 4}, {6, 1, 1}};
  for (const auto& size : sizes)
    for (int transposes = 0; transposes < 4; ++transposes) {
      const bool trans_a = transposes & 1, trans_b = transposes & 2;
      const int M = size[0], N = size[1], K = size[2];
      // Stored shapes and padded row strides.
      const int a_rows = trans_a ? K : M, a_cols = trans_a ? M : K, lda = a_cols + 2;
      const int b_rows = trans_b ? N : K, b_cols = trans_b ? K : N, ldb = b_cols + 1;
      const int ldc = N + 3;
      std::vector<float> A = random_floats(static_cast<size_t>(a_rows) * lda, rng);
      std::vector<float> Bm = random_floats(static_cast<size_t>(b_rows) * ldb, rng);
      std::vector<float> C = random_floats(static_cast<size_t>(M) * ldc, rng);
      std::vector<float> expected = C;
      const float alpha = 0.75f, beta = -0.5f;
      for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) {
          double sum = 0.0;
          for (int k = 0; k < K; ++k) {
            const float a = trans_a ? A[k * lda + i] : A[i * lda + k];
            const float b = trans_b ? Bm[j * ldb + k] : Bm[k * ldb + j];
            sum += static_cast<double>(a) * b;
          }
          expected[i * ldc + j] = static_cast<float>(alpha * sum + beta * C[i * ldc + j]);
        }
      cpu_gemm(trans_a, trans_b, M, N, K, alpha, A.data(), lda, Bm.data(), ldb, beta, C.data(), ldc);
      for (size_t i = 0; i < C.size(); ++i) BOOST_TEST(C[i] == expected[i], boost::test_tools::tolerance(1e-4f));
    }
}

BOOST_AUTO_TEST_CASE(empty_sizes_do_not_call_blas) {
  std::vector<float> C = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f};
  const float unused = 0.0f;
  // K == 0: an empty sum leaves beta * C.
  cpu_gemm(false, false, 2, 3, 0, 1.0f, &unused, 1, &unused, 3, 0.5f, C.data(), 3);
  BOOST_TEST(C == std::vector<float>({0.5f, 1.0f, 1.5f, 2.0f, 2.5f, 3.0f}), boost::test_tools::per_element());
  // beta == 0 clears C without reading it, even NaNs.
  C[4] = std::numeric_limits<float>::quiet_NaN();
  cpu_gemm(true, true, 2, 3, 0, 1.0f, &unused, 2, &unused, 1, 0.0f, C.data(), 3);
  BOOST_TEST(C == std::vector<float>(6, 0.0f), boost::test_tools::per_element());
  // M == 0 or N == 0: nothing is touched.
  C.assign(6, 7.0f);
  cpu_gemm(false, false, 0, 3, 2, 1.0f, nullptr, 2, nullptr, 3, 0.0f, C.data(), 3);
  cpu_gemm(false, false, 2, 0, 2, 1.0f, nullptr, 2, nullptr, 1, 0.0f, C.data(), 1);
  BOOST_TEST(C == std::vector<float>(6, 7.0f), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(rejects_short_row_strides) {
  std::vector<float> A(16), B(16), C(16);
  BOOST_CHECK_THROW(cpu_gemm(false, false, 2, 2, 3, 1.0f, A.data(), 2, B.data(), 2, 0.0f, C.data(), 2), Error);
  BOOST_CHECK_THROW(cpu_gemm(false, false, 2, 3, 2, 1.0f, A.data(), 2, B.data(), 3, 0.0f, C.data(), 2), Error);
  BOOST_CHECK_THROW(cpu_gemm(false, false, -1, 2, 2, 1.0f, A.data(), 2, B.data(), 2, 0.0f, C.data(), 2), Error);
}

BOOST_AUTO_TEST_SUITE_END()

// ---- layout, init, ALiBi --------------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(layout)

BOOST_AUTO_TEST_CASE(units_sizes_offsets_and_decay) {
  ModelConfig cfg = model_shape("bloom", 50, 12, 3, 3, 0.05f);
  const size_t V = 50, H = 12;
  const std::vector<UnitLayout> units = bloom_layout(cfg);
  BOOST_REQUIRE_EQUAL(units.size(), 4u);
  BOOST_TEST(units[0].name == "root");
  BOOST_TEST(units[0].numel == V * H + 4 * H);
  const std::vector<std::string> root_names = {"word_embeddings.weight", "word_embeddings_layernorm.weight",
                                               "word_embeddings_layernorm.bias", "ln_f.weight", "ln_f.bias"};
  BOOST_REQUIRE_EQUAL(units[0].tensors.size(), root_names.size());
  for (size_t i = 0; i < root_names.size(); ++i) BOOST_TEST(units[0].tensors[i].name == root_names[i]);
  BOOST_TEST((units[0].tensors[0].shape == std::vector<int64_t>{50, 12}));

  const std::vector<std::string> block_names = {"input_layernorm.weight",
                                                "input_layernorm.bias",
                                                "self_attention.query_key_value.weight",
                                                "self_attention.query_key_value.bias",
                                                "self_attention.dense.weight",
                                                "self_attention.dense.bias",
                                                "post_attention_layernorm.weight",
                                                "post_attention_layernorm.bias",
                                                "mlp.dense_h_to_4h.weight",
                                                "mlp.dense_h_to_4h.bias",
                                                "mlp.dense_4h_to_h.weight",
                                                "mlp.dense_4h_to_h.bias"};
  for (int i = 0; i < 3; ++i) {
    const UnitLayout& block = units[1 + i];
    BOOST_TEST(block.name == "h." + std::to_string(i));
    BOOST_TEST(block.numel == 12 * H * H + 13 * H);
    BOOST_REQUIRE_EQUAL(block.tensors.size(), block_names.size());
    for (size_t t = 0; t < block_names.size(); ++t)
      BOOST_TEST(block.tensors[t].name == block.name + "." + block_names[t]);
    BOOST_TEST((find_tensor(block, "query_key_value.weight").shape == std::vector<int64_t>{36, 12}));
    BOOST_TEST((find_tensor(block, "dense_4h_to_h.weight").shape == std::vector<int64_t>{12, 48}));
  }
  for (const UnitLayout& unit : units) {
    size_t offset = 0;
    for (const TensorSpec& t : unit.tensors) {
      BOOST_TEST(t.offset == offset);
      size_t product = 1;
      for (int64_t d : t.shape) product *= static_cast<size_t>(d);
      BOOST_TEST(t.numel == product);
      offset += t.numel;
      const bool is_weight_matrix = t.shape.size() == 2;
      const bool is_norm =
          t.name.find("layernorm") != std::string::npos || t.name.find("ln_f") != std::string::npos;
      const bool is_bias = t.name.size() > 5 && t.name.substr(t.name.size() - 5) == ".bias";
      BOOST_TEST(t.decay == is_weight_matrix, t.name);
      BOOST_TEST(t.decay == !(is_norm || is_bias), t.name);
      const InitKind expected = is_weight_matrix        ? InitKind::Normal
                                : (is_norm && !is_bias) ? InitKind::Ones
                                                        : InitKind::Zeros;
      BOOST_TEST((t.init == expected), t.name);
      BOOST_TEST(t.init_std == 0.05f);
    }
    BOOST_TEST(unit.numel == offset);
  }
}

BOOST_AUTO_TEST_CASE(rejects_heads_that_do_not_divide_hidden) {
  ModelConfig cfg = tiny_config();
  cfg.num_heads = 3;
  BOOST_CHECK_THROW(bloom_layout(cfg), Error);
}

BOOST_AUTO_TEST_CASE(init_slices_agree_with_whole_fill) {
  const ModelConfig cfg = tiny_config();
  const std::vector<UnitLayout> units = bloom_layout(cfg);
  for (size_t u = 0; u < units.size(); ++u) {
    // Padded as FSDP pads to a multiple of the world size: the tail must come back as zeros.
    const size_t padded = units[u].numel + 5;
    std::vector<float> whole(padded, -1.0f);
    init_unit_slice(units[u], static_cast<int>(u), 42, 0, padded, whole.data());
    for (size_t i = units[u].numel; i < padded; ++i) BOOST_TEST(whole[i] == 0.0f);
    for (size_t pieces = 1; pieces <= 4; ++pieces) {
      std::vector<float> joined(padded, -1.0f);
      for (size_t k = 0; k < pieces; ++k) {
        const size_t begin = padded * k / pieces, end = padded * (k + 1) / pieces;
        init_unit_slice(units[u], static_cast<int>(u), 42, begin, end, joined.data() + begin);
      }
      BOOST_TEST(joined == whole, boost::test_tools::per_element());
    }
    // Seed and unit both change the values.
    std::vector<float> other_seed(padded), other_unit(padded);
    init_unit_slice(units[u], static_cast<int>(u), 43, 0, padded, other_seed.data());
    init_unit_slice(units[u], static_cast<int>(u) + 7, 42, 0, padded, other_unit.data());
    const TensorSpec& normal = units[u].tensors[u == 0 ? 0 : 2];
    BOOST_TEST(other_seed[normal.offset] != whole[normal.offset]);
    BOOST_TEST(other_unit[normal.offset] != whole[normal.offset]);
  }
}

// A slice of more than one chunk (4 Mi elements) is filled by several threads: the same values as
// filling it in small serial pieces, whatever the slice's start.
BOOST_AUTO_TEST_CASE(threaded_init_equals_serial_pieces) {
  ModelConfig cfg = tiny_config();
  cfg.vocab_size = 40000;
  cfg.hidden_size = 256;
  cfg.num_heads = 4;
  const std::vector<UnitLayout> units = bloom_layout(cfg);
  const UnitLayout& root = units[0];
  BOOST_TEST_REQUIRE(root.numel > (size_t{9} << 20));
  for (size_t begin : {size_t{0}, size_t{12345}}) {
    const size_t end = root.numel + 3;
    std::vector<float> threaded(end - begin, -1.0f), pieces(end - begin, -1.0f);
    init_unit_slice(root, 0, 42, begin, end, threaded.data());
    for (size_t at = begin; at < end; at += 1000003)
      init_unit_slice(root, 0, 42, at, std::min(end, at + 1000003), pieces.data() + (at - begin));
    BOOST_TEST((threaded == pieces));
    BOOST_TEST(threaded.back() == 0.0f);
  }
}

BOOST_AUTO_TEST_CASE(init_distributions) {
  ModelConfig cfg = model_shape("bloom", 1000, 64, 1, 4, 0.02f);
  const std::vector<UnitLayout> units = bloom_layout(cfg);
  for (size_t u = 0; u < units.size(); ++u) {
    std::vector<float> flat(units[u].numel);
    init_unit_slice(units[u], static_cast<int>(u), 7, 0, flat.size(), flat.data());
    for (const TensorSpec& t : units[u].tensors) {
      if (t.init == InitKind::Ones)
        BOOST_TEST(std::all_of(flat.begin() + t.offset, flat.begin() + t.offset + t.numel,
                               [](float x) { return x == 1.0f; }),
                   t.name);
      if (t.init == InitKind::Zeros)
        BOOST_TEST(std::all_of(flat.begin() + t.offset, flat.begin() + t.offset + t.numel,
                               [](float x) { return x == 0.0f; }),
                   t.name);
    }
  }
  // The embedding matrix: 64,000 samples of Normal(0, 0.02).
  std::vector<float> flat(units[0].numel);
  init_unit_slice(units[0], 0, 7, 0, flat.size(), flat.data());
  const TensorSpec& embeddings = units[0].tensors[0];
  double sum = 0.0, squares = 0.0;
  size_t beyond_two_sigma = 0;
  for (size_t i = embeddings.offset; i < embeddings.offset + embeddings.numel; ++i) {
    sum += flat[i];
    squares += static_cast<double>(flat[i]) * flat[i];
    beyond_two_sigma += std::abs(flat[i]) > 0.04f;
  }
  const double n = static_cast<double>(embeddings.numel);
  const double mean = sum / n, std_dev = std::sqrt(squares / n - mean * mean);
  BOOST_TEST(std::abs(mean) < 4 * 0.02 / std::sqrt(n));
  BOOST_TEST(std::abs(std_dev / 0.02 - 1.0) < 0.02);
  // A normal puts 4.55% of its mass beyond two standard deviations.
  BOOST_TEST(std::abs(beyond_two_sigma / n - 0.0455) < 0.004);
}

BOOST_AUTO_TEST_CASE(alibi_slopes_powers_of_two) {
  for (int heads : {4, 8, 16}) {
    const std::vector<float> slopes = alibi_slopes(heads);
    BOOST_REQUIRE_EQUAL(slopes.size(), static_cast<size_t>(heads));
    for (int k = 1; k <= heads; ++k)
      BOOST_TEST(slopes[k - 1] == std::pow(2.0, -8.0 * k / heads), boost::test_tools::tolerance(1e-6));
  }
}

BOOST_AUTO_TEST_CASE(alibi_slopes_other_head_counts) {
  // 6 heads: closest power 4 gives 2^-2, 2^-4, 2^-6, 2^-8; the 2 extra heads take 2^-1 to the powers 1, 3.
  const std::vector<double> six = {0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125};
  // 12 heads: closest power 8 gives 2^-1 .. 2^-8; the 4 extra take 2^-0.5 to the powers 1, 3, 5, 7.
  std::vector<double> twelve;
  for (int k = 1; k <= 8; ++k) twelve.push_back(std::pow(2.0, -k));
  for (int k = 1; k <= 7; k += 2) twelve.push_back(std::pow(2.0, -0.5 * k));
  // 3 heads: closest power 2 gives 2^-4, 2^-8; the extra head takes 2^-2.
  const std::vector<double> three = {0.0625, 0.00390625, 0.25};
  for (const auto& [heads, expected] : {std::pair{6, six}, std::pair{12, twelve}, std::pair{3, three}}) {
    const std::vector<float> slopes = alibi_slopes(heads);
    BOOST_REQUIRE_EQUAL(slopes.size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i)
      BOOST_TEST(slopes[i] == expected[i], boost::test_tools::tolerance(1e-6));
  }
  BOOST_TEST(alibi_slopes(1) == std::vector<float>({std::pow(2.0f, -8.0f)}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_SUITE_END()

// ---- forward against the double reference ----------------------------------------------------

BOOST_AUTO_TEST_SUITE(forward)

BOOST_AUTO_TEST_CASE(embed_block_and_head_match_reference) {
  const ModelConfig cfg = tiny_config();
  const TinyModel m = make_model(cfg, 11);
  std::mt19937 rng(5);
  const Batch b = make_batch(2, 5, cfg.vocab_size, 0.3, rng);
  // Built larger than used, so strides of the saved activations differ from the call's shape.
  const std::unique_ptr<CpuModel> net = make_cpu_model(cfg, 3, 7);
  const size_t n = static_cast<size_t>(b.batch) * b.seq * cfg.hidden_size;

  BOOST_TEST(max_relative_error(embedded(*net, m, b), reference_embed(m, b)) < 1e-5);

  // Blocks on an input with a non-trivial scale and mean per row.
  std::vector<float> h_in = random_floats(n, rng, 2.0f);
  for (size_t i = 0; i < n; ++i) h_in[i] += 0.5f * static_cast<float>(i % cfg.hidden_size);
  for (int layer = 0; layer < cfg.num_layers; ++layer) {
    std::vector<float> h_out(n);
    net->block_forward(layer, m.params[1 + layer].data(), h_in.data(), h_out.data(), b.batch, b.seq);
    BOOST_TEST(max_relative_error(h_out, reference_block(m, layer, to_double(h_in), b.batch, b.seq)) < 1e-4);
  }

  int64_t count = -1, expected_count = -1;
  const double loss = net->head_loss(m.params[0].data(), h_in.data(), b.targets.data(), b.batch, b.seq, &count,
                                    1.0f, nullptr, nullptr);
  const double expected = reference_head_loss(m, to_double(h_in), b.targets, &expected_count);
  BOOST_TEST(count == expected_count);
  BOOST_TEST(count == std::count_if(b.targets.begin(), b.targets.end(), [](int32_t t) { return t >= 0; }));
  BOOST_TEST(loss == expected, boost::test_tools::tolerance(1e-5));
}

BOOST_AUTO_TEST_CASE(longer_sequence_with_more_heads_matches_reference) {
  ModelConfig cfg = tiny_config();
  cfg.hidden_size = 24;
  cfg.num_heads = 6;  // not a power of two: exercises the extra ALiBi slopes
  cfg.num_layers = 1;
  cfg.init_std = 0.2f;
  const TinyModel m = make_model(cfg, 3);
  std::mt19937 rng(8);
  const Batch b = make_batch(2, 33, cfg.vocab_size, 0.0, rng);
  const std::unique_ptr<CpuModel> net = make_cpu_model(cfg, 2, 40);
  const std::vector<float> h0 = embedded(*net, m, b);
  std::vector<float> h1(h0.size());
  net->block_forward(0, m.params[1].data(), h0.data(), h1.data(), b.batch, b.seq);
  BOOST_TEST(max_relative_error(h1, reference_block(m, 0, reference_embed(m, b), b.batch, b.seq)) < 1e-4);
}

BOOST_AUTO_TEST_CASE(causal_positions_before_a_change_are_unaffected) {
  check_causal_positions(tiny_config(), 12, 6);
}

BOOST_AUTO_TEST_SUITE_END()

// ---- gradients ------------------------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(gradients)

BOOST_AUTO_TEST_CASE(parameters_match_finite_differences) {
  const ModelConfig cfg = tiny_config();
  TinyModel m = make_model(cfg, 21);
  std::mt19937 rng(9);
  const Batch b = make_batch(2, 5, cfg.vocab_size, 0.3, rng);
  const std::unique_ptr<CpuModel> net = make_cpu_model(cfg, 2, 6);
  const std::vector<std::vector<float>> grads = model_grads(*net, m, b, 1.0f);

  // Softmax ignores a shift shared by all keys, so each head's key bias gets no gradient at all;
  // with the head-interleaved qkv layout these are columns n*3d + d .. n*3d + 2d.
  const int d = cfg.head_dim();
  for (int layer = 0; layer < cfg.num_layers; ++layer) {
    const std::vector<float>& g = grads[1 + layer];
    const size_t qkv_bias = find_tensor(m.layout[1 + layer], "query_key_value.bias").offset;
    for (int n = 0; n < cfg.num_heads; ++n)
      for (int c = 0; c < 3 * d; ++c) {
        const double value = std::abs(g[qkv_bias + n * 3 * d + c]);
        if (c >= d && c < 2 * d)
          BOOST_TEST(value < 1e-5 * max_abs(g), "key bias, head " << n);
        else if (c >= 2 * d)
          BOOST_TEST(value > 1e-5 * max_abs(g), "value bias, head " << n);
      }
  }

  // About 40 coordinates per unit, spread over every tensor; the key bias is judged with its unit.
  check_parameter_gradients(*net, m, b, rng, GradientSampling{40, 0, false});
}

BOOST_AUTO_TEST_CASE(hidden_inputs_match_finite_differences) { check_hidden_input_gradients(tiny_config(), 22, 10); }

BOOST_AUTO_TEST_CASE(grad_scale_scales_and_gradients_accumulate) {
  check_grad_scale_and_accumulation(tiny_config(), 23);
}

BOOST_AUTO_TEST_SUITE_END()

// ---- the LM head's chunking and argument checks ----------------------------------------------

BOOST_AUTO_TEST_SUITE(head)

BOOST_AUTO_TEST_CASE(chunked_loss_and_gradients_match) {
  ModelConfig cfg = tiny_config();
  cfg.vocab_size = 37;
  check_chunked_head(cfg, 31, 12, reference_head_loss);
}

BOOST_AUTO_TEST_CASE(bad_ids_and_shapes_throw_naming_them) { check_bad_ids_and_shapes(tiny_config(), 32); }

BOOST_AUTO_TEST_SUITE_END()

// ---- shapes and memory ----------------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(shapes)

BOOST_AUTO_TEST_CASE(oversized_and_mismatched_shapes_throw) {
  const ModelConfig cfg = tiny_config();
  const TinyModel m = make_model(cfg, 41);
  const std::unique_ptr<CpuModel> net = make_cpu_model(cfg, 2, 4);
  std::vector<float> h(3 * 5 * cfg.hidden_size), out(h.size()), grad(m.params[1].size());
  std::vector<int32_t> tokens(15, 1);
  BOOST_CHECK_THROW(net->embed_forward(m.params[0].data(), tokens.data(), 3, 4, h.data()), Error);
  BOOST_CHECK_THROW(net->block_forward(0, m.params[1].data(), h.data(), out.data(), 2, 5), Error);
  BOOST_CHECK_THROW(net->block_forward(2, m.params[1].data(), h.data(), out.data(), 2, 4), Error);
  int64_t count = 0;
  BOOST_CHECK_THROW(
      net->head_loss(m.params[0].data(), h.data(), tokens.data(), 1, 5, &count, 1.0f, nullptr, nullptr), Error);
  net->block_forward(0, m.params[1].data(), h.data(), out.data(), 2, 3);
  BOOST_CHECK_THROW(net->block_backward(0, m.params[1].data(), h.data(), out.data(), grad.data(), 2, 4), Error);
  BOOST_CHECK_THROW(net->block_backward(1, m.params[2].data(), h.data(), out.data(), grad.data(), 2, 3), Error);
}

BOOST_AUTO_TEST_CASE(empty_batches_do_nothing) { check_empty_batches(tiny_config(), 42); }

BOOST_AUTO_TEST_CASE(activation_memory_is_accounted) {
  const ModelConfig cfg = tiny_config();
  // At least the saved attention probabilities of every layer: L * B * heads * T * T floats.
  check_activation_memory(cfg, static_cast<size_t>(cfg.num_layers) * 4 * cfg.num_heads * 16 * 16 * sizeof(float));
}

BOOST_AUTO_TEST_SUITE_END()

// ---- the shared CPU attention with a sliding window --------------------------------------------

BOOST_AUTO_TEST_SUITE(sliding_window_attention)

using model_detail::AttentionShape;

// 2 sequences of 9 positions, 4 query heads over 2 kv heads of 4, q|k|v in separate row-major arrays;
// the second sequence packs two samples (starting at 0 and 4) when `packed`.
struct WindowCase {
  AttentionShape s;
  std::vector<int32_t> starts;
  std::vector<float> q, k, v;
  WindowCase(int window, bool packed, uint32_t seed) {
    const int B = 2, T = 9, heads = 4, kv = 2, d = 4;
    s = AttentionShape{B, T, heads, kv, d, heads * d, kv * d, d, nullptr};
    s.window = window;
    if (packed) {
      starts.assign(static_cast<size_t>(B) * T, 0);
      for (int t = 4; t < T; ++t) starts[T + t] = 4;
      s.starts = starts.data();
    }
    std::mt19937 rng(seed);
    q = random_floats(static_cast<size_t>(B) * T * heads * d, rng, 1.5f);
    k = random_floats(static_cast<size_t>(B) * T * kv * d, rng, 1.5f);
    v = random_floats(static_cast<size_t>(B) * T * kv * d, rng);
  }
};

// context in double, written apart from cpu_attention.cpp: query i of sequence b attends keys j with
// j <= i, j >= its sample's start and i - window < j (transformers' sliding_window_overlay).
Rows reference_window_context(const WindowCase& c) {
  const AttentionShape& s = c.s;
  const int T = s.seq, d = s.head_dim;
  Rows ctx(static_cast<size_t>(s.batch) * T * s.heads * d, 0.0);
  for (int b = 0; b < s.batch; ++b)
    for (int n = 0; n < s.heads; ++n) {
      const int g = n / (s.heads / s.kv_heads);
      for (int i = 0; i < T; ++i) {
        const int start = c.starts.empty() ? 0 : c.starts[b * T + i];
        std::vector<double> w(T, 0.0);
        double top = -1e300, total = 0.0;
        for (int j = 0; j <= i; ++j) {
          if (j < start || (s.window > 0 && !(j > i - s.window))) continue;
          double dot = 0.0;
          for (int e = 0; e < d; ++e)
            dot += double{c.q[(b * T + i) * s.q_ld + n * d + e]} * c.k[(b * T + j) * s.kv_ld + g * d + e];
          w[j] = dot / std::sqrt(static_cast<double>(d));
          top = std::max(top, w[j]);
        }
        for (int j = 0; j <= i; ++j) {
          if (j < start || (s.window > 0 && !(j > i - s.window))) continue;
          total += (w[j] = std::exp(w[j] - top));
        }
        for (int j = 0; j <= i; ++j) {
          if (j < start || (s.window > 0 && !(j > i - s.window))) continue;
          for (int e = 0; e < d; ++e)
            ctx[(b * T + i) * s.heads * d + n * d + e] += w[j] / total * c.v[(b * T + j) * s.kv_ld + g * d + e];
        }
      }
    }
  return ctx;
}

std::vector<float> window_context(const WindowCase& c, std::vector<float>* probs = nullptr) {
  const AttentionShape& s = c.s;
  std::vector<float> p(static_cast<size_t>(s.batch) * s.heads * s.seq * s.seq);
  std::vector<float> ctx(static_cast<size_t>(s.batch) * s.seq * s.heads * s.head_dim);
  model_detail::attention_forward(s, c.q.data(), c.k.data(), c.v.data(), p.data(), ctx.data());
  if (probs) *probs = p;
  return ctx;
}

BOOST_AUTO_TEST_CASE(forward_matches_double_reference) {
  for (int window : {1, 2, 3, 9, 20})
    for (bool packed : {false, true}) {
      const WindowCase c(window, packed, 7 + window);
      const std::vector<float> got = window_context(c);
      const Rows want = reference_window_context(c);
      for (size_t i = 0; i < got.size(); ++i)  // fp32 against double: outputs are O(1)
        BOOST_TEST(std::abs(got[i] - want[i]) <= 1e-5 * (1.0 + std::abs(want[i])),
                   "window " << window << " packed " << packed << " element " << i << ": " << got[i] << " != "
                             << want[i]);
    }
}

// The window changes the result (the reference is not just full causal attention): window 3 against
// none differs from position 3 on and equals it before.
BOOST_AUTO_TEST_CASE(window_masks_keys_before_it) {
  const WindowCase windowed(3, false, 11), full(0, false, 11);
  const std::vector<float> a = window_context(windowed), b = window_context(full);
  const int row = windowed.s.heads * windowed.s.head_dim;
  double before = 0.0, after = 0.0;
  for (int t = 0; t < windowed.s.seq; ++t)
    for (int e = 0; e < row; ++e) (t < 3 ? before : after) += std::abs(a[t * row + e] - b[t * row + e]);
  BOOST_TEST(before == 0.0);
  BOOST_TEST(after > 1e-3);
  // Key j gets probability 0 from query i when j <= i - window.
  std::vector<float> probs;
  window_context(windowed, &probs);
  const int T = windowed.s.seq;
  for (int i = 0; i < T; ++i)
    for (int j = 0; j < T; ++j) {
      const bool kept = j <= i && j > i - 3;
      BOOST_TEST((probs[i * T + j] > 0.0f) == kept, "query " << i << " key " << j);
    }
}

// dq, dk, dv of L = sum(context * weights) against central differences of the double reference.
BOOST_AUTO_TEST_CASE(backward_matches_finite_differences) {
  for (int window : {2, 4})
    for (bool packed : {false, true}) {
      WindowCase c(window, packed, 31 + window);
      const AttentionShape& s = c.s;
      std::mt19937 rng(5);
      const std::vector<float> weights = random_floats(c.q.size(), rng);  // context is q-shaped
      std::vector<float> probs;
      window_context(c, &probs);
      std::vector<float> dscores(static_cast<size_t>(s.seq) * s.seq), dq(c.q.size()), dk(c.k.size()),
          dv(c.v.size());
      model_detail::attention_backward(s, c.q.data(), c.k.data(), c.v.data(), probs.data(), weights.data(),
                                       dscores.data(), dq.data(), dk.data(), dv.data());
      auto loss = [&] {
        const Rows ctx = reference_window_context(c);
        double l = 0.0;
        for (size_t i = 0; i < ctx.size(); ++i) l += ctx[i] * weights[i];
        return l;
      };
      for (auto [x, grad, name] : {std::tuple{&c.q, &dq, "q"}, std::tuple{&c.k, &dk, "k"}, std::tuple{&c.v, &dv, "v"}})
        for (size_t i = 0; i < x->size(); i += 5) {
          const float keep = (*x)[i];
          const float h = 1e-2f;
          (*x)[i] = keep + h;
          const double up = loss();
          (*x)[i] = keep - h;
          const double down = loss();
          (*x)[i] = keep;
          const double numeric = (up - down) / (2.0 * h);
          BOOST_TEST(std::abs((*grad)[i] - numeric) <= 1e-3 * (1.0 + std::abs(numeric)),
                     name << "[" << i << "] = " << (*grad)[i] << ", finite differences " << numeric << " (window "
                          << window << ", packed " << packed << ")");
        }
    }
}

// Decoding's cached attention keeps the same window: each position's context equals the training
// forward's for that position, one cached row at a time.
BOOST_AUTO_TEST_CASE(cached_decoding_keeps_the_window) {
  const WindowCase c(3, false, 41);
  const AttentionShape& s = c.s;
  const std::vector<float> want = window_context(c);
  model_detail::KvCache cache;
  cache.reset(1, 1, s.seq, s.kv_heads, s.head_dim);
  AttentionShape row = s;
  row.batch = 1, row.seq = 1;
  std::vector<float> scores(s.seq), ctx(static_cast<size_t>(s.heads) * s.head_dim);
  const int slot = 0;
  for (int t = 0; t < s.seq; ++t) {
    model_detail::cached_attention_rows(cache, 0, row, c.q.data() + t * s.q_ld, c.k.data() + t * s.kv_ld,
                                       c.v.data() + t * s.kv_ld, 1, &slot, &t, scores.data(), ctx.data());
    for (size_t e = 0; e < ctx.size(); ++e)
      BOOST_TEST(ctx[e] == want[t * ctx.size() + e], boost::test_tools::tolerance(1e-5f) << "position " << t);
  }
}

BOOST_AUTO_TEST_SUITE_END()

// model.fp8_linear's start-up note: the layers in FP8, those whose sizes keep them 16-bit, a family's own
// 16-bit GEMMs, and a max_length that is not a multiple of 16.
BOOST_AUTO_TEST_CASE(fp8_linear_note_names_what_stays_16_bit) {
  using shardlm::model_detail::fp8_linear_note;
  BOOST_TEST(fp8_linear_note({{"q|k|v", 6144, 4096}, {"o", 4096, 4096}}, "", 2048) ==
             "q|k|v, o in E4M3 with per-tensor current scaling");
  const std::string odd = fp8_linear_note({{"q|k|v", 6144, 4096}, {"down", 4096, 11000}}, "the GELU ones", 500);
  BOOST_TEST(odd.find("q|k|v in E4M3") == 0u, odd);
  BOOST_TEST(odd.find("16-bit, sizes not multiples of 16: down (4096 x 11000)") != std::string::npos, odd);
  BOOST_TEST(odd.find("16-bit: the GELU ones") != std::string::npos, odd);
  BOOST_TEST(odd.find("data.max_length = 500 (not a multiple of 16)") != std::string::npos, odd);
  BOOST_TEST(fp8_linear_note({{"o", 40, 40}}, "", 64).find("none in E4M3") == 0u);
}
