// The BLOOM config in Hugging Face's names, shared by the checkpoint's model_config attribute and
// the exported config.json.
#pragma once

#include <charconv>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "shardlm/model.hpp"

namespace shardlm {

// The shortest decimal that reads back as the same float, so JSON shows 1e-05, not 9.99999974737875e-06.
inline double shortest_decimal(float f) {
  char text[64];
  const auto result = std::to_chars(text, text + sizeof(text) - 1, f);
  *result.ptr = '\0';
  return std::strtod(text, nullptr);
}

// model_type, sizes, layer-norm epsilon and init range, in config.json's order.
inline nlohmann::ordered_json bloom_config_fields(const BloomConfig& cfg) {
  nlohmann::ordered_json j;
  j["model_type"] = "bloom";
  j["vocab_size"] = cfg.vocab_size;
  j["hidden_size"] = cfg.hidden_size;
  j["n_layer"] = cfg.num_layers;
  j["n_head"] = cfg.num_heads;
  j["layer_norm_epsilon"] = shortest_decimal(cfg.layer_norm_eps);
  j["initializer_range"] = shortest_decimal(cfg.init_std);
  return j;
}

}  // namespace shardlm
