#define BOOST_TEST_MODULE test_llama
#include <boost/test/unit_test.hpp>
// Tests of the Llama-style families on the CPU (Llama; Qwen2, its layer with q/k/v biases; Qwen3, with
// per-head q/k RMSNorms and a head_dim of its own; Mistral, with a sliding window and a head_dim of its
// own): rotary
// frequencies (llama3 scaling) against independently computed values, RMSNorm and rotary on
// hand-computed values, the forward against a naive double reference, gradients of every unit
// against finite differences, GQA as MHA with repeated kv heads, padding, head chunking, argument
// checks; Qwen2's, Qwen3's and Mistral's layouts, Hugging Face names and config.json (Mistral's
// sliding_window: read, written back, bad values refused naming the file and key); Phi-3's fused
// qkv_proj / gate_up_proj, partial rotary and LongRoPE (forward, finite differences, layout, LoRA names,
// config.json in both transformers forms, refusals).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "shardlm/core.hpp"
#include "shardlm/model.hpp"
#include "cpu_model_test_support.hpp"
#include "gemma3_1b_config.hpp"
#include "model_checks.hpp"
#include "test_support.hpp"

using namespace shardlm;
using namespace model_test;

namespace {

// Helpers, the tiny model and the checks every family passes: tests/cpu_model_test_support.hpp,
// tests/model_checks.hpp.

// Hidden 16, 4 query heads over 2 kv heads (head_dim 4), SwiGLU width 24, 37 tokens, 2 layers;
// init_std larger than Llama's 0.02 so attention is far from uniform and every path carries signal.
ModelConfig tiny_config() {
  ModelConfig cfg = model_shape("llama", 37, 16, 2, 4, 0.3f);
  cfg.num_kv_heads = 2;
  cfg.intermediate_size = 24;
  cfg.rms_norm_eps = 1e-5f;
  cfg.rope_theta = 100.0f;  // low base: the second frequency (0.1) turns visibly over 5 positions
  return cfg;
}

// The same shape as Qwen2: q/k/v biases.
ModelConfig qwen2(ModelConfig cfg) {
  cfg.arch = "qwen2";
  return cfg;
}

// Qwen3's: per-head q/k RMSNorms, and head_dim 6 where hidden_size / heads is 4 (q is 24 wide, not 16).
ModelConfig qwen3(ModelConfig cfg) {
  cfg.arch = "qwen3";
  cfg.head_size = 6;
  return cfg;
}

// Mistral's: a sliding window of 3 keys (shorter than the tests' sequences of 5 to 7) and head_dim 6
// where hidden_size / heads is 4 (Mistral Nemo's 128 at hidden 5120 and 32 heads).
ModelConfig mistral(ModelConfig cfg) {
  cfg.arch = "mistral";
  cfg.sliding_window = 3;
  cfg.head_size = 6;
  return cfg;
}

// Gemma 3's: (1 + w) norms (weights off their init of 0 in make_model), sandwich norms, GeGLU, embeddings
// times sqrt(hidden), q/k norms, head_dim 6, query_pre_attn_scalar 5 (not head_dim), a local layer (window 3,
// rope base 10) then a global one (base 100, linear factor 2): every piece moves the output.
ModelConfig gemma3(ModelConfig cfg) { return as_gemma3(cfg, 6, 3, 10.0f, 5.0f); }
// Phi-3's: q|k|v and gate|up fused, head_dim 8 of which 6 rotate (partial_rotary_factor 0.75), LongRoPE with
// an original context of `original` positions against 64 (the tests' sequences of 5 to 7 take the long factors
// when it is 4, the short ones when it is 8), a sliding window of 3 keys.
ModelConfig phi3(ModelConfig cfg, int original = 4) {
  cfg.arch = "phi3";
  cfg.head_size = 8;
  cfg.partial_rotary_factor = 0.75;
  cfg.longrope.short_factor = {1.0f, 1.5f, 2.5f};
  cfg.longrope.long_factor = {1.25f, 3.0f, 7.0f};
  cfg.longrope.original_max_position_embeddings = original;
  cfg.max_position_embeddings = 64;
  cfg.sliding_window = 3;
  return cfg;
}

// The head tied to the embedding table.
ModelConfig tied(ModelConfig cfg) {
  cfg.tie_word_embeddings = true;
  return cfg;
}

// A sliding window of `window` keys; for Qwen2 and Qwen3, every layer windowed (use_sliding_window,
// max_window_layers 0).
ModelConfig windowed(ModelConfig cfg, int window) {
  cfg.sliding_window = window;
  return cfg;
}

// Llama 3.1's scaling with a short original context, so both the slowed and the blended regimes
// apply to the two frequencies of head_dim 4 (wavelengths 2 pi and 20 pi against 4 and 16).
ModelConfig with_llama3_scaling(ModelConfig cfg) {
  cfg.rope_scaling.factor = 8.0f;
  cfg.rope_scaling.low_freq_factor = 1.0f;
  cfg.rope_scaling.high_freq_factor = 4.0f;
  cfg.rope_scaling.original_max_position_embeddings = 16;
  return cfg;
}

// hf_config_json(cfg) as the family's config.json: its model_type, its `architecture` class and each
// of `parts`; read back, the same family. Returns what it read back.
ModelConfig written_and_read_back(const ModelConfig& cfg, const std::string& model_type,
                                  const std::string& architecture, const std::vector<std::string>& parts) {
  const std::string written = hf_config_json(cfg);
  BOOST_TEST(contains(written, "\"model_type\": \"" + model_type + "\""), written);
  BOOST_TEST(contains(written, "\"" + architecture + "\""), written);
  for (const std::string& part : parts) BOOST_TEST(contains(written, part), written);
  const ModelConfig again = model_config_from_hf(written, "written");
  BOOST_TEST(again.arch == model_type);
  return again;
}


// With `offset` (Gemma's 1) the weight is offset + weight.
Rows reference_rms_norm(const Rows& x, int rows, int H, const float* weight, double eps, double offset = 0.0) {
  Rows y(x.size());
  for (int r = 0; r < rows; ++r) {
    double mean_square = 0.0;
    for (int c = 0; c < H; ++c) mean_square += x[r * H + c] * x[r * H + c] / H;
    for (int c = 0; c < H; ++c) y[r * H + c] = x[r * H + c] / std::sqrt(mean_square + eps) * (offset + weight[c]);
  }
  return y;
}

bool is_gemma(const ModelConfig& cfg) { return cfg.arch == "gemma3"; }

// Gemma's embedding scale: sqrt(hidden) rounded to fp32 as transformers' fp32 buffer holds it.
double embed_scale(const ModelConfig& cfg) {
  return is_gemma(cfg) ? static_cast<double>(static_cast<float>(std::sqrt(static_cast<double>(cfg.hidden_size))))
                       : 1.0;
}

// tanh-approximated GELU (gelu_pytorch_tanh) in double.
double reference_gelu_tanh(double x) {
  const double pi = 3.14159265358979323846;
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / pi) * (x + 0.044715 * x * x * x)));
}

// x * cos + rotate_half(x) * sin per head, with rotate_half(x1, x2) = (-x2, x1) and the angles
// pos * inv_freq repeated over both halves; rows are [B, T] of `heads` heads of d. Partial rotary: only the
// first `rot` dimensions (2 x inv_freq's) rotate, the rest pass; cos and sin are scaled by `scale` (LongRoPE).
void reference_rotary(Rows& x, int B, int T, int heads, int d, const std::vector<float>& inv_freq,
                      double scale = 1.0) {
  const int rot = 2 * static_cast<int>(inv_freq.size());
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int n = 0; n < heads; ++n) {
        double* head = &x[((static_cast<size_t>(b) * T + t) * heads + n) * d];
        const Rows original(head, head + d);
        for (int c = 0; c < rot; ++c) {
          const double angle = t * static_cast<double>(inv_freq[c % (rot / 2)]);
          const double rotated = c < rot / 2 ? -original[c + rot / 2] : original[c - rot / 2];
          head[c] = scale * (original[c] * std::cos(angle) + rotated * std::sin(angle));
        }
      }
}

Rows reference_block(const TinyModel& m, int layer, const Rows& h_in, int B, int T) {
  const size_t u = 1 + layer;
  const int H = m.cfg.hidden_size, heads = m.cfg.num_heads, kv = m.cfg.kv_heads(), d = m.cfg.head_dim();
  const int F = m.cfg.ffn_size(), N = B * T;
  const double eps = m.cfg.rms_norm_eps;
  const bool gemma = is_gemma(m.cfg);
  const double offset = gemma ? 1.0 : 0.0;
  // LongRoPE: the long factors where the sequence reaches past the original context.
  const bool long_factors = m.cfg.longrope.enabled() && T > m.cfg.longrope.original_max_position_embeddings;
  // Gemma 3's local layers use rope_local_theta unscaled, its global ones rope_theta over the linear factor
  // (independent of rope_inv_freq's table argument: formed here from the bases).
  std::vector<float> inv_freq = rope_inv_freq(m.cfg, long_factors);
  if (gemma) {
    const bool local = (layer + 1) % m.cfg.sliding_window_pattern != 0;
    for (int i = 0; i < d / 2; ++i) {
      const double base = local ? m.cfg.rope_local_theta : m.cfg.rope_theta;
      const double f = 1.0 / std::pow(base, 2.0 * i / d);
      inv_freq[i] = static_cast<float>(local ? f : static_cast<float>(f) / m.cfg.rope_linear_factor);
    }
  }
  double rope_scale = 1.0;
  if (m.cfg.longrope.enabled()) {
    const double factor = static_cast<double>(m.cfg.max_position_embeddings) / m.cfg.longrope.original_max_position_embeddings;
    rope_scale = std::sqrt(1.0 + std::log(factor) / std::log(static_cast<double>(m.cfg.longrope.original_max_position_embeddings)));
  }
  // Phi-3's fused q|k|v and gate|up: the rows of each projection inside them.
  const float* qkv = m.tensor_or_null(u, "qkv_proj.weight");
  const float* gate_up = m.tensor_or_null(u, "gate_up_proj.weight");
  auto weight = [&](const char* name, size_t fused_row) {
    return qkv ? qkv + fused_row * H : m.tensor(u, name);
  };

  const Rows n1 = reference_rms_norm(h_in, N, H, m.tensor(u, "input_layernorm.weight"), eps, offset);
  // Qwen2's biases, before the rotation.
  Rows q = reference_linear(n1, N, H, weight("q_proj.weight", 0), m.tensor_or_null(u, "q_proj.bias"), heads * d);
  Rows k = reference_linear(n1, N, H, weight("k_proj.weight", static_cast<size_t>(heads) * d),
                            m.tensor_or_null(u, "k_proj.bias"), kv * d);
  const Rows v = reference_linear(n1, N, H, weight("v_proj.weight", static_cast<size_t>(heads + kv) * d),
                                  m.tensor_or_null(u, "v_proj.bias"), kv * d);
  // Qwen3's per-head norms, before the rotation.
  if (const float* w = m.tensor_or_null(u, "q_norm.weight")) q = reference_rms_norm(q, N * heads, d, w, eps, offset);
  if (const float* w = m.tensor_or_null(u, "k_norm.weight")) k = reference_rms_norm(k, N * kv, d, w, eps, offset);
  reference_rotary(q, B, T, heads, d, inv_freq, rope_scale);
  reference_rotary(k, B, T, kv, d, inv_freq, rope_scale);
  Rows context(static_cast<size_t>(N) * heads * d, 0.0);
  // Mistral's sliding window: query i attends keys i - window < j <= i (transformers' sliding_window_overlay).
  // Gemma 3: the window on its local layers only, scores scaled by query_pre_attn_scalar^-1/2.
  const int window = gemma && (layer + 1) % m.cfg.sliding_window_pattern == 0 ? 0 : m.cfg.sliding_window;
  const double scale = gemma ? 1.0 / std::sqrt(static_cast<double>(m.cfg.query_pre_attn_scalar))
                             : 1.0 / std::sqrt(static_cast<double>(d));
  for (int b = 0; b < B; ++b)
    for (int n = 0; n < heads; ++n) {
      const int g = n * kv / heads;  // the kv head of query head n
      for (int i = 0; i < T; ++i) {
        const int first = window > 0 ? std::max(0, i - window + 1) : 0;
        std::vector<double> weights(i + 1);
        double max_score = -1e300, total = 0.0;
        for (int j = first; j <= i; ++j) {
          double dot = 0.0;
          for (int c = 0; c < d; ++c) dot += q[(b * T + i) * heads * d + n * d + c] * k[(b * T + j) * kv * d + g * d + c];
          weights[j] = dot * scale;
          max_score = std::max(max_score, weights[j]);
        }
        for (int j = first; j <= i; ++j) total += (weights[j] = std::exp(weights[j] - max_score));
        for (int c = 0; c < d; ++c) {
          double sum = 0.0;
          for (int j = first; j <= i; ++j) sum += weights[j] / total * v[(b * T + j) * kv * d + g * d + c];
          context[(b * T + i) * heads * d + n * d + c] = sum;
        }
      }
    }
  Rows x = reference_linear(context, N, heads * d, m.tensor(u, "o_proj.weight"), nullptr, H);
  // Gemma 3: post_attention_layernorm on the attention's output before the residual add.
  if (gemma) x = reference_rms_norm(x, N, H, m.tensor(u, "post_attention_layernorm.weight"), eps, offset);
  for (size_t i = 0; i < x.size(); ++i) x[i] += h_in[i];
  const Rows n2 = reference_rms_norm(
      x, N, H, m.tensor(u, gemma ? "pre_feedforward_layernorm.weight" : "post_attention_layernorm.weight"), eps, offset);
  const Rows gate = reference_linear(n2, N, H, gate_up ? gate_up : m.tensor(u, "gate_proj.weight"), nullptr, F);
  Rows act = reference_linear(n2, N, H, gate_up ? gate_up + static_cast<size_t>(F) * H : m.tensor(u, "up_proj.weight"),
                              nullptr, F);
  for (size_t i = 0; i < act.size(); ++i)
    act[i] *= gemma ? reference_gelu_tanh(gate[i]) : gate[i] / (1.0 + std::exp(-gate[i]));
  Rows out = reference_linear(act, N, F, m.tensor(u, "down_proj.weight"), nullptr, H);
  if (gemma) out = reference_rms_norm(out, N, H, m.tensor(u, "post_feedforward_layernorm.weight"), eps, offset);
  for (size_t i = 0; i < out.size(); ++i) out[i] += x[i];
  return out;
}

double reference_head_loss(const TinyModel& m, const Rows& h, const std::vector<int32_t>& targets,
                           int64_t* count) {
  const int H = m.cfg.hidden_size, N = static_cast<int>(targets.size());
  const Rows hn = reference_rms_norm(h, N, H, m.tensor(0, "norm.weight"), m.cfg.rms_norm_eps, is_gemma(m.cfg) ? 1.0 : 0.0);
  const float* head = m.tensor(0, m.cfg.tie_word_embeddings ? "embed_tokens.weight" : "lm_head.weight");
  return reference_cross_entropy(hn, head, H, m.cfg.vocab_size, targets, count);
}

// Every tensor's gradient against finite differences, 8 coordinates each.
void check_parameter_gradients(const ModelConfig& cfg, uint64_t seed) {
  TinyModel m = make_model(cfg, seed);
  std::mt19937 rng(static_cast<uint32_t>(seed) + 100);
  const Batch b = make_batch(2, 5, cfg.vocab_size, 0.3, rng);
  const std::unique_ptr<CpuModel> net = make_cpu_model(cfg, 2, 6);
  model_test::check_parameter_gradients(*net, m, b, rng, GradientSampling{});
}

}  // namespace

// ---- rotary frequencies ---------------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(rope)

// Llama 3.1 8B's rotary settings: head_dim 128, theta 500000, factor 8, low 1, high 4, original
// context 8192. The expected values come from python3's math module, written apart from the C++:
//   f = 1 / theta ** (j / 128) for j = 0, 2, ..; w = 2 pi / f; f / 8 if w > 8192, f if w < 2048,
//   else s = (8192 / w - 1) / 3 and (1 - s) f / 8 + s f.
BOOST_AUTO_TEST_CASE(llama3_scaling_matches_independent_values) {
  ModelConfig cfg;
  cfg.arch = "llama";
  cfg.hidden_size = 4096;
  cfg.num_heads = 32;
  cfg.rope_theta = 500000.0f;
  cfg.rope_scaling.factor = 8.0f;
  cfg.rope_scaling.low_freq_factor = 1.0f;
  cfg.rope_scaling.high_freq_factor = 4.0f;
  cfg.rope_scaling.original_max_position_embeddings = 8192;
  const std::vector<float> inv_freq = rope_inv_freq(cfg);
  BOOST_REQUIRE_EQUAL(inv_freq.size(), 64u);
  const std::pair<int, double> expected[] = {
      {0, 1.0},                        // high frequencies: kept
      {10, 0.12868737343265052},       //
      {28, 0.0032114459947525913},     // wavelength 1956 < 2048: kept
      {29, 0.002166570763503359},      // between: blended
      {31, 0.0008567514129196321},     //
      {34, 0.00017850781276799638},    // wavelength 6695: still blended
      {35, 9.556212353964683e-05},     // wavelength 8219 > 8192: divided by 8
      {40, 3.428102195952591e-05},     //
      {63, 3.068925988914511e-07}};
  for (const auto& [i, value] : expected)
    BOOST_TEST(std::abs(inv_freq[i] - value) <= 2e-7 * value, "index " << i << ": " << inv_freq[i] << " vs " << value);

  // Without scaling: 1 / theta^(2i / d).
  cfg.rope_scaling.factor = 0.0f;
  const std::vector<float> plain = rope_inv_freq(cfg);
  BOOST_TEST(plain[29] == 0.0026160992529250353, boost::test_tools::tolerance(2e-7));
  BOOST_TEST(plain[63] == 2.455140791131609e-06, boost::test_tools::tolerance(2e-7));
}

BOOST_AUTO_TEST_SUITE_END()

// ---- RMSNorm and rotary by hand -------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(by_hand)

// No layers, an identity LM head: head_logits returns the final RMSNorm of the last position.
BOOST_AUTO_TEST_CASE(rms_norm_of_known_values) {
  ModelConfig cfg = model_shape("llama", 4, 4, 0, 1, 0.02f);
  cfg.rms_norm_eps = 1e-6f;
  TinyModel m = make_model(cfg, 1);
  float* embeddings = m.tensor(0, "embed_tokens.weight");
  const float rows[2][4] = {{1, 2, 3, 4}, {-2, 0, 0, 0}};
  std::copy(rows[0], rows[0] + 4, embeddings);
  std::copy(rows[1], rows[1] + 4, embeddings + 4);
  const float weight[4] = {1.0f, 0.5f, 2.0f, -1.0f};
  std::copy(weight, weight + 4, m.tensor(0, "norm.weight"));
  float* head = m.tensor(0, "lm_head.weight");
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 4; ++c) head[r * 4 + c] = r == c ? 1.0f : 0.0f;
  const std::unique_ptr<CpuModel> net = make_cpu_model(cfg, 2, 1);
  const std::vector<int32_t> tokens = {0, 1};
  std::vector<float> h(8), logits(8);
  net->embed_forward(m.params[0].data(), tokens.data(), 2, 1, h.data());
  net->head_logits(m.params[0].data(), h.data(), 2, 1, logits.data());
  // Row 1: mean square 30 / 4 = 7.5. Row 2: mean square 4 / 4 = 1.
  const double r1 = 1.0 / std::sqrt(7.5 + 1e-6), r2 = 1.0 / std::sqrt(1.0 + 1e-6);
  const double expected[8] = {r1, 2 * r1 * 0.5, 3 * r1 * 2, -4 * r1, -2 * r2, 0, 0, 0};
  for (int i = 0; i < 8; ++i) BOOST_TEST(logits[i] == expected[i], boost::test_tools::tolerance(1e-6));
}

// One head of dim 4, q/k/v projections the identity, o_proj the identity, no MLP: the block's
// output at position 1 is h1 + p0 v0 + p1 v1 with p = softmax(q1.k0 / 2, q1.k1 / 2), where
// q1 = rotary(n1, position 1) and k0 = n0 (position 0 is not rotated). With n0 = 2 e2 and
// n1 = 2 e0, rotate_half pairs element 0 with element 2: q1 = 2 (cos 1, 0, sin 1, 0), so
// q1.k0 = 4 sin 1 and q1.k1 = |n1|^2 = 4.
BOOST_AUTO_TEST_CASE(rotary_pairs_the_halves_with_the_sign_of_rotate_half) {
  ModelConfig cfg = model_shape("llama", 4, 4, 1, 1, 0.02f);
  cfg.intermediate_size = 2;
  cfg.rms_norm_eps = 1e-6f;
  cfg.rope_theta = 10000.0f;  // inverse frequencies 1 and 0.01
  TinyModel m = make_model(cfg, 2);
  for (const char* name : {"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight"}) {
    float* w = m.tensor(1, name);
    for (int r = 0; r < 4; ++r)
      for (int c = 0; c < 4; ++c) w[r * 4 + c] = r == c ? 1.0f : 0.0f;
  }
  std::fill_n(m.tensor(1, "input_layernorm.weight"), 4, 1.0f);
  std::fill_n(m.tensor(1, "down_proj.weight"), 8, 0.0f);
  const std::unique_ptr<CpuModel> net = make_cpu_model(cfg, 1, 2);
  const std::vector<float> h = {0, 0, 1, 0, 1, 0, 0, 0};  // rms 1/2: normed rows are 2 e2, 2 e0
  std::vector<float> out(8);
  net->block_forward(0, m.params[1].data(), h.data(), out.data(), 1, 2);
  const double n = 2.0 / std::sqrt(1.0 + 4e-6);  // 1 / sqrt(0.25 + eps), exactly 2 up to eps
  const double s0 = n * n * std::sin(1.0) / 2, s1 = n * n / 2;
  const double p0 = 1.0 / (1.0 + std::exp(s1 - s0)), p1 = 1.0 - p0;
  const double expected[8] = {0, 0, 1 + n, 0, 1 + p1 * n, 0, p0 * n, 0};
  for (int i = 0; i < 8; ++i)
    BOOST_TEST(std::abs(out[i] - expected[i]) <= 1e-5, "element " << i << ": " << out[i] << " vs " << expected[i]);
}

BOOST_AUTO_TEST_SUITE_END()

// ---- forward against the double reference ----------------------------------------------------

BOOST_AUTO_TEST_SUITE(forward)

BOOST_AUTO_TEST_CASE(embed_blocks_and_head_match_reference) {
  for (const ModelConfig& cfg :
       {tiny_config(), with_llama3_scaling(tiny_config()), qwen2(tiny_config()), qwen3(tiny_config()),
        mistral(tiny_config()), windowed(qwen2(tiny_config()), 2), gemma3(tiny_config()), phi3(tiny_config()),
        phi3(tiny_config(), 8)}) {
    for (bool tied : {false, true}) {
      ModelConfig c = cfg;
      c.tie_word_embeddings = tied;
      const TinyModel m = make_model(c, 11);
      std::mt19937 rng(5);
      const Batch b = make_batch(2, 7, c.vocab_size, 0.3, rng);
      // Built larger than used, so strides of the saved activations differ from the call's shape.
      const std::unique_ptr<CpuModel> net = make_cpu_model(c, 3, 9);
      std::vector<float> h = embedded(*net, m, b);
      const size_t n = h.size();
      Rows reference(n);
      for (size_t r = 0; r < b.tokens.size(); ++r)
        for (int col = 0; col < c.hidden_size; ++col)
          reference[r * c.hidden_size + col] =
              m.tensor(0, "embed_tokens.weight")[b.tokens[r] * c.hidden_size + col] * embed_scale(c);
      // Gemma's scaled embeddings: one fp32 product.
      BOOST_TEST(max_relative_error(h, reference) <= (is_gemma(c) ? 1e-7 : 0.0));
      for (int layer = 0; layer < c.num_layers; ++layer) {
        std::vector<float> next(n);
        net->block_forward(layer, m.params[1 + layer].data(), h.data(), next.data(), b.batch, b.seq);
        reference = reference_block(m, layer, to_double(h), b.batch, b.seq);
        BOOST_TEST(max_relative_error(next, reference) < 1e-5, "layer " << layer << " tied " << tied);
        h.swap(next);
      }
      int64_t count = -1, expected_count = -1;
      const double loss =
          net->head_loss(m.params[0].data(), h.data(), b.targets.data(), b.batch, b.seq, &count, 1.0f, nullptr, nullptr);
      BOOST_TEST(loss == reference_head_loss(m, to_double(h), b.targets, &expected_count),
                 boost::test_tools::tolerance(1e-5));
      BOOST_TEST(count == expected_count);
    }
  }
}

// The rotary scaling reaches the forward: the same weights give other hidden states with it.
BOOST_AUTO_TEST_CASE(llama3_scaling_changes_the_block_output) {
  const ModelConfig plain = tiny_config(), scaled = with_llama3_scaling(tiny_config());
  const TinyModel m = make_model(plain, 12);
  std::mt19937 rng(6);
  const Batch b = make_batch(1, 6, plain.vocab_size, 0.0, rng);
  std::vector<float> h_plain, h_scaled;
  const std::unique_ptr<CpuModel> net_plain = make_cpu_model(plain, 1, 6);
  const std::unique_ptr<CpuModel> net_scaled = make_cpu_model(scaled, 1, 6);
  model_loss(*net_plain, m, b, &h_plain);
  model_loss(*net_scaled, m, b, &h_scaled);
  const int H = plain.hidden_size;
  // Position 0 is never rotated; later ones are.
  for (int c = 0; c < H; ++c) BOOST_TEST(h_plain[c] == h_scaled[c]);
  double moved = 0.0;
  for (size_t i = H; i < h_plain.size(); ++i) moved = std::max(moved, double(std::abs(h_plain[i] - h_scaled[i])));
  BOOST_TEST(moved > 1e-3);
}

BOOST_AUTO_TEST_CASE(causal_positions_before_a_change_are_unaffected) {
  check_causal_positions(tiny_config(), 13, 7);
}

BOOST_AUTO_TEST_SUITE_END()

// ---- gradients ------------------------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(gradients)

BOOST_AUTO_TEST_CASE(parameters_match_finite_differences) { check_parameter_gradients(tiny_config(), 21); }

BOOST_AUTO_TEST_CASE(parameters_match_finite_differences_with_llama3_scaling) {
  check_parameter_gradients(with_llama3_scaling(tiny_config()), 22);
}

BOOST_AUTO_TEST_CASE(parameters_match_finite_differences_with_tied_head) {
  check_parameter_gradients(tied(tiny_config()), 23);
}

// Qwen2's q/k/v biases too (the key bias has a gradient: the rotation makes q.R_j b depend on j).
BOOST_AUTO_TEST_CASE(parameters_match_finite_differences_qwen2) {
  check_parameter_gradients(qwen2(tiny_config()), 26);
  check_parameter_gradients(tied(qwen2(tiny_config())), 27);
}

// Qwen3's q_norm / k_norm weights and the projections under them, head_dim != hidden_size / heads.
BOOST_AUTO_TEST_CASE(parameters_match_finite_differences_qwen3) {
  check_parameter_gradients(qwen3(tiny_config()), 28);
  check_parameter_gradients(tied(qwen3(tiny_config())), 29);
}

// Mistral's sliding window (3 keys over sequences of 5) and its own head_dim.
BOOST_AUTO_TEST_CASE(parameters_match_finite_differences_mistral) {
  check_parameter_gradients(mistral(tiny_config()), 31);
  check_parameter_gradients(windowed(tied(mistral(tiny_config())), 2), 32);
}

// Gemma 3's (1 + w) norms, its four norms per layer, GeGLU, the scaled embeddings' gradient, q/k norms and
// the local / global layers' windows and rope tables; its head tied or not.
BOOST_AUTO_TEST_CASE(parameters_match_finite_differences_gemma3) {
  check_parameter_gradients(gemma3(tiny_config()), 34);
  check_parameter_gradients(tied(gemma3(tiny_config())), 35);
}

// Phi-3: the fused projections, partial rotary and LongRoPE's long factors (sequences of 5 past an original
// context of 4) and short ones (original 8), with the attention factor on cos and sin.
BOOST_AUTO_TEST_CASE(parameters_match_finite_differences_phi3) {
  check_parameter_gradients(phi3(tiny_config()), 81);
  check_parameter_gradients(phi3(tiny_config(), 8), 82);
}

BOOST_AUTO_TEST_CASE(hidden_inputs_match_finite_differences) {
  check_hidden_input_gradients(with_llama3_scaling(tiny_config()), 24, 10);
  check_hidden_input_gradients(qwen3(tiny_config()), 30, 10);
  check_hidden_input_gradients(mistral(tiny_config()), 33, 10);
  check_hidden_input_gradients(gemma3(tiny_config()), 36, 10);
}

BOOST_AUTO_TEST_CASE(grad_scale_scales_and_gradients_accumulate) {
  check_grad_scale_and_accumulation(tiny_config(), 25);
}

BOOST_AUTO_TEST_SUITE_END()

// ---- grouped-query attention ----------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(gqa)

// num_kv_heads == num_heads is plain multi-head attention: the same as leaving it 0.
BOOST_AUTO_TEST_CASE(kv_heads_equal_to_heads_is_plain_mha) {
  ModelConfig mha = tiny_config();
  mha.num_kv_heads = 0;
  ModelConfig full = mha;
  full.num_kv_heads = mha.num_heads;
  const TinyModel m = make_model(mha, 31);
  TinyModel m_full = make_model(full, 31);
  BOOST_REQUIRE(m_full.params == m.params);
  std::mt19937 rng(12);
  const Batch b = make_batch(2, 5, mha.vocab_size, 0.2, rng);
  const std::unique_ptr<CpuModel> net = make_cpu_model(mha, 2, 5);
  const std::unique_ptr<CpuModel> net_full = make_cpu_model(full, 2, 5);
  double loss = 0.0, loss_full = 0.0;
  const auto grads = model_grads(*net, m, b, 1.0f, nullptr, &loss);
  const auto grads_full = model_grads(*net_full, m_full, b, 1.0f, nullptr, &loss_full);
  BOOST_TEST(loss == loss_full);
  BOOST_TEST((grads == grads_full));
}

// GQA with 2 kv heads for 4 query heads equals MHA whose k and v projections repeat each kv head
// for its group of query heads; the GQA kv gradients are the sums over the repeated copies.
BOOST_AUTO_TEST_CASE(grouped_heads_equal_mha_with_repeated_kv_heads) {
  const ModelConfig gqa = tiny_config();
  ModelConfig mha = gqa;
  mha.num_kv_heads = gqa.num_heads;
  const TinyModel m = make_model(gqa, 32);
  TinyModel r = make_model(mha, 32);
  const int H = gqa.hidden_size, d = gqa.head_dim(), group = gqa.num_heads / gqa.kv_heads();
  for (int l = 0; l < gqa.num_layers; ++l)
    for (const TensorSpec& t : m.layout[1 + l].tensors) {
      const float* src = m.params[1 + l].data() + t.offset;
      float* dst = r.params[1 + l].data() + find_tensor(r.layout[1 + l], t.name).offset;
      const bool kv = contains(t.name, "k_proj") || contains(t.name, "v_proj");
      if (!kv) {
        std::copy(src, src + t.numel, dst);
        continue;
      }
      for (int n = 0; n < gqa.num_heads; ++n)  // MHA head n's rows are kv head n / group's
        std::copy(src + (n / group) * d * H, src + (n / group + 1) * d * H, dst + n * d * H);
    }
  r.params[0] = m.params[0];
  std::mt19937 rng(13);
  const Batch b = make_batch(2, 6, gqa.vocab_size, 0.2, rng);
  const std::unique_ptr<CpuModel> net_gqa = make_cpu_model(gqa, 2, 6);
  const std::unique_ptr<CpuModel> net_mha = make_cpu_model(mha, 2, 6);
  std::vector<float> dh_gqa, dh_mha;
  double loss_gqa = 0.0, loss_mha = 0.0;
  const auto g_gqa = model_grads(*net_gqa, m, b, 1.0f, &dh_gqa, &loss_gqa);
  const auto g_mha = model_grads(*net_mha, r, b, 1.0f, &dh_mha, &loss_mha);
  BOOST_TEST(loss_gqa == loss_mha, boost::test_tools::tolerance(1e-6));
  for (size_t i = 0; i < dh_gqa.size(); ++i) BOOST_TEST(close(dh_gqa[i], dh_mha[i], 1e-5, max_abs(dh_mha)));
  for (int l = 0; l < gqa.num_layers; ++l)
    for (const TensorSpec& t : m.layout[1 + l].tensors) {
      const float* got = g_gqa[1 + l].data() + t.offset;
      const float* mha_grad = g_mha[1 + l].data() + find_tensor(r.layout[1 + l], t.name).offset;
      const double scale = max_abs(g_mha[1 + l]);
      std::vector<double> expected(t.numel, 0.0);
      const bool kv = contains(t.name, "k_proj") || contains(t.name, "v_proj");
      for (size_t i = 0; i < t.numel; ++i) {
        if (!kv) {
          expected[i] = mha_grad[i];
          continue;
        }
        const size_t g = i / (static_cast<size_t>(d) * H), within = i % (static_cast<size_t>(d) * H);
        for (int k = 0; k < group; ++k) expected[i] += mha_grad[(g * group + k) * d * H + within];
      }
      for (size_t i = 0; i < t.numel; ++i)
        BOOST_TEST(close(got[i], expected[i], 1e-4, scale), t.name << " element " << i);
    }
}

BOOST_AUTO_TEST_SUITE_END()

// ---- padding, head chunking, decoding logits -------------------------------------------------

BOOST_AUTO_TEST_SUITE(head)

// Padding after a sequence's real tokens (targets -1 there) changes neither its loss nor any gradient.
BOOST_AUTO_TEST_CASE(padded_batch_equals_unpadded_sequences) {
  const ModelConfig cfg = with_llama3_scaling(tiny_config());
  const TinyModel m = make_model(cfg, 41);
  std::mt19937 rng(14);
  const Batch first = make_batch(1, 4, cfg.vocab_size, 0.0, rng);
  const Batch second = make_batch(1, 7, cfg.vocab_size, 0.0, rng);
  Batch padded;
  padded.batch = 2;
  padded.seq = 7;
  padded.tokens = first.tokens;
  padded.targets = first.targets;
  for (int p = 4; p < 7; ++p) {
    padded.tokens.push_back(p);  // arbitrary pad ids: they must not matter
    padded.targets.push_back(-1);
  }
  padded.tokens.insert(padded.tokens.end(), second.tokens.begin(), second.tokens.end());
  padded.targets.insert(padded.targets.end(), second.targets.begin(), second.targets.end());
  const std::unique_ptr<CpuModel> net = make_cpu_model(cfg, 2, 7);
  double loss_padded = 0.0, loss_first = 0.0, loss_second = 0.0;
  const auto g_padded = model_grads(*net, m, padded, 1.0f, nullptr, &loss_padded);
  const auto g_first = model_grads(*net, m, first, 1.0f, nullptr, &loss_first);
  const auto g_second = model_grads(*net, m, second, 1.0f, nullptr, &loss_second);
  BOOST_TEST(loss_padded == loss_first + loss_second, boost::test_tools::tolerance(1e-6));
  for (size_t u = 0; u < g_padded.size(); ++u) {
    const double scale = max_abs(g_padded[u]);
    BOOST_TEST(scale > 0.0);
    for (size_t i = 0; i < g_padded[u].size(); ++i)
      BOOST_TEST(close(g_padded[u][i], g_first[u][i] + g_second[u][i], 1e-5, scale), "unit " << u << " element " << i);
  }
}

BOOST_AUTO_TEST_CASE(chunked_loss_and_gradients_match) {
  for (bool tied : {false, true}) {
    ModelConfig cfg = tiny_config();
    cfg.tie_word_embeddings = tied;
    const std::vector<float> root_grad = check_chunked_head(cfg, 42, 15, reference_head_loss);
    // The head's gradient lands in embed_tokens when tied and in lm_head otherwise.
    const TensorSpec& embeddings = find_tensor(model_layout(cfg)[0], "embed_tokens.weight");
    const bool embeddings_touched = std::any_of(root_grad.begin() + embeddings.offset,
                                                root_grad.begin() + embeddings.offset + embeddings.numel,
                                                [](float g) { return g != 0.0f; });
    BOOST_TEST(embeddings_touched == tied);
  }
}

// head_logits' last-position logits give the loss head_loss takes at that position alone.
BOOST_AUTO_TEST_CASE(last_position_logits_agree_with_the_loss) {
  for (bool tied : {false, true}) {
    ModelConfig cfg = tiny_config();
    cfg.tie_word_embeddings = tied;
    const TinyModel m = make_model(cfg, 43);
    std::mt19937 rng(16);
    const int B = 2, T = 5, H = cfg.hidden_size, V = cfg.vocab_size;
    const std::unique_ptr<CpuModel> net = make_cpu_model(cfg, B, T);
    const std::vector<float> h = random_floats(static_cast<size_t>(B) * T * H, rng, 1.5f);
    std::vector<float> logits(static_cast<size_t>(B) * V);
    net->head_logits(m.params[0].data(), h.data(), B, T, logits.data());
    for (int s = 0; s < B; ++s) {
      const int target = 3 + s;
      std::vector<int32_t> targets(B * T, -1);
      targets[s * T + T - 1] = target;
      int64_t count = 0;
      const double loss =
          net->head_loss(m.params[0].data(), h.data(), targets.data(), B, T, &count, 1.0f, nullptr, nullptr);
      double total = 0.0;
      for (int v = 0; v < V; ++v) total += std::exp(static_cast<double>(logits[s * V + v]));
      BOOST_TEST(loss == std::log(total) - logits[s * V + target], boost::test_tools::tolerance(1e-5));
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()

// ---- argument checks, memory, dispatch -------------------------------------------------------

BOOST_AUTO_TEST_SUITE(checks)

BOOST_AUTO_TEST_CASE(bad_ids_shapes_and_configs_throw) {
  const ModelConfig cfg = tiny_config();
  check_bad_ids_and_shapes(cfg, 51);
  ModelConfig unknown = cfg;
  unknown.arch = "gpt2";
  BOOST_TEST(contains(error_of([&] { make_cpu_model(unknown, 1, 4); }), "(bloom, llama"));
  ModelConfig odd_groups = cfg;
  odd_groups.num_kv_heads = 3;
  BOOST_CHECK_THROW(make_cpu_model(odd_groups, 1, 4), Error);
}

BOOST_AUTO_TEST_CASE(activation_memory_is_accounted) {
  for (bool tied : {false, true}) for (bool q3 : {false, true}) {
    ModelConfig cfg = q3 ? qwen3(tiny_config()) : tiny_config();
    cfg.tie_word_embeddings = tied;
    // At least the saved attention probabilities and SwiGLU inputs of every layer.
    const size_t tokens = 4 * 16;
    check_activation_memory(cfg, cfg.num_layers * (tokens * cfg.num_heads * 16 + 2 * tokens * cfg.ffn_size()) *
                                     sizeof(float));
  }
}

BOOST_AUTO_TEST_CASE(empty_batches_do_nothing) { check_empty_batches(tiny_config(), 52); }


BOOST_AUTO_TEST_SUITE_END()

// ---- Qwen2: layout, names, config.json ---------------------------------------------------------

BOOST_AUTO_TEST_SUITE(qwen2_family)

// Llama's block with the q, k and v biases after the three weights (one fused [q; k; v] each).
BOOST_AUTO_TEST_CASE(layout_adds_qkv_biases_with_hf_names) {
  const ModelConfig cfg = qwen2(tiny_config());
  const std::vector<UnitLayout> llama = model_layout(tiny_config()), layout = model_layout(cfg);
  const int64_t Q = cfg.num_heads * cfg.head_dim(), KV = cfg.kv_heads() * cfg.head_dim();
  BOOST_TEST(layout[0].numel == llama[0].numel);
  BOOST_TEST(layout[1].numel == llama[1].numel + static_cast<size_t>(Q + 2 * KV));
  const std::vector<std::string> names = {"layers.1.input_layernorm.weight", "layers.1.self_attn.q_proj.weight",
                                          "layers.1.self_attn.k_proj.weight", "layers.1.self_attn.v_proj.weight",
                                          "layers.1.self_attn.q_proj.bias",   "layers.1.self_attn.k_proj.bias",
                                          "layers.1.self_attn.v_proj.bias",   "layers.1.self_attn.o_proj.weight"};
  for (size_t i = 0; i < names.size(); ++i) BOOST_TEST(layout[2].tensors[i].name == names[i]);
  const TensorSpec& k_bias = layout[2].tensors[5];
  BOOST_TEST((k_bias.shape == std::vector<int64_t>{KV}));
  BOOST_TEST(!k_bias.decay);
  BOOST_TEST((k_bias.init == InitKind::Zeros));
  BOOST_TEST(hf_tensor_name(cfg, k_bias.name) == "model.layers.1.self_attn.k_proj.bias");
  BOOST_TEST(hf_tensor_name(cfg, "lm_head.weight") == "lm_head.weight");
  BOOST_TEST(!cfg.tied_head());
  BOOST_TEST(model_family("qwen2").rotary);
  BOOST_TEST(model_family("qwen2").grouped_query);
}

// Qwen2.5-0.5B's config.json as transformers 5 writes it: read, written back, read again.
BOOST_AUTO_TEST_CASE(config_json_round_trips) {
  const std::string text = R"({"architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0,
      "bos_token_id": 151643, "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896,
      "initializer_range": 0.02, "intermediate_size": 4864, "layer_types": ["full_attention", "full_attention"],
      "max_position_embeddings": 32768, "max_window_layers": 24, "model_type": "qwen2", "num_attention_heads": 14,
      "num_hidden_layers": 2, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
      "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}, "sliding_window": null,
      "tie_word_embeddings": true, "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})";
  const ModelConfig cfg = model_config_from_hf(text, "qwen2.5");
  BOOST_TEST(cfg.arch == "qwen2");
  BOOST_TEST(cfg.head_dim() == 64);
  BOOST_TEST(cfg.kv_heads() == 2);
  BOOST_TEST(cfg.ffn_size() == 4864);
  BOOST_TEST(cfg.rope_theta == 1e6f);
  BOOST_TEST(cfg.rms_norm_eps == 1e-6f);
  BOOST_TEST(cfg.tie_word_embeddings);
  BOOST_TEST(cfg.rope_scaling.factor == 0.0f);
  const ModelConfig again = written_and_read_back(cfg, "qwen2", "Qwen2ForCausalLM", {"\"use_sliding_window\": false"});
  BOOST_TEST(again.rope_theta == cfg.rope_theta);
  BOOST_TEST(again.num_layers == 2);
  // use_sliding_window with every layer full (layer_types) is no window; a sliding layer without
  // use_sliding_window is refused (qwen_sliding_windows below has the rest).
  std::string sliding = text;
  sliding.replace(sliding.find("\"use_sliding_window\": false"), 27, "\"use_sliding_window\": true ");
  BOOST_TEST(model_config_from_hf(sliding, "s").sliding_window == 0);
  std::string layer = text;
  layer.replace(layer.find("\"full_attention\"]"), 16, "\"sliding_attention\"");
  BOOST_TEST(contains(error_of([&] { model_config_from_hf(layer, "l"); }), "sliding_attention"));
}

// Sizes are checked before they are used: config.json integers are read at 64 bits and range-checked
// (2^32 + 2 layers must not train as 2), epsilons and the rotary base must be finite and > 0, and a
// shape beyond any real model's is refused before a layout is built.
BOOST_AUTO_TEST_CASE(config_json_sizes_are_checked) {
  const std::string base = R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
      "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300, "num_hidden_layers": LAYERS,
      "rms_norm_eps": EPS, "rope_theta": THETA})";
  auto with = [&](const std::string& layers, const std::string& eps, const std::string& theta) {
    std::string t = base;
    t.replace(t.find("LAYERS"), 6, layers);
    t.replace(t.find("EPS"), 3, eps);
    t.replace(t.find("THETA"), 5, theta);
    return t;
  };
  BOOST_TEST(model_config_from_hf(with("2", "1e-5", "10000"), "ok").num_layers == 2);
  BOOST_TEST(contains(error_of([&] { model_config_from_hf(with("4294967298", "1e-5", "10000"), "c"); }),
                      "'num_hidden_layers' = 4294967298 is out of range"));
  BOOST_TEST(contains(error_of([&] { model_config_from_hf(with("-4294967298", "1e-5", "10000"), "c"); }),
                      "out of range"));
  BOOST_TEST(contains(error_of([&] { model_config_from_hf(with("1000000000", "1e-5", "10000"), "c"); }),
                      "model.num_layers = 1000000000: more than shardlm takes"));
  for (const char* eps : {"0", "-1e-5"})
    BOOST_TEST(contains(error_of([&] { model_config_from_hf(with("2", eps, "10000"), "c"); }),
                        "'rms_norm_eps' = "), eps);
  BOOST_TEST(contains(error_of([&] { model_config_from_hf(with("2", "1e-5", "0"), "c"); }), "'rope_theta' = 0"));
  const std::string bloom = R"({"model_type": "bloom", "hidden_size": 64, "n_head": 4, "n_layer": 2,
      "vocab_size": 300, "layer_norm_epsilon": 0})";
  BOOST_TEST(contains(error_of([&] { model_config_from_hf(bloom, "b"); }), "'layer_norm_epsilon' = 0: must be > 0"));
}

// A partial_rotary_factor (at the top, or inside rope_parameters or rope_scaling) would be read and ignored by a
// family that rotates the whole head: it is refused naming the file and the key; 1 is no change. Errors about
// the rope keys name the key the file used.
BOOST_AUTO_TEST_CASE(partial_rotary_is_refused_where_the_family_rotates_the_whole_head) {
  const std::string base = R"({"model_type": "TYPE", "hidden_size": 64, "intermediate_size": 128,
      "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300, "num_hidden_layers": 2EXTRA})";
  auto with = [&](const std::string& type, const std::string& extra) {
    std::string t = base;
    t.replace(t.find("TYPE"), 4, type);
    t.replace(t.find("EXTRA"), 5, extra);
    return t;
  };
  for (const std::string type : {"llama", "qwen2", "qwen3", "mistral"}) {
    for (const std::pair<std::string, std::string>& extra_key : std::vector<std::pair<std::string, std::string>>{
             {R"(, "partial_rotary_factor": 0.5)", "'partial_rotary_factor' = 0.5"},
             {R"(, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5})",
              "'rope_parameters.partial_rotary_factor' = 0.5"},
             {R"(, "rope_scaling": {"rope_type": "default", "partial_rotary_factor": 0.25})",
              "'rope_scaling.partial_rotary_factor' = 0.25"}}) {
      const std::string text = with(type, extra_key.first);
      const std::string message = error_of([&] { model_config_from_hf(text, "dir/config.json"); });
      BOOST_TEST_CONTEXT(text) {
        BOOST_TEST(contains(message, "dir/config.json"), message);
        BOOST_TEST(contains(message, extra_key.second), message);
        BOOST_TEST(contains(message, "only for phi3"), message);
      }
    }
    BOOST_TEST(model_config_from_hf(with(type, R"(, "partial_rotary_factor": 1.0)"), "c").rotary_dim() == 16);
    // A rope type of rope_parameters is named so, not rope_scaling.
    const std::string yarn = error_of([&] {
      model_config_from_hf(with(type, R"(, "rope_parameters": {"rope_type": "yarn", "factor": 4.0})"), "c");
    });
    BOOST_TEST(contains(yarn, "rope_parameters type 'yarn' is not supported"), yarn);
    BOOST_TEST(!contains(yarn, "rope_scaling"), yarn);
  }
}

// An absent rms_norm_eps is the family's transformers config class default: Phi3Config's 1e-5, the others' 1e-6
// (Gemma3TextConfig's: a_sparse_multimodal_text_config_takes_gemma3_text_config_defaults).
BOOST_AUTO_TEST_CASE(an_absent_rms_norm_eps_is_the_config_class_default) {
  for (const std::pair<std::string, float>& family : std::vector<std::pair<std::string, float>>{
           {"llama", 1e-6f}, {"qwen2", 1e-6f}, {"qwen3", 1e-6f}, {"mistral", 1e-6f}, {"phi3", 1e-5f}}) {
    const std::string text = R"({"model_type": ")" + family.first + R"(", "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300, "num_hidden_layers": 2})";
    BOOST_TEST(model_config_from_hf(text, "c").rms_norm_eps == family.second, family.first);
  }
}

BOOST_AUTO_TEST_SUITE_END()

// ---- Qwen3: layout, names, config.json ---------------------------------------------------------

BOOST_AUTO_TEST_SUITE(qwen3_family)

// Llama's block with q_norm and k_norm ([head_dim] each) after o_proj, no biases; q and o are
// heads x head_dim wide, not hidden_size.
BOOST_AUTO_TEST_CASE(layout_adds_qk_norms_with_hf_names) {
  const ModelConfig cfg = qwen3(tiny_config());
  const std::vector<UnitLayout> layout = model_layout(cfg);
  const int64_t H = cfg.hidden_size, D = 6, Q = cfg.num_heads * D, KV = cfg.kv_heads() * D;
  BOOST_TEST(cfg.head_dim() == 6);
  const std::vector<std::string> names = {"layers.1.input_layernorm.weight", "layers.1.self_attn.q_proj.weight",
                                          "layers.1.self_attn.k_proj.weight", "layers.1.self_attn.v_proj.weight",
                                          "layers.1.self_attn.o_proj.weight", "layers.1.self_attn.q_norm.weight",
                                          "layers.1.self_attn.k_norm.weight", "layers.1.post_attention_layernorm.weight"};
  for (size_t i = 0; i < names.size(); ++i) BOOST_TEST(layout[2].tensors[i].name == names[i]);
  BOOST_TEST((layout[2].tensors[1].shape == std::vector<int64_t>{Q, H}));
  BOOST_TEST((layout[2].tensors[2].shape == std::vector<int64_t>{KV, H}));
  BOOST_TEST((layout[2].tensors[4].shape == std::vector<int64_t>{H, Q}));
  const TensorSpec& k_norm = layout[2].tensors[6];
  BOOST_TEST((k_norm.shape == std::vector<int64_t>{D}));
  BOOST_TEST(!k_norm.decay);
  BOOST_TEST((k_norm.init == InitKind::Ones));
  BOOST_TEST(hf_tensor_name(cfg, k_norm.name) == "model.layers.1.self_attn.k_norm.weight");
  const std::vector<LinearModule> modules = linear_modules(cfg);
  BOOST_TEST(modules[0].name == "q_proj");
  BOOST_TEST(modules[0].out == Q);
  BOOST_TEST(modules[3].name == "o_proj");
  BOOST_TEST(modules[3].in == Q);
  BOOST_TEST(model_family("qwen3").rotary);
  BOOST_TEST(model_family("qwen3").grouped_query);
}

// Qwen3-0.6B's config.json as transformers 5 writes it (head_dim 128 at hidden 1024 and 16 heads):
// read, written back, read again.
BOOST_AUTO_TEST_CASE(config_json_round_trips) {
  const std::string text = R"({"architectures": ["Qwen3ForCausalLM"], "attention_bias": false,
      "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128,
      "hidden_act": "silu", "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
      "layer_types": ["full_attention", "full_attention"], "max_position_embeddings": 40960,
      "max_window_layers": 28, "model_type": "qwen3", "num_attention_heads": 16, "num_hidden_layers": 2,
      "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
      "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}, "sliding_window": null,
      "tie_word_embeddings": true, "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})";
  const ModelConfig cfg = model_config_from_hf(text, "qwen3");
  BOOST_TEST(cfg.arch == "qwen3");
  BOOST_TEST(cfg.head_dim() == 128);
  BOOST_TEST(cfg.num_heads * cfg.head_dim() == 2048);
  BOOST_TEST(cfg.kv_heads() == 8);
  BOOST_TEST(cfg.ffn_size() == 3072);
  BOOST_TEST(cfg.rope_theta == 1e6f);
  BOOST_TEST(cfg.tie_word_embeddings);
  const ModelConfig again =
      written_and_read_back(cfg, "qwen3", "Qwen3ForCausalLM", {"\"head_dim\": 128", "\"attention_bias\": false"});
  BOOST_TEST(again.head_dim() == 128);
  BOOST_TEST(again.rope_theta == cfg.rope_theta);
  // Biases are refused.
  std::string bias = text;
  bias.replace(bias.find("\"attention_bias\": false"), 23, "\"attention_bias\": true ");
  BOOST_TEST(contains(error_of([&] { model_config_from_hf(bias, "b"); }), "attention_bias"));
}

// Qwen2's and Qwen3's windows as transformers reads them: layer i is windowed where layer_types[i] is
// sliding_attention, or (without layer_types) where use_sliding_window and i >= max_window_layers
// (default 28). Every layer windowed gives the model's window, none gives 0; some layers only, or
// sliding layers without use_sliding_window, are refused naming the file and the keys. Written back
// with every layer's type, it reads the same.
BOOST_AUTO_TEST_CASE(qwen_sliding_windows) {
  for (const std::string type : {"qwen2", "qwen3"}) {
    BOOST_TEST_CONTEXT(type) {
      auto config = [&](const std::string& window_keys) {
        return model_config_from_hf(R"({"model_type": ")" + type + R"(", "hidden_size": 32, "intermediate_size": 48,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 97, "num_hidden_layers": 3, )" +
                                        window_keys + "}",
                                    "dir/config.json");
      };
      BOOST_TEST(config(R"("use_sliding_window": false, "sliding_window": 8)").sliding_window == 0);
      BOOST_TEST(config(R"("use_sliding_window": true, "sliding_window": 8)").sliding_window == 0);  // 3 < 28
      BOOST_TEST(config(R"("use_sliding_window": true, "sliding_window": 8, "max_window_layers": 3)").sliding_window ==
                 0);
      const ModelConfig all = config(R"("use_sliding_window": true, "sliding_window": 8, "max_window_layers": 0)");
      BOOST_TEST(all.sliding_window == 8);
      BOOST_TEST(config(R"("use_sliding_window": true, "sliding_window": 8, "layer_types":
          ["sliding_attention", "sliding_attention", "sliding_attention"])")
                     .sliding_window == 8);
      const std::string written = hf_config_json(all);
      BOOST_TEST(contains(written, "\"use_sliding_window\": true"), written);
      BOOST_TEST(contains(written, "\"sliding_window\": 8"), written);
      BOOST_TEST(contains(written, "\"sliding_attention\""), written);
      BOOST_TEST(model_config_from_hf(written, "written").sliding_window == 8);
      BOOST_TEST(!contains(hf_config_json(config("\"use_sliding_window\": false")), "\"sliding_attention\""));
      auto refused = [&](const std::string& keys, const std::string& part) {
        const std::string message = error_of([&] { config(keys); });
        BOOST_TEST(contains(message, "dir/config.json"), message);
        BOOST_TEST(contains(message, part), message);
      };
      refused(R"("use_sliding_window": true, "sliding_window": 8, "max_window_layers": 1)",
              "2 of 3 layers use a sliding window (from layer 1");
      refused(R"("use_sliding_window": true, "sliding_window": 8, "layer_types":
          ["full_attention", "sliding_attention", "full_attention"])",
              "1 of 3 layers");
      refused(R"("use_sliding_window": false, "sliding_window": 8, "layer_types":
          ["sliding_attention", "sliding_attention", "sliding_attention"])",
              "use_sliding_window is false");
      refused(R"("use_sliding_window": true, "sliding_window": 0, "max_window_layers": 0)", "'sliding_window' = 0");
      refused(R"("use_sliding_window": true, "sliding_window": null, "max_window_layers": 0)", "needs a sliding_window");
      refused(R"("layer_types": ["full_attention"])", "layer_types must be a list of num_hidden_layers (3)");
      refused(R"("layer_types": ["full_attention", "chunked_attention", "full_attention"])", "chunked_attention");
    }
  }
}

// The Llama-style families read head_dim for themselves too; a Llama with hidden_size / heads as
// head_dim keeps 0 (the default), one with another head_dim keeps it.
BOOST_AUTO_TEST_CASE(llama_head_dim_is_read) {
  const std::string base = R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
      "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300, "num_hidden_layers": 2HEAD})";
  auto with = [&](const std::string& head) {
    std::string t = base;
    t.replace(t.find("HEAD"), 4, head);
    return model_config_from_hf(t, "c");
  };
  BOOST_TEST(with("").head_size == 0);
  BOOST_TEST(with(", \"head_dim\": 16").head_size == 0);
  BOOST_TEST(with(", \"head_dim\": 32").head_dim() == 32);
  BOOST_TEST(contains(error_of([&] { with(", \"head_dim\": 0"); }), "head_dim must be positive"));
}

BOOST_AUTO_TEST_SUITE_END()

// ---- Mistral: layout, names, config.json -------------------------------------------------------

BOOST_AUTO_TEST_SUITE(mistral_family)

// Llama's block and names (no biases, no q/k norms); q and o are heads x head_dim wide.
BOOST_AUTO_TEST_CASE(layout_is_llamas_with_hf_names) {
  const ModelConfig cfg = mistral(tiny_config());
  const std::vector<UnitLayout> layout = model_layout(cfg), llama = model_layout(qwen3(tiny_config()));
  const std::vector<std::string> names = {"layers.1.input_layernorm.weight", "layers.1.self_attn.q_proj.weight",
                                          "layers.1.self_attn.k_proj.weight", "layers.1.self_attn.v_proj.weight",
                                          "layers.1.self_attn.o_proj.weight", "layers.1.post_attention_layernorm.weight",
                                          "layers.1.mlp.gate_proj.weight",   "layers.1.mlp.up_proj.weight",
                                          "layers.1.mlp.down_proj.weight"};
  BOOST_TEST_REQUIRE(layout[2].tensors.size() == names.size());
  for (size_t i = 0; i < names.size(); ++i) BOOST_TEST(layout[2].tensors[i].name == names[i]);
  BOOST_TEST((layout[2].tensors[1].shape == std::vector<int64_t>{cfg.num_heads * 6, cfg.hidden_size}));
  BOOST_TEST(hf_tensor_name(cfg, "layers.1.self_attn.q_proj.weight") == "model.layers.1.self_attn.q_proj.weight");
  BOOST_TEST(hf_tensor_name(cfg, "lm_head.weight") == "lm_head.weight");
  const std::vector<LinearModule> modules = linear_modules(cfg);
  std::vector<std::string> module_names;
  for (const LinearModule& m : modules) module_names.push_back(m.name);
  // PEFT's target_modules for Mistral are Llama's.
  BOOST_TEST((module_names ==
              std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}));
  BOOST_TEST(model_family("mistral").sliding_window);
  BOOST_TEST(!model_family("llama").sliding_window);
  BOOST_TEST(model_family("qwen2").sliding_window);  // where every layer is windowed (qwen_sliding_windows)
  BOOST_TEST(!model_family("bloom").sliding_window);
}

// Mistral-7B-v0.1's config.json as transformers 5 writes it (sliding_window 4096), cut to 2 layers:
// read, written back with the window, read again.
const std::string kMistral7B = R"({"architectures": ["MistralForCausalLM"], "attention_dropout": 0.0,
    "bos_token_id": 1, "eos_token_id": 2, "head_dim": null, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 32768,
    "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 2, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": false,
    "torch_dtype": "bfloat16", "use_cache": true, "vocab_size": 32000})";

std::string with_window(const std::string& value) {
  std::string t = kMistral7B;
  const std::string key = "\"sliding_window\": 4096";
  t.replace(t.find(key), key.size(), value);
  return t;
}

BOOST_AUTO_TEST_CASE(config_json_round_trips_with_the_window) {
  const ModelConfig cfg = model_config_from_hf(kMistral7B, "mistral");
  BOOST_TEST(cfg.arch == "mistral");
  BOOST_TEST(cfg.sliding_window == 4096);
  BOOST_TEST(cfg.head_dim() == 128);
  BOOST_TEST(cfg.head_size == 0);
  BOOST_TEST(cfg.kv_heads() == 8);
  BOOST_TEST(cfg.ffn_size() == 14336);
  BOOST_TEST(!cfg.tie_word_embeddings);
  const ModelConfig again = written_and_read_back(cfg, "mistral", "MistralForCausalLM", {"\"sliding_window\": 4096"});
  BOOST_TEST(again.sliding_window == 4096);
  BOOST_TEST(again.head_dim() == 128);
}

// v0.3 sets sliding_window null: full causal attention, written back as null. Left out, it is
// transformers' MistralConfig default, 4096. Mistral Nemo's head_dim 128 at hidden 5120 and 32 heads.
BOOST_AUTO_TEST_CASE(null_absent_and_own_head_dim) {
  const ModelConfig none = model_config_from_hf(with_window("\"sliding_window\": null"), "v0.3");
  BOOST_TEST(none.sliding_window == 0);
  BOOST_TEST(contains(hf_config_json(none), "\"sliding_window\": null"), hf_config_json(none));
  BOOST_TEST(model_config_from_hf(with_window("\"vocab_size_copy\": 1"), "absent").sliding_window == 4096);
  std::string nemo = with_window("\"sliding_window\": null");
  nemo.replace(nemo.find("\"head_dim\": null"), 16, "\"head_dim\": 128");
  nemo.replace(nemo.find("\"hidden_size\": 4096"), 19, "\"hidden_size\": 5120");
  const ModelConfig n = model_config_from_hf(nemo, "nemo");
  BOOST_TEST(n.head_dim() == 128);
  BOOST_TEST(n.num_heads * n.head_dim() == 4096);
  BOOST_TEST(contains(hf_config_json(n), "\"head_dim\": 128"));
}

// A window of 0 or below, or not an integer, is refused naming the file and the key.
BOOST_AUTO_TEST_CASE(bad_windows_are_refused_naming_file_and_key) {
  for (const std::string bad : {"0", "-1", "-4096", "2.5", "\"4096\""}) {
    const std::string message = error_of([&] { model_config_from_hf(with_window("\"sliding_window\": " + bad), "dir/config.json"); });
    BOOST_TEST(contains(message, "dir/config.json"), message);
    BOOST_TEST(contains(message, "sliding_window"), message);
  }
  BOOST_TEST(contains(error_of([&] { model_config_from_hf(with_window("\"sliding_window\": 0"), "c"); }), "must be > 0"));
}

// A CPU model built with a window of 1 makes every position its own context: the block output of a
// position does not change when an earlier token changes (it only reaches later positions through
// the residual stream, which window 1 cuts in one layer).
BOOST_AUTO_TEST_CASE(window_of_one_isolates_positions_in_a_block) {
  ModelConfig cfg = mistral(tiny_config());
  cfg.sliding_window = 1;
  const TinyModel m = make_model(cfg, 61);
  std::mt19937 rng(9);
  const int T = 6, H = cfg.hidden_size;
  std::vector<float> h = random_floats(static_cast<size_t>(T) * H, rng), out(h.size()), changed_out(h.size());
  const std::unique_ptr<CpuModel> net = make_cpu_model(cfg, 1, T);
  net->block_forward(0, m.params[1].data(), h.data(), out.data(), 1, T);
  for (int c = 0; c < H; ++c) h[2 * H + c] += 0.5f;  // position 2's input
  net->block_forward(0, m.params[1].data(), h.data(), changed_out.data(), 1, T);
  for (int t = 0; t < T; ++t) {
    double moved = 0.0;
    for (int c = 0; c < H; ++c) moved += std::abs(out[t * H + c] - changed_out[t * H + c]);
    if (t == 2)
      BOOST_TEST(moved > 1e-3);
    else
      BOOST_TEST(moved == 0.0, "position " << t);
  }
}

BOOST_AUTO_TEST_SUITE_END()

// ---- Gemma 3: layout, names, config.json (both forms), refusals ---------------------------------

BOOST_AUTO_TEST_SUITE(gemma3_family)

// Llama's block with four norms (post_attention_layernorm on the attention's output; pre/post_feedforward)
// and q/k norms, every norm initialised to 0 (1 + w); PEFT's names are Llama's.
BOOST_AUTO_TEST_CASE(layout_has_four_norms_at_zero_and_llama_names) {
  const ModelConfig cfg = gemma3(tiny_config());
  const std::vector<UnitLayout> layout = model_layout(cfg);
  const std::vector<std::string> names = {
      "layers.1.input_layernorm.weight",         "layers.1.self_attn.q_proj.weight",
      "layers.1.self_attn.k_proj.weight",        "layers.1.self_attn.v_proj.weight",
      "layers.1.self_attn.o_proj.weight",        "layers.1.self_attn.q_norm.weight",
      "layers.1.self_attn.k_norm.weight",        "layers.1.post_attention_layernorm.weight",
      "layers.1.pre_feedforward_layernorm.weight", "layers.1.post_feedforward_layernorm.weight",
      "layers.1.mlp.gate_proj.weight",           "layers.1.mlp.up_proj.weight",
      "layers.1.mlp.down_proj.weight"};
  BOOST_TEST_REQUIRE(layout[2].tensors.size() == names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    BOOST_TEST(layout[2].tensors[i].name == names[i]);
    if (names[i].find("norm") != std::string::npos) BOOST_TEST((layout[2].tensors[i].init == InitKind::Zeros), names[i]);
  }
  BOOST_TEST((find_tensor(layout[0], "norm.weight").init == InitKind::Zeros));
  BOOST_TEST(hf_tensor_name(cfg, "layers.1.self_attn.q_norm.weight") == "model.layers.1.self_attn.q_norm.weight");
  std::vector<std::string> module_names;
  for (const LinearModule& m : linear_modules(cfg)) module_names.push_back(m.name);
  BOOST_TEST((module_names ==
              std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}));
  BOOST_TEST(model_family("gemma3").sliding_window);
}

// Layers alternate local and global: window and rotary table per layer; the global table is the linear
// scaling's (inv_freq / factor), the local one its own base.
BOOST_AUTO_TEST_CASE(per_layer_window_and_rope_tables) {
  ModelConfig cfg = gemma3(tiny_config());
  cfg.num_layers = 6;
  cfg.sliding_window_pattern = 3;
  for (int i = 0; i < 6; ++i) {
    const bool global = i == 2 || i == 5;
    BOOST_TEST(cfg.layer_sliding_window(i) == (global ? 0 : 3), i);
    BOOST_TEST(cfg.layer_rope_table(i) == (global ? 0 : 1), i);
  }
  const std::vector<float> global = rope_inv_freq(cfg, 0), local = rope_inv_freq(cfg, 1);
  BOOST_REQUIRE_EQUAL(global.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    BOOST_TEST(global[i] == static_cast<float>(1.0 / std::pow(100.0, 2.0 * i / 6)) / 2.0f);
    BOOST_TEST(local[i] == static_cast<float>(1.0 / std::pow(10.0, 2.0 * i / 6)));
  }
  BOOST_TEST(cfg.attention_scale() == static_cast<float>(1.0 / std::sqrt(5.0)));
  // Other families: every layer alike, one table, 1 / sqrt(head_dim).
  const ModelConfig m = mistral(tiny_config());
  BOOST_TEST(m.layer_sliding_window(1) == 3);
  BOOST_TEST(m.layer_rope_table(1) == 0);
  BOOST_TEST(m.rope_tables() == 1);
}

// Gemma-3-1B's config.json in transformers 4.5x's form (rope_theta, rope_local_base_freq, rope_scaling,
// sliding_window_pattern, no layer_types); the 4B's linear factor 8 added below.
const std::string kGemma1B = kGemma3_1bConfig;

std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  BOOST_REQUIRE_MESSAGE(at != std::string::npos, from);
  return text.replace(at, from.size(), to);
}

BOOST_AUTO_TEST_CASE(transformers_4_config_reads_and_round_trips) {
  const ModelConfig cfg = model_config_from_hf(kGemma1B, "gemma-3-1b");
  BOOST_TEST(cfg.arch == "gemma3");
  BOOST_TEST(cfg.head_dim() == 256);
  BOOST_TEST(cfg.kv_heads() == 1);
  BOOST_TEST(cfg.sliding_window == 512);
  BOOST_TEST(cfg.sliding_window_pattern == 6);
  BOOST_TEST(cfg.rope_theta == 1e6f);
  BOOST_TEST(cfg.rope_local_theta == 1e4f);
  BOOST_TEST(cfg.rope_linear_factor == 0.0f);
  BOOST_TEST(cfg.query_pre_attn_scalar == 256.0f);
  BOOST_TEST(cfg.tie_word_embeddings);  // Gemma3TextConfig's default
  BOOST_TEST(cfg.layer_sliding_window(5) == 0);
  BOOST_TEST(cfg.layer_sliding_window(6) == 512);
  const ModelConfig scaled = model_config_from_hf(
      replaced(kGemma1B, "\"rope_scaling\": null", R"("rope_scaling": {"rope_type": "linear", "factor": 8.0})"), "4b");
  BOOST_TEST(scaled.rope_linear_factor == 8.0f);
  for (const ModelConfig& c : {cfg, scaled}) {
    const std::string written = hf_config_json(c);
    for (const std::string part : {"\"model_type\": \"gemma3_text\"", "\"Gemma3ForCausalLM\"",
                                   "\"hidden_activation\": \"gelu_pytorch_tanh\"", "\"query_pre_attn_scalar\": 256",
                                   "\"full_attention\"", "\"sliding_attention\"", "\"rope_parameters\""})
      BOOST_TEST(contains(written, part), written);
    BOOST_TEST(!contains(written, "\"query_pre_attn_scalar\": 256.0"), written);  // an int, as transformers 5 demands
    BOOST_TEST(!contains(written, "\"hidden_act\""), written);
    BOOST_TEST(!contains(written, "\"rope_scaling\""), written);  // transformers 5 would read it for rope_parameters
    const ModelConfig again = model_config_from_hf(written, "written");
    BOOST_TEST(hf_config_json(again) == written);
    BOOST_TEST(again.sliding_window_pattern == 6);
    BOOST_TEST(again.rope_linear_factor == c.rope_linear_factor);
    BOOST_TEST(again.rope_local_theta == 1e4f);
    BOOST_TEST(again.sliding_window == 512);
  }
}

// A Gemma 3 of deck keys leaves query_pre_attn_scalar at 0 (head_dim): its config.json says head_dim, so its
// checkpoints resume and transformers reads it (config.json refuses a 0).
BOOST_AUTO_TEST_CASE(a_deck_gemma3_writes_its_head_dim_as_the_scalar) {
  ModelConfig cfg = model_config_from_hf(kGemma1B, "gemma-3-1b");
  cfg.query_pre_attn_scalar = 0.0f;
  const std::string written = hf_config_json(cfg);
  BOOST_TEST(contains(written, "\"query_pre_attn_scalar\": 256"), written);
  const ModelConfig again = model_config_from_hf(written, "written");
  BOOST_TEST(again.query_pre_attn_scalar == 256.0f);
  BOOST_TEST(again.attention_scale() == cfg.attention_scale());
}

// transformers 5's form: layer_types and rope_parameters per layer type (the fixture's config.json).
BOOST_AUTO_TEST_CASE(transformers_5_config_reads) {
  const std::string v5 = R"({"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "head_dim": 12,
      "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 32, "intermediate_size": 48, "num_attention_heads": 4,
      "num_hidden_layers": 3, "num_key_value_heads": 2, "query_pre_attn_scalar": 10, "sliding_window": 4,
      "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
      "rope_parameters": {"full_attention": {"factor": 2.0, "rope_theta": 1000.0, "rope_type": "linear"},
                          "sliding_attention": {"rope_theta": 100.0, "rope_type": "default"}},
      "attn_logit_softcapping": null, "final_logit_softcapping": null, "use_bidirectional_attention": false,
      "tie_word_embeddings": true, "vocab_size": 97})";
  const ModelConfig cfg = model_config_from_hf(v5, "v5");
  BOOST_TEST(cfg.sliding_window_pattern == 2);
  BOOST_TEST(cfg.rope_theta == 1000.0f);
  BOOST_TEST(cfg.rope_linear_factor == 2.0f);
  BOOST_TEST(cfg.rope_local_theta == 100.0f);
  BOOST_TEST(cfg.sliding_window == 4);
  // Every layer global: pattern 1; every layer local: pattern 0 (no global layer).
  const std::string all_full = replaced(v5, R"(["sliding_attention", "full_attention", "sliding_attention"])",
                                        R"(["full_attention", "full_attention", "full_attention"])");
  BOOST_TEST(model_config_from_hf(all_full, "full").sliding_window_pattern == 1);
  const std::string all_local = replaced(v5, R"(["sliding_attention", "full_attention", "sliding_attention"])",
                                         R"(["sliding_attention", "sliding_attention", "sliding_attention"])");
  BOOST_TEST(model_config_from_hf(all_local, "local").sliding_window_pattern == 0);
  // Not a repeating pattern of local layers then one global layer.
  const std::string irregular = replaced(v5, R"(["sliding_attention", "full_attention", "sliding_attention"])",
                                         R"(["full_attention", "sliding_attention", "sliding_attention"])");
  BOOST_TEST(contains(error_of([&] { model_config_from_hf(irregular, "c"); }), "layer_types"));
  // A scaled local table is not Gemma 3's.
  const std::string local_scaled = replaced(v5, R"({"rope_theta": 100.0, "rope_type": "default"})",
                                            R"({"rope_theta": 100.0, "rope_type": "linear", "factor": 2.0})");
  BOOST_TEST(contains(error_of([&] { model_config_from_hf(local_scaled, "c"); }), "rope_type 'linear'"));
}

// google/gemma-3-4b-it's config.json as the hub has it (tests/fixtures/hf/config_only): its text_config names only
// hidden_size, intermediate_size, num_hidden_layers, rope_scaling and sliding_window, and transformers takes every
// other key from Gemma3TextConfig's defaults; gemma-3-12b-it and 27b-it leave out no more keys than these.
BOOST_AUTO_TEST_CASE(a_sparse_multimodal_text_config_takes_gemma3_text_config_defaults) {
  const std::string path = SHARDLM_SOURCE_DIR "/tests/fixtures/hf/config_only/gemma-3-4b-it.json";
  const ModelConfig cfg = model_config_from_hf(read_text_file(path), path);
  BOOST_TEST(cfg.arch == "gemma3");
  BOOST_TEST(cfg.hidden_size == 2560);  // the file's
  BOOST_TEST(cfg.intermediate_size == 10240);
  BOOST_TEST(cfg.num_layers == 34);
  BOOST_TEST(cfg.sliding_window == 1024);
  BOOST_TEST(cfg.rope_linear_factor == 8.0f);
  BOOST_TEST(cfg.vocab_size == 262208);  // Gemma3TextConfig's
  BOOST_TEST(cfg.num_heads == 8);
  BOOST_TEST(cfg.kv_heads() == 4);
  BOOST_TEST(cfg.head_dim() == 256);
  BOOST_TEST(cfg.rms_norm_eps == 1e-6f);
  BOOST_TEST(cfg.max_position_embeddings == 131072);
  BOOST_TEST(cfg.init_std == 0.02f);
  BOOST_TEST(cfg.tie_word_embeddings);
  BOOST_TEST(cfg.rope_theta == 1e6f);
  BOOST_TEST(cfg.rope_local_theta == 1e4f);
  BOOST_TEST(cfg.query_pre_attn_scalar == 256.0f);
  BOOST_TEST(cfg.sliding_window_pattern == 6);
  // The text model alone of an empty text_config is Gemma3TextConfig() itself.
  const ModelConfig bare = model_config_from_hf(R"({"model_type": "gemma3", "text_config": {}})", "bare");
  BOOST_TEST((bare.hidden_size == 2304 && bare.intermediate_size == 9216 && bare.num_layers == 26));
  BOOST_TEST(bare.sliding_window == 4096);
}

// Soft-capping (Gemma 2's), bidirectional attention, another activation and Gemma 2 itself are refused
// naming the file and why.
BOOST_AUTO_TEST_CASE(unsupported_options_are_refused) {
  const auto refused = [](const std::string& text) { return error_of([&] { model_config_from_hf(text, "dir/config.json"); }); };
  const std::string attn = refused(replaced(kGemma1B, "\"attn_logit_softcapping\": null", "\"attn_logit_softcapping\": 50.0"));
  BOOST_TEST(contains(attn, "dir/config.json"), attn);
  BOOST_TEST(contains(attn, "soft-capping"), attn);
  BOOST_TEST(contains(refused(replaced(kGemma1B, "\"final_logit_softcapping\": null", "\"final_logit_softcapping\": 30.0")),
                      "final_logit_softcapping"));
  BOOST_TEST(contains(refused(replaced(kGemma1B, "\"rope_scaling\": null",
                                       "\"use_bidirectional_attention\": true, \"rope_scaling\": null")),
                      "use_bidirectional_attention"));
  BOOST_TEST(contains(refused(replaced(kGemma1B, "gelu_pytorch_tanh", "gelu")), "hidden_activation 'gelu'"));
  BOOST_TEST(contains(refused(replaced(kGemma1B, "\"rope_scaling\": null", "\"partial_rotary_factor\": 0.5")),
                      "'partial_rotary_factor' = 0.5"));
  BOOST_TEST(contains(refused(replaced(kGemma1B, "\"rope_scaling\": null",
                                       R"("rope_scaling": {"rope_type": "default", "partial_rotary_factor": 0.5})")),
                      "rope_scaling: partial_rotary_factor = 0.5 is not supported"));
  const std::string gemma2 = refused(replaced(kGemma1B, "\"gemma3_text\"", "\"gemma2\""));
  BOOST_TEST(contains(gemma2, "Gemma 2"), gemma2);
  BOOST_TEST(contains(gemma2, "soft-caps"), gemma2);
  // Another model_type lists the supported ones only: gemma2 is read only to be refused with its reason.
  const std::string gpt2 = refused(replaced(kGemma1B, "\"gemma3_text\"", "\"gpt2\""));
  BOOST_TEST(contains(gpt2, "dir/config.json: model_type 'gpt2' is not supported (bloom, llama, qwen2, qwen3, mistral, "
                            "gemma3_text, gemma3, phi3)"),
             gpt2);
}

BOOST_AUTO_TEST_SUITE_END()

// ---- Phi-3: fused layout, names, config.json ----------------------------------------------------

BOOST_AUTO_TEST_SUITE(phi3_family)

// q|k|v and gate|up are one tensor each, with Hugging Face's names and shapes; they sit where Llama's separate
// tensors sit, so the fused tensors' rows are the projections' (the offsets the models read).
BOOST_AUTO_TEST_CASE(layout_fuses_qkv_and_gate_up_with_hf_names) {
  const ModelConfig cfg = phi3(tiny_config());
  const std::vector<UnitLayout> layout = model_layout(cfg);
  const std::vector<std::string> names = {"layers.1.input_layernorm.weight", "layers.1.self_attn.qkv_proj.weight",
                                          "layers.1.self_attn.o_proj.weight", "layers.1.post_attention_layernorm.weight",
                                          "layers.1.mlp.gate_up_proj.weight", "layers.1.mlp.down_proj.weight"};
  BOOST_TEST_REQUIRE(layout[2].tensors.size() == names.size());
  for (size_t i = 0; i < names.size(); ++i) BOOST_TEST(layout[2].tensors[i].name == names[i]);
  const int64_t H = cfg.hidden_size, d = 8, F = cfg.ffn_size();
  BOOST_TEST((layout[2].tensors[1].shape == std::vector<int64_t>{(cfg.num_heads + 2 * cfg.kv_heads()) * d, H}));
  BOOST_TEST((layout[2].tensors[4].shape == std::vector<int64_t>{2 * F, H}));
  BOOST_TEST(hf_tensor_name(cfg, "layers.1.self_attn.qkv_proj.weight") == "model.layers.1.self_attn.qkv_proj.weight");
  BOOST_TEST(hf_tensor_name(cfg, "layers.0.mlp.gate_up_proj.weight") == "model.layers.0.mlp.gate_up_proj.weight");
  // The same element count per block as Llama's separate tensors.
  ModelConfig llama = cfg;
  llama.arch = "mistral";
  BOOST_TEST(model_layout(llama)[2].numel == layout[2].numel);
  std::vector<std::string> module_names;
  for (const LinearModule& m : linear_modules(cfg)) module_names.push_back(m.name);
  // PEFT's target_modules for Phi-3.
  BOOST_TEST((module_names == std::vector<std::string>{"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}));
  BOOST_TEST(linear_modules(cfg)[0].out == (cfg.num_heads + 2 * cfg.kv_heads()) * d);
  BOOST_TEST(linear_modules(cfg)[2].out == 2 * F);
  BOOST_TEST(model_family("phi3").sliding_window);
  BOOST_TEST(model_family("phi3").hf_block_class == "Phi3DecoderLayer");
}

// LoRA on qkv_proj is one A [r, hidden] and one B [(heads + 2 kv_heads) head_dim, r] with PEFT's names, not
// three adapters; gate_up_proj likewise.
BOOST_AUTO_TEST_CASE(lora_adapts_the_fused_modules_with_peft_names) {
  ModelConfig cfg = phi3(tiny_config());
  cfg.lora.r = 4;
  cfg.lora.target_modules = {"qkv_proj", "gate_up_proj"};
  const std::vector<UnitLayout> lora = lora_layout(cfg);
  BOOST_TEST_REQUIRE(lora[1].tensors.size() == 4u);
  BOOST_TEST(lora[1].tensors[0].name == "layers.0.self_attn.qkv_proj.lora_A.weight");
  BOOST_TEST((lora[1].tensors[0].shape == std::vector<int64_t>{4, cfg.hidden_size}));
  BOOST_TEST(lora[1].tensors[1].name == "layers.0.self_attn.qkv_proj.lora_B.weight");
  BOOST_TEST((lora[1].tensors[1].shape == std::vector<int64_t>{(cfg.num_heads + 2 * cfg.kv_heads()) * 8, 4}));
  BOOST_TEST((lora[1].tensors[3].shape == std::vector<int64_t>{2 * cfg.ffn_size(), 4}));
  BOOST_TEST(peft_tensor_name(cfg, lora[1].tensors[1].name) ==
             "base_model.model.model.layers.0.self_attn.qkv_proj.lora_B.weight");
  cfg.lora.target_modules = {"q_proj"};
  BOOST_TEST(contains(error_of([&] { lora_layout(cfg); }), "has no linear module 'q_proj'"));
}

// The tiny fixture's config.json as transformers 5.17 writes it (rope_parameters with LongRoPE and the
// partial rotary factor), and Phi-3-mini-128k-instruct's as transformers 4 wrote it (top-level
// partial_rotary_factor absent, rope_scaling type longrope), cut to 2 layers, hidden 256 (head_dim 8) and 4 factors.
const std::string kPhi3V5 = R"({"architectures": ["Phi3ForCausalLM"], "hidden_act": "silu", "hidden_size": 32,
    "initializer_range": 0.2, "intermediate_size": 48, "max_position_embeddings": 64, "model_type": "phi3",
    "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2, "original_max_position_embeddings": 8,
    "rms_norm_eps": 1e-06, "rope_parameters": {"long_factor": [1.25, 3.0, 7.0], "original_max_position_embeddings": 8,
    "partial_rotary_factor": 0.75, "rope_theta": 1000.0, "rope_type": "longrope", "short_factor": [1.0, 1.5, 2.5]},
    "sliding_window": 6, "tie_word_embeddings": false, "vocab_size": 97})";
const std::string kPhi3Mini128k = R"({"architectures": ["Phi3ForCausalLM"], "attention_bias": false,
    "attention_dropout": 0.0, "bos_token_id": 1, "embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu",
    "hidden_size": 256, "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 131072,
    "model_type": "phi3", "num_attention_heads": 32, "num_hidden_layers": 2, "num_key_value_heads": 32,
    "original_max_position_embeddings": 4096, "pad_token_id": 32000, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05,
    "rope_scaling": {"long_factor": [1.08, 1.11, 1.14, 1.34], "short_factor": [1.05, 1.05, 1.05, 1.1],
    "type": "longrope"}, "rope_theta": 10000.0, "sliding_window": 262144, "tie_word_embeddings": false,
    "torch_dtype": "bfloat16", "use_cache": true, "vocab_size": 32064})";

BOOST_AUTO_TEST_CASE(config_json_round_trips_both_forms) {
  const ModelConfig cfg = model_config_from_hf(kPhi3V5, "tiny_phi3");
  BOOST_TEST((cfg.longrope.long_factor == std::vector<float>{1.25f, 3.0f, 7.0f}));
  // arch, partial rotary (6 of 8 dimensions), theta, window and original context as the file says.
  BOOST_TEST((cfg.arch == "phi3" && cfg.partial_rotary_factor == 0.75 && cfg.rotary_dim() == 6));
  BOOST_TEST((cfg.rope_theta == 1000.0f && cfg.sliding_window == 6));
  BOOST_TEST(cfg.longrope.original_max_position_embeddings == 8);
  BOOST_TEST(rope_attention_factor(cfg) == std::sqrt(2.0f), boost::test_tools::tolerance(1e-6f));
  const ModelConfig again = written_and_read_back(
      cfg, "phi3", "Phi3ForCausalLM",
      {"\"rope_type\": \"longrope\"", "\"partial_rotary_factor\": 0.75", "\"original_max_position_embeddings\": 8",
       "\"sliding_window\": 6"});
  BOOST_TEST(again.rotary_dim() == 6);
  BOOST_TEST((again.longrope.short_factor == cfg.longrope.short_factor));
  BOOST_TEST(again.longrope.attention_factor == 0.0f);
  BOOST_TEST(!contains(hf_config_json(cfg), "\"rope_scaling\""));

  const ModelConfig mini = model_config_from_hf(kPhi3Mini128k, "phi3-mini-128k");
  BOOST_TEST(mini.rotary_dim() == 8);
  BOOST_TEST(mini.longrope.original_max_position_embeddings == 4096);
  BOOST_TEST(mini.longrope.long_factor.size() == 4u);
  // sqrt(1 + ln 32 / ln 4096)
  BOOST_TEST(rope_attention_factor(mini) == static_cast<float>(std::sqrt(1.0 + std::log(32.0) / std::log(4096.0))),
             boost::test_tools::tolerance(1e-6f));
  const ModelConfig mini_again = model_config_from_hf(hf_config_json(mini), "written");
  BOOST_TEST((mini_again.longrope.long_factor == mini.longrope.long_factor));
  BOOST_TEST(mini_again.sliding_window == 262144);
  // An attention_factor of its own is kept and written back.
  std::string own = kPhi3V5;
  own.replace(own.find("\"rope_type\""), 0, "\"attention_factor\": 1.5, ");
  const ModelConfig with_factor = model_config_from_hf(own, "own");
  BOOST_TEST(rope_attention_factor(with_factor) == 1.5f);
  BOOST_TEST(model_config_from_hf(hf_config_json(with_factor), "written").longrope.attention_factor == 1.5f);
}

// Rope types other than longrope (and default), biases, a bad partial factor or factors of the wrong length are
// refused naming the file and the key.
BOOST_AUTO_TEST_CASE(unsupported_keys_are_refused_naming_file_and_key) {
  auto replaced = [](const std::string& from, const std::string& to) {
    std::string t = kPhi3V5;
    t.replace(t.find(from), from.size(), to);
    return t;
  };
  auto refused = [](const std::string& json, const std::string& key) {
    const std::string message = error_of([&] { model_config_from_hf(json, "dir/config.json"); });
    BOOST_TEST(contains(message, "dir/config.json"), message);
    BOOST_TEST(contains(message, key), message);
  };
  refused(replaced("\"rope_type\": \"longrope\"", "\"rope_type\": \"dynamic\""), "rope_parameters type 'dynamic'");
  refused(replaced("\"vocab_size\": 97", "\"vocab_size\": 97, \"attention_bias\": true"), "attention_bias");
  refused(replaced("\"vocab_size\": 97", "\"vocab_size\": 97, \"mlp_bias\": true"), "mlp_bias");
  refused(replaced("\"partial_rotary_factor\": 0.75", "\"partial_rotary_factor\": 1.5"), "partial_rotary_factor");
  refused(replaced("[1.25, 3.0, 7.0]", "[1.25, 3.0]"), "long_factor");
  refused(replaced("[1.0, 1.5, 2.5]", "\"x\""), "short_factor");
  std::string no_original = replaced("\"original_max_position_embeddings\": 8,", "");
  no_original = no_original.replace(no_original.find("\"original_max_position_embeddings\": 8,"), 38, "");
  refused(no_original, "original_max_position_embeddings");
}

// Phi3Config reads the old rope types su and yarn as longrope, from rope_parameters or rope_scaling; a refused type
// names the key the file used.
BOOST_AUTO_TEST_CASE(su_and_yarn_are_longrope) {
  for (const std::string type : {"su", "yarn"}) {
    std::string t = kPhi3Mini128k;
    t.replace(t.find("\"longrope\""), 10, "\"" + type + "\"");
    const ModelConfig cfg = model_config_from_hf(t, type);
    BOOST_TEST((cfg.longrope.long_factor == std::vector<float>{1.08f, 1.11f, 1.14f, 1.34f}), type);
    BOOST_TEST(cfg.longrope.original_max_position_embeddings == 4096, type);
  }
  std::string dynamic = kPhi3Mini128k;
  dynamic.replace(dynamic.find("\"longrope\""), 10, "\"dynamic\"");
  const std::string message = error_of([&] { model_config_from_hf(dynamic, "c"); });
  BOOST_TEST(contains(message, "rope_scaling type 'dynamic' is not supported"), message);
}

// A forward of no more positions than the original context takes the short factors, a longer one the long
// factors: the block's output at the same positions differs between a sequence of 4 and one of 5.
BOOST_AUTO_TEST_CASE(longer_forwards_take_the_long_factors) {
  const ModelConfig cfg = phi3(tiny_config());
  const TinyModel m = make_model(cfg, 71);
  std::mt19937 rng(3);
  const int H = cfg.hidden_size;
  std::vector<float> h = random_floats(static_cast<size_t>(5) * H, rng), four(4 * H), five(5 * H);
  const std::unique_ptr<CpuModel> net = make_cpu_model(cfg, 1, 5);
  net->block_forward(0, m.params[1].data(), h.data(), four.data(), 1, 4);
  net->block_forward(0, m.params[1].data(), h.data(), five.data(), 1, 5);
  double moved = 0.0;
  for (int i = H; i < 4 * H; ++i) moved += std::abs(four[i] - five[i]);  // position 0 does not rotate
  BOOST_TEST(moved > 1e-3);
  BOOST_TEST(rope_uses_long(cfg, 4));
  BOOST_TEST(!rope_uses_long(cfg, 3));
}

BOOST_AUTO_TEST_SUITE_END()
