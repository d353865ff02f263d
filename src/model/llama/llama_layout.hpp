// Llama's parameter layout per FSDP unit: the root (embed_tokens, norm, lm_head when untied) and
// decoder layers "layers.<i>" (RMSNorms, q/k/v/o projections, SwiGLU's gate/up/down), and what the
// families built on Llama's decoder layer (Qwen2) change in it.
#pragma once

#include <string>
#include <vector>

#include "shardlm/model.hpp"

namespace shardlm {

// The options of the Llama-style decoder layer; Llama itself has none set.
struct LlamaBlock {
  bool qkv_bias = false;  // biases on q_proj, k_proj and v_proj (Qwen2), after the three weights
};

// Also validates the config (positive sizes, even head dimension, kv heads dividing heads).
std::vector<UnitLayout> llama_layout(const ModelConfig& cfg, const LlamaBlock& block);
// "model." + name, except lm_head.weight.
std::string llama_hf_tensor_name(const std::string& name);

}  // namespace shardlm
