// Llama's parameter layout per FSDP unit: the root (embed_tokens, norm, lm_head when untied) and
// decoder layers "layers.<i>" (RMSNorms, q/k/v/o projections, SwiGLU's gate/up/down), and what the
// families built on Llama's decoder layer (Qwen2, Qwen3) change in it.
#pragma once

#include <string>
#include <vector>

#include "shardlm/model.hpp"

namespace shardlm {

// The options of the Llama-style decoder layer; Llama itself has none set.
struct LlamaBlock {
  bool qkv_bias = false;  // biases on q_proj, k_proj and v_proj (Qwen2), after the three weights
  // RMSNorms over each head of q and of k before rotary (Qwen3): self_attn.q_norm / k_norm, [head_dim]
  bool qk_norm = false;
  // Gemma 3: every RMSNorm (q/k's and the final one too) multiplies by (1 + weight), its weight initialised to 0
  bool unit_offset_norms = false;
  // Gemma 3: RMSNorms on the attention's and the MLP's outputs before their residual adds
  // (post_attention_layernorm, post_feedforward_layernorm); the MLP's input norm is pre_feedforward_layernorm
  bool sandwich_norms = false;
  // Gemma 3: GeGLU, tanh-approximated GELU of gate times up (gelu_pytorch_tanh), instead of SwiGLU
  bool gelu_tanh = false;
  // Gemma 3: the embeddings multiplied by sqrt(hidden_size) (rounded to the embedding's dtype first)
  bool scaled_embeddings = false;
  // Phi-3: q|k|v one tensor self_attn.qkv_proj.weight [(heads + 2 kv_heads) head_dim, hidden] and gate|up one
  // mlp.gate_up_proj.weight [2 intermediate, hidden] (gate rows first), as in the Hugging Face files; LoRA
  // adapts each fused module with one A and one B (PEFT's qkv_proj / gate_up_proj).
  bool fused_projections = false;
};

// The embedding scale of `block` for cfg: sqrt(hidden_size), or 1.
float llama_embed_scale(const ModelConfig& cfg, const LlamaBlock& block);

// Also validates the config (positive sizes, even head dimension, kv heads dividing heads).
std::vector<UnitLayout> llama_layout(const ModelConfig& cfg, const LlamaBlock& block);
// The linear layers LoRA can adapt, in PEFT's order: q/k/v/o_proj, gate/up/down_proj.
std::vector<LinearModule> llama_linear_modules(const ModelConfig& cfg);
// Phi-3's (LlamaBlock::fused_projections): qkv_proj, o_proj, gate_up_proj, down_proj.
std::vector<LinearModule> llama_fused_linear_modules(const ModelConfig& cfg);
// Where LoRA adds onto a block's projections: for each of q, k, v, o, gate, up, down (LlamaProjection) the
// module index in the family's linear_modules and the first row of its B that the projection's outputs are
// (Llama: one module each, row 0; Phi-3: q, k and v rows of qkv_proj, gate and up rows of gate_up_proj).
enum LlamaProjection { kQProjection, kKProjection, kVProjection, kOProjection, kGateProjection, kUpProjection,
                       kDownProjection };
struct LlamaLoraSlot {
  int module = 0;
  int row = 0;
};
std::vector<LlamaLoraSlot> llama_lora_slots(const ModelConfig& cfg, const LlamaBlock& block);
// "model." + name, except lm_head.weight.
std::string llama_hf_tensor_name(const std::string& name);

// Where the tensors start (elements) in the root's flat parameter; the head is the embeddings when tied.
struct LlamaRootOffsets {
  size_t embeddings = 0, norm = 0, head = 0;
};
// The same in a block's (equal for every block); the q/k/v biases only with LlamaBlock::qkv_bias, the
// q/k norms only with LlamaBlock::qk_norm.
struct LlamaBlockOffsets {
  size_t input_norm = 0, q = 0, k = 0, v = 0, q_bias = 0, k_bias = 0, v_bias = 0, o = 0;
  size_t q_norm = 0, k_norm = 0;
  size_t post_norm = 0, gate = 0, up = 0, down = 0;  // post_norm: the MLP's input norm
  // LlamaBlock::sandwich_norms: the norms of the attention's output and of the MLP's output
  size_t attn_out_norm = 0, mlp_out_norm = 0;
  bool qkv_bias = false, qk_norm = false, sandwich_norms = false;
  bool fused = false;  // LlamaBlock::fused_projections: q, k, v inside qkv_proj and gate, up inside gate_up_proj
};
// From llama_layout's units, so that the models can never disagree with the layout.
LlamaRootOffsets llama_root_offsets(const UnitLayout& root, bool tied);
LlamaBlockOffsets llama_block_offsets(const UnitLayout& block, const LlamaBlock& options);
// Where the block's MLP part begins in its flat layout (UnitModel::backward_tail_begin): the first of its
// input norm, gate, up, down (and the norm on its output); 0 unless every tensor from there on is one of them.
size_t llama_backward_tail_begin(const UnitLayout& block, const LlamaBlockOffsets& o);

}  // namespace shardlm
