// The Phi-3 family's record for the registry (transformers' Phi3ForCausalLM): Llama's decoder layer without
// biases whose q|k|v and gate|up projections are one tensor each in the Hugging Face files and for LoRA
// (LlamaBlock::fused_projections: self_attn.qkv_proj, mlp.gate_up_proj with gate first), rotary over the first
// partial_rotary_factor of each head, LongRoPE scaling (rope type longrope, or su or yarn as Phi3Config reads
// them: short and long factors, the attention factor on cos and sin; the 128k variants), a sliding window where
// config.json sets one (Phi-3-mini-4k: 2047); everything else is the Llama-style code of src/model/llama/.
#include "../llama/llama_hf_config.hpp"
#include "../llama/llama_style_family.hpp"

namespace shardlm {
namespace {

// qkv_bias, qk_norm, unit_offset_norms, sandwich_norms, gelu_tanh, scaled_embeddings off; fused_projections on.
constexpr LlamaBlock kPhi3Block{false, false, false, false, false, false, true};

ModelConfig phi3_from_hf(const HfConfigReader& r) {
  ModelConfig c = read_llama_style_config(r, {1e-5f, true});  // Phi3Config's rms_norm_eps
  for (const char* key : {"attention_bias", "mlp_bias", "qkv_bias"})
    SHARDLM_CHECK(!r.get_or<bool>({key}, false), r.source(), ": config.json '", key,
                  "' = true is not supported (Phi-3's projections have no biases)");
  read_rope_options(r, c);
  c.sliding_window = read_sliding_window(r, 0);  // Phi3Config's default: none
  return c;
}

void phi3_to_hf(const ModelConfig& cfg, OrderedJson& c) {
  write_llama_style_config(cfg, c);
  write_rope_options(cfg, c);
  write_sliding_window(cfg, c);
  c["attention_dropout"] = 0.0;
  c["resid_pdrop"] = 0.0;
  c["embd_pdrop"] = 0.0;
  c["initializer_range"] = shortest_decimal(cfg.init_std);
}

}  // namespace

ModelFamily phi3_family() {
  ModelFamily f = llama_style_family<kPhi3Block>("phi3", "Phi3ForCausalLM", "Phi3DecoderLayer", phi3_from_hf,
                                                 phi3_to_hf, true);
  f.linear_modules = llama_fused_linear_modules;
  f.rotary_options = true;
  return f;
}

}  // namespace shardlm
