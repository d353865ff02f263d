// The Qwen3 family's record for the registry (transformers' Qwen3ForCausalLM): Llama's decoder layer
// without biases, with an RMSNorm over each head of q and of k before rotary (LlamaBlock::qk_norm:
// self_attn.q_norm / k_norm, [head_dim]), head_dim from config.json independent of hidden_size / heads,
// a tied or untied head, a sliding window where every layer has one (off in the released models);
// everything else is the Llama-style code of src/model/llama/.
#include "../llama/llama_hf_config.hpp"
#include "../llama/llama_style_family.hpp"

namespace shardlm {
namespace {

constexpr LlamaBlock kQwen3Block{false, true};

ModelConfig qwen3_from_hf(const HfConfigReader& r) {
  ModelConfig c = read_llama_style_config(r);
  SHARDLM_CHECK(!r.get_or<bool>({"attention_bias"}, false), r.source(), ": attention_bias = true is not supported");
  c.sliding_window = read_layer_sliding_window(r, c.num_layers);
  return c;
}

void qwen3_to_hf(const ModelConfig& cfg, OrderedJson& c) {
  write_llama_style_config(cfg, c);
  c["attention_bias"] = false;
  write_layer_sliding_window(cfg, c);
  write_dropout_and_init_range(cfg, c);
}

}  // namespace

ModelFamily qwen3_family() {
  return llama_style_family<kQwen3Block>("qwen3", "Qwen3ForCausalLM", "Qwen3DecoderLayer",
                                         qwen3_from_hf, qwen3_to_hf, true);
}

}  // namespace shardlm
