// LoRA's modules_to_save against a family's modules: the Hugging Face module paths of the model,
// PEFT's rule for which of them a name selects, and the root modules shardlm trains whole.
#include <algorithm>
#include <set>

#include "shardlm/model.hpp"

namespace shardlm {
namespace {

// The module path of a layout tensor: its Hugging Face name less the parameter's name.
std::string module_of(const std::string& hf_name) {
  const size_t dot = hf_name.rfind('.');
  return dot == std::string::npos ? std::string() : hf_name.substr(0, dot);
}

}  // namespace

bool peft_saves(const std::string& path, const std::string& entry) {
  return !entry.empty() && path.size() >= entry.size() &&
         path.compare(path.size() - entry.size(), entry.size(), entry) == 0;
}

std::vector<std::string> hf_module_paths(const ModelConfig& cfg) {
  std::set<std::string> paths;
  auto add = [&](std::string module) {
    // The module and every parent, as named_modules lists them ("model.layers.0" for "model.layers.0.mlp").
    while (!module.empty()) {
      paths.insert(module);
      const size_t dot = module.rfind('.');
      module = dot == std::string::npos ? std::string() : module.substr(0, dot);
    }
  };
  for (const UnitLayout& unit : model_layout(cfg))
    for (const TensorSpec& t : unit.tensors) add(module_of(peft_base_name(cfg, t.name)));
  // A tied head is a module of its own in transformers (*ForCausalLM.lm_head) that shares the embedding's weight.
  if (cfg.tied_head()) add("lm_head");
  return {paths.begin(), paths.end()};
}

std::vector<SavableModule> lora_savable_modules(const ModelConfig& cfg) {
  // Names as the text model's paths give them, the same for a multimodal base (where "model.norm", a string's
  // end of "model.language_model.norm", still selects the one module).
  ModelConfig text = cfg;
  text.hf_multimodal = false;
  const std::vector<std::string> paths = hf_module_paths(text);
  const UnitLayout root = model_layout(cfg).front();
  std::vector<SavableModule> out;
  for (const TensorSpec& t : root.tensors) {
    SavableModule m;
    m.prefix = module_of(t.name);
    m.path = module_of(peft_base_name(cfg, t.name));
    if (std::any_of(out.begin(), out.end(), [&](const SavableModule& o) { return o.path == m.path; })) continue;
    // A tied head's matrix is the embedding: PEFT would train a copy of either apart from the other.
    if (cfg.tied_head() && t.shape == std::vector<int64_t>{cfg.vocab_size, cfg.hidden_size}) continue;
    // The shortest end of the path (whole components) that PEFT's rule matches to this module alone.
    const std::string text_path = module_of(hf_tensor_name(cfg, t.name));
    size_t dot = text_path.size();
    while (true) {
      dot = dot == 0 ? std::string::npos : text_path.rfind('.', dot - 1);
      m.name = dot == std::string::npos ? text_path : text_path.substr(dot + 1);
      const auto selected = std::count_if(paths.begin(), paths.end(), [&](const std::string& p) { return peft_saves(p, m.name); });
      if (selected == 1 || dot == std::string::npos) break;
    }
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace shardlm
