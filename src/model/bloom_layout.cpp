// BLOOM's parameter layout per FSDP unit, the layout dispatch by architecture, the deterministic
// counter-based initialisation of any layout, ALiBi slopes.
#include <algorithm>
#include <cmath>
#include <functional>
#include <thread>
#include <vector>

#include "model_internal.hpp"

namespace shardlm {
namespace {

using model_detail::add_tensor;

void check_config(const ModelConfig& cfg) {
  SHARDLM_CHECK(cfg.vocab_size > 0 && cfg.hidden_size > 0 && cfg.num_heads > 0 && cfg.num_layers >= 0,
                "BLOOM config: vocab_size, hidden_size and num_heads must be positive and num_layers >= 0 (got ",
                cfg.vocab_size, ", ", cfg.hidden_size, ", ", cfg.num_heads, ", ", cfg.num_layers, ")");
  SHARDLM_CHECK(cfg.hidden_size % cfg.num_heads == 0, "BLOOM config: hidden_size ", cfg.hidden_size,
                " is not a multiple of num_heads ", cfg.num_heads);
}

// splitmix64's finaliser: a bijective mix whose outputs of consecutive inputs look independent.
uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Uniform in (0, 1] from the top 53 bits, never 0 so that log() below is finite.
double unit_interval(uint64_t bits) { return 1.0 - static_cast<double>(bits >> 11) * 0x1.0p-53; }

// A standard normal sample that depends only on (seed, unit, index): Box-Muller on two hashed uniforms.
double counter_normal(uint64_t seed, int unit_index, size_t index) {
  const uint64_t key =
      mix64(mix64(mix64(seed) ^ static_cast<uint64_t>(unit_index)) ^ static_cast<uint64_t>(index));
  const double radius = std::sqrt(-2.0 * std::log(unit_interval(mix64(key ^ 1))));
  const double angle = 6.283185307179586 * unit_interval(mix64(key ^ 2));
  return radius * std::cos(angle);
}

}  // namespace

std::vector<UnitLayout> bloom_layout(const ModelConfig& cfg) {
  check_config(cfg);
  const int64_t V = cfg.vocab_size, H = cfg.hidden_size;
  const float init_std = cfg.init_std;
  std::vector<UnitLayout> units;

  UnitLayout root;
  root.name = "root";
  add_tensor(root, "word_embeddings.weight", {V, H}, InitKind::Normal, init_std);
  add_tensor(root, "word_embeddings_layernorm.weight", {H}, InitKind::Ones, init_std);
  add_tensor(root, "word_embeddings_layernorm.bias", {H}, InitKind::Zeros, init_std);
  add_tensor(root, "ln_f.weight", {H}, InitKind::Ones, init_std);
  add_tensor(root, "ln_f.bias", {H}, InitKind::Zeros, init_std);
  units.push_back(std::move(root));

  for (int i = 0; i < cfg.num_layers; ++i) {
    UnitLayout block;
    block.name = concat("h.", i);
    const std::string p = block.name + ".";
    add_tensor(block, p + "input_layernorm.weight", {H}, InitKind::Ones, init_std);
    add_tensor(block, p + "input_layernorm.bias", {H}, InitKind::Zeros, init_std);
    add_tensor(block, p + "self_attention.query_key_value.weight", {3 * H, H}, InitKind::Normal, init_std);
    add_tensor(block, p + "self_attention.query_key_value.bias", {3 * H}, InitKind::Zeros, init_std);
    add_tensor(block, p + "self_attention.dense.weight", {H, H}, InitKind::Normal, init_std);
    add_tensor(block, p + "self_attention.dense.bias", {H}, InitKind::Zeros, init_std);
    add_tensor(block, p + "post_attention_layernorm.weight", {H}, InitKind::Ones, init_std);
    add_tensor(block, p + "post_attention_layernorm.bias", {H}, InitKind::Zeros, init_std);
    add_tensor(block, p + "mlp.dense_h_to_4h.weight", {4 * H, H}, InitKind::Normal, init_std);
    add_tensor(block, p + "mlp.dense_h_to_4h.bias", {4 * H}, InitKind::Zeros, init_std);
    add_tensor(block, p + "mlp.dense_4h_to_h.weight", {H, 4 * H}, InitKind::Normal, init_std);
    add_tensor(block, p + "mlp.dense_4h_to_h.bias", {H}, InitKind::Zeros, init_std);
    units.push_back(std::move(block));
  }
  return units;
}

namespace {

// Elements [lo, hi) of the unit (lo >= base): out[i - base].
void init_range(const UnitLayout& unit, int unit_index, uint64_t seed, size_t lo, size_t hi, size_t base, float* out) {
  // Padding past the last tensor stays zero.
  for (size_t i = lo; i < hi; ++i) out[i - base] = 0.0f;
  for (const TensorSpec& t : unit.tensors) {
    const size_t a = std::max(lo, t.offset), b = std::min(hi, t.offset + t.numel);
    for (size_t i = a; i < b; ++i) {
      switch (t.init) {
        case InitKind::Zeros: out[i - base] = 0.0f; break;
        case InitKind::Ones: out[i - base] = 1.0f; break;
        case InitKind::Normal:
          out[i - base] = static_cast<float>(t.init_std * counter_normal(seed, unit_index, i));
          break;
      }
    }
  }
}

}  // namespace

void init_unit_slice(const UnitLayout& unit, int unit_index, uint64_t seed, size_t begin, size_t end,
                     float* out) {
  SHARDLM_CHECK(begin <= end, "init_unit_slice: begin ", begin, " > end ", end, " in unit ", unit.name);
  // Each element depends only on (seed, unit, index), so threads over chunks give the same values;
  // a 7B model's slices would take minutes on one core.
  constexpr size_t kChunk = size_t{1} << 22;
  const size_t n = end - begin;
  const unsigned threads =
      static_cast<unsigned>(std::min<size_t>({std::max(1u, std::thread::hardware_concurrency()), 16, (n + kChunk - 1) / kChunk}));
  if (threads <= 1) return init_range(unit, unit_index, seed, begin, end, begin, out);
  std::vector<std::thread> pool;
  const size_t per = (n + threads - 1) / threads;
  for (unsigned k = 0; k < threads; ++k) {
    const size_t lo = begin + std::min(n, k * per), hi = begin + std::min(n, (k + 1) * per);
    pool.emplace_back(init_range, std::cref(unit), unit_index, seed, lo, hi, begin, out);
  }
  for (std::thread& t : pool) t.join();
}

std::vector<float> alibi_slopes(int num_heads) {
  SHARDLM_CHECK(num_heads > 0, "alibi_slopes: num_heads must be positive, got ", num_heads);
  // The largest power of two <= num_heads gets the geometric sequence 2^(-8k/p), k = 1..p.
  int closest_power_of_2 = 1;
  while (closest_power_of_2 * 2 <= num_heads) closest_power_of_2 *= 2;
  std::vector<float> slopes;
  const double base = std::pow(2.0, -8.0 / closest_power_of_2);
  for (int k = 1; k <= closest_power_of_2; ++k) slopes.push_back(static_cast<float>(std::pow(base, k)));
  // Remaining heads take the odd powers of the sequence for 2p heads, interleaving between the others.
  if (closest_power_of_2 != num_heads) {
    const double extra_base = std::pow(2.0, -4.0 / closest_power_of_2);
    const int remaining = std::min(closest_power_of_2, num_heads - closest_power_of_2);
    for (int k = 1; k <= 2 * remaining - 1; k += 2) slopes.push_back(static_cast<float>(std::pow(extra_base, k)));
  }
  return slopes;
}

std::vector<UnitLayout> model_layout(const ModelConfig& cfg) {
  if (cfg.is_llama()) return llama_layout(cfg);
  SHARDLM_CHECK(cfg.arch == "bloom", "model.arch = '", cfg.arch, "' is not supported (bloom or llama)");
  return bloom_layout(cfg);
}

std::string hf_tensor_name(const ModelConfig& cfg, const std::string& name) {
  if (!cfg.is_llama()) return "transformer." + name;
  return name == "lm_head.weight" ? name : "model." + name;
}

}  // namespace shardlm
