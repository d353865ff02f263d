// LoRA's layouts over any family's: the adapters' A and B of the targeted linear modules of each block
// (ModelFamily::linear_modules) and the root tensors of modules_to_save (lora_layout), the frozen base
// without those (lora_frozen_layout), PEFT's tensor names and the scale.
#include <algorithm>
#include <cmath>

#include "model_internal.hpp"
#include "shardlm/model.hpp"

namespace shardlm {

double LoraConfig::scale() const {
  return use_rslora ? alpha / std::sqrt(static_cast<double>(r)) : alpha / static_cast<double>(r);
}

bool LoraConfig::targets(const std::string& module) const {
  return std::find(target_modules.begin(), target_modules.end(), module) != target_modules.end();
}

namespace {

// Whether the root tensor `name` belongs to a module of cfg.lora.modules_to_save (Error for a name that
// is not a savable module: the config resolves the deck's and the adapter's names before).
bool saved_tensor(const ModelConfig& cfg, const std::vector<SavableModule>& savable, const std::string& name) {
  for (const std::string& m : cfg.lora.modules_to_save) {
    const auto it = std::find_if(savable.begin(), savable.end(), [&](const SavableModule& s) { return s.name == m; });
    SHARDLM_CHECK(it != savable.end(), "lora.modules_to_save: '", m, "' is not a module of ", cfg.arch,
                  " that can be trained whole");
    if (name.rfind(it->prefix + ".", 0) == 0) return true;
  }
  return false;
}

}  // namespace

std::vector<UnitLayout> lora_layout(const ModelConfig& cfg) {
  const std::vector<UnitLayout> base = model_layout(cfg);  // validates the shape
  std::vector<UnitLayout> units(base.size());
  for (size_t u = 0; u < base.size(); ++u) units[u].name = base[u].name;
  if (!cfg.lora.enabled()) return units;
  // The saved modules' tensors as the base lays them out, drawing the same initial values.
  const std::vector<SavableModule> savable = lora_savable_modules(cfg);
  for (const TensorSpec& t : base.front().tensors)
    if (saved_tensor(cfg, savable, t.name)) {
      TensorSpec moved = t;
      moved.offset = units[0].numel;
      units[0].numel += moved.numel;
      units[0].tensors.push_back(std::move(moved));
    }
  const std::vector<LinearModule> modules = linear_modules(cfg);
  for (const std::string& t : cfg.lora.target_modules)
    SHARDLM_CHECK(std::any_of(modules.begin(), modules.end(), [&](const LinearModule& m) { return m.name == t; }),
                  "lora.target_modules: ", cfg.arch, " has no linear module '", t, "'");
  const int64_t r = cfg.lora.r;
  for (size_t u = 1; u < base.size(); ++u) {
    for (const LinearModule& m : modules) {
      if (!cfg.lora.targets(m.name)) continue;
      const std::string p = base[u].name + "." + m.path;
      // PEFT: A Kaiming-uniform with a = sqrt(5), which is uniform in +-1/sqrt(in); or normal, std 1/r.
      if (cfg.lora.init == LoraInit::Kaiming)
        model_detail::add_tensor(units[u], p + ".lora_A.weight", {r, m.in}, InitKind::Uniform,
                                 static_cast<float>(1.0 / std::sqrt(static_cast<double>(m.in))));
      else
        model_detail::add_tensor(units[u], p + ".lora_A.weight", {r, m.in}, InitKind::Normal,
                                 static_cast<float>(1.0 / static_cast<double>(r)));
      model_detail::add_tensor(units[u], p + ".lora_B.weight", {m.out, r}, InitKind::Zeros, 0.0f);
    }
  }
  return units;
}

std::vector<UnitLayout> lora_frozen_layout(const ModelConfig& cfg) {
  std::vector<UnitLayout> units = model_layout(cfg);
  if (!cfg.lora.enabled() || cfg.lora.modules_to_save.empty()) return units;
  const std::vector<SavableModule> savable = lora_savable_modules(cfg);
  UnitLayout root;
  root.name = units[0].name;
  for (TensorSpec t : units[0].tensors)
    if (!saved_tensor(cfg, savable, t.name)) {
      t.offset = root.numel;  // init_offset stays: the same initial values
      root.numel += t.numel;
      root.tensors.push_back(std::move(t));
    }
  units[0] = std::move(root);
  return units;
}

std::string peft_base_name(const ModelConfig& cfg, const std::string& name) {
  const std::string hf = hf_tensor_name(cfg, name);
  if (!cfg.hf_multimodal) return hf;
  const ModelFamily& family = model_family(cfg.arch);
  SHARDLM_CHECK(family.hf_multimodal_name, cfg.arch, " has no multimodal model to name ", hf, " in");
  return family.hf_multimodal_name(hf);
}

std::string peft_tensor_name(const ModelConfig& cfg, const std::string& name) {
  return "base_model.model." + peft_base_name(cfg, name);
}

}  // namespace shardlm
