// config.json keys of the Llama-style families (LlamaForCausalLM and those built on its decoder
// layer, as Qwen2ForCausalLM): sizes, RMSNorm epsilon, rotary theta and scaling, tied head.
#pragma once

#include "../hf_config_reader.hpp"
#include "shardlm/model.hpp"

namespace shardlm {

// The keys every Llama-style config.json has; Errors name unsupported values (activation, rope type).
ModelConfig read_llama_style_config(const HfConfigReader& r);
// Writes them, from vocab_size to tie_word_embeddings.
void write_llama_style_config(const ModelConfig& cfg, OrderedJson& c);

// Qwen2 and Qwen3: use_sliding_window = true, or a layer_types entry other than full_attention, refused.
void refuse_sliding_window(const HfConfigReader& r);

// config.json sliding_window as ModelConfig::sliding_window: null is none (0), absent is `absent`
// (transformers' default for the family); 0 or negative is an Error naming the file and the key.
int read_sliding_window(const HfConfigReader& r, int absent);
// Writes it back: the window, or null for none.
void write_sliding_window(const ModelConfig& cfg, OrderedJson& c);

}  // namespace shardlm
