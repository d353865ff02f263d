// The Qwen2 family's record for the registry (transformers' Qwen2ForCausalLM): Llama's decoder
// layer with biases on q_proj, k_proj and v_proj (LlamaBlock::qkv_bias), a tied or untied head, its
// rope_theta and rms_norm_eps, a sliding window where every layer has one (off in the released
// models); everything else is the Llama-style code of src/model/llama/.
#include "../llama/llama_hf_config.hpp"
#include "../llama/llama_style_family.hpp"

namespace shardlm {
namespace {

constexpr LlamaBlock kQwen2Block{true};

}  // namespace

ModelFamily qwen2_family() {
  return llama_style_family<kQwen2Block>("qwen2", "Qwen2ForCausalLM", "Qwen2DecoderLayer",
                                         read_layer_windowed_llama_style_config,
                                         write_windowed_llama_style_config<write_layer_sliding_window>, true);
}

}  // namespace shardlm
