// BLOOM's parameter layout per FSDP unit: the root (word embeddings, their LayerNorm, ln_f; the LM
// head is tied to the embeddings) and blocks "h.<i>" (LayerNorms, fused query_key_value, dense,
// dense_h_to_4h, dense_4h_to_h, all with biases).
#pragma once

#include <vector>

#include "shardlm/model.hpp"

namespace shardlm {

// Also validates the config (positive sizes, heads dividing hidden_size).
std::vector<UnitLayout> bloom_layout(const ModelConfig& cfg);

// The linear layers LoRA can adapt: query_key_value, dense, dense_h_to_4h, dense_4h_to_h.
std::vector<LinearModule> bloom_linear_modules(const ModelConfig& cfg);

// Where the tensors start (elements) in the root's flat parameter; the head is the embeddings.
struct BloomRootOffsets {
  size_t embeddings = 0, embed_norm_weight = 0, embed_norm_bias = 0, final_norm_weight = 0, final_norm_bias = 0;
};
// The same in a block's (equal for every block).
struct BloomBlockOffsets {
  size_t ln1_weight = 0, ln1_bias = 0, qkv_weight = 0, qkv_bias = 0, dense_weight = 0, dense_bias = 0;
  size_t ln2_weight = 0, ln2_bias = 0, mlp_in_weight = 0, mlp_in_bias = 0, mlp_out_weight = 0, mlp_out_bias = 0;
};
// From bloom_layout's units, so that the models can never disagree with the layout.
BloomRootOffsets bloom_root_offsets(const UnitLayout& root);
BloomBlockOffsets bloom_block_offsets(const UnitLayout& block);

}  // namespace shardlm
