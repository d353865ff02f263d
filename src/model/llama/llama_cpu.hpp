// LlamaCpu: the CpuModel of Llama's decoder (transformers' LlamaForCausalLM: RMSNorm, rotary
// embeddings, grouped-query attention, SwiGLU MLP; the LM head is lm_head.weight, or
// embed_tokens.weight when tied), fp32 on the CPU, with the options of LlamaBlock (Qwen2's q/k/v
// biases, Qwen3's q/k norms); and the bytes it holds for `shardlm plan`.
#pragma once

#include <cstddef>
#include <memory>

#include "llama_layout.hpp"
#include "shardlm/model.hpp"

namespace shardlm {

// LlamaCpu(cfg, max_batch, max_seq) with the options of `block`: the CpuModel of the Llama-style
// families' registry records.
std::unique_ptr<CpuModel> make_llama_cpu(const ModelConfig& cfg, int max_batch, int max_seq, const LlamaBlock& block);

// LlamaCpu(cfg, max_batch, max_seq, block).activation_bytes() without building it.
size_t llama_cpu_activation_bytes(const ModelConfig& cfg, int max_batch, int max_seq, const LlamaBlock& block);

}  // namespace shardlm
