// Shared by the CPU model suites (test_model: BLOOM, test_llama: Llama, test_unit_model,
// test_generate): tiny configs, random data, a tiny model's flat parameters, and full
// forward/backward passes through the CpuModel interface.
#pragma once

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "shardlm/core.hpp"
#include "shardlm/model.hpp"

// A tiny model named by its family in Boost.Test's log, as a data test case's sample.
namespace shardlm {
inline std::ostream& boost_test_print_type(std::ostream& os, const ModelConfig& cfg) { return os << cfg.arch; }
}  // namespace shardlm

namespace model_test {

using namespace shardlm;

// ---- tiny models of each family ---------------------------------------------------------------

// A config of `arch` with the sizes every family has (the rest at ModelConfig's defaults).
inline ModelConfig model_shape(const std::string& arch, int vocab_size, int hidden_size, int num_layers, int num_heads,
                               float init_std) {
  ModelConfig c;
  c.arch = arch;
  c.vocab_size = vocab_size;
  c.hidden_size = hidden_size;
  c.num_layers = num_layers;
  c.num_heads = num_heads;
  c.init_std = init_std;
  return c;
}

// Larger init_std than the real models' so attention is far from uniform and every path carries signal.
inline ModelConfig tiny_bloom() { return model_shape("bloom", 41, 24, 2, 3, 0.3f); }

inline ModelConfig tiny_llama() {
  ModelConfig c = model_shape("llama", 37, 32, 2, 4, 0.3f);
  c.num_kv_heads = 2;
  c.intermediate_size = 40;
  c.rope_theta = 500.0f;
  c.rope_scaling.factor = 8.0f;
  c.rope_scaling.original_max_position_embeddings = 8;  // all three frequency bands within a few positions
  return c;
}

// cfg as family `arch` without Llama 3's rope scaling, which Mistral, Gemma 3 and Phi-3 do not take.
inline ModelConfig unscaled_as(ModelConfig c, const char* arch) {
  c.arch = arch;
  c.rope_scaling = RopeScaling{};
  return c;
}

// Qwen2: tiny_llama's shape with q/k/v biases and the head tied, as Qwen2.5's small models.
inline ModelConfig tiny_qwen2() {
  ModelConfig c = tiny_llama();
  c.arch = "qwen2";
  c.tie_word_embeddings = true;
  return c;
}

// Qwen3: tiny_llama's shape with per-head q/k RMSNorms, no biases, an untied head and head_dim 12 where
// hidden_size / heads is 8 (q is 48 wide, as Qwen3-0.6B's 2048 at hidden 1024).
inline ModelConfig tiny_qwen3() {
  ModelConfig c = tiny_llama();
  c.arch = "qwen3";
  c.head_size = 12;
  return c;
}

// Mistral: tiny_llama's shape without rope scaling, head_dim 12 where hidden_size / heads is 8 (as
// Mistral Nemo's) and a sliding window of 3 keys, shorter than the tests' sequences.
inline ModelConfig tiny_mistral() {
  ModelConfig c = unscaled_as(tiny_llama(), "mistral");
  c.head_size = 12;
  c.sliding_window = 3;
  return c;
}

// cfg as Gemma 3 (its block: (1 + w) norms, sandwich norms, GeGLU, scaled embeddings, q/k norms) with local
// layers (a window of `window` keys, rope base `local_theta`) then global ones (cfg's rope_theta over a
// linear factor 2) in turn, its own head_dim and a score scale other than head_dim's.
inline ModelConfig as_gemma3(const ModelConfig& cfg, int head_dim, int window, float local_theta, float query_scalar) {
  ModelConfig c = unscaled_as(cfg, "gemma3");
  c.head_size = head_dim;
  c.sliding_window = window;
  c.sliding_window_pattern = 2;
  c.rope_local_theta = local_theta;
  c.rope_linear_factor = 2.0f;
  c.query_pre_attn_scalar = query_scalar;
  return c;
}

// Gemma 3: tiny_llama's shape as Gemma 3 with head_dim 12, a local layer (window 3, rope base 100) then a
// global one (base 500 / 2), query_pre_attn_scalar 10, tied head as the released models.
inline ModelConfig tiny_gemma3() {
  ModelConfig c = as_gemma3(tiny_llama(), 12, 3, 100.0f, 10.0f);
  c.tie_word_embeddings = true;
  return c;
}

// Phi-3: tiny_llama's shape without llama3 scaling, q|k|v and gate|up fused, rotary over 6 of the 8 dimensions
// of each head (partial_rotary_factor 0.75), LongRoPE with an original context of 3 positions (so the tests'
// sequences of 4 or more, and decoding's prefills of 4, take the long factors) against max_position_embeddings
// 32 (attention factor sqrt(1 + ln(32 / 3) / ln 3)), a sliding window of 3 keys, untied.
inline ModelConfig tiny_phi3() {
  ModelConfig c = unscaled_as(tiny_llama(), "phi3");
  c.partial_rotary_factor = 0.75;
  c.longrope.short_factor = {1.0f, 1.5f, 2.5f};
  c.longrope.long_factor = {1.25f, 3.0f, 7.0f};
  c.longrope.original_max_position_embeddings = 3;
  c.max_position_embeddings = 32;
  c.sliding_window = 3;
  return c;
}

// Every family's tiny model, for the cases each family passes (BOOST_DATA_TEST_CASE over them).
inline std::vector<ModelConfig> tiny_families() {
  return {tiny_bloom(), tiny_llama(), tiny_qwen2(), tiny_qwen3(), tiny_mistral(), tiny_gemma3(), tiny_phi3()};
}

// ---- helpers --------------------------------------------------------------------------------

inline std::vector<float> random_floats(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

inline const TensorSpec& find_tensor(const UnitLayout& unit, const std::string& suffix) {
  for (const TensorSpec& t : unit.tensors)
    if (t.name.size() >= suffix.size() &&
        t.name.compare(t.name.size() - suffix.size(), suffix.size(), suffix) == 0)
      return t;
  throw Error("no tensor " + suffix + " in unit " + unit.name);
}

// Largest element-wise error relative to the reference's largest magnitude; infinite where actual
// has a NaN (which std::max would skip: 16-bit garbage reads as NaN).
inline double max_relative_error(const std::vector<float>& actual, const std::vector<double>& reference) {
  BOOST_REQUIRE_EQUAL(actual.size(), reference.size());
  double worst = 0.0, scale = 0.0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double error = std::abs(actual[i] - reference[i]);
    worst = std::isnan(error) ? INFINITY : std::max(worst, error);
    scale = std::max(scale, std::abs(reference[i]));
  }
  return worst / std::max(scale, 1e-30);
}

// A whole model's parameters: one flat fp32 vector per FSDP unit.
struct TinyModel {
  ModelConfig cfg;
  std::vector<UnitLayout> layout;
  std::vector<std::vector<float>> params;
  float* tensor(size_t unit, const std::string& suffix) {
    return params[unit].data() + find_tensor(layout[unit], suffix).offset;
  }
  const float* tensor(size_t unit, const std::string& suffix) const {
    return params[unit].data() + find_tensor(layout[unit], suffix).offset;
  }
  // Null when the unit has no such tensor (the biases only some families have).
  const float* tensor_or_null(size_t unit, const std::string& suffix) const {
    for (const TensorSpec& t : layout[unit].tensors)
      if (t.name.size() >= suffix.size() && t.name.compare(t.name.size() - suffix.size(), suffix.size(), suffix) == 0)
        return params[unit].data() + t.offset;
    return nullptr;
  }
};

// The library's init, then noise on the Ones/Zeros tensors (norm weights, biases) so they matter.
inline TinyModel make_model(const ModelConfig& cfg, uint64_t seed) {
  TinyModel m;
  m.cfg = cfg;
  m.layout = model_layout(cfg);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> noise(0.0f, 0.2f);
  for (size_t u = 0; u < m.layout.size(); ++u) {
    std::vector<float> flat(m.layout[u].numel);
    init_unit_slice(m.layout[u], static_cast<int>(u), seed, 0, flat.size(), flat.data());
    for (const TensorSpec& t : m.layout[u].tensors)
      if (t.init != InitKind::Normal)
        for (size_t i = t.offset; i < t.offset + t.numel; ++i) flat[i] += noise(rng);
    m.params.push_back(std::move(flat));
  }
  return m;
}

struct Batch {
  int batch = 0, seq = 0;
  std::vector<int32_t> tokens, targets;
};

// Random tokens; targets are random ids or -1 with probability `no_target`.
inline Batch make_batch(int B, int T, int vocab, double no_target, std::mt19937& rng) {
  Batch b;
  b.batch = B;
  b.seq = T;
  std::uniform_int_distribution<int32_t> token(0, vocab - 1);
  std::bernoulli_distribution skip(no_target);
  for (int i = 0; i < B * T; ++i) {
    b.tokens.push_back(token(rng));
    b.targets.push_back(skip(rng) ? -1 : token(rng));
  }
  return b;
}

// Blocks then head on a given h0; `final_hidden` receives the last hidden states when given.
inline double loss_from_h0(CpuModel& net, const TinyModel& m, const std::vector<float>& h0, const Batch& b,
                           std::vector<float>* final_hidden = nullptr) {
  std::vector<float> h = h0, next(h0.size());
  for (int l = 0; l < m.cfg.num_layers; ++l) {
    net.block_forward(l, m.params[1 + l].data(), h.data(), next.data(), b.batch, b.seq);
    h.swap(next);
  }
  if (final_hidden) *final_hidden = h;
  int64_t count = 0;
  return net.head_loss(m.params[0].data(), h.data(), b.targets.data(), b.batch, b.seq, &count, 0.0f, nullptr,
                       nullptr);
}

// The embedding's hidden states h_0 of b's tokens through net: batch x seq rows of hidden_size.
inline std::vector<float> embedded(CpuModel& net, const TinyModel& m, const Batch& b) {
  std::vector<float> h0(static_cast<size_t>(b.batch) * b.seq * m.cfg.hidden_size);
  net.embed_forward(m.params[0].data(), b.tokens.data(), b.batch, b.seq, h0.data());
  return h0;
}

inline double model_loss(CpuModel& net, const TinyModel& m, const Batch& b, std::vector<float>* final_hidden = nullptr) {
  return loss_from_h0(net, m, embedded(net, m, b), b, final_hidden);
}

// Full forward and backward of grad_scale * loss: gradients per unit, and d/dh0 in *dh0.
inline std::vector<std::vector<float>> model_grads(CpuModel& net, const TinyModel& m, const Batch& b, float grad_scale,
                                            std::vector<float>* dh0 = nullptr, double* loss = nullptr) {
  const size_t n = static_cast<size_t>(b.batch) * b.seq * m.cfg.hidden_size;
  const int L = m.cfg.num_layers;
  std::vector<std::vector<float>> hidden(L + 1, std::vector<float>(n));
  net.embed_forward(m.params[0].data(), b.tokens.data(), b.batch, b.seq, hidden[0].data());
  for (int l = 0; l < L; ++l)
    net.block_forward(l, m.params[1 + l].data(), hidden[l].data(), hidden[l + 1].data(), b.batch, b.seq);
  std::vector<std::vector<float>> grads;
  for (const std::vector<float>& p : m.params) grads.emplace_back(p.size(), 0.0f);
  std::vector<float> dh(n), dh_prev(n);
  int64_t count = 0;
  const double l_value = net.head_loss(m.params[0].data(), hidden[L].data(), b.targets.data(), b.batch, b.seq,
                                       &count, grad_scale, dh.data(), grads[0].data());
  if (loss) *loss = l_value;
  for (int l = L - 1; l >= 0; --l) {
    net.block_backward(l, m.params[1 + l].data(), dh.data(), dh_prev.data(), grads[1 + l].data(), b.batch, b.seq);
    dh.swap(dh_prev);
  }
  if (dh0) *dh0 = dh;
  net.embed_backward(m.params[0].data(), b.tokens.data(), dh.data(), grads[0].data(), b.batch, b.seq);
  return grads;
}

}  // namespace model_test
