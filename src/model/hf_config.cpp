// Hugging Face config.json <-> ModelConfig, for the BLOOM and Llama families: read when a model
// directory is loaded, written into checkpoints (attribute model_config) and exports.
#include <charconv>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "shardlm/model.hpp"

namespace shardlm {
namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

// The shortest decimal that reads back as the same float, so JSON shows 1e-05, not 9.99999974737875e-06.
double shortest_decimal(float f) {
  char text[64];
  const auto result = std::to_chars(text, text + sizeof(text) - 1, f);
  *result.ptr = '\0';
  return std::strtod(text, nullptr);
}

// Reads config[key] (or the first of several spellings) as T; Error naming the key and the file.
class ConfigReader {
 public:
  ConfigReader(const Json& j, std::string source) : j_(j), source_(std::move(source)) {}

  const Json* find(std::initializer_list<const char*> keys) const {
    for (const char* k : keys) {
      auto it = j_.find(k);
      if (it != j_.end() && !it->is_null()) return &*it;
    }
    return nullptr;
  }
  template <typename T>
  T get(std::initializer_list<const char*> keys) const {
    const Json* v = find(keys);
    SHARDLM_CHECK(v, source_, ": config.json has no '", *keys.begin(), "'");
    return as<T>(*v, *keys.begin());
  }
  template <typename T>
  T get_or(std::initializer_list<const char*> keys, T fallback) const {
    const Json* v = find(keys);
    return v ? as<T>(*v, *keys.begin()) : fallback;
  }
  template <typename T>
  T as(const Json& v, const char* key) const {
    try {
      if constexpr (std::is_same_v<T, int>) {
        SHARDLM_CHECK(v.is_number_integer(), source_, ": config.json '", key, "' must be an integer, got ", v.dump());
      } else if constexpr (std::is_same_v<T, bool>) {
        SHARDLM_CHECK(v.is_boolean(), source_, ": config.json '", key, "' must be true or false, got ", v.dump());
      } else if constexpr (std::is_same_v<T, std::string>) {
        SHARDLM_CHECK(v.is_string(), source_, ": config.json '", key, "' must be a string, got ", v.dump());
      } else {
        SHARDLM_CHECK(v.is_number(), source_, ": config.json '", key, "' must be a number, got ", v.dump());
      }
      return v.get<T>();
    } catch (const nlohmann::json::exception& e) {
      throw Error(concat(source_, ": config.json '", key, "': ", e.what()));
    }
  }
  const std::string& source() const { return source_; }

 private:
  const Json& j_;
  std::string source_;
};

ModelConfig bloom_from(const ConfigReader& r) {
  ModelConfig c;
  c.arch = "bloom";
  c.vocab_size = r.get<int>({"vocab_size"});
  c.hidden_size = r.get<int>({"hidden_size", "n_embed"});
  c.num_layers = r.get<int>({"n_layer", "num_hidden_layers"});
  c.num_heads = r.get<int>({"n_head", "num_attention_heads"});
  c.layer_norm_eps = r.get_or<float>({"layer_norm_epsilon"}, 1e-5f);
  c.init_std = r.get_or<float>({"initializer_range"}, 0.02f);
  SHARDLM_CHECK(!r.get_or<bool>({"apply_residual_connection_post_layernorm"}, false), r.source(),
                ": apply_residual_connection_post_layernorm = true is not supported");
  return c;
}

ModelConfig llama_from(const ConfigReader& r) {
  ModelConfig c;
  c.arch = "llama";
  c.vocab_size = r.get<int>({"vocab_size"});
  c.hidden_size = r.get<int>({"hidden_size"});
  c.num_layers = r.get<int>({"num_hidden_layers"});
  c.num_heads = r.get<int>({"num_attention_heads"});
  c.num_kv_heads = r.get_or<int>({"num_key_value_heads"}, c.num_heads);
  c.intermediate_size = r.get<int>({"intermediate_size"});
  c.rms_norm_eps = r.get_or<float>({"rms_norm_eps"}, 1e-6f);
  c.rope_theta = r.get_or<float>({"rope_theta"}, 10000.0f);
  c.tie_word_embeddings = r.get_or<bool>({"tie_word_embeddings"}, false);
  c.max_position_embeddings = r.get_or<int>({"max_position_embeddings"}, 2048);
  c.init_std = r.get_or<float>({"initializer_range"}, 0.02f);
  const std::string act = r.get_or<std::string>({"hidden_act"}, "silu");
  SHARDLM_CHECK(act == "silu", r.source(), ": hidden_act '", act, "' is not supported (silu)");
  SHARDLM_CHECK(!r.get_or<bool>({"attention_bias"}, false) && !r.get_or<bool>({"mlp_bias"}, false), r.source(),
                ": attention_bias / mlp_bias = true are not supported");
  SHARDLM_CHECK(r.get_or<int>({"pretraining_tp"}, 1) == 1, r.source(), ": pretraining_tp other than 1 is not supported");
  if (c.num_heads > 0) {
    const int head_dim = r.get_or<int>({"head_dim"}, c.hidden_size / c.num_heads);
    SHARDLM_CHECK(head_dim * c.num_heads == c.hidden_size, r.source(), ": head_dim ", head_dim, " x num_attention_heads ",
                  c.num_heads, " != hidden_size ", c.hidden_size, " is not supported");
  }
  // transformers 4 writes rope_theta and rope_scaling; transformers 5 writes both in rope_parameters.
  const Json* rs = r.find({"rope_parameters"});
  if (rs) {
    SHARDLM_CHECK(rs->is_object(), r.source(), ": rope_parameters must be an object");
    c.rope_theta = ConfigReader(*rs, r.source() + " rope_parameters").get_or<float>({"rope_theta"}, c.rope_theta);
  } else {
    rs = r.find({"rope_scaling"});
  }
  if (rs) {
    SHARDLM_CHECK(rs->is_object(), r.source(), ": rope_scaling must be an object or null");
    const ConfigReader s(*rs, r.source() + " rope_scaling");
    const std::string type = s.get_or<std::string>({"rope_type", "type"}, "default");
    if (type == "llama3") {
      c.rope_scaling.factor = s.get<float>({"factor"});
      c.rope_scaling.low_freq_factor = s.get<float>({"low_freq_factor"});
      c.rope_scaling.high_freq_factor = s.get<float>({"high_freq_factor"});
      c.rope_scaling.original_max_position_embeddings = s.get<int>({"original_max_position_embeddings"});
      SHARDLM_CHECK(c.rope_scaling.factor > 0 && c.rope_scaling.high_freq_factor > c.rope_scaling.low_freq_factor,
                    r.source(), ": rope_scaling needs factor > 0 and high_freq_factor > low_freq_factor");
    } else {
      SHARDLM_CHECK(type == "default", r.source(), ": rope_scaling type '", type,
                    "' is not supported (llama3, or none)");
    }
  }
  return c;
}

}  // namespace

ModelConfig model_config_from_hf(const std::string& json_text, const std::string& source) {
  Json j;
  try {
    j = Json::parse(json_text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(concat(source, ": config.json is not valid JSON: ", e.what()));
  }
  SHARDLM_CHECK(j.is_object(), source, ": config.json must hold a JSON object");
  const ConfigReader r(j, source);
  const std::string type = r.get<std::string>({"model_type"});
  ModelConfig c;
  if (type == "bloom") {
    c = bloom_from(r);
  } else if (type == "llama") {
    c = llama_from(r);
  } else {
    throw Error(concat(source, ": model_type '", type, "' is not supported (bloom or llama)"));
  }
  // The layout checks the remaining consistency (divisibility, positive sizes) with a clear message.
  model_layout(c);
  return c;
}

std::string hf_config_json(const ModelConfig& cfg) {
  OrderedJson c;
  if (cfg.is_llama()) {
    c["architectures"] = {"LlamaForCausalLM"};
    c["model_type"] = "llama";
    c["vocab_size"] = cfg.vocab_size;
    c["hidden_size"] = cfg.hidden_size;
    c["intermediate_size"] = cfg.ffn_size();
    c["num_hidden_layers"] = cfg.num_layers;
    c["num_attention_heads"] = cfg.num_heads;
    c["num_key_value_heads"] = cfg.kv_heads();
    c["head_dim"] = cfg.head_dim();
    c["hidden_act"] = "silu";
    c["rms_norm_eps"] = shortest_decimal(cfg.rms_norm_eps);
    c["rope_theta"] = shortest_decimal(cfg.rope_theta);
    if (cfg.rope_scaling.factor > 0) {
      c["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", shortest_decimal(cfg.rope_scaling.factor)},
                           {"low_freq_factor", shortest_decimal(cfg.rope_scaling.low_freq_factor)},
                           {"high_freq_factor", shortest_decimal(cfg.rope_scaling.high_freq_factor)},
                           {"original_max_position_embeddings", cfg.rope_scaling.original_max_position_embeddings}};
    } else {
      c["rope_scaling"] = nullptr;
    }
    c["max_position_embeddings"] = cfg.max_position_embeddings;
    c["tie_word_embeddings"] = cfg.tie_word_embeddings;
    c["attention_bias"] = false;
    c["mlp_bias"] = false;
    c["initializer_range"] = shortest_decimal(cfg.init_std);
  } else {
    c["architectures"] = {"BloomForCausalLM"};
    c["model_type"] = "bloom";
    c["vocab_size"] = cfg.vocab_size;
    c["hidden_size"] = cfg.hidden_size;
    c["n_layer"] = cfg.num_layers;
    c["n_head"] = cfg.num_heads;
    c["layer_norm_epsilon"] = shortest_decimal(cfg.layer_norm_eps);
    c["initializer_range"] = shortest_decimal(cfg.init_std);
    c["apply_residual_connection_post_layernorm"] = false;
    c["hidden_dropout"] = 0.0;
    c["attention_dropout"] = 0.0;
    c["tie_word_embeddings"] = true;
    c["pretraining_tp"] = 1;
    c["slow_but_exact"] = false;
  }
  c["use_cache"] = true;
  c["torch_dtype"] = "float32";
  return c.dump(2) + "\n";
}

}  // namespace shardlm
