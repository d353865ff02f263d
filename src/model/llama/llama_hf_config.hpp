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

// Qwen2 and Qwen3: transformers windows layer i where layer_types[i] is sliding_attention (config.json's
// layer_types, or without it use_sliding_window and i >= max_window_layers). shardlm's window is the
// model's: every layer windowed gives sliding_window, none gives 0; some but not all, or windowed layers
// without use_sliding_window, is an Error naming the file and the keys.
int read_layer_sliding_window(const HfConfigReader& r, int num_layers);
// Writes them back: use_sliding_window, sliding_window (null for none), max_window_layers and layer_types.
void write_layer_sliding_window(const ModelConfig& cfg, OrderedJson& c);

// config.json sliding_window as ModelConfig::sliding_window: null is none (0), absent is `absent`
// (transformers' default for the family); 0 or negative is an Error naming the file and the key.
int read_sliding_window(const HfConfigReader& r, int absent);
// Writes it back: the window, or null for none.
void write_sliding_window(const ModelConfig& cfg, OrderedJson& c);

}  // namespace shardlm
