// The Llama family's record for the registry: LlamaForCausalLM's config.json keys, its Hugging Face
// tensor names ("model." + layout name, lm_head.weight as is), its CPU and CUDA models and sizes.
#include "llama_hf_config.hpp"
#include "llama_style_family.hpp"

namespace shardlm {
namespace {

constexpr LlamaBlock kLlamaBlock{};

ModelConfig llama_from_hf(const HfConfigReader& r) {
  ModelConfig c = read_llama_style_config(r);
  SHARDLM_CHECK(!r.get_or<bool>({"attention_bias"}, false) && !r.get_or<bool>({"mlp_bias"}, false), r.source(),
                ": attention_bias / mlp_bias = true are not supported");
  SHARDLM_CHECK(r.get_or<int>({"pretraining_tp"}, 1) == 1, r.source(), ": pretraining_tp other than 1 is not supported");
  return c;
}

void llama_to_hf(const ModelConfig& cfg, OrderedJson& c) {
  write_llama_style_config(cfg, c);
  c["attention_bias"] = false;
  c["mlp_bias"] = false;
  c["initializer_range"] = shortest_decimal(cfg.init_std);
}

}  // namespace

ModelFamily llama_family() {
  return llama_style_family<kLlamaBlock>("llama", "LlamaForCausalLM", "LlamaDecoderLayer",
                                         llama_from_hf, llama_to_hf);
}

}  // namespace shardlm
