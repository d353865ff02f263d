// config.json keys of the Llama-style families (LlamaForCausalLM and those built on its decoder
// layer, as Qwen2ForCausalLM): sizes, RMSNorm epsilon, rotary theta and scaling, tied head.
#pragma once

#include "../hf_config_reader.hpp"
#include "shardlm/model.hpp"

namespace shardlm {

// What a family's transformers config class changes in reading the shared keys.
struct LlamaStyleKeys {
  // The class's default for an absent rms_norm_eps (LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config and
  // Gemma3TextConfig: 1e-6; Phi3Config: 1e-5).
  float rms_norm_eps = 1e-6f;
  // The family reads partial_rotary_factor and LongRoPE with read_rope_options (ModelFamily::rotary_options: a rope
  // type longrope, su or yarn is left to it); otherwise a partial_rotary_factor other than 1 is refused.
  bool rotary_options = false;
};

// The keys every Llama-style config.json has; Errors name unsupported values (activation, rope type, a partial
// rotary factor the family does not take) and the key read (rope_parameters or rope_scaling).
ModelConfig read_llama_style_config(const HfConfigReader& r, const LlamaStyleKeys& keys = {});
// Writes them, from vocab_size to tie_word_embeddings.
void write_llama_style_config(const ModelConfig& cfg, OrderedJson& c);

// Qwen2 and Qwen3: transformers windows layer i where layer_types[i] is sliding_attention (config.json's
// layer_types, or without it use_sliding_window and i >= max_window_layers). shardlm's window is the
// model's: every layer windowed gives sliding_window, none gives 0; some but not all, or windowed layers
// without use_sliding_window, is an Error naming the file and the keys.
int read_layer_sliding_window(const HfConfigReader& r, int num_layers);
// Writes them back: use_sliding_window, sliding_window (null for none), max_window_layers and layer_types.
void write_layer_sliding_window(const ModelConfig& cfg, OrderedJson& c);
// A config.json with no keys beside the Llama-style ones and the per-layer window (Qwen2's): read_llama_style_config
// and read_layer_sliding_window; written by write_windowed_llama_style_config<write_layer_sliding_window>.
ModelConfig read_layer_windowed_llama_style_config(const HfConfigReader& r);

// The rotary options a family may take beside theta (Phi-3's): partial_rotary_factor and LongRoPE's
// short_factor, long_factor, original_max_position_embeddings and attention_factor, from transformers 5's
// rope_parameters or 4.x's top-level partial_rotary_factor / original_max_position_embeddings and rope_scaling
// (type longrope, or su or yarn, which Phi3Config reads as longrope). Errors name the file and the key.
void read_rope_options(const HfConfigReader& r, ModelConfig& c);
// Writes them as transformers 5 does: rope_parameters (rope_type, rope_theta, partial_rotary_factor and
// LongRoPE's keys) in place of rope_theta / rope_scaling, original_max_position_embeddings also at the top.
void write_rope_options(const ModelConfig& cfg, OrderedJson& c);

// The training-only keys that end the windowed Llama-style families' config.json (Mistral, Qwen2, Qwen3,
// Gemma 3): attention_dropout (0: shardlm has none) and initializer_range (ModelConfig::init_std).
void write_dropout_and_init_range(const ModelConfig& cfg, OrderedJson& c);

// config.json sliding_window as ModelConfig::sliding_window: null is none (0), absent is `absent`
// (transformers' default for the family); 0 or negative is an Error naming the file and the key.
int read_sliding_window(const HfConfigReader& r, int absent);
// Writes it back: the window, or null for none.
void write_sliding_window(const ModelConfig& cfg, OrderedJson& c);

// The whole config.json of a windowed Llama-style family without keys of its own: the Llama-style keys, the
// window's (WriteWindow: write_sliding_window for Mistral, write_layer_sliding_window for Qwen2) and
// write_dropout_and_init_range; a template so that the family record can hold it as a plain function pointer.
template <void (*WriteWindow)(const ModelConfig&, OrderedJson&)>
void write_windowed_llama_style_config(const ModelConfig& cfg, OrderedJson& c) {
  write_llama_style_config(cfg, c);
  WriteWindow(cfg, c);
  write_dropout_and_init_range(cfg, c);
}

}  // namespace shardlm
