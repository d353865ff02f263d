// BLOOM's parameter layout per FSDP unit (names of the Hugging Face state dict without
// "transformer.") and its positions, ALiBi slopes.
#include "bloom_layout.hpp"

#include <algorithm>
#include <cmath>

#include "../model_internal.hpp"

namespace shardlm {

using model_detail::add_tensor;

std::vector<UnitLayout> bloom_layout(const ModelConfig& cfg) {
  model_detail::check_common_shape(cfg, "BLOOM", "num_heads");
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

BloomRootOffsets bloom_root_offsets(const UnitLayout& root) {
  auto at = [&](const char* name) { return model_detail::tensor_offset(root, name, "BLOOM layout"); };
  BloomRootOffsets o;
  o.embeddings = at("word_embeddings.weight");
  o.embed_norm_weight = at("word_embeddings_layernorm.weight");
  o.embed_norm_bias = at("word_embeddings_layernorm.bias");
  o.final_norm_weight = at("ln_f.weight");
  o.final_norm_bias = at("ln_f.bias");
  return o;
}

BloomBlockOffsets bloom_block_offsets(const UnitLayout& block) {
  const std::string p = block.name + ".";
  auto at = [&](const char* name) { return model_detail::tensor_offset(block, p + name, "BLOOM layout"); };
  BloomBlockOffsets o;
  o.ln1_weight = at("input_layernorm.weight");
  o.ln1_bias = at("input_layernorm.bias");
  o.qkv_weight = at("self_attention.query_key_value.weight");
  o.qkv_bias = at("self_attention.query_key_value.bias");
  o.dense_weight = at("self_attention.dense.weight");
  o.dense_bias = at("self_attention.dense.bias");
  o.ln2_weight = at("post_attention_layernorm.weight");
  o.ln2_bias = at("post_attention_layernorm.bias");
  o.mlp_in_weight = at("mlp.dense_h_to_4h.weight");
  o.mlp_in_bias = at("mlp.dense_h_to_4h.bias");
  o.mlp_out_weight = at("mlp.dense_4h_to_h.weight");
  o.mlp_out_bias = at("mlp.dense_4h_to_h.bias");
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
