// Hugging Face config.json <-> ModelConfig: the family is picked by model_type (reading) or
// model.arch (writing) and maps its own keys. Read when a model directory is loaded, written into
// checkpoints (attribute model_config) and exports.
#include <charconv>
#include <cstdlib>

#include "../core/input_file.hpp"
#include "hf_config_reader.hpp"
#include "shardlm/model.hpp"

namespace shardlm {

double shortest_decimal(float f) {
  char text[64];
  const auto result = std::to_chars(text, text + sizeof(text) - 1, f);
  *result.ptr = '\0';
  return std::strtod(text, nullptr);
}

ModelConfig model_config_from_hf(const std::string& json_text, const std::string& source) {
  nlohmann::json j;
  try {
    j = parse_json_bounded(json_text, source + ": config.json");
  } catch (const nlohmann::json::exception& e) {
    throw Error(concat(source, ": config.json is not valid JSON: ", e.what()));
  }
  SHARDLM_CHECK(j.is_object(), source, ": config.json must hold a JSON object");
  const HfConfigReader r(j, source);
  const ModelFamily& family = model_family_of_hf_type(r.get<std::string>({"model_type"}), source);
  ModelConfig c = family.config_from_hf(r);
  c.arch = family.name;
  // The layout checks the remaining consistency (divisibility, positive sizes) with a clear message.
  model_layout(c);
  return c;
}

std::string hf_config_json(const ModelConfig& cfg) {
  const ModelFamily& family = model_family(cfg.arch);
  OrderedJson c;
  c["architectures"] = {family.hf_architecture};
  c["model_type"] = family.hf_model_types.front();
  family.config_to_hf(cfg, c);
  c["use_cache"] = true;
  c["torch_dtype"] = "float32";
  return c.dump(2) + "\n";
}

}  // namespace shardlm
