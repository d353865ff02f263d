#define BOOST_TEST_MODULE test_lora
#include <boost/test/unit_test.hpp>
#include <boost/test/data/test_case.hpp>
// LoRA's layout and names: the adapters of each family's targeted modules (shapes, order, PEFT's
// tensor names), PEFT's initialisation (Kaiming-uniform A within 1/sqrt(in), zero B; Gaussian A),
// the scale with and without rsLoRA, and the refusal of a module the family does not have; the CPU
// models with adapters against the merged model; LoRA dropout (its masks' statistics, gradients
// against finite differences, evaluation and decoding without it, seeds, memory).

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cpu_lora.hpp"
#include "cpu_model_test_support.hpp"
#include "model_checks.hpp"
#include "shardlm/core.hpp"
#include "shardlm/model.hpp"
#include "test_support.hpp"

using namespace shardlm;
using namespace model_test;
namespace data = boost::unit_test::data;

namespace {

ModelConfig with_lora(ModelConfig cfg, std::vector<std::string> targets, int r = 4) {
  cfg.lora.r = r;
  cfg.lora.alpha = 8;
  cfg.lora.target_modules = std::move(targets);
  return cfg;
}

std::vector<std::string> names_of(const UnitLayout& u) {
  std::vector<std::string> n;
  for (const TensorSpec& t : u.tensors) n.push_back(t.name);
  return n;
}

}  // namespace

BOOST_AUTO_TEST_CASE(llama_adapters_follow_the_family_order_with_peft_names) {
  const ModelConfig cfg = with_lora(tiny_llama(), {"v_proj", "q_proj", "down_proj"});
  const std::vector<UnitLayout> lora = lora_layout(cfg);
  BOOST_TEST_REQUIRE(lora.size() == 3u);
  BOOST_TEST(lora[0].tensors.empty());
  BOOST_TEST(lora[0].name == "root");
  const std::vector<std::string> want = {
      "layers.1.self_attn.q_proj.lora_A.weight", "layers.1.self_attn.q_proj.lora_B.weight",
      "layers.1.self_attn.v_proj.lora_A.weight", "layers.1.self_attn.v_proj.lora_B.weight",
      "layers.1.mlp.down_proj.lora_A.weight",    "layers.1.mlp.down_proj.lora_B.weight"};
  BOOST_TEST(names_of(lora[2]) == want, boost::test_tools::per_element());
  // q_proj: [r, H] and [H, r]; v_proj's output is kv_heads * head_dim = 2 * 8; down_proj reads F = 40.
  const auto& t = lora[2].tensors;
  BOOST_TEST((t[0].shape == std::vector<int64_t>{4, 32}));
  BOOST_TEST((t[1].shape == std::vector<int64_t>{32, 4}));
  BOOST_TEST((t[3].shape == std::vector<int64_t>{16, 4}));
  BOOST_TEST((t[4].shape == std::vector<int64_t>{4, 40}));
  BOOST_TEST(t[1].offset == t[0].numel);
  BOOST_TEST(lora[2].numel == 4u * 32 + 32 * 4 + 4 * 32 + 16 * 4 + 4 * 40 + 32 * 4);
  BOOST_TEST(peft_tensor_name(cfg, t[0].name) == "base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight");
}

BOOST_AUTO_TEST_CASE(bloom_adapters_and_names) {
  const ModelConfig cfg = with_lora(tiny_bloom(), {"query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"}, 2);
  const std::vector<UnitLayout> lora = lora_layout(cfg);
  BOOST_TEST_REQUIRE(lora[1].tensors.size() == 8u);
  BOOST_TEST(lora[1].tensors[0].name == "h.0.self_attention.query_key_value.lora_A.weight");
  BOOST_TEST((lora[1].tensors[1].shape == std::vector<int64_t>{3 * 24, 2}));
  BOOST_TEST((lora[1].tensors[6].shape == std::vector<int64_t>{2, 4 * 24}));
  BOOST_TEST(peft_tensor_name(cfg, lora[1].tensors[2].name) ==
             "base_model.model.transformer.h.0.self_attention.dense.lora_A.weight");
  const std::vector<LinearModule> modules = linear_modules(cfg);
  BOOST_TEST(modules.size() == 4u);
}

BOOST_AUTO_TEST_CASE(off_without_a_rank) {
  ModelConfig cfg = tiny_llama();
  BOOST_TEST(!cfg.lora.enabled());
  for (const UnitLayout& u : lora_layout(cfg)) BOOST_TEST(u.tensors.empty());
}

BOOST_AUTO_TEST_CASE(peft_initialisation) {
  for (LoraInit init : {LoraInit::Kaiming, LoraInit::Gaussian}) {
    ModelConfig cfg = with_lora(tiny_llama(), {"q_proj", "up_proj"}, 8);
    cfg.lora.init = init;
    const UnitLayout block = lora_layout(cfg)[1];
    std::vector<float> values(block.numel);
    init_unit_slice(block, 1, 42, 0, block.numel, values.data());
    for (const TensorSpec& t : block.tensors) {
      const auto begin = values.begin() + static_cast<std::ptrdiff_t>(t.offset);
      const std::vector<float> v(begin, begin + static_cast<std::ptrdiff_t>(t.numel));
      double ss = 0, max_abs = 0;
      for (float x : v) ss += double(x) * x, max_abs = std::max(max_abs, double(std::fabs(x)));
      const double rms = std::sqrt(ss / v.size());
      if (t.name.find("lora_B") != std::string::npos) {
        BOOST_TEST(max_abs == 0.0, t.name);
      } else if (init == LoraInit::Kaiming) {
        // Uniform in +-1/sqrt(in): within the bound, rms near bound/sqrt(3).
        const double bound = 1.0 / std::sqrt(double(t.shape[1]));
        BOOST_TEST(max_abs <= bound, t.name);
        BOOST_TEST(std::fabs(rms - bound / std::sqrt(3.0)) < 0.1 * bound, t.name << " rms " << rms);
      } else {
        BOOST_TEST(std::fabs(rms - 1.0 / 8) < 0.1 / 8, t.name << " rms " << rms);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(scale_as_peft) {
  LoraConfig l;
  l.r = 16, l.alpha = 32;
  BOOST_TEST(l.scale() == 2.0);
  l.use_rslora = true;
  BOOST_TEST(l.scale() == 8.0);
}

BOOST_AUTO_TEST_CASE(an_unknown_module_is_refused) {
  const ModelConfig cfg = with_lora(tiny_bloom(), {"q_proj"});
  const std::string e = error_of([&] { lora_layout(cfg); });
  BOOST_TEST(e.find("bloom has no linear module 'q_proj'") != std::string::npos, e);
}

// ---- the CPU models with adapters, against the merged model W + scale B A ----------------------

namespace {

struct Adapted {
  TinyModel base;                        // the base weights (model_layout)
  std::vector<UnitLayout> lora;          // the adapters' layout
  std::vector<std::vector<float>> adapters;
};

// Base weights as the model suites make them, adapters random (A and B non-zero) on every module.
Adapted adapted_model(ModelConfig cfg, int r, uint64_t seed) {
  std::vector<std::string> all;
  for (const LinearModule& m : linear_modules(cfg)) all.push_back(m.name);
  cfg = with_lora(cfg, all, r);
  cfg.lora.alpha = 3;  // scale 3 / r, not 1
  Adapted a;
  a.base = make_model(cfg, seed);
  a.lora = lora_layout(cfg);
  std::mt19937 rng(static_cast<uint32_t>(seed + 1));
  for (const UnitLayout& u : a.lora) a.adapters.push_back(random_floats(u.numel, rng, 0.3f));
  return a;
}

// An adapted weight of unit `unit`: its LoRA A [r, in] and B [out, r] among the unit's adapters and the
// base weight W [out, in] they add to.
struct AdaptedWeight {
  size_t unit;
  const TensorSpec& a;
  const TensorSpec& b;
  const TensorSpec& w;
  int64_t r() const { return a.shape[0]; }
  int64_t in() const { return a.shape[1]; }
  int64_t out() const { return b.shape[0]; }
};

// Every adapted weight of the units past the root.
std::vector<AdaptedWeight> adapted_weights(const Adapted& a) {
  const std::string suffix = ".lora_A.weight";
  std::vector<AdaptedWeight> all;
  for (size_t u = 1; u < a.lora.size(); ++u)
    for (const TensorSpec& t : a.lora[u].tensors) {
      if (t.name.find(suffix) == std::string::npos) continue;
      const std::string module = t.name.substr(0, t.name.size() - suffix.size());
      all.push_back({u, t, find_tensor(a.lora[u], module + ".lora_B.weight"),
                     find_tensor(a.base.layout[u], module + ".weight")});
    }
  return all;
}

// The base model with each adapted weight replaced by W + scale * B A (LoRA off).
TinyModel merged(const Adapted& a) {
  TinyModel m = a.base;
  m.cfg.lora = LoraConfig{};
  const double scale = a.base.cfg.lora.scale();
  for (const AdaptedWeight& aw : adapted_weights(a)) {
    const int64_t r = aw.r(), in = aw.in(), out = aw.out();
    const float* A = a.adapters[aw.unit].data() + aw.a.offset;
    const float* B = a.adapters[aw.unit].data() + aw.b.offset;
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) {
        double s = 0;
        for (int64_t k = 0; k < r; ++k) s += double(B[o * r + k]) * A[k * in + i];
        m.params[aw.unit][aw.w.offset + o * in + i] += static_cast<float>(scale * s);
      }
  }
  return m;
}

// The first layer's output for hidden rows h0 of one sequence decoded from its start (a cache of as
// many positions as rows of `hidden` width), by `net` with `params`.
std::vector<float> decoded_first_layer(CpuModel& net, CpuParams params, const std::vector<float>& h0, int hidden) {
  const int n = static_cast<int>(h0.size()) / hidden;
  net.decode_begin(1, n, n);
  std::vector<int> slots(n, 0), positions(n);
  for (int i = 0; i < n; ++i) positions[i] = i;
  std::vector<float> out(h0.size());
  net.block_decode(0, params, h0.data(), out.data(), n, slots.data(), positions.data());
  return out;
}

// The adapted model's hidden states h_0 .. h_L on b, the root's parameters `root` (the base's own root
// by default; split as lora.modules_to_save trains it otherwise).
std::vector<std::vector<float>> adapted_forward(CpuModel& net, const Adapted& a, const Batch& b, CpuParams root = {}) {
  const TinyModel& m = a.base;
  if (!root.base && !root.adapter) root = m.params[0].data();  // (a root saved whole has no frozen part: base null)
  const size_t n = static_cast<size_t>(b.batch) * b.seq * m.cfg.hidden_size;
  const int L = m.cfg.num_layers;
  std::vector<std::vector<float>> hidden(L + 1, std::vector<float>(n));
  net.embed_forward(root, b.tokens.data(), b.batch, b.seq, hidden[0].data());
  for (int l = 0; l < L; ++l)
    net.block_forward(l, {m.params[1 + l].data(), a.adapters[1 + l].data()}, hidden[l].data(), hidden[l + 1].data(),
                      b.batch, b.seq);
  return hidden;
}

// The adapted model's loss on b (a forward alone).
double adapted_loss(CpuModel& net, const Adapted& a, const Batch& b) {
  const std::vector<std::vector<float>> hidden = adapted_forward(net, a, b);
  int64_t count = 0;
  return net.head_loss(a.base.params[0].data(), hidden.back().data(), b.targets.data(), b.batch, b.seq, &count, 0.0f,
                       nullptr, nullptr);
}

// Forward and backward of the adapted model with the base frozen: the loss, d/dh0, and the
// adapters' gradients per unit. `root` and `droot` are the root's parameters and gradients (the base's
// own root, frozen, by default; split as lora.modules_to_save trains it otherwise).
double adapted_grads(CpuModel& net, const Adapted& a, const Batch& b, std::vector<float>* dh0,
                     std::vector<std::vector<float>>* grads, CpuParams root = {}, UnitGrads droot = {}) {
  const TinyModel& m = a.base;
  if (!root.base && !root.adapter) root = m.params[0].data();
  const size_t n = static_cast<size_t>(b.batch) * b.seq * m.cfg.hidden_size;
  const int L = m.cfg.num_layers;
  std::vector<std::vector<float>> hidden = adapted_forward(net, a, b, root);
  grads->clear();
  for (const std::vector<float>& p : a.adapters) grads->emplace_back(p.size(), 0.0f);
  std::vector<float> dh(n), dh_prev(n);
  int64_t count = 0;
  const double loss = net.head_loss(root, hidden[L].data(), b.targets.data(), b.batch, b.seq, &count, 1.0f, dh.data(),
                                    droot);
  for (int l = L - 1; l >= 0; --l) {
    net.block_backward(l, {m.params[1 + l].data(), a.adapters[1 + l].data()}, dh.data(), dh_prev.data(),
                       UnitGrads{nullptr, (*grads)[1 + l].data()}, b.batch, b.seq);
    dh.swap(dh_prev);
  }
  *dh0 = dh;
  net.embed_backward(root, b.tokens.data(), dh.data(), droot, b.batch, b.seq);  // frozen: nothing
  return loss;
}

// The root of `m` as a LoRA run of cfg holds it: the frozen rest (lora_frozen_layout) and the modules of
// lora.modules_to_save (lora_layout's root), each tensor copied by name.
std::vector<float> root_part(const TinyModel& m, const UnitLayout& as) {
  std::vector<float> out(as.numel);
  for (const TensorSpec& t : as.tensors)
    for (const TensorSpec& w : m.layout[0].tensors)
      if (w.name == t.name) std::copy_n(m.params[0].begin() + w.offset, t.numel, out.begin() + t.offset);
  return out;
}

void check_against_merged(const ModelConfig& shape) {
  const Adapted a = adapted_model(shape, 3, 11);
  const TinyModel m = merged(a);
  std::mt19937 rng(5);
  const Batch b = make_batch(2, 7, shape.vocab_size, 0.2, rng);
  auto adapted_net = make_cpu_model(a.base.cfg, 2, 7);
  auto merged_net = make_cpu_model(m.cfg, 2, 7);

  std::vector<float> dh0_lora, dh0_merged;
  std::vector<std::vector<float>> dadapters;
  const double loss = adapted_grads(*adapted_net, a, b, &dh0_lora, &dadapters);
  double loss_merged = 0;
  const std::vector<std::vector<float>> dmerged = model_grads(*merged_net, m, b, 1.0f, &dh0_merged, &loss_merged);
  BOOST_TEST(loss == loss_merged, boost::test_tools::tolerance(1e-5));
  BOOST_TEST(max_relative_error(dh0_lora, std::vector<double>(dh0_merged.begin(), dh0_merged.end())) < 1e-4);

  // With W' = W + s B A: dB = s dW' A^T and dA = s B^T dW', from the merged model's weight gradient.
  const double scale = a.base.cfg.lora.scale();
  for (const AdaptedWeight& aw : adapted_weights(a)) {
    const size_t u = aw.unit;
    const int64_t r = aw.r(), in = aw.in(), out = aw.out();
    const float* A = a.adapters[u].data() + aw.a.offset;
    const float* B = a.adapters[u].data() + aw.b.offset;
    const float* dW = dmerged[u].data() + aw.w.offset;
    std::vector<double> want_a(r * in, 0.0), want_b(out * r, 0.0);
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i)
        for (int64_t k = 0; k < r; ++k) {
          want_b[o * r + k] += scale * dW[o * in + i] * A[k * in + i];
          want_a[k * in + i] += scale * B[o * r + k] * dW[o * in + i];
        }
    const auto got = [&](const TensorSpec& s) {
      return std::vector<float>(dadapters[u].begin() + s.offset, dadapters[u].begin() + s.offset + s.numel);
    };
    BOOST_TEST_CONTEXT(aw.a.name) {
      BOOST_TEST(max_relative_error(got(aw.a), want_a) < 1e-4);
      BOOST_TEST(max_relative_error(got(aw.b), want_b) < 1e-4);
    }
  }
}

}  // namespace

BOOST_DATA_TEST_CASE(adapters_equal_the_merged_model, data::make(tiny_families()), shape) {
  check_against_merged(shape);
}

// PEFT's initialisation (B = 0) leaves the model as it was.
BOOST_AUTO_TEST_CASE(fresh_adapters_change_nothing) {
  for (const ModelConfig& shape : {tiny_llama(), tiny_bloom()}) {
    const ModelConfig cfg = with_lora(shape, {linear_modules(shape).front().name, linear_modules(shape).back().name});
    const TinyModel m = make_model(cfg, 3);
    std::vector<std::vector<float>> adapters;
    for (const UnitLayout& u : lora_layout(cfg)) {
      adapters.emplace_back(u.numel);
      init_unit_slice(u, 0, 3, 0, u.numel, adapters.back().data());
    }
    std::mt19937 rng(2);
    const Batch b = make_batch(1, 5, cfg.vocab_size, 0.0, rng);
    auto with = make_cpu_model(cfg, 1, 5);
    ModelConfig plain = cfg;
    plain.lora = LoraConfig{};
    auto without = make_cpu_model(plain, 1, 5);
    std::vector<float> h0(5 * cfg.hidden_size), h(h0.size()), h_lora(h0.size());
    with->embed_forward(m.params[0].data(), b.tokens.data(), 1, 5, h0.data());
    without->block_forward(0, m.params[1].data(), h0.data(), h.data(), 1, 5);
    with->block_forward(0, {m.params[1].data(), adapters[1].data()}, h0.data(), h_lora.data(), 1, 5);
    BOOST_TEST(h == h_lora, boost::test_tools::per_element());
  }
}

// Greedy decoding's blocks with adapters (the KV-cache path generation takes) give the merged model's
// hidden states, row by row.
BOOST_AUTO_TEST_CASE(decoding_with_adapters_equals_the_merged_model) {
  for (const ModelConfig& shape : {tiny_llama(), tiny_bloom()}) {
    const Adapted a = adapted_model(shape, 3, 21);
    const TinyModel m = merged(a);
    auto adapted_net = make_cpu_model(a.base.cfg, 1, 6);
    auto merged_net = make_cpu_model(m.cfg, 1, 6);
    const int H = shape.hidden_size, n = 6;
    std::mt19937 rng(9);
    const std::vector<float> h0 = random_floats(static_cast<size_t>(n) * H, rng);
    const std::vector<float> out_a =
        decoded_first_layer(*adapted_net, {a.base.params[1].data(), a.adapters[1].data()}, h0, H);
    const std::vector<float> out_m = decoded_first_layer(*merged_net, m.params[1].data(), h0, H);
    BOOST_TEST_CONTEXT(shape.arch) {
      BOOST_TEST(max_relative_error(out_a, std::vector<double>(out_m.begin(), out_m.end())) < 1e-5);
    }
  }
}

// ---- LoRA dropout --------------------------------------------------------------------------------

namespace {

constexpr uint64_t kDropoutSeed = 0x5eed;

// One mask's draw over `rows` rows of `seq` positions and `cols` columns: which elements it keeps.
std::vector<bool> kept_elements(const DropoutMask& mask, int rows, int seq, int cols) {
  const std::vector<float> ones(static_cast<size_t>(rows) * cols, 1.0f);
  std::vector<float> out(ones.size());
  model_detail::apply_lora_dropout(mask, ones.data(), rows, seq, cols, false, out.data());
  std::vector<bool> kept(out.size());
  for (size_t i = 0; i < out.size(); ++i) kept[i] = out[i] != 0.0f;
  return kept;
}

// |observed - expected| within 5 standard deviations of a mean of n Bernoulli(q) draws.
void expect_binomial_fraction(size_t hits, size_t n, double q, const std::string& what) {
  const double fraction = static_cast<double>(hits) / n, sigma = std::sqrt(q * (1 - q) / n);
  BOOST_TEST(std::fabs(fraction - q) <= 5 * sigma, what << ": " << fraction << " against " << q << " (sigma " << sigma
                                                        << ")");
}

}  // namespace

// dropout(x) keeps a fraction 1 - p of the elements, each multiplied by 1 / (1 - p) (so its mean is x's),
// with masks independent between layers, modules, seeds and neighbouring columns; tolerances are 5
// standard deviations of the binomial counts.
BOOST_AUTO_TEST_CASE(dropout_keeps_one_minus_p_scaled_by_its_inverse) {
  const int seqs = 4, seq = 64, cols = 512, rows = seqs * seq;
  const size_t n = static_cast<size_t>(rows) * cols;
  for (const double p : {0.1, 0.5}) {
    BOOST_TEST_CONTEXT("p = " << p) {
      const DropoutMask mask = dropout_mask(kDropoutSeed, p, 1, 2);
      const float scale = static_cast<float>(1.0 / (1.0 - p));
      BOOST_TEST(mask.scale == scale);
      // x ~ N(1, 1): every output is 0 or scale x; dropout(x) - x has mean 0 and variance p / (1 - p) E[x^2].
      std::mt19937 rng(17);
      std::normal_distribution<float> normal(1.0f, 1.0f);
      std::vector<float> x(n), out(n);
      for (float& v : x) v = normal(rng);
      model_detail::apply_lora_dropout(mask, x.data(), rows, seq, cols, false, out.data());
      size_t kept = 0, odd = 0;
      double diff = 0, x2 = 0;
      for (size_t i = 0; i < n; ++i) {
        kept += out[i] != 0.0f;
        odd += out[i] != 0.0f && out[i] != x[i] * scale;
        diff += static_cast<double>(out[i]) - x[i];
        x2 += static_cast<double>(x[i]) * x[i];
      }
      BOOST_TEST(odd == 0u);
      expect_binomial_fraction(kept, n, 1 - p, "kept fraction");
      const double sigma_mean = std::sqrt(p / (1 - p) * (x2 / n) / n);
      BOOST_TEST(std::fabs(diff / n) <= 5 * sigma_mean, "mean of dropout(x) - x: " << diff / n << " (sigma "
                                                                                 << sigma_mean << ")");

      // Independent draws: both of two masks keep an element with probability (1 - p)^2.
      const std::vector<bool> a = kept_elements(mask, rows, seq, cols);
      const double both = (1 - p) * (1 - p);
      auto both_kept = [&](const std::vector<bool>& b) {
        size_t k = 0;
        for (size_t i = 0; i < n; ++i) k += a[i] && b[i];
        return k;
      };
      expect_binomial_fraction(both_kept(kept_elements(dropout_mask(kDropoutSeed, p, 0, 2), rows, seq, cols)), n, both,
                               "another layer");
      expect_binomial_fraction(both_kept(kept_elements(dropout_mask(kDropoutSeed, p, 1, 3), rows, seq, cols)), n, both,
                               "another module");
      expect_binomial_fraction(both_kept(kept_elements(dropout_mask(kDropoutSeed + 1, p, 1, 2), rows, seq, cols)), n,
                               both, "another seed");
      size_t neighbours = 0, pairs = 0;
      for (size_t i = 0; i + 1 < n; ++i)
        if ((i + 1) % cols != 0) neighbours += a[i] && a[i + 1], ++pairs;
      expect_binomial_fraction(neighbours, pairs, both, "neighbouring columns");
      size_t next_position = 0;
      for (size_t i = 0; i + cols < n; ++i) next_position += a[i] && a[i + cols];
      expect_binomial_fraction(next_position, n - cols, both, "neighbouring positions");
      // The same draw again: a mask is a function of its coordinates.
      BOOST_TEST((kept_elements(mask, rows, seq, cols) == a));
    }
  }
}

// The masks depend on (sequence, position), not on the padded length of the rows: a micro-batch padded
// to a longer T draws the same mask on its real positions.
BOOST_AUTO_TEST_CASE(dropout_masks_follow_positions_not_padding) {
  const DropoutMask mask = dropout_mask(kDropoutSeed, 0.5, 0, 0);
  const std::vector<bool> short_rows = kept_elements(mask, 2 * 5, 5, 16), long_rows = kept_elements(mask, 2 * 8, 8, 16);
  for (int b = 0; b < 2; ++b)
    for (int t = 0; t < 5; ++t)
      for (int c = 0; c < 16; ++c)
        BOOST_TEST(short_rows[(b * 5 + t) * 16 + c] == long_rows[(b * 8 + t) * 16 + c]);
}

namespace {

// The model of `shape` with random adapters on every linear layer and lora.dropout p.
Adapted dropout_model(const ModelConfig& shape, double p, uint64_t seed) {
  Adapted a = adapted_model(shape, 3, seed);
  a.base.cfg.lora.dropout = p;
  return a;
}

// A finer step than kStep: Phi-3's one adapter over q, k and v together (q and k moving at once, with LongRoPE's
// attention factor on both) curves the loss enough for kStep's truncation error to reach the tolerance.
constexpr double kDropoutStep = 2e-3;

// Sampled coordinates of every adapter tensor against central differences of the loss with the mask of
// kDropoutSeed held fixed: each tensor's error is under model_checks' tolerance; the same check against
// the gradients of the model without dropout fails (so the masks matter to the test).
void check_dropout_gradients(const ModelConfig& shape) {
  Adapted a = dropout_model(shape, 0.3, 13);
  std::mt19937 rng(23);
  const Batch b = make_batch(2, 5, shape.vocab_size, 0.2, rng);
  const std::unique_ptr<CpuModel> net = make_cpu_model(a.base.cfg, 2, 5);
  std::vector<float> dh0;
  std::vector<std::vector<float>> grads, undropped;
  adapted_grads(*net, a, b, &dh0, &undropped);  // evaluation state: no dropout
  net->set_dropout(kDropoutSeed);
  adapted_grads(*net, a, b, &dh0, &grads);
  auto loss = [&] { return adapted_loss(*net, a, b); };
  for (size_t u = 1; u < a.lora.size(); ++u) {
    std::vector<double> unit_numeric, unit_analytic, unit_undropped;
    for (const TensorSpec& t : a.lora[u].tensors) {
      std::uniform_int_distribution<size_t> pick(t.offset, t.offset + t.numel - 1);
      std::vector<double> numeric, analytic;
      for (int k = 0; k < 6; ++k) {
        const size_t i = pick(rng);
        numeric.push_back(central_difference(a.adapters[u][i], kDropoutStep, loss));
        analytic.push_back(grads[u][i]);
        unit_undropped.push_back(undropped[u][i]);
      }
      const double error = gradient_error(numeric, analytic);
      BOOST_TEST(error < kGradTolerance, t.name << ": relative error " << error);
      unit_numeric.insert(unit_numeric.end(), numeric.begin(), numeric.end());
      unit_analytic.insert(unit_analytic.end(), analytic.begin(), analytic.end());
    }
    BOOST_TEST(gradient_error(unit_numeric, unit_analytic) < kGradTolerance, a.lora[u].name);
    BOOST_TEST(gradient_error(unit_numeric, unit_undropped) > 10 * kGradTolerance, a.lora[u].name);
  }
}

}  // namespace

BOOST_DATA_TEST_CASE(dropout_gradients_match_finite_differences, data::make(tiny_families()), shape) {
  check_dropout_gradients(shape);
}

// Evaluation (no seed set, or set back to none) and greedy decoding (even while a training seed is set)
// compute exactly what the model without dropout computes; a training forward does not.
BOOST_AUTO_TEST_CASE(evaluation_and_decoding_do_not_drop) {
  for (const ModelConfig& shape : {tiny_llama(), tiny_bloom()}) {
    BOOST_TEST_CONTEXT(shape.arch) {
      const Adapted plain = dropout_model(shape, 0.0, 31), dropping = dropout_model(shape, 0.5, 31);
      std::mt19937 rng(3);
      const Batch b = make_batch(2, 6, shape.vocab_size, 0.2, rng);
      const std::unique_ptr<CpuModel> plain_net = make_cpu_model(plain.base.cfg, 2, 6);
      const std::unique_ptr<CpuModel> net = make_cpu_model(dropping.base.cfg, 2, 6);
      const double want = adapted_loss(*plain_net, plain, b);
      BOOST_TEST(adapted_loss(*net, dropping, b) == want);
      net->set_dropout(kDropoutSeed);
      const double training = adapted_loss(*net, dropping, b);
      BOOST_TEST(std::fabs(training - want) > 1e-3 * std::fabs(want), training << " against " << want);
      net->set_dropout(std::nullopt);
      BOOST_TEST(adapted_loss(*net, dropping, b) == want);

      // Decoding with the training seed still set.
      net->set_dropout(kDropoutSeed);
      const int H = shape.hidden_size, n = 6;
      const std::vector<float> h0 = random_floats(static_cast<size_t>(n) * H, rng);
      const std::vector<float> got =
          decoded_first_layer(*net, {dropping.base.params[1].data(), dropping.adapters[1].data()}, h0, H);
      const std::vector<float> expected =
          decoded_first_layer(*plain_net, {plain.base.params[1].data(), plain.adapters[1].data()}, h0, H);
      BOOST_TEST(got == expected, boost::test_tools::per_element());
    }
  }
}

// A seed fixes the masks: the same seed gives the same loss and adapter gradients bit for bit (in another
// model object too), other seeds other losses.
BOOST_AUTO_TEST_CASE(the_seed_decides_the_masks) {
  for (const ModelConfig& shape : {tiny_llama(), tiny_bloom()}) {
    BOOST_TEST_CONTEXT(shape.arch) {
      const Adapted a = dropout_model(shape, 0.3, 41);
      std::mt19937 rng(4);
      const Batch b = make_batch(2, 6, shape.vocab_size, 0.2, rng);
      auto pass = [&](uint64_t seed, std::vector<std::vector<float>>* grads) {
        const std::unique_ptr<CpuModel> net = make_cpu_model(a.base.cfg, 2, 6);
        net->set_dropout(seed);
        std::vector<float> dh0;
        return adapted_grads(*net, a, b, &dh0, grads);
      };
      std::vector<std::vector<float>> g1, g2, g3;
      const double l1 = pass(1, &g1), l2 = pass(1, &g2), l3 = pass(2, &g3);
      BOOST_TEST(l1 == l2);
      BOOST_TEST((g1 == g2));
      BOOST_TEST(std::fabs(l1 - l3) > 1e-4 * std::fabs(l1), l1 << " against " << l3);
      BOOST_TEST((g1 != g3));
    }
  }
}

// Dropout's scratch ([tokens, widest adapted input]) is counted where it is allocated: the CPU model's
// activation bytes and `shardlm plan`'s sizes of both backends.
BOOST_AUTO_TEST_CASE(dropout_scratch_is_planned) {
  for (const ModelConfig& shape : {tiny_llama(), tiny_bloom()}) {
    BOOST_TEST_CONTEXT(shape.arch) {
      const ModelConfig plain = adapted_model(shape, 3, 1).base.cfg;
      ModelConfig dropping = plain;
      dropping.lora.dropout = 0.1;
      const int B = 3, T = 7;
      const size_t widest = static_cast<size_t>(shape.arch == "bloom" ? 4 * shape.hidden_size : shape.ffn_size());
      BOOST_TEST(model_detail::lora_widest_input(dropping) == static_cast<int>(widest));
      const size_t cpu = make_cpu_model(dropping, B, T)->activation_bytes();
      BOOST_TEST(cpu == make_cpu_model(plain, B, T)->activation_bytes() + B * T * widest * sizeof(float));
      BOOST_TEST(cpu_activation_bytes(dropping, B, T) == cpu);
      BOOST_TEST(unit_model_memory(dropping, BackendKind::Cpu, DType::F32, B, T, false).activations ==
                 make_unit_model(dropping, BackendKind::Cpu, DType::F32, B, T, false)->activation_bytes());
      for (const bool checkpointing : {false, true}) {
        const size_t bf16 = (B * T * widest * 2 + 255) / 256 * 256;
        BOOST_TEST(unit_model_memory(dropping, BackendKind::Cuda, DType::BF16, B, T, checkpointing).activations ==
                   unit_model_memory(plain, BackendKind::Cuda, DType::BF16, B, T, checkpointing).activations + bf16);
      }
    }
  }
}

// Coordinates beyond the masks' counter fields are refused at build time, naming the key.
BOOST_AUTO_TEST_CASE(dropout_refuses_sizes_its_masks_cannot_address) {
  ModelConfig cfg = adapted_model(tiny_llama(), 3, 1).base.cfg;
  cfg.lora.dropout = 0.1;
  const std::string e = error_of([&] { model_detail::check_lora_dropout_sizes(cfg, (1 << 20) + 1, 1); });
  BOOST_TEST(e.find("lora.dropout = 0.1") != std::string::npos, e);
  BOOST_CHECK_NO_THROW(model_detail::check_lora_dropout_sizes(cfg, 1 << 20, 1 << 22));
  cfg.lora.dropout = 0;
  BOOST_CHECK_NO_THROW(model_detail::check_lora_dropout_sizes(cfg, 1 << 21, 1));
}

// ---- modules_to_save: whole root modules trained beside the adapters --------------------------

namespace {

ModelConfig with_saved(ModelConfig cfg, std::vector<std::string> saved) {
  cfg.lora.modules_to_save = std::move(saved);
  return cfg;
}

}  // namespace

// The saved modules leave the root's layout for the trainable one, in its order, drawing the initial
// values they have in the whole model; the frozen rest keeps its order.
BOOST_AUTO_TEST_CASE(saved_modules_split_the_root) {
  const ModelConfig cfg = with_saved(with_lora(tiny_llama(), {"q_proj"}), {"lm_head", "model.norm"});
  const UnitLayout saved = lora_layout(cfg)[0], frozen = lora_frozen_layout(cfg)[0], whole = model_layout(cfg)[0];
  BOOST_TEST((names_of(saved) == std::vector<std::string>{"norm.weight", "lm_head.weight"}));
  BOOST_TEST((names_of(frozen) == std::vector<std::string>{"embed_tokens.weight"}));
  BOOST_TEST(saved.numel + frozen.numel == whole.numel);
  BOOST_TEST(saved.tensors[1].offset == saved.tensors[0].numel);
  BOOST_TEST(!saved.tensors[0].decay);  // a norm: no weight decay, as in full fine-tuning
  BOOST_TEST(saved.tensors[1].decay);
  // The blocks keep their adapters, and the base its blocks.
  BOOST_TEST(lora_layout(cfg)[1].tensors.size() == 2u);
  BOOST_TEST(lora_frozen_layout(cfg)[1].numel == model_layout(cfg)[1].numel);
  std::vector<float> w(whole.numel), s(saved.numel), f(frozen.numel);
  init_unit_slice(whole, 0, 9, 0, w.size(), w.data());
  init_unit_slice(saved, 0, 9, 0, s.size(), s.data());
  init_unit_slice(frozen, 0, 9, 0, f.size(), f.data());
  for (const UnitLayout* part : {&saved, &frozen})
    for (const TensorSpec& t : part->tensors) {
      const TensorSpec& in_whole = find_tensor(whole, t.name);
      const float* got = (part == &saved ? s.data() : f.data()) + t.offset;
      BOOST_TEST(std::equal(got, got + t.numel, w.data() + in_whole.offset), t.name);
    }
  // Without modules_to_save the base is whole and the trainable root empty.
  const ModelConfig plain = with_lora(tiny_llama(), {"q_proj"});
  BOOST_TEST(lora_layout(plain)[0].tensors.empty());
  BOOST_TEST(lora_frozen_layout(plain)[0].numel == whole.numel);
}

namespace {

// The adapted model (adapters on every module) with `saved` trained whole: its loss, input gradient and
// the saved modules' gradients against a full fine-tune of the merged model (W + scale B A, no LoRA) on
// the same batch and weights, which computes every gradient; the frozen part of the root forms none
// (its gradient buffer is null: the model would crash writing it).
void check_saved_against_full_fine_tune(const ModelConfig& shape, const std::vector<std::string>& saved) {
  const Adapted a = adapted_model(with_saved(shape, saved), 3, 17);
  const ModelConfig& cfg = a.base.cfg;
  const TinyModel m = merged(a);
  std::mt19937 rng(6);
  const Batch b = make_batch(2, 7, shape.vocab_size, 0.2, rng);
  auto lora_net = make_cpu_model(cfg, 2, 7);
  auto full_net = make_cpu_model(m.cfg, 2, 7);

  const UnitLayout saved_root = lora_layout(cfg)[0], frozen_root = lora_frozen_layout(cfg)[0];
  BOOST_TEST_REQUIRE(!saved_root.tensors.empty());
  const std::vector<float> frozen = root_part(a.base, frozen_root), trained = root_part(a.base, saved_root);
  std::vector<float> dtrained(trained.size(), 0.0f), dh0;
  std::vector<std::vector<float>> dadapters;
  const double loss = adapted_grads(*lora_net, a, b, &dh0, &dadapters, {frozen.data(), trained.data()},
                                    UnitGrads{nullptr, dtrained.data()});
  std::vector<float> dh0_full;
  double loss_full = 0;
  const std::vector<std::vector<float>> dfull = model_grads(*full_net, m, b, 1.0f, &dh0_full, &loss_full);
  BOOST_TEST(loss == loss_full, boost::test_tools::tolerance(1e-5));
  BOOST_TEST(max_relative_error(dh0, std::vector<double>(dh0_full.begin(), dh0_full.end())) < 1e-4);
  for (const TensorSpec& t : saved_root.tensors) {
    const TensorSpec& w = find_tensor(m.layout[0], t.name);
    const std::vector<float> got(dtrained.begin() + t.offset, dtrained.begin() + t.offset + t.numel);
    const std::vector<double> want(dfull[0].begin() + w.offset, dfull[0].begin() + w.offset + w.numel);
    BOOST_TEST_CONTEXT(t.name) {
      BOOST_TEST(max_abs(got) > 0.0);
      BOOST_TEST(max_relative_error(got, want) < 1e-4);
    }
  }
}

}  // namespace

// lm_head alone (Llama, untied): its gradient is the full fine-tune's; the embeddings and the final norm
// stay frozen (no gradient buffer), and the adapters still learn through the blocks.
BOOST_AUTO_TEST_CASE(a_saved_head_gets_the_full_fine_tune_gradient) {
  check_saved_against_full_fine_tune(tiny_llama(), {"lm_head"});
}

BOOST_AUTO_TEST_CASE(every_savable_module_gets_the_full_fine_tune_gradient) {
  check_saved_against_full_fine_tune(tiny_llama(), {"model.norm"});
  check_saved_against_full_fine_tune(tiny_llama(), {"embed_tokens", "model.norm", "lm_head"});
  check_saved_against_full_fine_tune(tiny_qwen2(), {"model.norm"});  // tied: only the final norm
  // BLOOM: the embedding's LayerNorm under a frozen table, and the final LayerNorm.
  check_saved_against_full_fine_tune(tiny_bloom(), {"word_embeddings_layernorm"});
  check_saved_against_full_fine_tune(tiny_bloom(), {"word_embeddings_layernorm", "ln_f"});
}

// A saved norm's gradient against central differences of the adapted model's loss.
BOOST_AUTO_TEST_CASE(saved_norms_against_finite_differences) {
  for (const auto& [shape, saved] : std::vector<std::pair<ModelConfig, std::vector<std::string>>>{
           {tiny_llama(), {"model.norm"}}, {tiny_bloom(), {"word_embeddings_layernorm", "ln_f"}}}) {
    const Adapted a = adapted_model(with_saved(shape, saved), 2, 23);
    const ModelConfig& cfg = a.base.cfg;
    std::mt19937 rng(8);
    const Batch b = make_batch(2, 5, shape.vocab_size, 0.3, rng);
    auto net = make_cpu_model(cfg, 2, 5);
    const std::vector<float> frozen = root_part(a.base, lora_frozen_layout(cfg)[0]);
    std::vector<float> trained = root_part(a.base, lora_layout(cfg)[0]);
    std::vector<float> dtrained(trained.size(), 0.0f), dh0;
    std::vector<std::vector<float>> dadapters;
    adapted_grads(*net, a, b, &dh0, &dadapters, {frozen.data(), trained.data()}, UnitGrads{nullptr, dtrained.data()});
    const auto loss = [&] {
      std::vector<float> unused;
      std::vector<std::vector<float>> grads;
      std::vector<float> scratch(trained.size(), 0.0f);
      return adapted_grads(*net, a, b, &unused, &grads, {frozen.data(), trained.data()},
                           UnitGrads{nullptr, scratch.data()});
    };
    std::vector<double> numeric, analytic;
    for (size_t i = 0; i < trained.size(); ++i) {
      numeric.push_back(central_difference(trained[i], kStep, loss));
      analytic.push_back(dtrained[i]);
    }
    BOOST_TEST_CONTEXT(shape.arch) { BOOST_TEST(gradient_error(numeric, analytic) < kGradTolerance); }
  }
}
