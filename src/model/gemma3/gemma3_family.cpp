// The Gemma 3 text family's record for the registry (transformers' Gemma3ForCausalLM, model_type gemma3_text;
// the text model of the multimodal Gemma3ForConditionalGeneration checkpoints too, model_type gemma3: its
// text_config and its language_model.model.* tensors, the vision tower's ignored). Llama's decoder layer with
// the LlamaBlock options Gemma needs: every RMSNorm (1 + weight), norms on the attention's and the MLP's outputs
// (sandwich norms), GeGLU with tanh GELU, embeddings scaled by sqrt(hidden_size), per-head q/k norms; and the
// ModelConfig fields of its attention: query_pre_attn_scalar, local (sliding-window, rope_local_theta) layers
// interleaved with global ones (every sliding_window_pattern-th layer, rope_theta with linear scaling).
// Soft-capping (Gemma 2) and bidirectional attention are refused.
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "../llama/llama_hf_config.hpp"
#include "../llama/llama_style_family.hpp"

namespace shardlm {
namespace {

constexpr LlamaBlock kGemma3Block{false, true, true, true, true, true};

// Gemma3TextConfig's defaults for keys a config.json may leave out: the multimodal checkpoints' text_config
// names only what differs from them (gemma-3-4b-it's: hidden_size, intermediate_size, num_hidden_layers,
// rope_scaling, sliding_window). The shared Llama-style keys first, then Gemma's own.
const HfConfigReader::Json& text_config_defaults() {
  static const HfConfigReader::Json defaults = {
      {"vocab_size", 262208},       {"hidden_size", 2304},         {"intermediate_size", 9216},
      {"num_hidden_layers", 26},    {"num_attention_heads", 8},    {"num_key_value_heads", 4},
      {"head_dim", 256},            {"rms_norm_eps", 1e-6},        {"max_position_embeddings", 131072},
      {"initializer_range", 0.02}};
  return defaults;
}
constexpr int kDefaultWindow = 4096;
constexpr int kDefaultPattern = 6;
constexpr float kDefaultRopeTheta = 1000000.0f;
constexpr float kDefaultLocalTheta = 10000.0f;
constexpr float kDefaultQueryScalar = 256.0f;

// The global and the local rotary tables' keys: rope_type default or linear (global only), rope_theta, factor.
struct RopeKeys {
  float theta = 0, linear_factor = 0;
};

RopeKeys read_rope(const HfConfigReader::Json& j, const std::string& source, float theta, bool global) {
  SHARDLM_CHECK(j.is_object(), source, " must be an object or null");
  const HfConfigReader r(j, source);
  RopeKeys k;
  k.theta = r.positive_or({"rope_theta"}, theta);
  const double partial = r.get_or<double>({"partial_rotary_factor"}, 1.0);
  SHARDLM_CHECK(partial == 1.0, source, ": partial_rotary_factor = ", partial, " is not supported (Gemma 3 rotates the "
                "whole head); a factor of 1 (or none) is");
  const std::string type = r.get_or<std::string>({"rope_type", "type"}, "default");
  if (type == "linear" && global) {
    k.linear_factor = r.get<float>({"factor"});
    SHARDLM_CHECK(k.linear_factor > 0, source, ": linear factor must be > 0");
  } else {
    SHARDLM_CHECK(type == "default", source, ": rope_type '", type, "' is not supported (",
                  global ? "default or linear" : "default", ")");
  }
  return k;
}

// layer_types (or sliding_window_pattern) as ModelConfig::sliding_window_pattern.
int read_pattern(const HfConfigReader& r, int num_layers) {
  const HfConfigReader::Json* types = r.find({"layer_types"});
  if (!types) {
    const int pattern = r.get_or<int>({"sliding_window_pattern", "_sliding_window_pattern"}, kDefaultPattern);
    SHARDLM_CHECK(pattern > 0, r.source(), ": sliding_window_pattern must be > 0 (got ", pattern, ")");
    return pattern;
  }
  SHARDLM_CHECK(types->is_array() && static_cast<int>(types->size()) == num_layers, r.source(),
                ": layer_types must be a list of num_hidden_layers (", num_layers, ") entries");
  std::vector<bool> global;
  for (const auto& t : *types) {
    SHARDLM_CHECK(t == "full_attention" || t == "sliding_attention", r.source(), ": layer_types entry ", t.dump(),
                  " is not supported (full_attention, sliding_attention)");
    global.push_back(t == "full_attention");
  }
  int pattern = 0;  // every layer local
  for (int i = 0; i < num_layers; ++i)
    if (global[i]) {
      pattern = i + 1;
      break;
    }
  for (int i = 0; i < num_layers; ++i) {
    const bool expected = pattern > 0 && (i + 1) % pattern == 0;
    SHARDLM_CHECK(global[i] == expected, r.source(), ": layer_types is not a repeating pattern of local layers then ",
                  "one global layer (layer ", i, " is ", global[i] ? "full_attention" : "sliding_attention",
                  "); only such interleaves are supported");
  }
  return pattern;
}

ModelConfig gemma3_text_from_hf(const HfConfigReader& r) {
  SHARDLM_CHECK(!r.get_or<bool>({"attention_bias"}, false), r.source(), ": attention_bias = true is not supported");
  SHARDLM_CHECK(r.find({"attn_logit_softcapping"}) == nullptr && r.find({"final_logit_softcapping"}) == nullptr,
                r.source(), ": attn_logit_softcapping / final_logit_softcapping must be null: soft-capping (a tanh on "
                "the attention scores and logits) is not implemented (docs/huggingface.md says why)");
  SHARDLM_CHECK(!r.get_or<bool>({"use_bidirectional_attention"}, false), r.source(),
                ": use_bidirectional_attention = true is not supported (causal attention only)");
  const std::string act = r.get_or<std::string>({"hidden_activation", "hidden_act"}, "gelu_pytorch_tanh");
  SHARDLM_CHECK(act == "gelu_pytorch_tanh", r.source(), ": hidden_activation '", act,
                "' is not supported (gelu_pytorch_tanh)");
  // Llama's keys from a copy without what Gemma reads itself (its activation and rope keys), with Gemma's
  // defaults where the file leaves a key out.
  HfConfigReader::Json copy = *r.root();
  for (const char* key : {"hidden_act", "hidden_activation", "rope_scaling", "rope_parameters", "rope_theta"})
    copy.erase(key);
  for (const auto& [key, value] : text_config_defaults().items())
    if (r.find({key.c_str()}) == nullptr) copy[key] = value;
  if (!r.has("tie_word_embeddings")) copy["tie_word_embeddings"] = true;
  ModelConfig c = read_llama_style_config(HfConfigReader(copy, r.source()));

  RopeKeys global{r.positive_or({"rope_theta"}, kDefaultRopeTheta), 0};
  RopeKeys local{r.positive_or({"rope_local_base_freq"}, kDefaultLocalTheta), 0};
  const HfConfigReader::Json* params = r.find({"rope_parameters"});
  if (params && params->is_object() && (params->contains("full_attention") || params->contains("sliding_attention"))) {
    if (params->contains("full_attention") && !(*params)["full_attention"].is_null())
      global = read_rope((*params)["full_attention"], r.source() + " rope_parameters.full_attention", global.theta, true);
    if (params->contains("sliding_attention") && !(*params)["sliding_attention"].is_null())
      local = read_rope((*params)["sliding_attention"], r.source() + " rope_parameters.sliding_attention", local.theta,
                        false);
  } else if (params) {
    global = read_rope(*params, r.source() + " rope_parameters", global.theta, true);
  } else if (const HfConfigReader::Json* scaling = r.find({"rope_scaling"})) {
    global = read_rope(*scaling, r.source() + " rope_scaling", global.theta, true);
  }
  c.rope_theta = global.theta;
  c.rope_linear_factor = global.linear_factor;
  c.rope_local_theta = local.theta;
  c.query_pre_attn_scalar = r.positive_or({"query_pre_attn_scalar"}, kDefaultQueryScalar);
  c.sliding_window_pattern = read_pattern(r, c.num_layers);
  c.sliding_window = read_sliding_window(r, kDefaultWindow);
  SHARDLM_CHECK(c.sliding_window > 0 || c.sliding_window_pattern == 1, r.source(),
                ": sliding_window must be set for the sliding_attention layers");
  return c;
}

ModelConfig gemma3_from_hf(const HfConfigReader& r) {
  const std::string type = r.get<std::string>({"model_type"});
  SHARDLM_CHECK(type != "gemma2", r.source(), ": model_type 'gemma2' (Gemma 2) is not supported: it soft-caps the "
                "attention scores and the logits with tanh, which neither attention path implements "
                "(docs/huggingface.md); Gemma 3 (gemma3_text, gemma3) is");
  if (type == "gemma3") {  // the multimodal checkpoint: its text model's config
    const HfConfigReader::Json* text = r.find({"text_config"});
    SHARDLM_CHECK(text && text->is_object(), r.source(), ": model_type gemma3 needs a text_config object");
    ModelConfig c = gemma3_text_from_hf(HfConfigReader(*text, r.source() + " text_config"));
    c.hf_multimodal = true;
    return c;
  }
  return gemma3_text_from_hf(r);
}

void gemma3_to_hf(const ModelConfig& cfg, OrderedJson& c) {
  write_llama_style_config(cfg, c);
  c.erase("hidden_act");
  c.erase("rope_theta");
  c.erase("rope_scaling");
  c["hidden_activation"] = "gelu_pytorch_tanh";
  // An integer where it is one: transformers 5's Gemma3TextConfig declares it int and refuses 40.0. A deck's 0
  // means head_dim, which config.json must say outright: it takes no 0.
  const float scalar = static_cast<float>(cfg.attention_scalar());
  if (scalar == std::floor(scalar) && std::fabs(scalar) < 1e9f)
    c["query_pre_attn_scalar"] = static_cast<long long>(scalar);
  else
    c["query_pre_attn_scalar"] = shortest_decimal(scalar);
  write_sliding_window(cfg, c);
  std::vector<std::string> types;
  for (int i = 0; i < cfg.num_layers; ++i)
    types.push_back(cfg.layer_is_local(i) ? "sliding_attention" : "full_attention");
  c["layer_types"] = types;
  // transformers 5's form, as transformers 5.17 saves Gemma 3 (rope_parameters per layer type, no rope_theta or
  // rope_scaling beside it: transformers 5 would take a rope_scaling for the whole rope_parameters).
  OrderedJson full = {{"rope_type", cfg.rope_linear_factor > 0 ? "linear" : "default"},
                      {"rope_theta", shortest_decimal(cfg.rope_theta)}};
  if (cfg.rope_linear_factor > 0) full["factor"] = shortest_decimal(cfg.rope_linear_factor);
  const float local = cfg.rope_local_theta > 0 ? cfg.rope_local_theta : cfg.rope_theta;
  c["rope_parameters"] = {{"full_attention", full},
                          {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", shortest_decimal(local)}}}};
  c["attn_logit_softcapping"] = nullptr;
  c["final_logit_softcapping"] = nullptr;
  c["use_bidirectional_attention"] = false;
  c["attention_bias"] = false;
  write_dropout_and_init_range(cfg, c);
}

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// A text model's tensor in transformers 5's Gemma3ForConditionalGeneration: model.language_model.* (its
// Gemma3Model's language_model is the text model's Gemma3TextModel), lm_head.weight as it is.
std::string gemma3_multimodal_name(const std::string& hf_name) {
  return starts_with(hf_name, "model.") ? "model.language_model." + hf_name.substr(6) : hf_name;
}

// The multimodal checkpoints' names of the text model's tensors: language_model.model.* (transformers 4.5x, and
// 5.x's save_pretrained) or model.language_model.* (5.x's modules), language_model.lm_head.weight.
std::vector<std::string> gemma3_tensor_aliases(const std::string& hf_name) {
  if (starts_with(hf_name, "model.")) return {"language_model." + hf_name, gemma3_multimodal_name(hf_name)};
  return {"language_model." + hf_name};
}

// The multimodal checkpoints' vision tower and projector, and their tied head's copy.
bool gemma3_ignored_tensor(const ModelConfig& cfg, const std::string& hf_name) {
  for (const char* p : {"vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector."})
    if (starts_with(hf_name, p)) return true;
  return cfg.tie_word_embeddings && hf_name == "language_model.lm_head.weight";
}

}  // namespace

ModelFamily gemma3_family() {
  ModelFamily f = llama_style_family<kGemma3Block>("gemma3", "Gemma3ForCausalLM", "Gemma3DecoderLayer",
                                                   gemma3_from_hf, gemma3_to_hf, true);
  f.hf_model_types = {"gemma3_text", "gemma3"};
  f.hf_refused_model_types = {"gemma2"};  // gemma3_from_hf says why (tanh soft-capping)
  f.hf_tensor_aliases = gemma3_tensor_aliases;
  f.hf_multimodal_name = gemma3_multimodal_name;
  f.hf_ignored_tensor = gemma3_ignored_tensor;
  f.local_global_layers = true;
  return f;
}

}  // namespace shardlm
