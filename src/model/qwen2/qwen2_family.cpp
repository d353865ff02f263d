// The Qwen2 family's record for the registry (transformers' Qwen2ForCausalLM): Llama's decoder
// layer with biases on q_proj, k_proj and v_proj (LlamaBlock::qkv_bias), a tied or untied head, its
// rope_theta and rms_norm_eps, a sliding window where every layer has one (off in the released
// models); everything else is the Llama-style code of src/model/llama/.
#include "../llama/llama_hf_config.hpp"
#include "../llama/llama_style_family.hpp"

namespace shardlm {
namespace {

constexpr LlamaBlock kQwen2Block{true};

ModelConfig qwen2_from_hf(const HfConfigReader& r) {
  ModelConfig c = read_llama_style_config(r);
  c.sliding_window = read_layer_sliding_window(r, c.num_layers);
  return c;
}

void qwen2_to_hf(const ModelConfig& cfg, OrderedJson& c) {
  write_llama_style_config(cfg, c);
  write_layer_sliding_window(cfg, c);
  write_dropout_and_init_range(cfg, c);
}

}  // namespace

ModelFamily qwen2_family() {
  return llama_style_family<kQwen2Block>("qwen2", "Qwen2ForCausalLM", "Qwen2DecoderLayer",
                                         qwen2_from_hf, qwen2_to_hf, true);
}

}  // namespace shardlm
