// The Mistral family's record for the registry (transformers' MistralForCausalLM): Llama's decoder layer
// without biases, attention over a sliding window of keys where config.json sets sliding_window (v0.1:
// 4096; v0.3: null, full causal attention), head_dim from config.json independent of hidden_size / heads
// (Mistral Nemo / Small: 128 at hidden 5120 and 32 heads); everything else is the Llama-style code of
// src/model/llama/, whose attention applies ModelConfig::sliding_window on both backends.
#include "../llama/llama_hf_config.hpp"
#include "../llama/llama_style_family.hpp"

namespace shardlm {
namespace {

constexpr LlamaBlock kMistralBlock{};
// MistralConfig's default when config.json leaves sliding_window out.
constexpr int kTransformersDefaultWindow = 4096;

ModelConfig mistral_from_hf(const HfConfigReader& r) {
  ModelConfig c = read_llama_style_config(r);
  SHARDLM_CHECK(!r.get_or<bool>({"attention_bias"}, false) && !r.get_or<bool>({"mlp_bias"}, false), r.source(),
                ": attention_bias / mlp_bias = true are not supported");
  c.sliding_window = read_sliding_window(r, kTransformersDefaultWindow);
  return c;
}

}  // namespace

ModelFamily mistral_family() {
  return llama_style_family<kMistralBlock>("mistral", "MistralForCausalLM", "MistralDecoderLayer", mistral_from_hf,
                                           write_windowed_llama_style_config<write_sliding_window>, true);
}

}  // namespace shardlm
