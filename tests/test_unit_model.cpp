#define BOOST_TEST_MODULE test_unit_model
#include <boost/test/unit_test.hpp>
// Tests of the UnitModel of the CPU backend (make_unit_model): forward, backward and greedy
// decoding equal the CpuModel path the CPU engine drives (hidden states held by the caller,
// row-by-row embedding, head_logits and the first maximum), to the bit, for every family; its
// activation_bytes() equal unit_model_memory's and what it allocates; bad arguments are refused;
// packed rows give each sample the loss and gradients of its own row.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "cpu_model_test_support.hpp"
#include "shardlm/core.hpp"
#include "shardlm/model.hpp"
#include "test_support.hpp"

using namespace shardlm;
using namespace model_test;

namespace {

const std::vector<ModelConfig> kFamilies = tiny_families();

// Forward and backward of grad_scale * loss through the UnitModel interface: the loss sum and the
// gradient of every unit.
std::vector<std::vector<float>> unit_model_grads(UnitModel& net, const TinyModel& m, const Batch& b, float grad_scale,
                                                 double* loss) {
  const int L = m.cfg.num_layers;
  std::vector<std::vector<float>> grads;
  for (const std::vector<float>& p : m.params) grads.emplace_back(p.size(), 0.0f);
  net.reset_loss(nullptr);
  net.embed_forward(m.params[0].data(), b.tokens.data(), b.batch, b.seq, nullptr);
  for (int l = 0; l < L; ++l) net.block_forward(l, m.params[1 + l].data(), b.batch, b.seq, nullptr);
  net.head(m.params[0].data(), b.targets.data(), b.batch, b.seq, grad_scale, true, grads[0].data(), nullptr);
  for (int l = L - 1; l >= 0; --l)
    net.block_backward(l, m.params[1 + l].data(), grads[1 + l].data(), b.batch, b.seq, nullptr);
  net.embed_backward(m.params[0].data(), b.tokens.data(), grads[0].data(), b.batch, b.seq, nullptr);
  *loss = net.loss_sum(nullptr);
  return grads;
}

// One decoding step as the CPU engine took it before UnitModel: each row embedded alone, the
// blocks on all rows, then each wanted row's last-position logits and their first maximum.
std::vector<int32_t> cpu_model_step(CpuModel& net, const TinyModel& m, const std::vector<int32_t>& tokens,
                                    const std::vector<int>& slots, const std::vector<int>& positions,
                                    const std::vector<int32_t>& rows) {
  const int n = static_cast<int>(tokens.size()), H = m.cfg.hidden_size, V = m.cfg.vocab_size;
  std::vector<float> h(static_cast<size_t>(n) * H), next(h.size()), logits(V);
  for (int r = 0; r < n; ++r) net.embed_forward(m.params[0].data(), &tokens[r], 1, 1, h.data() + r * H);
  for (int l = 0; l < m.cfg.num_layers; ++l) {
    net.block_decode(l, m.params[1 + l].data(), h.data(), next.data(), n, slots.data(), positions.data());
    h.swap(next);
  }
  std::vector<int32_t> out;
  for (int32_t row : rows) {
    net.head_logits(m.params[0].data(), h.data() + static_cast<size_t>(row) * H, 1, 1, logits.data());
    out.push_back(static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
  }
  return out;
}

std::vector<int32_t> unit_model_step(UnitModel& net, const TinyModel& m, const std::vector<int32_t>& tokens,
                                     const std::vector<int>& slots, const std::vector<int>& positions,
                                     const std::vector<int32_t>& rows) {
  const int n = static_cast<int>(tokens.size());
  net.decode_embed(m.params[0].data(), tokens.data(), n, nullptr);
  for (int l = 0; l < m.cfg.num_layers; ++l)
    net.decode_block(l, m.params[1 + l].data(), slots.data(), positions.data(), n, nullptr);
  std::vector<int32_t> next(rows.size());
  net.decode_head(m.params[0].data(), rows.data(), static_cast<int>(rows.size()), next.data(), nullptr, nullptr);
  return next;
}

}  // namespace

BOOST_AUTO_TEST_CASE(forward_and_backward_equal_the_cpu_model_path) {
  for (const ModelConfig& cfg : kFamilies) {
    const TinyModel m = make_model(cfg, 61);
    std::mt19937 rng(17);
    const std::unique_ptr<UnitModel> net = make_unit_model(cfg, BackendKind::Cpu, DType::F32, 3, 8, false);
    const std::unique_ptr<CpuModel> reference = make_cpu_model(cfg, 3, 8);
    BOOST_TEST((net->compute_dtype() == DType::F32));
    BOOST_TEST(net->config().arch == cfg.arch);
    // Two micro-batches of other shapes: the loss restarts at reset_loss, the hidden states follow.
    for (const auto& [B, T] : {std::pair{2, 7}, std::pair{3, 8}}) {
      const Batch b = make_batch(B, T, cfg.vocab_size, 0.3, rng);
      double loss = 0.0, expected_loss = 0.0;
      const auto grads = unit_model_grads(*net, m, b, 0.5f, &loss);
      const auto expected = model_grads(*reference, m, b, 0.5f, nullptr, &expected_loss);
      BOOST_TEST(loss == expected_loss, cfg.arch);
      BOOST_TEST((grads == expected), cfg.arch);
    }
    // Forward only (evaluation): the same loss, no gradient anywhere.
    const Batch b = make_batch(2, 5, cfg.vocab_size, 0.3, rng);
    net->reset_loss(nullptr);
    net->embed_forward(m.params[0].data(), b.tokens.data(), 2, 5, nullptr);
    for (int l = 0; l < cfg.num_layers; ++l) net->block_forward(l, m.params[1 + l].data(), 2, 5, nullptr);
    net->head(m.params[0].data(), b.targets.data(), 2, 5, 0.0f, false, nullptr, nullptr);
    BOOST_TEST(net->loss_sum(nullptr) == model_loss(*reference, m, b), cfg.arch);
  }
}

// Sequence packing: samples end to end in one row, each attending to itself only and its positions
// restarting at 0, give every sample the loss and the gradients it has in a row of its own
// (data.packing), fp32 to 1e-5, for every family (BLOOM's ALiBi, Llama's and Qwen2's rotary).
BOOST_AUTO_TEST_CASE(packed_samples_equal_their_own_rows) {
  const std::vector<int> lengths = {5, 1, 9, 3};
  const int packed_T = 20;  // 18 tokens and 2 of padding
  for (const ModelConfig& cfg : kFamilies) {
    const TinyModel m = make_model(cfg, 71);
    std::mt19937 rng(23);
    std::vector<Batch> samples;
    for (const int n : lengths) samples.push_back(make_batch(1, n, cfg.vocab_size, 0.0, rng));
    const int longest = *std::max_element(lengths.begin(), lengths.end());
    const std::unique_ptr<UnitModel> net =
        make_unit_model(cfg, BackendKind::Cpu, DType::F32, static_cast<int>(lengths.size()), packed_T, false);
    for (size_t k = 0; k < samples.size(); ++k) {
      // Sample k's targets only; the others ride along without a loss.
      Batch packed{1, packed_T, std::vector<int32_t>(packed_T, 0), std::vector<int32_t>(packed_T, -1)};
      Batch own{static_cast<int>(samples.size()), longest, {}, {}};
      own.tokens.assign(samples.size() * longest, 0);
      own.targets.assign(samples.size() * longest, -1);
      std::vector<int32_t> starts(packed_T);
      int at = 0;
      for (size_t j = 0; j < samples.size(); ++j) {
        const int n = lengths[j];
        for (int t = 0; t < n; ++t) {
          packed.tokens[at + t] = own.tokens[j * longest + t] = samples[j].tokens[t];
          if (j == k) packed.targets[at + t] = own.targets[j * longest + t] = samples[j].targets[t];
          starts[at + t] = at;
        }
        at += n;
      }
      for (int t = at; t < packed_T; ++t) starts[t] = at;  // the padding is a sample of its own
      double packed_loss = 0.0, own_loss = 0.0;
      net->set_sample_starts(starts.data());
      const auto packed_grads = unit_model_grads(*net, m, packed, 1.0f, &packed_loss);
      net->set_sample_starts(nullptr);
      const auto own_grads = unit_model_grads(*net, m, own, 1.0f, &own_loss);
      BOOST_TEST_CONTEXT(cfg.arch << " sample " << k) {
        BOOST_TEST(std::abs(packed_loss - own_loss) <= 1e-5 * std::abs(own_loss));
        for (size_t u = 0; u < own_grads.size(); ++u)
          BOOST_TEST(max_relative_error(packed_grads[u], std::vector<double>(own_grads[u].begin(), own_grads[u].end())) <=
                     1e-5);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(decoding_equals_the_cpu_model_path) {
  for (const ModelConfig& cfg : kFamilies) {
    const TinyModel m = make_model(cfg, 62);
    const std::unique_ptr<UnitModel> net = make_unit_model(cfg, BackendKind::Cpu, DType::F32, 1, 4, false);
    const std::unique_ptr<CpuModel> reference = make_cpu_model(cfg, 1, 4);
    net->decode_allocate(2, 9, 6);
    reference->decode_begin(2, 9, 6);
    // A prompt of 4 tokens in slot 0 and one of 2 in slot 1 in one step, then one token each per step.
    std::vector<int32_t> tokens = {3, 7, 1, 4, 9, 2};
    std::vector<int> slots = {0, 0, 0, 0, 1, 1}, positions = {0, 1, 2, 3, 0, 1};
    std::vector<int32_t> rows = {3, 5};
    for (int step = 0; step < 4; ++step) {
      const std::vector<int32_t> next = unit_model_step(*net, m, tokens, slots, positions, rows);
      BOOST_TEST(next == cpu_model_step(*reference, m, tokens, slots, positions, rows),
                 boost::test_tools::per_element());
      tokens = next;
      slots = {0, 1};
      positions = {positions[rows[0]] + 1, positions[rows[1]] + 1};
      rows = {0, 1};
    }
    BOOST_TEST(contains(error_of([&] { unit_model_step(*net, m, {1}, {0}, {8}, {1}); }), "logit row 1"));
    net->decode_free();
    reference->decode_end();
  }
}

BOOST_AUTO_TEST_CASE(activation_bytes_equal_the_planned_and_the_allocated) {
  for (const ModelConfig& cfg : kFamilies)
    for (const auto& [B, T] : {std::pair{1, 1}, std::pair{2, 5}, std::pair{3, 200}}) {
      const size_t before = memory_stats().current[static_cast<int>(MemKind::Activations)];
      const std::unique_ptr<UnitModel> net = make_unit_model(cfg, BackendKind::Cpu, DType::F32, B, T, false);
      const size_t held = memory_stats().current[static_cast<int>(MemKind::Activations)] - before;
      const ModelMemory planned = unit_model_memory(cfg, BackendKind::Cpu, DType::F32, B, T, false);
      BOOST_TEST(net->activation_bytes() == held, cfg.arch << " " << B << "x" << T);
      BOOST_TEST(planned.activations == held, cfg.arch << " " << B << "x" << T);
      BOOST_TEST(planned.extra == 0u);
      // The hidden states and their gradients beside the model's own activations.
      const size_t hidden = static_cast<size_t>(B) * T * cfg.hidden_size * sizeof(float);
      BOOST_TEST(held == cpu_activation_bytes(cfg, B, T) + 4 * hidden);
    }
}

BOOST_AUTO_TEST_CASE(unknown_families_and_other_dtypes_are_refused) {
  ModelConfig cfg = tiny_llama();
  BOOST_TEST(contains(error_of([&] { make_unit_model(cfg, BackendKind::Cpu, DType::BF16, 1, 4, false); }), "fp32"));
  cfg.arch = "gpt2";
  const std::string message = error_of([&] { make_unit_model(cfg, BackendKind::Cpu, DType::F32, 1, 4, false); });
  BOOST_TEST(contains(message, "'gpt2'"), message);
  BOOST_TEST(contains(message, "bloom, llama"), message);
  BOOST_TEST(contains(error_of([&] { unit_model_memory(cfg, BackendKind::Cuda, DType::BF16, 1, 4, false); }),
                      "gpt2"));
#ifndef SHARDLM_HAVE_CUDA
  BOOST_TEST(contains(error_of([&] { make_unit_model(tiny_bloom(), BackendKind::Cuda, DType::BF16, 1, 4, false); }),
                      "without the CUDA backend"));
#endif
}
