// The registry of model families: one line per family below, and the lookups by model.arch and by
// config.json model_type that every family-dependent call goes through.
#include <algorithm>
#include <cmath>

#include "model_internal.hpp"
#include "shardlm/model.hpp"

namespace shardlm {

// Each defined in its folder, src/model/<family>/<family>_family.cpp.
ModelFamily bloom_family();
ModelFamily llama_family();
ModelFamily qwen2_family();
ModelFamily qwen3_family();
ModelFamily mistral_family();

const std::vector<const ModelFamily*>& model_families() {
  static const ModelFamily records[] = {
      bloom_family(),
      llama_family(),
      qwen2_family(),
      qwen3_family(),
      mistral_family(),
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

namespace {

std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

}  // namespace

const ModelFamily& model_family(const std::string& arch) {
  for (const ModelFamily* f : model_families())
    if (f->name == arch) return *f;
  throw Error(concat("model.arch = '", arch, "' is not supported (", joined(model_family_names()), ")"));
}

const ModelFamily& model_family_of_hf_type(const std::string& type, const std::string& source) {
  std::vector<std::string> known;
  for (const ModelFamily* f : model_families()) {
    const auto& types = f->hf_model_types;
    if (std::find(types.begin(), types.end(), type) != types.end()) return *f;
    known.insert(known.end(), types.begin(), types.end());
  }
  throw Error(concat(source, ": model_type '", type, "' is not supported (", joined(known), ")"));
}

// ---- what callers ask of cfg.arch's family ----

bool ModelConfig::tied_head() const { return model_family(arch).head_always_tied || tie_word_embeddings; }

// Sizes beyond any real model's are refused before a layout is built: a wrapped or mistyped size
// (1e9 layers) would otherwise allocate until the process is killed.
constexpr int64_t kMaxLayers = 4096, kMaxHidden = 1 << 17, kMaxVocab = 1 << 24, kMaxHeads = 4096;

std::vector<UnitLayout> model_layout(const ModelConfig& cfg) {
  auto bound = [](const char* key, int64_t value, int64_t limit) {
    SHARDLM_CHECK(value <= limit, "model.", key, " = ", value, ": more than shardlm takes (at most ", limit, ")");
  };
  bound("num_layers", cfg.num_layers, kMaxLayers);
  bound("hidden_size", cfg.hidden_size, kMaxHidden);
  bound("vocab_size", cfg.vocab_size, kMaxVocab);
  bound("num_heads", cfg.num_heads, kMaxHeads);
  bound("intermediate_size", cfg.intermediate_size, 8 * kMaxHidden);
  return model_family(cfg.arch).layout(cfg);
}

std::string hf_tensor_name(const ModelConfig& cfg, const std::string& name) {
  return model_family(cfg.arch).hf_tensor_name(name);
}

std::vector<LinearModule> linear_modules(const ModelConfig& cfg) { return model_family(cfg.arch).linear_modules(cfg); }

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

std::string peft_tensor_name(const ModelConfig& cfg, const std::string& name) {
  return "base_model.model." + hf_tensor_name(cfg, name);
}

std::unique_ptr<CpuModel> make_cpu_model(const ModelConfig& cfg, int max_batch, int max_seq) {
  return model_family(cfg.arch).make_cpu(cfg, max_batch, max_seq);
}

size_t cpu_activation_bytes(const ModelConfig& cfg, int max_batch, int max_seq) {
  return model_family(cfg.arch).cpu_activation_bytes(cfg, max_batch, max_seq);
}

}  // namespace shardlm
