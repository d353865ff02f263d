// PEFT's adapter_config.json for a LoRA adapter: read into a LoraConfig (refusing what shardlm does
// not compute as PEFT would) and written as PEFT 0.21 saves a CAUSAL_LM adapter.
#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "../core/input_file.hpp"
#include "config_internal.hpp"

namespace shardlm {

using namespace config_detail;
using Json = nlohmann::json;  // std::map-backed: dump() sorts the keys, as PEFT's json.dumps(sort_keys=True)

namespace {

// Keys read for what they say, and keys whose value changes nothing shardlm computes (the base
// model's revision, PEFT's version, ...). Every other key must be off: null, false, {} or [].
const std::set<std::string> kReadKeys = {"peft_type", "task_type", "r", "lora_alpha", "lora_dropout",
                                         "target_modules", "modules_to_save", "use_rslora", "init_lora_weights",
                                         "bias", "ensure_weight_tying", "base_model_name_or_path"};
const std::set<std::string> kIgnoredKeys = {"revision", "inference_mode", "peft_version", "auto_mapping",
                                            "megatron_core", "qalora_group_size"};

// init_lora_weights values that only say how A and B started; others (PiSSA, OLoRA, CorDA, LoftQ,
// LoRA-GA) also change the base weights, which the adapter then needs.
const std::set<std::string> kInitOnlyAdapters = {"gaussian", "eva", "orthogonal"};

bool is_off(const Json& v) {
  return v.is_null() || (v.is_boolean() && !v.get<bool>()) || ((v.is_object() || v.is_array()) && v.empty());
}

// One adapter_config.json's keys, each error naming the file and the key.
class PeftConfigReader {
 public:
  PeftConfigReader(const std::string& text, const std::string& source) : source_(source) {
    try {
      j_ = parse_json_bounded(text, source);
    } catch (const Json::exception& e) {
      throw Error(concat(source, ": not valid JSON: ", e.what()));
    }
    SHARDLM_CHECK(j_.is_object(), source, ": expected a JSON object (PEFT's adapter_config.json)");
  }

  [[noreturn]] void fail(const std::string& key, const std::string& why) const {
    const auto it = j_.find(key);
    throw Error(concat(source_, ": ", key, it == j_.end() ? "" : " = " + clip_for_message(it->dump(), 80), ": ", why));
  }
  // The key's value, or nullptr when it is absent or null (PEFT's default then applies).
  const Json* get(const std::string& key) const {
    const auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  bool flag(const std::string& key, bool fallback) const {
    const Json* v = get(key);
    if (v && !v->is_boolean()) fail(key, "must be true or false");
    return v ? v->get<bool>() : fallback;
  }
  double number(const std::string& key, double fallback) const {
    const Json* v = get(key);
    if (v && !(v->is_number() && std::isfinite(v->get<double>()))) fail(key, "must be a finite number");
    return v ? v->get<double>() : fallback;
  }
  // A list of names, or null / absent for none.
  std::vector<std::string> names(const std::string& key) const {
    std::vector<std::string> out;
    const Json* v = get(key);
    if (!v) return out;
    if (!v->is_array()) fail(key, "must be a list of module names");
    for (const Json& n : *v) {
      if (!n.is_string()) fail(key, "must be a list of module names");
      out.push_back(n.get<std::string>());
    }
    return out;
  }
  // Every key neither read nor ignored (kIgnoredKeys, and `also_ignored`) must be off.
  void check_the_rest(const std::set<std::string>& also_ignored) const {
    for (const auto& [key, value] : j_.items())
      if (!kReadKeys.count(key) && !kIgnoredKeys.count(key) && !also_ignored.count(key) && !is_off(value))
        fail(key, "not supported by shardlm, which computes plain LoRA (W x + scale B A x on every targeted "
                  "module of every layer); it reads this key only when it is off (null, false, {} or [])");
  }
  const std::string& source() const { return source_; }

 private:
  std::string source_;
  Json j_;
};

// The Hugging Face module path of a layout module ("layers.0.self_attn.q_proj" ->
// "model.layers.0.self_attn.q_proj"; a multimodal Gemma 3's "model.language_model.layers.0.self_attn.q_proj"):
// what PEFT matches its names against.
std::string module_key(const ModelConfig& model, const std::string& layout_module) {
  const std::string weight = peft_base_name(model, layout_module + ".weight");
  return weight.substr(0, weight.size() - std::string(".weight").size());
}

// Every block's module path of each linear module: [module in the family's order][block].
std::vector<std::vector<std::string>> linear_module_keys(const ModelConfig& model) {
  const std::vector<UnitLayout> layout = model_layout(model);  // unit 1 + i is block i
  std::vector<std::vector<std::string>> keys;
  for (const LinearModule& m : linear_modules(model)) {
    keys.emplace_back();
    for (size_t i = 1; i < layout.size(); ++i) keys.back().push_back(module_key(model, layout[i].name + "." + m.path));
  }
  return keys;
}

// Whether PEFT's name `entry` selects the module at `key`: the whole path, or its end after a dot.
bool peft_matches(const std::string& key, const std::string& entry) {
  return key == entry ||
         (key.size() > entry.size() && key.compare(key.size() - entry.size(), entry.size(), entry) == 0 &&
          key[key.size() - entry.size() - 1] == '.');
}

// target_modules as PEFT reads a list: each entry selects the modules it matches ("q_proj" every
// layer's, "model.layers.0.self_attn.q_proj" one; PEFT's all-linear is saved as the full paths). The
// result must adapt each module in every layer or in none: shardlm's adapters are per module name.
std::vector<std::string> read_target_list(const PeftConfigReader& in, const ModelConfig& model,
                                          const std::vector<std::string>& entries) {
  const std::vector<std::vector<std::string>> keys = linear_module_keys(model);
  std::vector<std::string> names;
  for (const LinearModule& m : linear_modules(model)) names.push_back(m.name);
  std::vector<std::vector<bool>> picked(keys.size(), std::vector<bool>(model.num_layers, false));
  for (const std::string& entry : entries) {
    bool found = false;
    for (size_t m = 0; m < keys.size(); ++m)
      for (size_t i = 0; i < keys[m].size(); ++i)
        if (peft_matches(keys[m][i], entry)) picked[m][i] = found = true;
    if (!found) in.fail("target_modules", concat("'", entry, "' is not a linear module of ", model.arch, ": ",
                                                 choice_list(names), " (or the path of one)"));
  }
  std::vector<std::string> out;
  for (size_t m = 0; m < keys.size(); ++m) {
    const auto layers = static_cast<size_t>(std::count(picked[m].begin(), picked[m].end(), true));
    if (layers > 0 && layers < picked[m].size())
      in.fail("target_modules", concat("adapts ", names[m], " in ", layers, " of ", picked[m].size(),
                                       " layers; shardlm adapts a module in every layer or in none"));
    if (layers > 0) out.push_back(names[m]);
  }
  return out;
}

// target_modules: a list (above), or "all-linear"; PEFT's other string form is a regular expression,
// which shardlm does not match.
std::vector<std::string> read_targets(const PeftConfigReader& in, const ModelConfig& model) {
  const Json* v = in.get("target_modules");
  if (!v) in.fail("target_modules", "missing: shardlm needs the module names listed (PEFT's choice by architecture is not read)");
  if (!v->is_string()) return read_target_list(in, model, in.names("target_modules"));
  if (v->get<std::string>() != "all-linear")
    in.fail("target_modules", "a regular expression is not supported: list the module names instead");
  return resolve_lora_targets(model, {"all-linear"}, concat(in.source(), ": target_modules"));
}

// modules_to_save as PEFT matches it (an entry selects every module whose path ends with it), as
// lora_savable_modules' names; resolve_lora_saved_modules refuses what shardlm does not train whole.
std::vector<std::string> read_saved_modules(const PeftConfigReader& in, const ModelConfig& model) {
  return resolve_lora_saved_modules(model, in.names("modules_to_save"), concat(in.source(), ": modules_to_save"));
}

// The model whose module paths the file's target_modules and modules_to_save name: `model` itself, or for a
// family with a multimodal model (Gemma 3) the other one of the two when an entry is a path only it has
// ("model.language_model.layers.0.self_attn.q_proj"; "q_proj" and "model.norm" name either). Both adapt the same
// text model's weights, and a checkpoint's model config is always the text model's (hf_config_json).
ModelConfig model_named_in(const PeftConfigReader& in, const ModelConfig& model) {
  if (!model_family(model.arch).hf_multimodal_name) return model;
  ModelConfig other = model;
  other.hf_multimodal = !model.hf_multimodal;
  const auto names = [&](const char* key) {
    const Json* v = in.get(key);
    return v && v->is_array() ? in.names(key) : std::vector<std::string>{};
  };
  // Each model's paths: its blocks' linear modules (target_modules) and every module (modules_to_save).
  std::vector<std::string> targets[2], paths[2];
  for (int k = 0; k < 2; ++k) {
    for (const auto& blocks : linear_module_keys(k == 0 ? model : other))
      targets[k].insert(targets[k].end(), blocks.begin(), blocks.end());
    paths[k] = hf_module_paths(k == 0 ? model : other);
  }
  bool mine_only = false, other_only = false;
  const auto tally = [&](const std::string& key, const std::vector<std::string>(&in_model)[2],
                         bool (*selects)(const std::string& path, const std::string& entry)) {
    for (const std::string& e : names(key.c_str())) {
      bool hit[2];
      for (int k = 0; k < 2; ++k)
        hit[k] = std::any_of(in_model[k].begin(), in_model[k].end(), [&](const std::string& p) { return selects(p, e); });
      mine_only |= hit[0] && !hit[1];
      other_only |= hit[1] && !hit[0];
    }
  };
  tally("target_modules", targets, peft_matches);
  tally("modules_to_save", paths, peft_saves);
  return other_only && !mine_only ? other : model;
}

}  // namespace

PeftAdapterConfig peft_adapter_config_from_json(const std::string& json_text, const std::string& source,
                                                const ModelConfig& model) {
  const PeftConfigReader in(json_text, source);
  const Json* type = in.get("peft_type");
  if (!type || *type != "LORA") in.fail("peft_type", "a LoRA adapter (\"LORA\") is expected");
  if (const Json* task = in.get("task_type"); task && *task != "CAUSAL_LM")
    in.fail("task_type", "a causal language model's adapter (\"CAUSAL_LM\") is expected");
  if (const Json* bias = in.get("bias"); bias && *bias != "none")
    in.fail("bias", "only \"none\" is supported (shardlm keeps every base bias frozen)");
  // PEFT's LoraConfig sets eva_config whenever init_lora_weights is "eva": how A was initialised from the
  // data's activations, before training; the per-layer ranks EVA may leave (rank_pattern) are still refused.
  const Json* init = in.get("init_lora_weights");
  in.check_the_rest(init && *init == "eva" ? std::set<std::string>{"eva_config"} : std::set<std::string>{});

  PeftAdapterConfig out;
  const ModelConfig named = model_named_in(in, model);
  out.hf_multimodal = named.hf_multimodal;
  LoraConfig& lora = out.lora;
  const Json* r = in.get("r");
  if (!r || !r->is_number_integer() || r->get<int64_t>() < 1 || r->get<int64_t>() > (1 << 20))
    in.fail("r", "must be an integer >= 1");
  lora.r = static_cast<int>(r->get<int64_t>());
  lora.alpha = in.number("lora_alpha", 8);
  if (!(lora.alpha > 0)) in.fail("lora_alpha", "must be > 0");
  lora.dropout = in.number("lora_dropout", 0);
  if (!(lora.dropout >= 0 && lora.dropout < 1)) in.fail("lora_dropout", "must be in [0, 1)");
  lora.use_rslora = in.flag("use_rslora", false);
  lora.target_modules = read_targets(in, named);
  lora.modules_to_save = read_saved_modules(in, named);
  // ensure_weight_tying acts on a tied embedding or head in modules_to_save or target_modules, which
  // shardlm refuses above: whatever its value, it changes nothing here.
  in.flag("ensure_weight_tying", false);

  if (init) {
    const bool init_only = init->is_boolean() || (init->is_string() && kInitOnlyAdapters.count(init->get<std::string>()));
    if (!init_only)
      in.fail("init_lora_weights", "not supported: this initialisation also changes the base weights, which the "
                                   "adapter then needs (shardlm applies it to the unchanged base model)");
    lora.init = *init == "gaussian" ? LoraInit::Gaussian : LoraInit::Kaiming;
  }
  if (const Json* base = in.get("base_model_name_or_path")) {
    if (!base->is_string()) in.fail("base_model_name_or_path", "must be a string or null");
    out.base_model_name_or_path = base->get<std::string>();
  }
  return out;
}

std::string peft_adapter_config_json(const ModelConfig& cfg, const std::string& base_model_name_or_path) {
  const LoraConfig& lora = cfg.lora;
  SHARDLM_CHECK(lora.enabled() && !lora.target_modules.empty(), "adapter_config.json: LoRA is off (lora.r = ",
                lora.r, "), there is no adapter to describe");
  const Json none = nullptr;
  Json j = Json::object();
  // PEFT 0.21's keys, at the values of a plain LoRA adapter; the ones shardlm sets below.
  for (const char* key : {"alora_invocation_tokens", "arrow_config", "auto_mapping", "corda_config", "eva_config",
                          "exclude_modules", "kasa_config", "layer_replication", "layers_pattern", "layers_to_transform",
                          "lora_ga_config", "megatron_config", "monteclora_config", "revision", "target_parameters",
                          "trainable_token_indices", "use_bdlora", "velora_config"})
    j[key] = none;
  for (const char* key : {"alpha_pattern", "loftq_config", "rank_pattern"}) j[key] = Json::object();
  for (const char* key : {"fan_in_fan_out", "lora_bias", "use_dora", "use_qalora"}) j[key] = false;
  j["bias"] = "none";
  j["inference_mode"] = true;
  j["megatron_core"] = "megatron.core";
  j["peft_type"] = "LORA";
  j["qalora_group_size"] = 16;
  j["task_type"] = "CAUSAL_LM";

  j["base_model_name_or_path"] = base_model_name_or_path.empty() ? none : Json(base_model_name_or_path);
  j["r"] = lora.r;
  // An integer alpha as PEFT's int field holds it ("lora_alpha": 16), another as a float.
  const bool whole = lora.alpha == std::floor(lora.alpha) && std::fabs(lora.alpha) < 1e15;
  j["lora_alpha"] = whole ? Json(static_cast<int64_t>(lora.alpha)) : Json(lora.alpha);
  j["lora_dropout"] = lora.dropout;
  j["target_modules"] = lora.target_modules;
  j["modules_to_save"] = lora.modules_to_save.empty() ? none : Json(lora.modules_to_save);
  if (cfg.hf_multimodal) {
    // Every module by its full path in the multimodal model, which PEFT matches as the whole name: a short name
    // ("q_proj") would also select the vision tower's modules of that name, which shardlm does not train.
    std::vector<std::string> targets, saved;
    const std::vector<LinearModule> modules = linear_modules(cfg);
    const std::vector<std::vector<std::string>> keys = linear_module_keys(cfg);
    for (size_t m = 0; m < modules.size(); ++m)
      if (lora.targets(modules[m].name)) targets.insert(targets.end(), keys[m].begin(), keys[m].end());
    for (const SavableModule& m : lora_savable_modules(cfg))
      if (std::find(lora.modules_to_save.begin(), lora.modules_to_save.end(), m.name) != lora.modules_to_save.end())
        saved.push_back(m.path);
    j["target_modules"] = targets;
    if (!saved.empty()) j["modules_to_save"] = saved;
  }
  j["ensure_weight_tying"] = false;  // no tied module is ever trained (resolve_lora_saved_modules)
  j["use_rslora"] = lora.use_rslora;
  j["init_lora_weights"] = lora.init == LoraInit::Gaussian ? Json("gaussian") : Json(true);
  return j.dump(2);
}

}  // namespace shardlm
