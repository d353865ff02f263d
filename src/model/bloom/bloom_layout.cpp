// BLOOM's parameter layout per FSDP unit (names of the Hugging Face state dict without
// "transformer.") and its positions, ALiBi slopes.
#include "bloom_layout.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "../model_internal.hpp"

namespace shardlm {

namespace {

using Root = BloomRootOffsets;
using Block = BloomBlockOffsets;

// A unit's modules as tensors, each passed to visit(name, offset field, shape, init): a LayerNorm
// is a weight (ones) and a bias (zeros) of hidden_size, a linear layer a weight [out, in] (normal)
// and a bias [out].
template <typename Offsets, typename Visit>
struct Modules {
  Visit& visit;
  int64_t H;
  void layer_norm(const std::string& name, size_t Offsets::*weight, size_t Offsets::*bias) {
    visit(name + ".weight", weight, {H}, InitKind::Ones);
    visit(name + ".bias", bias, {H}, InitKind::Zeros);
  }
  void linear(const std::string& name, size_t Offsets::*weight, size_t Offsets::*bias, int64_t out, int64_t in) {
    visit(name + ".weight", weight, {out, in}, InitKind::Normal);
    visit(name + ".bias", bias, {out}, InitKind::Zeros);
  }
};

// The root's and a block's tensors in layout order: the one list that bloom_layout lays out and
// the offsets are found from.
template <typename Visit>
void root_tensors(Visit&& visit, int64_t V, int64_t H) {
  visit("word_embeddings.weight", &Root::embeddings, {V, H}, InitKind::Normal);
  Modules<Root, Visit> m{visit, H};
  m.layer_norm("word_embeddings_layernorm", &Root::embed_norm_weight, &Root::embed_norm_bias);
  m.layer_norm("ln_f", &Root::final_norm_weight, &Root::final_norm_bias);
}

template <typename Visit>
void block_tensors(Visit&& visit, int64_t H) {
  Modules<Block, Visit> m{visit, H};
  m.layer_norm("input_layernorm", &Block::ln1_weight, &Block::ln1_bias);
  m.linear("self_attention.query_key_value", &Block::qkv_weight, &Block::qkv_bias, 3 * H, H);
  m.linear("self_attention.dense", &Block::dense_weight, &Block::dense_bias, H, H);
  m.layer_norm("post_attention_layernorm", &Block::ln2_weight, &Block::ln2_bias);
  m.linear("mlp.dense_h_to_4h", &Block::mlp_in_weight, &Block::mlp_in_bias, 4 * H, H);
  m.linear("mlp.dense_4h_to_h", &Block::mlp_out_weight, &Block::mlp_out_bias, H, 4 * H);
}

// Visitors: one appends each tensor to `unit`, the other sets each offset field of `o` from `unit`
// (shapes unused); tensor names are `prefix` + name.
auto append_to(UnitLayout& unit, const std::string& prefix, float init_std) {
  return [&unit, prefix, init_std](const std::string& name, auto, std::vector<int64_t> shape, InitKind init) {
    model_detail::add_tensor(unit, prefix + name, std::move(shape), init, init_std);
  };
}

template <typename Offsets>
auto find_in(const UnitLayout& unit, const std::string& prefix, Offsets& o) {
  return [&unit, prefix, &o](const std::string& name, size_t Offsets::*field, const std::vector<int64_t>&, InitKind) {
    o.*field = model_detail::tensor_offset(unit, prefix + name, "BLOOM layout");
  };
}

}  // namespace

std::vector<UnitLayout> bloom_layout(const ModelConfig& cfg) {
  model_detail::check_common_shape(cfg, "BLOOM", "num_heads");
  const int64_t V = cfg.vocab_size, H = cfg.hidden_size;
  std::vector<UnitLayout> units;

  UnitLayout root;
  root.name = "root";
  root_tensors(append_to(root, "", cfg.init_std), V, H);
  units.push_back(std::move(root));

  for (int i = 0; i < cfg.num_layers; ++i) {
    UnitLayout block;
    block.name = concat("h.", i);
    block_tensors(append_to(block, block.name + ".", cfg.init_std), H);
    units.push_back(std::move(block));
  }
  return units;
}

std::vector<LinearModule> bloom_linear_modules(const ModelConfig& cfg) {
  const int64_t H = cfg.hidden_size;
  return {{"query_key_value", "self_attention.query_key_value", H, 3 * H},
          {"dense", "self_attention.dense", H, H},
          {"dense_h_to_4h", "mlp.dense_h_to_4h", H, 4 * H},
          {"dense_4h_to_h", "mlp.dense_4h_to_h", 4 * H, H}};
}

BloomRootOffsets bloom_root_offsets(const UnitLayout& root) {
  BloomRootOffsets o;
  root_tensors(find_in(root, "", o), 0, 0);
  return o;
}

BloomBlockOffsets bloom_block_offsets(const UnitLayout& block) {
  BloomBlockOffsets o;
  block_tensors(find_in(block, block.name + ".", o), 0);
  return o;
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

}  // namespace shardlm
