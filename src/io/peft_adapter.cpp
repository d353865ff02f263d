// PEFT LoRA adapter directories: adapter_config.json and adapter_model.safetensors, written as PEFT
// saves them and read back checked against the model they adapt.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>

#include "shardlm/io.hpp"
#include "staged_folder.hpp"

namespace shardlm {
namespace {

namespace fs = std::filesystem;

constexpr const char* kConfigFile = "adapter_config.json";
constexpr const char* kWeightsFile = "adapter_model.safetensors";


std::string shape_of(const std::vector<int64_t>& shape) {
  std::string s;
  for (int64_t d : shape) s += (s.empty() ? "" : ", ") + std::to_string(d);
  return "[" + s + "]";
}

// One tensor as a source names and holds it.
struct FoundTensor {
  const std::string& name;
  const std::vector<int64_t>& shape;
  const std::vector<float>& values;
};

// `found` must hold each tensor of `expected` (by the names the source uses) exactly once, with its
// shape and finite values, and nothing else. `where` names the source in the Error.
void check_tensors(const std::string& where, const std::map<std::string, const TensorSpec*>& expected,
                   const std::vector<FoundTensor>& found) {
  std::set<std::string> seen;
  std::vector<std::string> extra;
  for (const FoundTensor& t : found) {
    const auto it = expected.find(t.name);
    if (it == expected.end()) {
      extra.push_back(t.name);
      continue;
    }
    const TensorSpec& spec = *it->second;
    SHARDLM_CHECK(seen.insert(t.name).second, where, ": tensor '", t.name, "' is given twice");
    SHARDLM_CHECK(t.shape == spec.shape, where, ": tensor '", t.name, "' has shape ", shape_of(t.shape),
                  ", the adapter's config implies ", shape_of(spec.shape));
    SHARDLM_CHECK(t.values.size() == spec.numel, where, ": tensor '", t.name, "' has ", t.values.size(),
                  " values for a shape of ", spec.numel);
    const auto bad = std::find_if(t.values.begin(), t.values.end(), [](float x) { return !std::isfinite(x); });
    SHARDLM_CHECK(bad == t.values.end(), where, ": tensor '", t.name, "' holds ", *bad, " at element ",
                  bad - t.values.begin(), " (every value of an adapter must be finite)");
  }
  if (!extra.empty()) {
    std::string list;
    for (size_t i = 0; i < extra.size() && i < 5; ++i) list += (i ? ", '" : "'") + extra[i] + "'";
    throw Error(concat(where, ": ", extra.size(), " tensor(s) that the adapter's config has no place for: ", list,
                       extra.size() > 5 ? ", ..." : "", " (another model's adapter, or another r or target_modules?)"));
  }
  for (const auto& [name, spec] : expected)
    SHARDLM_CHECK(seen.count(name), where, ": tensor '", name, "' is missing (the adapter's config implies it, ",
                  shape_of(spec->shape), ")");
}

}  // namespace

std::vector<TensorSpec> peft_adapter_tensors(const ModelConfig& cfg) {
  const std::vector<UnitLayout> units = lora_layout(cfg);
  std::vector<TensorSpec> out;
  // PEFT's order: the blocks' adapters, then the modules_to_save (the root's).
  for (size_t u = 1; u < units.size(); ++u) out.insert(out.end(), units[u].tensors.begin(), units[u].tensors.end());
  out.insert(out.end(), units.front().tensors.begin(), units.front().tensors.end());
  return out;
}

void write_peft_adapter(const std::string& dir, const ModelConfig& cfg, const std::string& base_model_name_or_path,
                        const std::vector<AdapterTensor>& tensors, bool overwrite) {
  const std::string config = peft_adapter_config_json(cfg, base_model_name_or_path);
  const std::vector<TensorSpec> specs = peft_adapter_tensors(cfg);
  std::map<std::string, const TensorSpec*> expected;
  for (const TensorSpec& s : specs) expected[s.name] = &s;
  std::vector<FoundTensor> found;
  std::map<std::string, const AdapterTensor*> given;
  for (const AdapterTensor& t : tensors) {
    found.push_back({t.name, t.shape, t.values});
    given[t.name] = &t;
  }
  check_tensors(concat("adapter ", dir), expected, found);

  std::vector<SafetensorsEntry> entries;  // in peft_adapter_tensors' order, under PEFT's names
  for (const TensorSpec& s : specs) entries.push_back({peft_tensor_name(cfg, s.name), s.shape, given.at(s.name)->values});
  // An adapter write puts both of its files every time: they are the only ones it replaces, and nothing
  // of an earlier write is left to remove; others (a README, a tokenizer, PEFT's pickle weights, which
  // PEFT reads only without the safetensors file) stay.
  const auto nothing_stale = [](const std::string&) { return false; };
  write_staged_folder(dir, "adapter", overwrite, nothing_stale, [&](const fs::path& staging) {
    replace_file((staging / kConfigFile).string(), config, "adapter config");
    write_safetensors((staging / kWeightsFile).string(), entries);
  });
}

PeftAdapter read_peft_adapter(const std::string& dir, const ModelConfig& cfg) {
  const fs::path root(dir);
  std::error_code ec;
  SHARDLM_CHECK(fs::is_directory(root, ec), "PEFT adapter ", dir, " is not a directory");
  const std::string config_path = (root / kConfigFile).string();
  PeftAdapterConfig file =
      peft_adapter_config_from_json(read_input_file(config_path, "PEFT adapter config", kMaxDeckBytes), config_path, cfg);
  if (cfg.lora.enabled()) {
    const std::string d = lora_disagreement(cfg.lora, file.lora, config_path, [](const std::string&) { return true; });
    SHARDLM_CHECK(d.empty(), d);
  }
  ModelConfig adapted = cfg;
  adapted.lora = file.lora;
  adapted.hf_multimodal = file.hf_multimodal;

  const std::string weights = (root / kWeightsFile).string();
  SHARDLM_CHECK(fs::exists(weights, ec), "PEFT adapter ", dir, " has no ", kWeightsFile,
                fs::exists(root / "adapter_model.bin", ec)
                    ? " (its adapter_model.bin, PyTorch's pickle format, is not read: save with safe_serialization=True)"
                    : "");
  std::vector<SafetensorsEntry> entries = read_safetensors(weights);
  const std::vector<TensorSpec> specs = peft_adapter_tensors(adapted);
  std::map<std::string, const TensorSpec*> expected;  // by PEFT's name, as the file has them
  for (const TensorSpec& s : specs) expected[peft_tensor_name(adapted, s.name)] = &s;
  std::vector<FoundTensor> found;
  for (const SafetensorsEntry& e : entries) found.push_back({e.name, e.shape, e.data});
  check_tensors(weights, expected, found);

  PeftAdapter out;
  out.lora = file.lora;
  out.base_model_name_or_path = file.base_model_name_or_path;
  for (SafetensorsEntry& e : entries) {
    const TensorSpec& spec = *expected.at(e.name);
    out.tensors[spec.name] = AdapterTensor{spec.name, spec.shape, std::move(e.data)};
  }
  return out;
}

}  // namespace shardlm

namespace shardlm {

ModelConfig checkpoint_lora_model(const CheckpointMeta& meta, const std::string& path, std::string* base_dir) {
  SHARDLM_CHECK(!meta.lora.empty(), "checkpoint ", path, " holds a whole model, not LoRA adapters (its run had no [lora])");
  const PeftAdapterConfig c = peft_adapter_config_from_json(meta.lora, concat("checkpoint ", path, ": attribute lora"),
                                                            meta.model);
  ModelConfig cfg = meta.model;
  cfg.lora = c.lora;
  cfg.hf_multimodal = c.hf_multimodal;  // the run's base, as its adapter config names the modules
  if (base_dir) *base_dir = c.base_model_name_or_path;
  return cfg;
}

std::string export_checkpoint_adapter(const std::string& checkpoint_path, const std::string& dir, bool overwrite,
                                      const std::string& base_dir) {
  CheckpointReader reader(checkpoint_path);
  reader.require_intact();
  std::string base;
  ModelConfig cfg = checkpoint_lora_model(reader.meta(), checkpoint_path, &base);
  if (!base_dir.empty()) {
    // The adapter names that folder's modules: a multimodal Gemma 3 folder's or its text model's paths.
    base = base_dir;
    const std::string config = (fs::path(base_dir) / "config.json").string();
    cfg.hf_multimodal = model_config_from_hf(read_input_file(config, "model config", kMaxDeckBytes), config).hf_multimodal;
  }
  std::vector<AdapterTensor> tensors;
  for (const CheckpointTensor& t : reader.tensors()) tensors.push_back({t.name, t.shape, reader.read(t)});
  write_peft_adapter(dir, cfg, base, tensors, overwrite);
  return base;
}

}  // namespace shardlm
