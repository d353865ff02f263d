// The registry of model families: one line per family below, the lookups by model.arch and by
// config.json model_type that every family-dependent call goes through, and the families' names and
// Hugging Face block classes listed for choices and messages.
#include <algorithm>

#include "shardlm/model.hpp"

namespace shardlm {

// Each defined in its folder, src/model/<family>/<family>_family.cpp.
ModelFamily bloom_family();
ModelFamily llama_family();
ModelFamily qwen2_family();
ModelFamily qwen3_family();
ModelFamily mistral_family();
ModelFamily gemma3_family();
ModelFamily phi3_family();

const std::vector<const ModelFamily*>& model_families() {
  static const ModelFamily records[] = {
      bloom_family(),
      llama_family(),
      qwen2_family(),
      qwen3_family(),
      mistral_family(),
      gemma3_family(),
      phi3_family(),
  };
  static const std::vector<const ModelFamily*> families = [] {
    std::vector<const ModelFamily*> all;
    for (const ModelFamily& f : records) all.push_back(&f);
    return all;
  }();
  return families;
}

std::vector<std::string> model_family_names() {
  std::vector<std::string> names;
  for (const ModelFamily* f : model_families()) names.push_back(f->name);
  return names;
}

std::vector<std::string> hf_block_classes() {
  std::vector<std::string> classes;
  for (const ModelFamily* f : model_families()) classes.push_back(f->hf_block_class);
  return classes;
}

namespace {

std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

}  // namespace

std::string hf_block_class_names() { return joined(hf_block_classes()); }

const ModelFamily& model_family(const std::string& arch) {
  for (const ModelFamily* f : model_families())
    if (f->name == arch) return *f;
  throw Error(concat("model.arch = '", arch, "' is not supported (", joined(model_family_names()), ")"));
}

const ModelFamily& model_family_of_hf_type(const std::string& type, const std::string& source) {
  const auto has = [&](const std::vector<std::string>& types) {
    return std::find(types.begin(), types.end(), type) != types.end();
  };
  std::vector<std::string> supported;
  for (const ModelFamily* f : model_families()) {
    if (has(f->hf_model_types) || has(f->hf_refused_model_types)) return *f;
    supported.insert(supported.end(), f->hf_model_types.begin(), f->hf_model_types.end());
  }
  throw Error(concat(source, ": model_type '", type, "' is not supported (", joined(supported), ")"));
}

}  // namespace shardlm
