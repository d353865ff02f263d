// [lora] against the model's family: module names resolved and checked, and model.adapter's
// adapter_config.json merged with the deck's lora.* keys.
#include <algorithm>
#include <filesystem>

#include "config_internal.hpp"

namespace shardlm {

using namespace config_detail;

namespace {

constexpr const char* kAllLinear = "all-linear";

// `names` as `valid`'s names in valid's order, repeats removed (with all_linear, "all-linear" picks
// every one); a name not in `valid` is an Error "WHERE: WHY(name): must be ..." listing the valid names.
template <typename Why>
std::vector<std::string> pick_in_order(const std::vector<std::string>& valid, const std::vector<std::string>& names,
                                       const std::string& where, bool all_linear, Why why) {
  std::vector<std::string> listed = valid;
  if (all_linear) listed.emplace_back(kAllLinear);
  std::vector<bool> picked(valid.size(), false);
  for (const std::string& name : names) {
    if (all_linear && name == kAllLinear) {
      picked.assign(valid.size(), true);
      continue;
    }
    const auto it = std::find(valid.begin(), valid.end(), name);
    if (it == valid.end()) throw Error(concat(where, ": ", why(name), ": ", choice_list(listed)));
    picked[static_cast<size_t>(it - valid.begin())] = true;
  }
  std::vector<std::string> out;
  for (size_t i = 0; i < valid.size(); ++i)
    if (picked[i]) out.push_back(valid[i]);
  return out;
}

// The values the deck and an adapter must agree on, as the deck and adapter_config.json name them.
struct LoraField {
  const char* deck_key;
  const char* peft_key;
  std::string (*text)(const LoraConfig&);
};

const LoraField kAgreedFields[] = {
    {"lora.r", "r", [](const LoraConfig& l) { return std::to_string(l.r); }},
    {"lora.alpha", "lora_alpha", [](const LoraConfig& l) { return format_double(l.alpha); }},
    {"lora.target_modules", "target_modules", [](const LoraConfig& l) { return quoted(join_names(l.target_modules)); }},
    {"lora.modules_to_save", "modules_to_save", [](const LoraConfig& l) { return quoted(join_names(l.modules_to_save)); }},
    {"lora.use_rslora", "use_rslora", [](const LoraConfig& l) { return std::string(l.use_rslora ? "true" : "false"); }},
};

// The Hugging Face path of the model's embedding module: the root's [vocab, hidden] matrix's.
std::string embedding_path(const ModelConfig& cfg) {
  const UnitLayout root = model_layout(cfg).front();
  for (const TensorSpec& t : root.tensors)
    if (t.shape == std::vector<int64_t>{cfg.vocab_size, cfg.hidden_size}) {
      const std::string name = peft_base_name(cfg, t.name);
      return name.substr(0, name.rfind('.'));
    }
  return "";
}

}  // namespace

std::vector<std::string> resolve_lora_targets(const ModelConfig& cfg, const std::vector<std::string>& names,
                                              const std::string& where) {
  std::vector<std::string> valid;
  for (const LinearModule& m : linear_modules(cfg)) valid.push_back(m.name);
  return pick_in_order(valid, names, where, true, [&](const std::string& name) {
    return concat("'", name, "' is not a linear module of ", cfg.arch);
  });
}

std::vector<std::string> resolve_lora_saved_modules(const ModelConfig& cfg, const std::vector<std::string>& names,
                                                    const std::string& where) {
  const std::vector<SavableModule> savable = lora_savable_modules(cfg);
  const std::vector<std::string> paths = hf_module_paths(cfg);
  std::vector<std::string> valid;
  for (const SavableModule& m : savable) valid.push_back(m.name);
  const std::string must = valid.empty() ? std::string("this model has none") : choice_list(valid);
  std::vector<bool> picked(savable.size(), false);
  for (const std::string& name : names) {
    std::vector<std::string> others;  // selected modules shardlm does not train whole
    bool found = false;
    for (const std::string& path : paths) {
      if (!peft_saves(path, name)) continue;
      found = true;
      const auto it = std::find_if(savable.begin(), savable.end(), [&](const SavableModule& m) { return m.path == path; });
      if (it == savable.end()) others.push_back(path);
      else picked[static_cast<size_t>(it - savable.begin())] = true;
    }
    if (!found)
      throw Error(concat(where, ": '", name, "' is not a module of ", cfg.arch, " that can be trained whole: ", must));
    if (others.empty()) continue;
    const std::string& first = others.front();
    const bool tied = cfg.tied_head() && std::any_of(others.begin(), others.end(), [&](const std::string& p) {
      return p == "lm_head" || p == embedding_path(cfg);
    });
    if (tied)
      throw Error(concat(where, ": '", name, "' selects ", first, ", but this ", cfg.arch, " model's LM head is tied to ",
                         "its embedding (one matrix): PEFT trains a copy of the named module apart from its tied twin ",
                         "(ensure_weight_tying ties them again only for the names embed_tokens and lm_head), which ",
                         "shardlm, holding the one matrix, does not reproduce; leave the embedding and the head to the ",
                         "base, or train the whole model without [lora]. Valid here: ", must));
    throw Error(concat(where, ": '", name, "' selects ", first,
                       others.size() > 1 ? concat(" and ", others.size() - 1, " more module(s)") : std::string(),
                       " (PEFT trains every module whose path ends with the name); shardlm trains whole only modules ",
                       "of the root unit (the embeddings, final norm and LM head), not of the blocks: ", must,
                       " (a module's path, as model.norm or transformer.ln_f, names it alone)"));
  }
  std::vector<std::string> out;
  for (size_t i = 0; i < savable.size(); ++i)
    if (picked[i]) out.push_back(savable[i].name);
  return out;
}

std::string lora_disagreement(const LoraConfig& run, const LoraConfig& file, const std::string& source,
                              const std::function<bool(const std::string& deck_key)>& compared) {
  for (const LoraField& f : kAgreedFields) {
    if (!compared(f.deck_key)) continue;
    const std::string mine = f.text(run), theirs = f.text(file);
    if (mine != theirs) return concat(f.deck_key, " = ", mine, " disagrees with ", source, " (", f.peft_key, " = ", theirs, ")");
  }
  return "";
}

namespace config_detail {

void resolve_run_lora(RunConfig& cfg, const std::set<std::string>& given) {
  LoraConfig& lora = cfg.model.lora;
  const auto where = [&](const char* key, const std::vector<std::string>& names) {
    return concat(key, " = ", quoted(join_names(names)));
  };
  if (given.count("lora.target_modules"))
    lora.target_modules = resolve_lora_targets(cfg.model, lora.target_modules, where("lora.target_modules", lora.target_modules));
  if (given.count("lora.modules_to_save"))
    lora.modules_to_save =
        resolve_lora_saved_modules(cfg.model, lora.modules_to_save, where("lora.modules_to_save", lora.modules_to_save));

  if (cfg.model.adapter.empty()) {
    if (given.empty()) return;  // no [lora]: LoRA is off
    if (!given.count("lora.r"))
      throw Error("lora.r is required when the deck has a [lora] section (set it there or with --lora.r=N; "
                  "without [lora] LoRA is off)");
    if (lora.target_modules.empty())
      throw Error("lora.target_modules is required when the deck has a [lora] section (set it there or with "
                  "--lora.target_modules=NAMES: the model's linear module names, comma-separated, or all-linear)");
    return;
  }

  // model.adapter: its adapter_config.json says what the adapters are; the deck may repeat it, not change it.
  const std::string path = (std::filesystem::path(cfg.model.adapter) / "adapter_config.json").string();
  const PeftAdapterConfig file = peft_adapter_config_from_json(
      read_input_file(path, "model.adapter's adapter_config.json", kMaxDeckBytes), path, cfg.model);
  const std::string disagreement =
      lora_disagreement(lora, file.lora, path, [&](const std::string& key) { return given.count(key) > 0; });
  if (!disagreement.empty())
    throw Error(concat(disagreement, ": model.adapter's adapter_config.json decides it; remove the key from the ",
                       "deck or make it agree"));
  const LoraConfig deck = lora;
  lora = file.lora;
  // How to go on training, not what the adapters are: the deck's word where it has one.
  if (given.count("lora.dropout")) lora.dropout = deck.dropout;
  if (given.count("lora.init")) lora.init = deck.init;
}

}  // namespace config_detail
}  // namespace shardlm
