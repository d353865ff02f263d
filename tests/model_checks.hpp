// The checks every family's CpuModel must pass, shared by the model suites (test_model: BLOOM,
// test_llama: the Llama-style families): the reference pieces of a naive double-precision model,
// causality, finite differences of the loss against the backward, the head's chunking, grad_scale
// and accumulation, empty batches, bad ids, and the activation memory's accounting.
#pragma once

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "cpu_model_test_support.hpp"
#include "test_support.hpp"

namespace model_test {

// ---- the naive double-precision reference's pieces -------------------------------------------

using Rows = std::vector<double>;  // row-major [rows, cols]

inline Rows to_double(const std::vector<float>& v) { return Rows(v.begin(), v.end()); }

// y = x W^T (+ b) with W [out, in]; bias may be null.
inline Rows reference_linear(const Rows& x, int rows, int in, const float* weight, const float* bias, int out) {
  Rows y(static_cast<size_t>(rows) * out);
  for (int r = 0; r < rows; ++r)
    for (int o = 0; o < out; ++o) {
      double sum = bias ? bias[o] : 0.0;
      for (int i = 0; i < in; ++i) sum += x[r * in + i] * static_cast<double>(weight[o * in + i]);
      y[r * out + o] = sum;
    }
  return y;
}

// The summed cross-entropy of the rows of hn [N, H] with a target, through the head [V, H].
inline double reference_cross_entropy(const Rows& hn, const float* head, int H, int V,
                                      const std::vector<int32_t>& targets, int64_t* count) {
  const int N = static_cast<int>(targets.size());
  const Rows logits = reference_linear(hn, N, H, head, nullptr, V);
  double loss = 0.0;
  *count = 0;
  for (int r = 0; r < N; ++r) {
    if (targets[r] < 0) continue;
    double total = 0.0;
    for (int v = 0; v < V; ++v) total += std::exp(logits[r * V + v]);
    loss += std::log(total) - logits[r * V + targets[r]];
    ++*count;
  }
  return loss;
}

// A family's reference head: the final norm and the cross-entropy of h [N, H].
using ReferenceHeadLoss =
    std::function<double(const TinyModel&, const Rows& h, const std::vector<int32_t>& targets, int64_t* count)>;

// ---- comparisons ------------------------------------------------------------------------------

// |actual - expected| within `rel` of the larger of |expected| and `scale` (the magnitude of the
// whole array), so entries that are zero up to rounding are judged against the array's size.
inline bool close(double actual, double expected, double rel, double scale) {
  return std::abs(actual - expected) <= rel * std::max(std::abs(expected), scale);
}

inline double max_abs(const std::vector<float>& v) {
  double m = 0.0;
  for (float x : v) m = std::max(m, static_cast<double>(std::abs(x)));
  return m;
}

// ---- finite differences ---------------------------------------------------------------------

constexpr double kStep = 1e-2;           // finite-difference step on parameters of size ~0.3-1
constexpr double kGradTolerance = 1e-2;  // norm-relative; a 10% error in any tensor fails

// Central difference of the model loss along one float coordinate.
template <typename LossFn>
double central_difference(float& coordinate, double step, LossFn loss) {
  const float saved = coordinate;
  coordinate = static_cast<float>(saved + step);
  const double up = loss();
  coordinate = static_cast<float>(saved - step);
  const double down = loss();
  coordinate = saved;
  return (up - down) / (2.0 * step);
}

// Norm of (numeric - analytic) over norm of numeric, for one group of sampled coordinates.
inline double gradient_error(const std::vector<double>& numeric, const std::vector<double>& analytic) {
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < numeric.size(); ++i) {
    diff += (numeric[i] - analytic[i]) * (numeric[i] - analytic[i]);
    norm += numeric[i] * numeric[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-30));
}

// How the coordinates of each tensor are sampled: per_unit spread over a unit's tensors, or
// per_tensor each. A tensor whose sampled gradient may be zero (BLOOM's key bias, to which the
// softmax is invariant) is judged with its unit only, when not every_tensor_carries_signal.
struct GradientSampling {
  size_t per_unit = 0;
  size_t per_tensor = 8;
  bool every_tensor_carries_signal = true;
};

// Sampled coordinates of every tensor of every unit against central differences of the loss on b.
inline void check_parameter_gradients(CpuModel& net, TinyModel& m, const Batch& b, std::mt19937& rng,
                                      const GradientSampling& sampling) {
  const std::vector<std::vector<float>> grads = model_grads(net, m, b, 1.0f);
  auto loss = [&] { return model_loss(net, m, b); };
  for (size_t u = 0; u < m.layout.size(); ++u) {
    const UnitLayout& unit = m.layout[u];
    const size_t per_tensor = sampling.per_unit > 0
                                  ? (sampling.per_unit + unit.tensors.size() - 1) / unit.tensors.size()
                                  : sampling.per_tensor;
    std::vector<double> unit_numeric, unit_analytic;
    for (const TensorSpec& t : unit.tensors) {
      std::uniform_int_distribution<size_t> pick(t.offset, t.offset + t.numel - 1);
      std::vector<double> numeric, analytic;
      for (size_t k = 0; k < per_tensor; ++k) {
        const size_t i = pick(rng);
        numeric.push_back(central_difference(m.params[u][i], kStep, loss));
        analytic.push_back(grads[u][i]);
      }
      double norm = 0.0;
      for (double g : numeric) norm += g * g;
      norm = std::sqrt(norm);
      const double error = gradient_error(numeric, analytic);
      BOOST_TEST_MESSAGE(t.name << ": norm " << norm << " error " << error);
      if (sampling.every_tensor_carries_signal) BOOST_TEST(norm > 1e-3, t.name << ": the sampled gradient is zero");
      if (sampling.every_tensor_carries_signal || norm > 1e-2) {
        BOOST_TEST(error < kGradTolerance, t.name << ": relative error " << error);
        // The tolerance is tight enough to catch a gradient off by 10% or of the wrong sign.
        std::vector<double> off = analytic, flipped = analytic;
        for (double& g : off) g *= 0.9;
        for (double& g : flipped) g = -g;
        BOOST_TEST(gradient_error(numeric, off) > kGradTolerance, t.name);
        BOOST_TEST(gradient_error(numeric, flipped) > kGradTolerance, t.name);
      }
      unit_numeric.insert(unit_numeric.end(), numeric.begin(), numeric.end());
      unit_analytic.insert(unit_analytic.end(), analytic.begin(), analytic.end());
    }
    const double unit_error = gradient_error(unit_numeric, unit_analytic);
    BOOST_TEST(unit_error < kGradTolerance, unit.name << ": relative error " << unit_error);
  }
}

// The gradient of the first hidden states against central differences of the loss.
inline void check_hidden_input_gradients(const ModelConfig& cfg, uint64_t model_seed, uint32_t rng_seed) {
  const TinyModel m = make_model(cfg, model_seed);
  std::mt19937 rng(rng_seed);
  const Batch b = make_batch(2, 5, cfg.vocab_size, 0.3, rng);
  const std::unique_ptr<CpuModel> net = make_cpu_model(cfg, 2, 5);
  std::vector<float> dh0;
  model_grads(*net, m, b, 1.0f, &dh0);
  std::vector<float> h0(dh0.size());
  net->embed_forward(m.params[0].data(), b.tokens.data(), b.batch, b.seq, h0.data());
  std::vector<double> numeric, analytic;
  std::uniform_int_distribution<size_t> pick(0, h0.size() - 1);
  for (int k = 0; k < 40; ++k) {
    const size_t i = pick(rng);
    numeric.push_back(central_difference(h0[i], kStep, [&] { return loss_from_h0(*net, m, h0, b); }));
    analytic.push_back(dh0[i]);
  }
  BOOST_TEST(gradient_error(numeric, analytic) < kGradTolerance);
}

// grad_scale scales every gradient and not the loss; parameter gradients add onto the buffer's
// contents, the hidden-state gradients are overwritten.
inline void check_grad_scale_and_accumulation(const ModelConfig& cfg, uint64_t model_seed) {
  const TinyModel m = make_model(cfg, model_seed);
  std::mt19937 rng(11);
  const Batch b = make_batch(2, 5, cfg.vocab_size, 0.3, rng);
  const std::unique_ptr<CpuModel> net = make_cpu_model(cfg, 2, 5);
  std::vector<float> dh_full, dh_scaled;
  double loss_full = 0.0, loss_scaled = 0.0;
  const auto full = model_grads(*net, m, b, 1.0f, &dh_full, &loss_full);
  const auto scaled = model_grads(*net, m, b, 0.25f, &dh_scaled, &loss_scaled);
  BOOST_TEST(loss_full == loss_scaled);  // the returned loss is never scaled
  for (size_t u = 0; u < full.size(); ++u)
    for (size_t i = 0; i < full[u].size(); ++i)
      BOOST_TEST(close(scaled[u][i], 0.25 * full[u][i], 1e-5, 0.25 * max_abs(full[u])),
                 "unit " << u << " element " << i);
  // A second backward into the same buffers adds the same gradients again.
  const int L = cfg.num_layers;
  const size_t n = dh_full.size();
  std::vector<std::vector<float>> twice = full, h(L + 1, std::vector<float>(n));
  std::vector<float> dh(n), dh_in(n);
  net->embed_forward(m.params[0].data(), b.tokens.data(), b.batch, b.seq, h[0].data());
  for (int l = 0; l < L; ++l)
    net->block_forward(l, m.params[1 + l].data(), h[l].data(), h[l + 1].data(), b.batch, b.seq);
  int64_t count = 0;
  net->head_loss(m.params[0].data(), h[L].data(), b.targets.data(), b.batch, b.seq, &count, 1.0f, dh.data(),
                 twice[0].data());
  for (int l = L - 1; l >= 0; --l) {
    net->block_backward(l, m.params[1 + l].data(), dh.data(), dh_in.data(), twice[1 + l].data(), b.batch, b.seq);
    dh.swap(dh_in);
  }
  net->embed_backward(m.params[0].data(), b.tokens.data(), dh.data(), twice[0].data(), b.batch, b.seq);
  for (size_t u = 0; u < full.size(); ++u)
    for (size_t i = 0; i < full[u].size(); ++i)
      BOOST_TEST(close(twice[u][i], 2.0 * full[u][i], 1e-5, max_abs(full[u])), "unit " << u << " element " << i);
  BOOST_TEST(dh == dh_full, boost::test_tools::per_element());  // overwritten, not accumulated
}

// The head over 300 tokens (several chunks, some across sequences) against the reference, and the
// whole batch against one sequence at a time; positions without a target get no gradient.
// Returns the root's gradient of the whole batch, for the family's own checks.
inline std::vector<float> check_chunked_head(const ModelConfig& cfg, uint64_t model_seed, uint32_t rng_seed,
                                             const ReferenceHeadLoss& reference) {
  const TinyModel m = make_model(cfg, model_seed);
  std::mt19937 rng(rng_seed);
  const int B = 3, T = 100, H = cfg.hidden_size;
  const Batch b = make_batch(B, T, cfg.vocab_size, 0.2, rng);
  const std::unique_ptr<CpuModel> net = make_cpu_model(cfg, B, T);
  const std::vector<float> h = random_floats(static_cast<size_t>(B) * T * H, rng, 1.5f);
  int64_t count = 0, expected_count = 0;
  const double loss =
      net->head_loss(m.params[0].data(), h.data(), b.targets.data(), B, T, &count, 1.0f, nullptr, nullptr);
  BOOST_TEST(loss == reference(m, to_double(h), b.targets, &expected_count), boost::test_tools::tolerance(1e-5));
  BOOST_TEST(count == expected_count);
  std::vector<float> dh(h.size(), 99.0f), root_grad(m.params[0].size(), 0.0f);
  net->head_loss(m.params[0].data(), h.data(), b.targets.data(), B, T, &count, 1.0f, dh.data(), root_grad.data());
  std::vector<float> dh_each(h.size()), root_grad_each(m.params[0].size(), 0.0f);
  double loss_each = 0.0;
  for (int s = 0; s < B; ++s) {
    const size_t at = static_cast<size_t>(s) * T;
    loss_each += net->head_loss(m.params[0].data(), h.data() + at * H, b.targets.data() + at, 1, T, &count, 1.0f,
                                dh_each.data() + at * H, root_grad_each.data());
  }
  BOOST_TEST(loss_each == loss, boost::test_tools::tolerance(1e-9));
  for (size_t i = 0; i < dh.size(); ++i) BOOST_TEST(close(dh[i], dh_each[i], 1e-5, max_abs(dh)), "dh " << i);
  for (size_t i = 0; i < root_grad.size(); ++i)
    BOOST_TEST(close(root_grad[i], root_grad_each[i], 1e-5, max_abs(root_grad)), "root " << i);
  for (int p = 0; p < B * T; ++p)
    if (b.targets[p] < 0)
      for (int c = 0; c < H; ++c) BOOST_TEST(dh[p * H + c] == 0.0f);
  return root_grad;
}

// Causality: a token changed at position 3 of sequence 0 moves the final hidden states and the
// per-position losses of that position and the later ones of its sequence, and nothing else.
inline void check_causal_positions(const ModelConfig& cfg, uint64_t model_seed, uint32_t rng_seed) {
  const TinyModel m = make_model(cfg, model_seed);
  std::mt19937 rng(rng_seed);
  Batch b = make_batch(2, 6, cfg.vocab_size, 0.0, rng);
  const std::unique_ptr<CpuModel> net = make_cpu_model(cfg, 2, 6);
  const int H = cfg.hidden_size, changed = 3;
  std::vector<float> before, after;
  model_loss(*net, m, b, &before);
  // Per-position losses, each taken alone through a target at that position only.
  auto position_losses = [&](const Batch& batch, const std::vector<float>& hidden) {
    std::vector<double> losses;
    for (int p = 0; p < batch.batch * batch.seq; ++p) {
      std::vector<int32_t> one(batch.targets.size(), -1);
      one[p] = batch.targets[p];
      int64_t count = 0;
      losses.push_back(net->head_loss(m.params[0].data(), hidden.data(), one.data(), batch.batch, batch.seq, &count,
                                     0.0f, nullptr, nullptr));
    }
    return losses;
  };
  const std::vector<double> losses_before = position_losses(b, before);
  b.tokens[changed] = (b.tokens[changed] + 1) % cfg.vocab_size;  // sequence 0, position 3
  model_loss(*net, m, b, &after);
  const std::vector<double> losses_after = position_losses(b, after);
  for (int p = 0; p < b.batch * b.seq; ++p) {
    double moved = 0.0;
    for (int c = 0; c < H; ++c)
      moved = std::max(moved, static_cast<double>(std::abs(before[p * H + c] - after[p * H + c])));
    const bool may_change = p >= changed && p < b.seq;  // later positions of the same sequence
    if (may_change) {
      BOOST_TEST(moved > 1e-3, "position " << p);
      BOOST_TEST(std::abs(losses_before[p] - losses_after[p]) > 1e-6, "position " << p);
    } else {
      BOOST_TEST(moved < 1e-6, "position " << p);
      BOOST_TEST(std::abs(losses_before[p] - losses_after[p]) < 1e-6, "position " << p);
    }
  }
}

// Micro-batches without tokens give no loss and no gradient.
inline void check_empty_batches(const ModelConfig& cfg, uint64_t model_seed) {
  const TinyModel m = make_model(cfg, model_seed);
  const std::unique_ptr<CpuModel> net = make_cpu_model(cfg, 2, 4);
  for (const auto& [B, T] : {std::pair{0, 4}, std::pair{2, 0}, std::pair{0, 0}}) {
    Batch b;
    b.batch = B;
    b.seq = T;
    double loss = -1.0;
    const auto g = model_grads(*net, m, b, 1.0f, nullptr, &loss);
    BOOST_TEST(loss == 0.0);
    for (const auto& unit : g) BOOST_TEST(std::all_of(unit.begin(), unit.end(), [](float x) { return x == 0.0f; }));
  }
}

// Ids outside the vocabulary are errors naming them, before any gradient is written; so are shapes
// beyond the model's and a backward of another shape than its forward.
inline void check_bad_ids_and_shapes(const ModelConfig& cfg, uint64_t model_seed) {
  const TinyModel m = make_model(cfg, model_seed);
  const std::unique_ptr<CpuModel> net = make_cpu_model(cfg, 1, 4);
  std::vector<float> h(4 * cfg.hidden_size, 0.5f), dh(h.size()), root_grad(m.params[0].size(), 0.0f);
  int64_t count = 0;
  const int V = cfg.vocab_size;
  for (int32_t bad : {V, 1000, -2}) {
    const std::vector<int32_t> targets = {1, -1, bad, 3};
    const std::string message = error_of([&] {
      net->head_loss(m.params[0].data(), h.data(), targets.data(), 1, 4, &count, 1.0f, dh.data(), root_grad.data());
    });
    BOOST_TEST(contains(message, "target id " + std::to_string(bad)), message);
  }
  BOOST_TEST(std::all_of(root_grad.begin(), root_grad.end(), [](float g) { return g == 0.0f; }));
  const std::vector<int32_t> tokens = {1, 2, V, 3};
  BOOST_TEST(contains(error_of([&] { net->embed_forward(m.params[0].data(), tokens.data(), 1, 4, h.data()); }),
                      "token id " + std::to_string(V)));
  std::vector<float> out(h.size()), grad(m.params[1].size());
  BOOST_TEST(contains(error_of([&] { net->block_forward(0, m.params[1].data(), h.data(), out.data(), 1, 5); }),
                      "exceeds the sizes"));
  BOOST_CHECK_THROW(net->block_forward(cfg.num_layers, m.params[1].data(), h.data(), out.data(), 1, 4), Error);
  net->block_forward(0, m.params[1].data(), h.data(), out.data(), 1, 3);
  BOOST_CHECK_THROW(net->block_backward(0, m.params[1].data(), h.data(), out.data(), grad.data(), 1, 4), Error);
}

// What the model reports holding is what it allocated (and freed again); it is at least
// `at_least` bytes; cpu_activation_bytes, for `shardlm plan`, agrees without building it.
inline void check_activation_memory(const ModelConfig& cfg, size_t at_least) {
  const size_t before = memory_stats().current[static_cast<int>(MemKind::Activations)];
  {
    const std::unique_ptr<CpuModel> net = make_cpu_model(cfg, 4, 16);
    const size_t held = memory_stats().current[static_cast<int>(MemKind::Activations)] - before;
    BOOST_TEST(net->activation_bytes() == held);
    BOOST_TEST(held > at_least);
  }
  BOOST_TEST(memory_stats().current[static_cast<int>(MemKind::Activations)] == before);
  for (const auto& [B, T] : {std::pair{1, 1}, std::pair{2, 5}, std::pair{4, 16}, std::pair{3, 200}})
    BOOST_TEST(cpu_activation_bytes(cfg, B, T) == make_cpu_model(cfg, B, T)->activation_bytes(), B << "x" << T);
}

}  // namespace model_test
