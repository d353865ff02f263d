// The config.json keys shared by the Llama-style families (llama_hf_config.hpp). transformers 4
// writes rope_theta and rope_scaling; transformers 5 writes both in rope_parameters.
#include "llama_hf_config.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace shardlm {

// Qwen2Config's and Qwen3Config's default max_window_layers, for a config.json without it.
constexpr int kTransformersMaxWindowLayers = 28;

namespace {

// The rotary keys' object and its name for messages: transformers 5's rope_parameters, else 4.x's rope_scaling;
// none when both are absent or null.
struct RopeSection {
  const HfConfigReader::Json* json = nullptr;
  std::string key;
};

RopeSection rope_section(const HfConfigReader& r) {
  RopeSection rope{r.find({"rope_parameters"}), "rope_parameters"};
  if (!rope.json) rope = {r.find({"rope_scaling"}), "rope_scaling"};
  SHARDLM_CHECK(!rope.json || rope.json->is_object(), r.source(), ": ", rope.key, " must be an object or null");
  return rope;
}

// Phi3Config rewrites the old names su and yarn to longrope.
bool is_longrope(const std::string& type) { return type == "longrope" || type == "su" || type == "yarn"; }

// partial_rotary_factor inside the rotary keys' object (transformers 5, which reads rope_scaling as
// rope_parameters), else at the top (4.x); 1 when absent. *key names the one read.
double read_partial_rotary_factor(const HfConfigReader& r, const RopeSection& rope, std::string* key) {
  *key = "partial_rotary_factor";
  double partial = r.get_or<double>({"partial_rotary_factor"}, 1.0);
  if (rope.json && rope.json->contains("partial_rotary_factor") && !(*rope.json)["partial_rotary_factor"].is_null()) {
    *key = rope.key + ".partial_rotary_factor";
    partial = HfConfigReader(*rope.json, r.source() + " " + rope.key).get<double>({"partial_rotary_factor"});
  }
  SHARDLM_CHECK(partial > 0 && partial <= 1, r.source(), ": config.json '", *key, "' = ", partial,
                ": must be in (0, 1]");
  return partial;
}

// The families whose config.json may rotate part of each head (ModelFamily::rotary_options), for messages.
std::string rotary_option_families() {
  std::string names;
  for (const ModelFamily* f : model_families())
    if (f->rotary_options) names += (names.empty() ? "" : ", ") + f->name;
  return names;
}

}  // namespace

ModelConfig read_llama_style_config(const HfConfigReader& r, const LlamaStyleKeys& keys) {
  ModelConfig c;
  c.vocab_size = r.get<int>({"vocab_size"});
  c.hidden_size = r.get<int>({"hidden_size"});
  c.num_layers = r.get<int>({"num_hidden_layers"});
  c.num_heads = r.get<int>({"num_attention_heads"});
  c.num_kv_heads = r.get_or<int>({"num_key_value_heads"}, c.num_heads);
  c.intermediate_size = r.get<int>({"intermediate_size"});
  c.rms_norm_eps = r.positive_or({"rms_norm_eps"}, keys.rms_norm_eps);
  c.rope_theta = r.positive_or({"rope_theta"}, 10000.0f);
  c.tie_word_embeddings = r.get_or<bool>({"tie_word_embeddings"}, false);
  c.max_position_embeddings = r.get_or<int>({"max_position_embeddings"}, 2048);
  c.init_std = r.get_or<float>({"initializer_range"}, 0.02f);
  const std::string act = r.get_or<std::string>({"hidden_act"}, "silu");
  SHARDLM_CHECK(act == "silu", r.source(), ": hidden_act '", act, "' is not supported (silu)");
  // head_dim may differ from hidden_size / heads (Qwen3: 128 at hidden 1024 and 16 heads); null or absent
  // is hidden_size / heads, kept as 0 so that a config without it round-trips unchanged.
  if (c.num_heads > 0 && c.hidden_size % c.num_heads == 0) {
    const int head_dim = r.get_or<int>({"head_dim"}, c.hidden_size / c.num_heads);
    SHARDLM_CHECK(head_dim > 0, r.source(), ": head_dim must be positive (got ", head_dim, ")");
    if (head_dim != c.hidden_size / c.num_heads) c.head_size = head_dim;
  } else {
    c.head_size = r.get<int>({"head_dim"});
    SHARDLM_CHECK(c.head_size > 0, r.source(), ": head_dim must be positive (got ", c.head_size, ")");
  }
  const RopeSection rope = rope_section(r);
  std::string partial_key;
  const double partial = read_partial_rotary_factor(r, rope, &partial_key);
  // Read and ignored, it would rotate the whole head where transformers rotates a part.
  SHARDLM_CHECK(keys.rotary_options || partial == 1.0, r.source(), ": config.json '", partial_key, "' = ", partial,
                ": partial rotary is not supported for model_type '", r.get_or<std::string>({"model_type"}, "?"),
                "' (only for ", rotary_option_families(), "); a factor of 1 (or none) is");
  if (rope.json) {
    const HfConfigReader s(*rope.json, r.source() + " " + rope.key);
    if (rope.key == "rope_parameters") c.rope_theta = s.positive_or({"rope_theta"}, c.rope_theta);
    const std::string type = s.get_or<std::string>({"rope_type", "type"}, "default");
    if (type == "llama3") {
      c.rope_scaling.factor = s.get<float>({"factor"});
      c.rope_scaling.low_freq_factor = s.get<float>({"low_freq_factor"});
      c.rope_scaling.high_freq_factor = s.get<float>({"high_freq_factor"});
      c.rope_scaling.original_max_position_embeddings = s.get<int>({"original_max_position_embeddings"});
      SHARDLM_CHECK(c.rope_scaling.factor > 0 && c.rope_scaling.high_freq_factor > c.rope_scaling.low_freq_factor,
                    r.source(), ": ", rope.key, " needs factor > 0 and high_freq_factor > low_freq_factor");
    } else if (!(keys.rotary_options && is_longrope(type))) {
      SHARDLM_CHECK(type == "default", r.source(), ": ", rope.key, " type '", type, "' is not supported (",
                    keys.rotary_options ? "llama3, longrope (su, yarn)" : "llama3", ", or none)");
    }
  }
  return c;
}

void write_llama_style_config(const ModelConfig& cfg, OrderedJson& c) {
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
}

void read_rope_options(const HfConfigReader& r, ModelConfig& c) {
  const RopeSection rope = rope_section(r);
  std::string partial_key;
  c.partial_rotary_factor = read_partial_rotary_factor(r, rope, &partial_key);
  if (!rope.json) return;
  const std::string where = " " + rope.key;
  const HfConfigReader s(*rope.json, r.source() + where);
  const std::string type = s.get_or<std::string>({"rope_type", "type"}, "default");
  if (!is_longrope(type)) return;  // read_llama_style_config took the others
  auto factors = [&](const char* key) {
    const HfConfigReader::Json* list = s.find({key});
    SHARDLM_CHECK(list && list->is_array() && !list->empty(), r.source(), ":", where, " '", key,
                  "' must be a list of numbers (LongRoPE)");
    std::vector<float> out;
    for (const HfConfigReader::Json& v : *list) {
      const float f = s.as<float>(v, key);
      SHARDLM_CHECK(std::isfinite(f) && f > 0, r.source(), ":", where, " '", key, "' holds ", f, ": must be > 0");
      out.push_back(f);
    }
    return out;
  };
  c.longrope.short_factor = factors("short_factor");
  c.longrope.long_factor = factors("long_factor");
  // transformers reads original_max_position_embeddings from the top of config.json (Phi-3), or from
  // rope_parameters (transformers 5 puts it in both).
  c.longrope.original_max_position_embeddings =
      r.get_or<int>({"original_max_position_embeddings"}, s.get_or<int>({"original_max_position_embeddings"}, 0));
  SHARDLM_CHECK(c.longrope.original_max_position_embeddings > 0, r.source(),
                ": LongRoPE needs original_max_position_embeddings > 0 (at the top of config.json or in", where, ")");
  const float attention = s.get_or<float>({"attention_factor"}, 0.0f);
  SHARDLM_CHECK(std::isfinite(attention) && attention >= 0, r.source(), ":", where, " 'attention_factor' = ",
                attention, ": must be > 0 (or absent)");
  c.longrope.attention_factor = attention;
  const size_t half = static_cast<size_t>(c.rotary_dim() / 2);
  SHARDLM_CHECK(c.longrope.short_factor.size() == half && c.longrope.long_factor.size() == half, r.source(), ":",
                where, " 'short_factor' and 'long_factor' need ", half, " entries each (rotary dimension ",
                c.rotary_dim(), " / 2), have ", c.longrope.short_factor.size(), " and ", c.longrope.long_factor.size());
}

void write_rope_options(const ModelConfig& cfg, OrderedJson& c) {
  c.erase("rope_theta");
  c.erase("rope_scaling");
  OrderedJson p;
  const LongRope& lr = cfg.longrope;
  p["rope_type"] = lr.enabled() ? "longrope" : "default";
  p["rope_theta"] = shortest_decimal(cfg.rope_theta);
  p["partial_rotary_factor"] = cfg.partial_rotary_factor;
  if (lr.enabled()) {
    std::vector<double> short_factor, long_factor;
    for (float f : lr.short_factor) short_factor.push_back(shortest_decimal(f));
    for (float f : lr.long_factor) long_factor.push_back(shortest_decimal(f));
    p["short_factor"] = short_factor;
    p["long_factor"] = long_factor;
    p["original_max_position_embeddings"] = lr.original_max_position_embeddings;
    if (lr.attention_factor > 0) p["attention_factor"] = shortest_decimal(lr.attention_factor);
    c["original_max_position_embeddings"] = lr.original_max_position_embeddings;
  }
  c["rope_parameters"] = std::move(p);
}

int read_layer_sliding_window(const HfConfigReader& r, int num_layers) {
  const bool use = r.get_or<bool>({"use_sliding_window"}, false);
  std::vector<bool> windowed(static_cast<size_t>(std::max(num_layers, 0)), false);
  if (const HfConfigReader::Json* types = r.find({"layer_types"})) {
    SHARDLM_CHECK(types->is_array() && types->size() == windowed.size(), r.source(),
                  ": layer_types must be a list of num_hidden_layers (", num_layers, ") entries");
    for (size_t i = 0; i < windowed.size(); ++i) {
      const HfConfigReader::Json& t = (*types)[i];
      SHARDLM_CHECK(t == "full_attention" || t == "sliding_attention", r.source(), ": layer_types entry ", t.dump(),
                    " is not supported (full_attention, sliding_attention)");
      windowed[i] = t == "sliding_attention";
    }
  } else {
    const int from = r.get_or<int>({"max_window_layers"}, kTransformersMaxWindowLayers);
    for (size_t i = 0; i < windowed.size(); ++i) windowed[i] = use && static_cast<int>(i) >= from;
  }
  const auto first = std::find(windowed.begin(), windowed.end(), true);
  if (first == windowed.end()) return 0;
  SHARDLM_CHECK(use, r.source(), ": layer_types has sliding_attention layers but use_sliding_window is false ",
                "(transformers then gives them no window); set both or neither");
  const auto count = std::count(windowed.begin(), windowed.end(), true);
  SHARDLM_CHECK(count == num_layers, r.source(), ": ", count, " of ", num_layers, " layers use a sliding window (from ",
                "layer ", first - windowed.begin(), ", max_window_layers / layer_types); a window on some layers only "
                "is not supported, only on every layer or none");
  const int window = read_sliding_window(r, 0);
  SHARDLM_CHECK(window > 0, r.source(), ": use_sliding_window = true needs a sliding_window");
  return window;
}

void write_layer_sliding_window(const ModelConfig& cfg, OrderedJson& c) {
  const bool windowed = cfg.sliding_window > 0;
  c["use_sliding_window"] = windowed;
  write_sliding_window(cfg, c);
  c["max_window_layers"] = windowed ? 0 : cfg.num_layers;
  c["layer_types"] = std::vector<std::string>(static_cast<size_t>(cfg.num_layers),
                                              windowed ? "sliding_attention" : "full_attention");
}

ModelConfig read_layer_windowed_llama_style_config(const HfConfigReader& r) {
  ModelConfig c = read_llama_style_config(r);
  c.sliding_window = read_layer_sliding_window(r, c.num_layers);
  return c;
}

int read_sliding_window(const HfConfigReader& r, int absent) {
  if (!r.has("sliding_window")) return absent;
  const int window = r.get_or<int>({"sliding_window"}, 0);
  SHARDLM_CHECK(window > 0 || r.find({"sliding_window"}) == nullptr, r.source(), ": config.json 'sliding_window' = ",
                window, ": must be > 0 (or null for no window)");
  return window;
}

void write_sliding_window(const ModelConfig& cfg, OrderedJson& c) {
  if (cfg.sliding_window > 0)
    c["sliding_window"] = cfg.sliding_window;
  else
    c["sliding_window"] = nullptr;
}

void write_dropout_and_init_range(const ModelConfig& cfg, OrderedJson& c) {
  c["attention_dropout"] = 0.0;
  c["initializer_range"] = shortest_decimal(cfg.init_std);
}

}  // namespace shardlm
