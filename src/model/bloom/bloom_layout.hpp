// BLOOM's parameter layout per FSDP unit: the root (word embeddings, their LayerNorm, ln_f; the LM
// head is tied to the embeddings) and blocks "h.<i>" (LayerNorms, fused query_key_value, dense,
// dense_h_to_4h, dense_4h_to_h, all with biases).
#pragma once

#include <vector>

#include "shardlm/model.hpp"

namespace shardlm {

// Also validates the config (positive sizes, heads dividing hidden_size).
std::vector<UnitLayout> bloom_layout(const ModelConfig& cfg);

}  // namespace shardlm
