// Llama's parameter layout per FSDP unit (names of the Hugging Face state dict without "model.")
// and its rotary frequencies, Llama 3.1's rope_scaling included.
#include "llama_layout.hpp"

#include <algorithm>
#include <cmath>

#include "../model_internal.hpp"

namespace shardlm {
namespace {

using model_detail::add_tensor;

void check_config(const ModelConfig& cfg) {
  model_detail::check_common_shape(cfg, "Llama", "num_attention_heads", true);
  SHARDLM_CHECK(cfg.head_dim() % 2 == 0, "Llama config: head dimension ", cfg.head_dim(),
                " must be even for rotary embeddings");
  SHARDLM_CHECK(cfg.kv_heads() > 0 && cfg.num_heads % cfg.kv_heads() == 0, "Llama config: num_attention_heads ",
                cfg.num_heads, " is not a multiple of num_key_value_heads ", cfg.kv_heads());
  SHARDLM_CHECK(cfg.ffn_size() > 0, "Llama config: intermediate_size must be positive");
  SHARDLM_CHECK(cfg.partial_rotary_factor > 0 && cfg.partial_rotary_factor <= 1 && cfg.rotary_dim() >= 2 &&
                    cfg.rotary_dim() % 2 == 0,
                "Llama config: partial_rotary_factor ", cfg.partial_rotary_factor, " gives ", cfg.rotary_dim(),
                " rotary dimensions of the head's ", cfg.head_dim(), "; they must be even and at least 2");
  const LongRope& lr = cfg.longrope;
  if (lr.enabled()) {
    const size_t half = static_cast<size_t>(cfg.rotary_dim() / 2);
    SHARDLM_CHECK(lr.short_factor.size() == half && lr.long_factor.size() == half, "Llama config: LongRoPE's ",
                  "short_factor and long_factor need rotary_dim / 2 = ", half, " entries each (they have ",
                  lr.short_factor.size(), " and ", lr.long_factor.size(), ")");
    SHARDLM_CHECK(lr.original_max_position_embeddings > 0, "Llama config: LongRoPE needs ",
                  "original_max_position_embeddings > 0");
    SHARDLM_CHECK(lr.attention_factor >= 0, "Llama config: LongRoPE's attention_factor must be >= 0");
  }
}

}  // namespace

std::vector<UnitLayout> llama_layout(const ModelConfig& cfg, const LlamaBlock& options) {
  check_config(cfg);
  const int64_t V = cfg.vocab_size, H = cfg.hidden_size, D = cfg.head_dim();
  const int64_t Q = cfg.num_heads * D, KV = cfg.kv_heads() * D, F = cfg.ffn_size();
  const float std_ = cfg.init_std;
  // (1 + weight) norms start at 0, as transformers initialises Gemma's.
  const InitKind norm_init = options.unit_offset_norms ? InitKind::Zeros : InitKind::Ones;
  std::vector<UnitLayout> units;

  UnitLayout root;
  root.name = "root";
  add_tensor(root, "embed_tokens.weight", {V, H}, InitKind::Normal, std_);
  add_tensor(root, "norm.weight", {H}, norm_init, std_);
  if (!cfg.tie_word_embeddings) add_tensor(root, "lm_head.weight", {V, H}, InitKind::Normal, std_);
  units.push_back(std::move(root));

  for (int i = 0; i < cfg.num_layers; ++i) {
    UnitLayout block;
    block.name = concat("layers.", i);
    const std::string p = block.name + ".";
    add_tensor(block, p + "input_layernorm.weight", {H}, norm_init, std_);
    if (options.fused_projections) {
      add_tensor(block, p + "self_attn.qkv_proj.weight", {Q + 2 * KV, H}, InitKind::Normal, std_);
    } else {
      add_tensor(block, p + "self_attn.q_proj.weight", {Q, H}, InitKind::Normal, std_);
      add_tensor(block, p + "self_attn.k_proj.weight", {KV, H}, InitKind::Normal, std_);
      add_tensor(block, p + "self_attn.v_proj.weight", {KV, H}, InitKind::Normal, std_);
    }
    // After the three weights, so that [q; k; v] weights and biases are each one fused tensor.
    if (options.qkv_bias) {
      add_tensor(block, p + "self_attn.q_proj.bias", {Q}, InitKind::Zeros, std_);
      add_tensor(block, p + "self_attn.k_proj.bias", {KV}, InitKind::Zeros, std_);
      add_tensor(block, p + "self_attn.v_proj.bias", {KV}, InitKind::Zeros, std_);
    }
    add_tensor(block, p + "self_attn.o_proj.weight", {H, Q}, InitKind::Normal, std_);
    if (options.qk_norm) {
      add_tensor(block, p + "self_attn.q_norm.weight", {D}, norm_init, std_);
      add_tensor(block, p + "self_attn.k_norm.weight", {D}, norm_init, std_);
    }
    add_tensor(block, p + "post_attention_layernorm.weight", {H}, norm_init, std_);
    if (options.sandwich_norms) {
      add_tensor(block, p + "pre_feedforward_layernorm.weight", {H}, norm_init, std_);
      add_tensor(block, p + "post_feedforward_layernorm.weight", {H}, norm_init, std_);
    }
    if (options.fused_projections) {
      add_tensor(block, p + "mlp.gate_up_proj.weight", {2 * F, H}, InitKind::Normal, std_);
    } else {
      add_tensor(block, p + "mlp.gate_proj.weight", {F, H}, InitKind::Normal, std_);
      add_tensor(block, p + "mlp.up_proj.weight", {F, H}, InitKind::Normal, std_);
    }
    add_tensor(block, p + "mlp.down_proj.weight", {H, F}, InitKind::Normal, std_);
    units.push_back(std::move(block));
  }
  return units;
}

LlamaRootOffsets llama_root_offsets(const UnitLayout& root, bool tied) {
  auto at = [&](const char* name) { return model_detail::tensor_offset(root, name, "Llama layout"); };
  LlamaRootOffsets o;
  o.embeddings = at("embed_tokens.weight");
  o.norm = at("norm.weight");
  o.head = tied ? o.embeddings : at("lm_head.weight");
  return o;
}

LlamaBlockOffsets llama_block_offsets(const UnitLayout& block, const LlamaBlock& options) {
  const std::string p = block.name + ".";
  auto at = [&](const char* name) { return model_detail::tensor_offset(block, p + name, "Llama layout"); };
  LlamaBlockOffsets o;
  o.input_norm = at("input_layernorm.weight");
  o.o = at("self_attn.o_proj.weight");
  o.post_norm = at("post_attention_layernorm.weight");
  o.sandwich_norms = options.sandwich_norms;
  if (options.sandwich_norms) {
    o.attn_out_norm = o.post_norm;
    o.post_norm = at("pre_feedforward_layernorm.weight");
    o.mlp_out_norm = at("post_feedforward_layernorm.weight");
  }
  o.down = at("mlp.down_proj.weight");
  o.fused = options.fused_projections;
  if (o.fused) {
    // The projections' rows inside the fused tensors: o_proj is [hidden, q] and down_proj [hidden, F].
    auto numel = [&](const char* name) {
      for (const TensorSpec& t : block.tensors)
        if (t.name == p + name) return t.numel;
      throw Error(concat("Llama layout: no tensor ", p, name));
    };
    const size_t q = numel("self_attn.o_proj.weight"), qkv = numel("self_attn.qkv_proj.weight");
    o.q = at("self_attn.qkv_proj.weight");
    o.k = o.q + q;
    o.v = o.k + (qkv - q) / 2;
    o.gate = at("mlp.gate_up_proj.weight");
    o.up = o.gate + numel("mlp.down_proj.weight");
  } else {
    o.q = at("self_attn.q_proj.weight");
    o.k = at("self_attn.k_proj.weight");
    o.v = at("self_attn.v_proj.weight");
    o.gate = at("mlp.gate_proj.weight");
    o.up = at("mlp.up_proj.weight");
  }
  o.qkv_bias = options.qkv_bias;
  if (options.qkv_bias) {
    o.q_bias = at("self_attn.q_proj.bias");
    o.k_bias = at("self_attn.k_proj.bias");
    o.v_bias = at("self_attn.v_proj.bias");
  }
  o.qk_norm = options.qk_norm;
  if (options.qk_norm) {
    o.q_norm = at("self_attn.q_norm.weight");
    o.k_norm = at("self_attn.k_norm.weight");
  }
  return o;
}

size_t llama_backward_tail_begin(const UnitLayout& block, const LlamaBlockOffsets& o) {
  std::vector<size_t> mlp = {o.post_norm, o.gate, o.up, o.down};
  if (o.sandwich_norms) mlp.push_back(o.mlp_out_norm);
  const size_t tail = *std::min_element(mlp.begin(), mlp.end());
  for (const TensorSpec& t : block.tensors)
    if (t.offset >= tail && std::find(mlp.begin(), mlp.end(), t.offset) == mlp.end()) return 0;
  return tail;
}

float llama_embed_scale(const ModelConfig& cfg, const LlamaBlock& block) {
  return block.scaled_embeddings ? static_cast<float>(std::sqrt(static_cast<double>(cfg.hidden_size))) : 1.0f;
}

std::vector<LinearModule> llama_linear_modules(const ModelConfig& cfg) {
  const int64_t H = cfg.hidden_size, Q = static_cast<int64_t>(cfg.num_heads) * cfg.head_dim();
  const int64_t KV = static_cast<int64_t>(cfg.kv_heads()) * cfg.head_dim(), F = cfg.ffn_size();
  return {{"q_proj", "self_attn.q_proj", H, Q},   {"k_proj", "self_attn.k_proj", H, KV},
          {"v_proj", "self_attn.v_proj", H, KV},  {"o_proj", "self_attn.o_proj", Q, H},
          {"gate_proj", "mlp.gate_proj", H, F},   {"up_proj", "mlp.up_proj", H, F},
          {"down_proj", "mlp.down_proj", F, H}};
}

std::vector<LinearModule> llama_fused_linear_modules(const ModelConfig& cfg) {
  const int64_t H = cfg.hidden_size, Q = static_cast<int64_t>(cfg.num_heads) * cfg.head_dim();
  const int64_t KV = static_cast<int64_t>(cfg.kv_heads()) * cfg.head_dim(), F = cfg.ffn_size();
  return {{"qkv_proj", "self_attn.qkv_proj", H, Q + 2 * KV},
          {"o_proj", "self_attn.o_proj", Q, H},
          {"gate_up_proj", "mlp.gate_up_proj", H, 2 * F},
          {"down_proj", "mlp.down_proj", F, H}};
}

std::vector<LlamaLoraSlot> llama_lora_slots(const ModelConfig& cfg, const LlamaBlock& block) {
  if (!block.fused_projections) return {{0, 0}, {1, 0}, {2, 0}, {3, 0}, {4, 0}, {5, 0}, {6, 0}};
  const int Q = cfg.num_heads * cfg.head_dim(), KV = cfg.kv_heads() * cfg.head_dim();
  return {{0, 0}, {0, Q}, {0, Q + KV}, {1, 0}, {2, 0}, {2, cfg.ffn_size()}, {3, 0}};
}

std::string llama_hf_tensor_name(const std::string& name) {
  return name == "lm_head.weight" ? name : "model." + name;
}

std::vector<float> rope_inv_freq(const ModelConfig& cfg, bool long_factors) {
  const int D = cfg.rotary_dim();
  std::vector<float> inv_freq(D / 2);
  const double pi = 3.14159265358979323846;
  const RopeScaling& rs = cfg.rope_scaling;
  const std::vector<float>& ext = long_factors ? cfg.longrope.long_factor : cfg.longrope.short_factor;
  SHARDLM_CHECK(!cfg.longrope.enabled() || ext.size() == inv_freq.size(), "LongRoPE: ",
                long_factors ? "long_factor" : "short_factor", " has ", ext.size(), " entries, the rotary dimension ", D,
                " needs ", inv_freq.size());
  for (int i = 0; i < D / 2; ++i) {
    // transformers computes 1 / theta^(2i / D) in fp32 from an int64 arange; double then rounding
    // to float gives the same value here.
    double f = 1.0 / std::pow(static_cast<double>(cfg.rope_theta), (2.0 * i) / D);
    // LongRoPE: 1 / (ext_i * theta^(2i / D)), theta^(2i / D) rounded to fp32 first as transformers forms it.
    if (cfg.longrope.enabled())
      f = 1.0 / (static_cast<double>(ext[i]) *
                 static_cast<float>(std::pow(static_cast<double>(cfg.rope_theta), (2.0 * i) / D)));
    if (rs.factor > 0) {
      // Llama 3.1: wavelengths beyond original/low_freq_factor are slowed by `factor`, those below
      // original/high_freq_factor kept, and those between blended linearly in 1/wavelength.
      const double wavelen = 2 * pi / f;
      const double low_wavelen = rs.original_max_position_embeddings / rs.low_freq_factor;
      const double high_wavelen = rs.original_max_position_embeddings / rs.high_freq_factor;
      if (wavelen > low_wavelen) {
        f = f / rs.factor;
      } else if (wavelen >= high_wavelen) {
        const double smooth = (rs.original_max_position_embeddings / wavelen - rs.low_freq_factor) /
                              (rs.high_freq_factor - rs.low_freq_factor);
        f = (1 - smooth) * f / rs.factor + smooth * f;
      }
    }
    inv_freq[i] = static_cast<float>(f);
  }
  return inv_freq;
}

std::vector<float> rope_inv_freq(const ModelConfig& cfg, int table, bool long_factors) {
  if (table == 1) {
    SHARDLM_CHECK(cfg.rope_local_theta > 0, "rope_inv_freq: the model has no local rotary table (rope_local_theta)");
    ModelConfig local;
    local.head_size = cfg.head_dim();
    local.partial_rotary_factor = cfg.partial_rotary_factor;
    local.rope_theta = cfg.rope_local_theta;
    return rope_inv_freq(local);
  }
  std::vector<float> inv_freq = rope_inv_freq(cfg, long_factors);
  // transformers' linear scaling divides the fp32 frequencies by the factor.
  if (cfg.rope_linear_factor > 0)
    for (float& f : inv_freq) f = f / cfg.rope_linear_factor;
  return inv_freq;
}

float rope_attention_factor(const ModelConfig& cfg) {
  const LongRope& lr = cfg.longrope;
  if (!lr.enabled()) return 1.0f;
  if (lr.attention_factor > 0) return lr.attention_factor;
  const double factor = static_cast<double>(cfg.max_position_embeddings) / lr.original_max_position_embeddings;
  if (factor <= 1.0) return 1.0f;
  return static_cast<float>(std::sqrt(1.0 + std::log(factor) / std::log(static_cast<double>(lr.original_max_position_embeddings))));
}

}  // namespace shardlm
