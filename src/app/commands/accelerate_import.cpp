// import_accelerate: an Accelerate config (YAML, read with yaml-cpp) and TrainingArguments (JSON)
// turned into a deck. Every key of both files gets a comment line in the deck saying where it went,
// and a warning where shardlm does it differently or not at all.
#include "accelerate_import.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "../../core/input_file.hpp"
#include "shardlm/config.hpp"
#include "shardlm/core.hpp"
#include "shardlm/model.hpp"

namespace shardlm {

namespace {

using nlohmann::json;

// ---- YAML to JSON ---------------------------------------------------------------------------

// A YAML scalar as JSON: YAML 1.2's core-schema booleans, null, integers and floats; the rest strings.
json yaml_scalar(const YAML::Node& n) {
  const std::string& s = n.Scalar();
  if (n.Tag() == "!") return s;  // quoted: always a string
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL") return nullptr;
  char* end = nullptr;
  long long i = std::strtoll(s.c_str(), &end, 10);
  if (*end == '\0' && end != s.c_str()) return i;
  double d = std::strtod(s.c_str(), &end);
  if (*end == '\0' && end != s.c_str()) return d;
  return s;
}

// An alias names an earlier node again, so a small text can stand for a huge tree (a "billion
// laughs") or one that holds itself: the copy stops at these bounds, far past any Accelerate config.
constexpr size_t kMaxYamlValues = 100000;
constexpr int kMaxYamlDepth = 64;

struct YamlBudget {
  const std::string& source;
  size_t values = 0;
};

json yaml_to_json(const YAML::Node& n, YamlBudget& budget, int depth = 0) {
  if (++budget.values > kMaxYamlValues)
    throw Error(concat(budget.source, ": expands to more than ", kMaxYamlValues,
                       " values (aliases repeating a node?); an Accelerate config holds a few dozen"));
  if (depth > kMaxYamlDepth)
    throw Error(concat(budget.source, ": nests deeper than ", kMaxYamlDepth,
                       " levels (an alias inside its own anchor?); an Accelerate config nests 2"));
  switch (n.Type()) {
    case YAML::NodeType::Map: {
      json o = json::object();
      for (const auto& kv : n) o[kv.first.Scalar()] = yaml_to_json(kv.second, budget, depth + 1);
      return o;
    }
    case YAML::NodeType::Sequence: {
      json a = json::array();
      for (const auto& v : n) a.push_back(yaml_to_json(v, budget, depth + 1));
      return a;
    }
    case YAML::NodeType::Scalar:
      return yaml_scalar(n);
    default:
      return nullptr;
  }
}

// ---- the deck being written -------------------------------------------------------------------

const char* kSections[] = {"model", "data", "train", "fsdp", "eval", "dist", "checkpoint", "run"};

struct DeckEntry {
  std::string value;
  std::vector<std::string> notes;  // comment lines above the key: origins, then warnings
};

class Importer {
 public:
  Importer(std::string yaml_name, std::string args_name) : yaml_name_(std::move(yaml_name)), args_name_(std::move(args_name)) {}

  // Sets deck key `key` (section.key) to `value`, noting where it came from.
  void set(const std::string& key, const std::string& value, const std::string& origin) {
    DeckEntry& e = entries_[key];
    if (given_.count(key)) {  // the command line wins over both files
      if (e.value != value) e.notes.push_back(concat(origin, " (", value, "): replaced by the command line"));
      return;
    }
    e.value = value;
    e.notes.push_back(origin);
  }
  // A key given on the command line: kept whatever the files say.
  void give(const std::string& key, const std::string& value, const std::string& origin) {
    const std::string section = key.substr(0, key.find('.'));
    if (std::none_of(std::begin(kSections), std::end(kSections), [&](const char* s) { return section == s; }))
      throw Error(concat("no deck section [", section, "] for ", origin));
    set(key, value, origin);
    given_.insert(key);
  }
  bool has(const std::string& key) const { return entries_.count(key) > 0; }
  std::string value(const std::string& key) const { return entries_.count(key) ? entries_.at(key).value : ""; }
  // A warning: on stderr and as a comment above `key` (or in the header when `key` is empty).
  void warn(const std::string& key, const std::string& origin, const std::string& text) {
    warnings_.push_back(concat(origin, ": ", text));
    if (key.empty() || !has(key))
      header_warnings_.push_back("warning: " + origin + ": " + text);
    else
      entries_[key].notes.push_back("warning: " + text);
  }
  // A comment line above `key`, neither origin nor warning.
  void note(const std::string& key, const std::string& text) { entries_[key].notes.push_back(text); }
  // A key with no counterpart: a comment in the closing list.
  void unused(const std::string& origin, const std::string& why) { unused_.push_back(origin + ": " + why); }

  std::string deck(const std::vector<std::string>& header) const {
    std::ostringstream os;
    for (const std::string& h : header) os << "# " << h << "\n";
    for (const std::string& w : header_warnings_) os << "# " << w << "\n";
    for (const char* section : kSections) {
      bool opened = false;
      for (const auto& [key, e] : entries_) {
        if (key.rfind(std::string(section) + ".", 0) != 0) continue;
        if (!opened) os << "\n[" << section << "]\n";
        opened = true;
        for (const std::string& n : e.notes) os << "# " << n << "\n";
        os << key.substr(key.find('.') + 1) << " = " << e.value << "\n";
      }
    }
    if (!unused_.empty()) {
      os << "\n# Keys with nothing to set in a deck:\n";
      for (const std::string& u : unused_) os << "#   " << u << "\n";
    }
    return os.str();
  }
  const std::vector<std::string>& warnings() const { return warnings_; }
  const std::string& yaml_name() const { return yaml_name_; }
  const std::string& args_name() const { return args_name_; }

 private:
  std::string yaml_name_, args_name_;
  std::map<std::string, DeckEntry> entries_;
  std::set<std::string> given_;
  std::vector<std::string> header_warnings_, warnings_, unused_;
};

// A value as the files write it, for comments and messages.
std::string shown(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

// The keys of one source in a file, each checked against the table: an unknown key is an error
// naming the nearest known one.
struct Source {
  const char* table;   // ForeignKey::source
  std::string where;   // "FILE" or "FILE fsdp_config" for messages
  json values;         // the file's object
  std::string prefix;  // added to a key before the table lookup (TrainingArguments' fsdp_config: "fsdp_")

  // The table's name of a key of the file ("" when the table has none): TrainingArguments'
  // fsdp_config takes its keys with or without the fsdp_ prefix, as Trainer does.
  std::string canonical(const std::string& key) const {
    if (find_foreign_key(table, key)) return key;
    if (!prefix.empty() && find_foreign_key(table, prefix + key)) return prefix + key;
    return "";
  }
  void check_keys() const {
    for (const auto& [key, v] : values.items()) {
      if (!canonical(key).empty()) continue;
      std::string best;
      size_t best_d = 4;
      for (const ForeignKey& k : foreign_keys()) {
        if (std::string(k.source) != table) continue;
        size_t d = std::min(edit_distance(key, k.name), edit_distance(prefix + key, k.name));
        if (d < best_d) best_d = d, best = k.name;
      }
      throw Error(concat(where, ": unknown key '", key, "'",
                         best.empty() ? std::string() : concat(" (did you mean '", best, "'?)")));
    }
  }
  // The key as the file spells it ("" when absent).
  std::string spelled(const std::string& name) const {
    if (values.contains(name)) return name;
    if (!prefix.empty() && name.rfind(prefix, 0) == 0 && values.contains(name.substr(prefix.size())))
      return name.substr(prefix.size());
    return "";
  }
  bool given(const std::string& name) const { return !spelled(name).empty(); }
  // The value, or the table's default when the key is absent.
  json get(const std::string& name) const {
    if (given(name)) return values.at(spelled(name));
    return json::parse(find_foreign_key(table, name)->default_json);
  }
  // "FILE: key: value" or "FILE: key absent: Accelerate's default value".
  std::string origin(const std::string& name, const char* whose) const {
    if (given(name)) return concat(where, ": ", spelled(name), ": ", clip_for_message(shown(get(name)), 80));
    return concat(where, ": ", name, " absent: ", whose, "'s default ", shown(get(name)));
  }
};

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

bool truthy(const json& v, const std::string& what) {
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_string()) {
    std::string s = upper(v.get<std::string>());
    if (s == "TRUE" || s == "YES" || s == "1") return true;
    if (s == "FALSE" || s == "NO" || s == "0") return false;
  }
  if (v.is_number_integer() && (v.get<long long>() == 0 || v.get<long long>() == 1)) return v.get<long long>() == 1;
  throw Error(concat(what, ": expected true or false, got ", clip_for_message(shown(v))));
}

double number(const json& v, const std::string& what) {
  if (v.is_number()) return v.get<double>();
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    char* end = nullptr;
    double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && *end == '\0') return d;
  }
  throw Error(concat(what, ": expected a number, got ", clip_for_message(shown(v))));
}

long long whole(const json& v, const std::string& what, long long min) {
  double d = number(v, what);
  if (d != std::floor(d) || d < double(min) || d > 2147483647.0)
    throw Error(concat(what, ": expected a whole number >= ", min, ", got ", clip_for_message(shown(v))));
  return static_cast<long long>(d);
}

std::string text(const json& v, const std::string& what) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number()) return v.dump();
  throw Error(concat(what, ": expected a word, got ", clip_for_message(shown(v))));
}

std::string number_text(double d) {
  std::ostringstream os;
  os.precision(10);
  os << d;
  return os.str();
}

// ---- the FSDP settings, from Accelerate's fsdp_config and TrainingArguments' fsdp / fsdp_config ----

const std::map<std::string, std::string> kStrategyNames = {
    {"FULL_SHARD", "FULL_SHARD"},        {"1", "FULL_SHARD"},          {"SHARD_GRAD_OP", "SHARD_GRAD_OP"},
    {"2", "SHARD_GRAD_OP"},              {"NO_SHARD", "NO_SHARD"},     {"3", "NO_SHARD"},
    {"HYBRID_SHARD", "HYBRID_SHARD"},    {"4", "HYBRID_SHARD"},        {"HYBRID_SHARD_ZERO2", "HYBRID_SHARD_ZERO2"},
    {"_HYBRID_SHARD_ZERO2", "HYBRID_SHARD_ZERO2"}, {"5", "HYBRID_SHARD_ZERO2"}};

std::string strategy_name(const json& v, const std::string& what) {
  std::string s = upper(text(v, what));
  auto it = kStrategyNames.find(s);
  if (it == kStrategyNames.end())
    throw Error(concat(what, ": unknown sharding strategy '", clip_for_message(s),
                       "' (FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD, HYBRID_SHARD_ZERO2 or 1-5)"));
  return it->second;
}

// The block classes shardlm wraps, one per family (ModelFamily::hf_block_class).
const std::vector<std::string> kBlockClasses = hf_block_classes();

void import_fsdp_config(Importer& im, const Source& fc, bool from_trainer) {
  const char* whose = "Accelerate";
  auto given = [&](const char* k) { return fc.given(k); };
  auto origin = [&](const char* k) { return fc.origin(k, whose); };
  // Trainer's fsdp_config changes only what it names; Accelerate's sets everything (absent: its defaults).
  auto touch = [&](const char* k) { return !from_trainer || given(k); };

  // Strategy: fsdp_version 2 takes it from fsdp_reshard_after_forward, version 1 from
  // fsdp_sharding_strategy (or, in Accelerate 1.6+, a strategy name in fsdp_reshard_after_forward).
  long long version = whole(fc.get("fsdp_version"), fc.where + ": fsdp_version", 1);
  if (version > 2) throw Error(concat(fc.where, ": fsdp_version: expected 1 or 2, got ", version));
  if (given("fsdp_version")) im.unused(origin("fsdp_version"), "the FSDP version; the strategy below says what is sharded");
  if (given("fsdp_reshard_after_forward") || (version == 2 && !from_trainer)) {
    const json v = fc.get("fsdp_reshard_after_forward");
    const bool flag = v.is_boolean() || (v.is_string() && (upper(v.get<std::string>()) == "TRUE" ||
                                                           upper(v.get<std::string>()) == "FALSE"));
    std::string s = flag
                        ? (truthy(v, fc.where + ": fsdp_reshard_after_forward") ? "FULL_SHARD" : "SHARD_GRAD_OP")
                        : strategy_name(v, fc.where + ": fsdp_reshard_after_forward");
    im.set("fsdp.strategy", s, origin("fsdp_reshard_after_forward"));
    if (given("fsdp_sharding_strategy"))
      im.unused(origin("fsdp_sharding_strategy"), "fsdp_reshard_after_forward decides the strategy");
  } else if (touch("fsdp_sharding_strategy")) {
    im.set("fsdp.strategy", strategy_name(fc.get("fsdp_sharding_strategy"), fc.where + ": fsdp_sharding_strategy"),
           origin("fsdp_sharding_strategy"));
  }

  if (touch("fsdp_offload_params"))
    im.set("fsdp.cpu_offload", truthy(fc.get("fsdp_offload_params"), fc.where) ? "true" : "false", origin("fsdp_offload_params"));
  if (touch("fsdp_forward_prefetch"))
    im.set("fsdp.forward_prefetch", truthy(fc.get("fsdp_forward_prefetch"), fc.where) ? "true" : "false",
           origin("fsdp_forward_prefetch"));
  const char* prefetch_key = given("fsdp_backward_prefetch_policy") && !given("fsdp_backward_prefetch")
                                 ? "fsdp_backward_prefetch_policy" : "fsdp_backward_prefetch";
  if (touch(prefetch_key)) {
    const json v = fc.get(prefetch_key);
    std::string p = v.is_null() ? "NO_PREFETCH" : upper(text(v, fc.where + ": " + prefetch_key));
    const std::map<std::string, std::string> names = {{"BACKWARD_PRE", "pre"}, {"BACKWARD_POST", "post"},
                                                      {"NO_PREFETCH", "none"}, {"1", "pre"}, {"2", "post"}, {"3", "none"}};
    if (!names.count(p))
      throw Error(concat(fc.where, ": ", prefetch_key, ": unknown value '", clip_for_message(p),
                         "' (BACKWARD_PRE, BACKWARD_POST or NO_PREFETCH)"));
    im.set("fsdp.backward_prefetch", names.at(p), origin(prefetch_key));
  }
  if (given("fsdp_backward_prefetch_policy") && prefetch_key != std::string("fsdp_backward_prefetch_policy"))
    im.unused(origin("fsdp_backward_prefetch_policy"), "fsdp_backward_prefetch wins");
  if (touch("fsdp_activation_checkpointing") && truthy(fc.get("fsdp_activation_checkpointing"), fc.where))
    im.set("fsdp.activation_checkpointing", "true", origin("fsdp_activation_checkpointing"));
  else if (given("fsdp_activation_checkpointing"))
    im.unused(origin("fsdp_activation_checkpointing"), "off, as in the deck unless gradient_checkpointing turns it on");
  if (given("fsdp_limit_all_gathers")) {
    if (truthy(fc.get("fsdp_limit_all_gathers"), fc.where)) {
      im.set("fsdp.limit_all_gathers", "2", origin("fsdp_limit_all_gathers"));
    } else {
      im.set("fsdp.limit_all_gathers", "2", origin("fsdp_limit_all_gathers"));
      im.warn("fsdp.limit_all_gathers", origin("fsdp_limit_all_gathers"),
              "shardlm always limits the gathered blocks in flight (fsdp.limit_all_gathers, 2 here); raise it for more overlap");
    }
  }

  // Wrapping: shardlm wraps each transformer block.
  if (touch("fsdp_auto_wrap_policy")) {
    const json v = fc.get("fsdp_auto_wrap_policy");
    std::string policy = v.is_null() ? "NO_WRAP" : upper(text(v, fc.where + ": fsdp_auto_wrap_policy"));
    if (policy == "TRANSFORMER_BASED_WRAP")
      im.unused(origin("fsdp_auto_wrap_policy"), "shardlm wraps each transformer block, as this policy does");
    else if (policy == "SIZE_BASED_WRAP" || policy == "NO_WRAP")
      im.warn("", origin("fsdp_auto_wrap_policy"),
              "shardlm wraps each transformer block (TRANSFORMER_BASED_WRAP): per-rank memory and all-gather sizes differ "
              "from this policy's");
    else
      throw Error(concat(fc.where, ": fsdp_auto_wrap_policy: unknown policy '", clip_for_message(policy),
                         "' (TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP or NO_WRAP)"));
  }
  if (given("fsdp_transformer_layer_cls_to_wrap")) {
    const json v = fc.get("fsdp_transformer_layer_cls_to_wrap");
    std::vector<std::string> classes;
    if (v.is_array())
      for (const json& c : v) classes.push_back(text(c, fc.where + ": fsdp_transformer_layer_cls_to_wrap"));
    else
      for (std::istringstream in(text(v, fc.where + ": fsdp_transformer_layer_cls_to_wrap")); in.good();) {
        std::string c;
        std::getline(in, c, ',');
        c.erase(0, c.find_first_not_of(' '));
        c.erase(c.find_last_not_of(' ') + 1);
        if (!c.empty()) classes.push_back(c);
      }
    bool all_blocks = !classes.empty();
    for (const std::string& c : classes)
      all_blocks = all_blocks && std::find(kBlockClasses.begin(), kBlockClasses.end(), c) != kBlockClasses.end();
    if (all_blocks)
      im.unused(origin("fsdp_transformer_layer_cls_to_wrap"), "the block shardlm wraps for this family");
    else
      im.warn("", origin("fsdp_transformer_layer_cls_to_wrap"),
              concat("shardlm wraps the transformer block of its families (", hf_block_class_names(),
                     "), whatever this names"));
  }

  // Checkpoint format.
  if (touch("fsdp_state_dict_type")) {
    std::string t = upper(text(fc.get("fsdp_state_dict_type"), fc.where + ": fsdp_state_dict_type"));
    if (t != "FULL_STATE_DICT" && t != "SHARDED_STATE_DICT" && t != "LOCAL_STATE_DICT")
      throw Error(concat(fc.where, ": fsdp_state_dict_type: unknown type '", clip_for_message(t),
                         "' (FULL_STATE_DICT, SHARDED_STATE_DICT or LOCAL_STATE_DICT)"));
    im.warn("", origin("fsdp_state_dict_type"),
            t == "FULL_STATE_DICT"
                ? "shardlm's checkpoints are one HDF5 file with every rank's slices, not a full state dict gathered on "
                  "rank 0; `shardlm export` writes the full model as safetensors"
                : "shardlm's checkpoints are one HDF5 file with every rank's slices (sharded, as asked), not "
                  "torch.distributed.checkpoint folders: Accelerate cannot load them; `shardlm export` writes safetensors");
  }

  // What no deck key needs, and what shardlm does not do: every other key of the block.
  for (const auto& [key, v] : fc.values.items()) {
    const std::string name = fc.canonical(key);
    const ForeignKey* k = find_foreign_key("fsdp_config", name);
    static const std::set<std::string> handled = {
        "fsdp_version", "fsdp_reshard_after_forward", "fsdp_sharding_strategy", "fsdp_offload_params",
        "fsdp_forward_prefetch", "fsdp_backward_prefetch", "fsdp_backward_prefetch_policy",
        "fsdp_activation_checkpointing", "fsdp_limit_all_gathers", "fsdp_auto_wrap_policy",
        "fsdp_transformer_layer_cls_to_wrap", "fsdp_state_dict_type"};
    if (handled.count(name)) continue;
    if (k->use == ForeignKeyUse::NotDone && v != json::parse(k->default_json))
      im.warn("", concat(fc.where, ": ", key, ": ", shown(v)), concat("not done: ", k->deck));
    else
      im.unused(concat(fc.where, ": ", key, ": ", shown(v)), k->deck);
  }
}

}  // namespace

AccelerateImport import_accelerate(const std::string& yaml_text, const std::string& yaml_name,
                                   const std::string& args_json, const std::string& args_name,
                                   const std::vector<std::string>& deck_keys, const std::string& command_line) {
  // ---- read both files ----
  json acc;
  try {
    YAML::Node root = YAML::Load(yaml_text);
    if (!root.IsMap()) throw Error(concat(yaml_name, ": expected an Accelerate config (a YAML mapping of keys)"));
    YamlBudget budget{yaml_name};
    acc = yaml_to_json(root, budget);
  } catch (const YAML::Exception& e) {
    throw Error(concat(yaml_name, ": not valid YAML: ", e.what()));
  }
  json ta = json::object();
  if (!args_json.empty()) {
    try {
      ta = parse_json_bounded(args_json, args_name);
    } catch (const json::exception& e) {
      throw Error(concat(args_name, ": not valid JSON: ", e.what()));
    }
    if (!ta.is_object()) throw Error(concat(args_name, ": expected a JSON object of TrainingArguments"));
  }
  Importer im(yaml_name, args_name);
  Source a{"accelerate", yaml_name, acc, ""};
  a.check_keys();
  Source t{"training_args", args_json.empty() ? "TrainingArguments" : args_name, ta, ""};
  t.check_keys();
  auto a_origin = [&](const char* k) { return a.origin(k, "Accelerate"); };
  auto t_origin = [&](const char* k) {
    return args_json.empty() ? concat("no --training-args: Trainer's default ", k, " = ", shown(t.get(k)))
                             : t.origin(k, "Trainer");
  };
  std::set<std::string> done_a, done_t;  // keys handled below; the rest go through the table

  // ---- deck keys from the command line ----
  for (const std::string& kv : deck_keys) {
    size_t eq = kv.find('=');
    if (kv.rfind("--", 0) != 0 || eq == std::string::npos || kv.find('.') > eq)
      throw Error(concat("expected a deck key as --section.key=value, got '", clip_for_message(kv), "'"));
    im.give(kv.substr(2, eq - 2), kv.substr(eq + 1), concat("command line: ", kv));
  }

  // ---- the launch: processes, machines, backend ----
  const std::string dist_type = upper(text(a.get("distributed_type"), yaml_name + ": distributed_type"));
  done_a.insert("distributed_type");
  if (dist_type != "FSDP" && dist_type != "MULTI_GPU" && dist_type != "NO" && dist_type != "MULTI_CPU")
    throw Error(concat(yaml_name, ": distributed_type ", dist_type,
                       ": shardlm imports FSDP configs (and MULTI_GPU, NO, MULTI_CPU, as NO_SHARD); it has no counterpart "
                       "for this one"));
  long long procs = whole(a.get("num_processes"), yaml_name + ": num_processes", 1);
  long long machines = whole(a.get("num_machines"), yaml_name + ": num_machines", 1);
  done_a.insert({"num_processes", "num_machines"});
  if (dist_type == "NO") procs = 1;
  if (a.given("num_machines"))
    im.unused(a_origin("num_machines"), machines > 1 ? "the job's nodes; HYBRID_SHARD's nodes are the real hosts"
                                                     : "one node");
  if (procs % machines != 0)
    throw Error(concat(yaml_name, ": num_processes ", procs, " is not a multiple of num_machines ", machines));

  bool cpu = truthy(a.get("use_cpu"), yaml_name + ": use_cpu") || dist_type == "MULTI_CPU";
  std::string cpu_origin = a_origin("use_cpu");
  for (const char* k : {"use_cpu", "no_cuda"})
    if (t.given(k) && truthy(t.get(k), args_name + ": " + k)) cpu = true, cpu_origin = t_origin(k);
  done_a.insert("use_cpu");
  done_t.insert({"use_cpu", "no_cuda"});
  if (!im.has("run.backend")) im.set("run.backend", cpu ? "cpu" : "cuda", cpu_origin);

  // ---- strategy and FSDP settings ----
  if (dist_type == "FSDP") {
    im.unused(a_origin("distributed_type"), "fully sharded data parallelism: the [fsdp] keys");
    Source fc{"fsdp_config", yaml_name + ": fsdp_config", a.given("fsdp_config") ? a.get("fsdp_config") : json::object(), ""};
    if (!fc.values.is_object()) throw Error(concat(yaml_name, ": fsdp_config: expected a mapping of keys"));
    fc.check_keys();
    import_fsdp_config(im, fc, false);
  } else {
    im.set("fsdp.strategy", "NO_SHARD",
           concat(yaml_name, ": distributed_type: ", dist_type, dist_type == "MULTI_GPU" ? " (DDP: every rank holds everything)" : ""));
    if (a.given("fsdp_config")) im.unused(a_origin("fsdp_config"), "distributed_type is not FSDP");
  }
  done_a.insert("fsdp_config");
  // TrainingArguments' own FSDP switches, applied over Accelerate's as Trainer does.
  if (t.given("fsdp") && !t.get("fsdp").is_null() && shown(t.get("fsdp")) != "" && t.get("fsdp") != json::array()) {
    std::vector<std::string> words;
    const json v = t.get("fsdp");
    if (v.is_array())
      for (const json& w : v) words.push_back(text(w, args_name + ": fsdp"));
    else if (v.is_boolean())
      words.push_back(v.get<bool>() ? "full_shard" : "");
    else
      for (std::istringstream in(text(v, args_name + ": fsdp")); in.good();) {
        std::string w;
        in >> w;
        if (!w.empty()) words.push_back(w);
      }
    for (const std::string& w : words) {
      if (w.empty()) continue;
      std::string u = upper(w);
      if (u == "OFFLOAD") {
        im.set("fsdp.cpu_offload", "true", t_origin("fsdp"));
      } else if (u == "AUTO_WRAP") {
      } else if (kStrategyNames.count(u) && u.size() > 1) {
        if (im.has("fsdp.strategy") && im.value("fsdp.strategy") != kStrategyNames.at(u))
          im.warn("fsdp.strategy", t_origin("fsdp"),
                  concat("replaces ", yaml_name, "'s ", im.value("fsdp.strategy"), ", as Trainer does"));
        im.set("fsdp.strategy", kStrategyNames.at(u), t_origin("fsdp"));
      } else {
        throw Error(concat(args_name, ": fsdp: unknown option '", clip_for_message(w),
                           "' (full_shard, shard_grad_op, hybrid_shard, hybrid_shard_zero2, no_shard, offload, auto_wrap)"));
      }
    }
  }
  done_t.insert("fsdp");
  if (t.given("fsdp_config") && !t.get("fsdp_config").is_null()) {
    Source fc{"fsdp_config", args_name + ": fsdp_config", t.get("fsdp_config"), "fsdp_"};
    if (!fc.values.is_object())
      throw Error(concat(args_name, ": fsdp_config: expected an object (a path to a JSON file is not read: paste its keys)"));
    fc.check_keys();
    import_fsdp_config(im, fc, true);
  }
  done_t.insert("fsdp_config");
  if (t.given("fsdp_transformer_layer_cls_to_wrap")) {
    Source fc{"fsdp_config", args_name, json{{"fsdp_transformer_layer_cls_to_wrap", t.get("fsdp_transformer_layer_cls_to_wrap")}}, ""};
    import_fsdp_config(im, fc, true);
    done_t.insert("fsdp_transformer_layer_cls_to_wrap");
  }
  if (im.value("fsdp.strategy").rfind("HYBRID", 0) == 0 && machines == 1)
    im.warn("fsdp.strategy", a_origin("num_machines"),
            "HYBRID_SHARD on one machine shards over all its ranks and replicates nothing; give dist.ranks_per_node "
            "to emulate nodes");
  if (cpu && im.value("fsdp.cpu_offload") == "true")
    im.warn("fsdp.cpu_offload", "run.backend cpu", "CPU offload changes nothing on the CPU backend");

  // ---- precision: TrainingArguments' bf16/fp16 win over Accelerate's mixed_precision, as in Trainer ----
  std::string mp = upper(text(a.get("mixed_precision"), yaml_name + ": mixed_precision"));
  std::string dtype_origin = a_origin("mixed_precision");
  done_a.insert("mixed_precision");
  const bool ta_bf16 = truthy(t.get("bf16"), args_name + ": bf16"), ta_fp16 = truthy(t.get("fp16"), args_name + ": fp16");
  done_t.insert({"bf16", "fp16"});
  if (ta_bf16 && ta_fp16) throw Error(concat(args_name, ": bf16 and fp16 are both true (Trainer refuses this too)"));
  if (ta_bf16 || ta_fp16) {
    std::string want = ta_bf16 ? "BF16" : "FP16";
    if (a.given("mixed_precision") && mp != "NO" && mp != want)
      im.warn("", t_origin(ta_bf16 ? "bf16" : "fp16"),
              concat("replaces ", yaml_name, "'s mixed_precision ", mp, ", as Trainer does"));
    mp = want;
    dtype_origin = t_origin(ta_bf16 ? "bf16" : "fp16");
  }
  std::string dtype = mp == "NO" ? "fp32" : mp == "BF16" ? "bf16" : mp == "FP16" ? "fp16" : mp == "FP8" ? "bf16" : "";
  if (dtype.empty())
    throw Error(concat(yaml_name, ": mixed_precision: unknown value '", clip_for_message(mp), "' (no, fp16, bf16 or fp8)"));
  im.set("fsdp.param_dtype", dtype, dtype_origin);
  im.set("fsdp.reduce_dtype", dtype, dtype_origin);
  if (mp == "FP8") im.warn("fsdp.param_dtype", dtype_origin, "shardlm has no fp8 training: bf16 instead");
  if (dtype == "fp16")
    im.set("train.loss_scale", "0", "fp16: dynamic loss scaling from 65536, doubling after 2000 good steps (Trainer's GradScaler)");
  if (ta_bf16 || ta_fp16) {
    if (a.given("mixed_precision")) im.unused(a_origin("mixed_precision"), "TrainingArguments' bf16/fp16 decide, as in Trainer");
  }
  if (dtype == "bf16" && !cpu)
    im.note("fsdp.param_dtype", "bf16 needs compute capability 8.0 or newer (A100, H100); on a V100: "
                                "--fsdp.param_dtype=fp16 --fsdp.reduce_dtype=fp16 (loss scaling turns itself on)");

  // ---- batch, epochs, schedule ----
  const char* pdtbs = t.given("per_gpu_train_batch_size") && !t.get("per_gpu_train_batch_size").is_null()
                          ? "per_gpu_train_batch_size" : "per_device_train_batch_size";
  long long micro = whole(t.get(pdtbs), args_name + ": " + pdtbs, 1);
  long long accum = whole(t.get("gradient_accumulation_steps"), args_name + ": gradient_accumulation_steps", 1);
  done_t.insert({"per_gpu_train_batch_size", "per_device_train_batch_size", "gradient_accumulation_steps"});
  im.set("train.micro_batch_size", std::to_string(micro), t_origin(pdtbs));
  im.set("train.batch_size", std::to_string(micro * accum * procs),
         concat("per-device batch ", micro, " x gradient_accumulation_steps ", accum, " x num_processes ", procs,
                ": the global batch (", t_origin("gradient_accumulation_steps"), "; ", a_origin("num_processes"), ")"));

  const double epochs = number(t.get("num_train_epochs"), args_name + ": num_train_epochs");
  if (!(epochs > 0)) throw Error(concat(args_name, ": num_train_epochs must be > 0"));
  im.set("train.epochs", std::to_string(static_cast<long long>(std::ceil(epochs))), t_origin("num_train_epochs"));
  if (epochs != std::ceil(epochs))
    im.warn("train.epochs", t_origin("num_train_epochs"),
            "shardlm runs whole epochs: rounded up; set train.max_steps to stop inside the last one");
  long long max_steps = whole(t.get("max_steps"), args_name + ": max_steps", -1);
  im.set("train.max_steps", std::to_string(std::max(0LL, max_steps)), t_origin("max_steps"));
  if (max_steps > 0)
    im.warn("train.max_steps", t_origin("max_steps"),
            "Trainer runs max_steps steps whatever num_train_epochs says; shardlm also stops at the end of train.epochs: "
            "raise train.epochs if the data set is shorter than max_steps global batches");
  done_t.insert({"num_train_epochs", "max_steps"});

  im.set("train.lr", number_text(number(t.get("learning_rate"), args_name + ": learning_rate")), t_origin("learning_rate"));
  const std::string sched = text(t.get("lr_scheduler_type"), args_name + ": lr_scheduler_type");
  // The schedules shardlm computes as transformers does (tests/test_schedules.cpp); others become linear.
  static const std::set<std::string> kSchedules = {"linear", "constant", "constant_with_warmup", "cosine",
                                                   "cosine_with_restarts", "polynomial", "cosine_with_min_lr"};
  if (kSchedules.count(sched)) {
    im.set("train.lr_schedule", sched, t_origin("lr_scheduler_type"));
  } else {
    im.set("train.lr_schedule", "linear", t_origin("lr_scheduler_type"));
    im.warn("train.lr_schedule", t_origin("lr_scheduler_type"),
            concat("shardlm has transformers' linear, constant, constant_with_warmup, cosine, cosine_with_restarts, "
                   "polynomial and cosine_with_min_lr schedules: linear decay instead of ", sched));
  }
  // lr_scheduler_kwargs: the schedules' arguments.
  const json kwargs = t.get("lr_scheduler_kwargs");
  if (kwargs.is_object()) {
    const double lr = number(t.get("learning_rate"), args_name + ": learning_rate");
    for (const auto& [name, value] : kwargs.items()) {
      const std::string origin = concat(t_origin("lr_scheduler_kwargs"), ".", name);
      const double v = number(value, concat(args_name, ": lr_scheduler_kwargs.", name));
      if (name == "num_cycles") im.set("train.lr_num_cycles", number_text(v), origin);
      else if (name == "power") im.set("train.lr_power", number_text(v), origin);
      else if (name == "lr_end") im.set("train.lr_end", number_text(v), origin);
      else if (name == "min_lr_rate") im.set("train.min_lr_ratio", number_text(v), origin);
      else if (name == "min_lr" && lr > 0) im.set("train.min_lr_ratio", number_text(v / lr), concat(origin, " / learning_rate"));
      else im.warn("", origin, "not done: shardlm's schedules take num_cycles, power, lr_end, min_lr_rate and min_lr");
    }
  }
  done_t.insert("lr_scheduler_kwargs");
  // Warm-up: steps, or a ratio of the run (warmup_ratio, or warmup_steps below 1 in transformers 5);
  // warmup_steps wins when both are set, as in Trainer.
  double warm = number(t.get("warmup_steps"), args_name + ": warmup_steps");
  const char* warm_key = "warmup_steps";
  double ratio = 0;
  if (warm > 0 && warm < 1) ratio = warm;
  if (t.given("warmup_ratio") && !t.get("warmup_ratio").is_null() && number(t.get("warmup_ratio"), args_name) > 0 && warm == 0)
    ratio = number(t.get("warmup_ratio"), args_name + ": warmup_ratio"), warm_key = "warmup_ratio";
  if (warm < 0 || ratio < 0 || ratio > 1) throw Error(concat(args_name, ": ", warm_key, " out of range"));
  if (sched == "constant" && (warm > 0 || ratio > 0)) {
    // Trainer's constant schedule ignores the warm-up; shardlm's deck refuses the pair.
    im.set("train.warmup_steps", "0", t_origin(warm_key));
    im.warn("train.warmup_steps", t_origin(warm_key),
            "Trainer's constant schedule ignores the warm-up, and so does this deck (use constant_with_warmup to warm up)");
  } else if (ratio > 0) {
    im.set("train.warmup_steps", "0", t_origin(warm_key));
    im.set("train.warmup_ratio", number_text(ratio), t_origin(warm_key));
  } else {
    if (warm != std::floor(warm)) throw Error(concat(args_name, ": warmup_steps above 1 must be whole"));
    im.set("train.warmup_steps", std::to_string(static_cast<long long>(warm)), t_origin("warmup_steps"));
  }
  done_t.insert({"learning_rate", "lr_scheduler_type", "warmup_steps", "warmup_ratio"});

  const std::string optim = text(t.get("optim"), args_name + ": optim");
  if (optim != "adamw_torch" && optim != "adamw_torch_fused" && optim != "adamw_hf" && optim != "adamw_apex_fused")
    im.warn("", t_origin("optim"), concat("shardlm's optimizer is AdamW (PyTorch's), not ", optim));
  else
    im.unused(t_origin("optim"), "AdamW, shardlm's optimizer");
  done_t.insert("optim");
  const struct { const char* from; const char* to; } numbers[] = {
      {"weight_decay", "train.weight_decay"}, {"adam_beta1", "train.adam_beta1"}, {"adam_beta2", "train.adam_beta2"},
      {"adam_epsilon", "train.adam_eps"},     {"max_grad_norm", "train.max_grad_norm"}};
  for (const auto& n : numbers) {
    im.set(n.to, number_text(number(t.get(n.from), args_name + ": " + n.from)), t_origin(n.from));
    done_t.insert(n.from);
  }
  // A flag shardlm always behaves as if set: a warning where it is off, else nothing to do.
  auto always_on = [&](const char* key, const char* deck_key, const char* why_off) {
    if (!truthy(t.get(key), args_name))
      im.warn(deck_key, t_origin(key), why_off);
    else
      im.unused(t_origin(key), "what shardlm always does");
    done_t.insert(key);
  };
  always_on("average_tokens_across_devices", "",
            "shardlm's loss is always the mean over the loss tokens of the whole global batch");
  im.set("train.seed", std::to_string(whole(t.get("seed"), args_name + ": seed", 0)), t_origin("seed"));
  done_t.insert("seed");
  const std::string sampling = text(t.get("train_sampling_strategy"), args_name + ": train_sampling_strategy");
  const bool grouped = t.given("group_by_length") && truthy(t.get("group_by_length"), args_name);
  im.set("train.shuffle", sampling == "sequential" ? "false" : "true", t_origin("train_sampling_strategy"));
  if (t.given("group_by_length")) im.note("train.shuffle", t_origin("group_by_length"));
  if (sampling == "group_by_length" || grouped)
    im.warn("train.shuffle", t_origin(grouped ? "group_by_length" : "train_sampling_strategy"),
            "shardlm draws samples in a seeded random order, not grouped by length");
  done_t.insert({"train_sampling_strategy", "group_by_length"});
  always_on("dataloader_drop_last", "train.batch_size",
            "shardlm drops the last incomplete global batch of every epoch; Trainer runs it");

  // ---- activation checkpointing ----
  if (truthy(t.get("gradient_checkpointing"), args_name + ": gradient_checkpointing"))
    im.set("fsdp.activation_checkpointing", "true", t_origin("gradient_checkpointing"));
  else if (!im.has("fsdp.activation_checkpointing"))
    im.set("fsdp.activation_checkpointing", "false", t_origin("gradient_checkpointing"));
  done_t.insert("gradient_checkpointing");

  // ---- logging, evaluation, checkpoints, output ----
  const std::string log_strategy = text(t.get("logging_strategy"), args_name + ": logging_strategy");
  const double log_steps = number(t.get("logging_steps"), args_name + ": logging_steps");
  if (log_strategy == "steps" && log_steps >= 1 && log_steps == std::floor(log_steps)) {
    im.set("train.log_every", std::to_string(static_cast<long long>(log_steps)), t_origin("logging_steps"));
    if (t.given("logging_strategy")) im.unused(t_origin("logging_strategy"), "train.log_every, from logging_steps");
  } else {
    im.set("train.log_every", "1", t_origin(log_strategy == "steps" ? "logging_steps" : "logging_strategy"));
    im.warn("train.log_every", t_origin(log_strategy == "steps" ? "logging_steps" : "logging_strategy"),
            "shardlm logs every train.log_every optimizer steps: every step here");
  }
  done_t.insert({"logging_strategy", "logging_steps"});

  const char* eval_key = t.given("evaluation_strategy") && !t.given("eval_strategy") ? "evaluation_strategy" : "eval_strategy";
  const std::string eval_strategy = text(t.get(eval_key), args_name + ": " + eval_key);
  const bool eval_file = !im.value("data.eval_file").empty();
  if (eval_strategy == "steps") {
    // eval_steps defaults to logging_steps in Trainer; a fraction below 1 is a ratio of the run.
    const json es = t.get("eval_steps");
    const double steps = es.is_null() ? number(t.get("logging_steps"), args_name + ": logging_steps")
                                      : number(es, args_name + ": eval_steps");
    const std::string origin = t_origin(es.is_null() ? "logging_steps" : "eval_steps");
    if (steps >= 1 && steps == std::floor(steps) && eval_file) {
      im.set("eval.every_steps", std::to_string(static_cast<long long>(steps)), origin);
      im.warn("eval.every_steps", origin, "shardlm also evaluates after each epoch");
    } else if (!eval_file) {
      im.warn("", t_origin(eval_key), "evaluation needs data.eval_file: give --data.eval_file=FILE, then set eval.every_steps");
    } else {
      im.warn("eval.every_steps", origin, "a fraction of the run is not done: set eval.every_steps to a step count");
    }
  } else if (eval_strategy == "no" && eval_file)
    im.warn("data.eval_file", t_origin(eval_key), "shardlm evaluates after each epoch when data.eval_file is set");
  else if (eval_strategy == "epoch" && !eval_file)
    im.warn("", t_origin(eval_key), "evaluation needs data.eval_file: give --data.eval_file=FILE");
  else if (eval_strategy == "epoch")
    im.unused(t_origin(eval_key), "evaluation after each epoch on data.eval_file");
  else
    im.unused(t_origin(eval_key), "no evaluation: no data.eval_file");
  done_t.insert("eval_steps");
  // load_best_model_at_end with the eval loss: the best checkpoint is kept (and named by DIR/best).
  if (truthy(t.get("load_best_model_at_end"), args_name + ": load_best_model_at_end")) {
    const json metric = t.get("metric_for_best_model");
    const std::string m = metric.is_null() ? "loss" : text(metric, args_name + ": metric_for_best_model");
    if ((m == "loss" || m == "eval_loss") && eval_file) {
      im.set("checkpoint.keep_best", "eval_loss", t_origin("load_best_model_at_end"));
      im.warn("checkpoint.keep_best", t_origin("load_best_model_at_end"),
              "shardlm keeps the best checkpoint (DIR/best names it) instead of loading it at the end: export it "
              "with shardlm export");
    } else if (!eval_file) {
      im.warn("", t_origin("load_best_model_at_end"), "the best model needs data.eval_file: give --data.eval_file=FILE");
    } else {
      im.warn("", t_origin("metric_for_best_model"), concat("not done: shardlm keeps the best by eval_loss only, not ", m));
    }
  }
  done_t.insert({"load_best_model_at_end", "metric_for_best_model"});
  done_t.insert({"eval_strategy", "evaluation_strategy"});
  const char* pdebs = t.given("per_gpu_eval_batch_size") && !t.get("per_gpu_eval_batch_size").is_null()
                          ? "per_gpu_eval_batch_size" : "per_device_eval_batch_size";
  im.set("eval.batch_size", std::to_string(whole(t.get(pdebs), args_name + ": " + pdebs, 1)), t_origin(pdebs));
  done_t.insert({"per_device_eval_batch_size", "per_gpu_eval_batch_size"});

  const std::string save_strategy = text(t.get("save_strategy"), args_name + ": save_strategy");
  const double save_steps = number(t.get("save_steps"), args_name + ": save_steps");
  if (save_strategy == "no") {
    im.set("checkpoint.every", "0", t_origin("save_strategy"));
    im.set("checkpoint.at_end", "false", t_origin("save_strategy"));
  } else if (save_strategy == "epoch") {
    im.set("checkpoint.every", "0", t_origin("save_strategy"));
    im.set("checkpoint.every_epoch", "true", t_origin("save_strategy"));
  } else if (save_strategy == "steps" && save_steps >= 1 && save_steps == std::floor(save_steps)) {
    im.set("checkpoint.every", std::to_string(static_cast<long long>(save_steps)), t_origin("save_steps"));
    if (t.given("save_strategy")) im.unused(t_origin("save_strategy"), "checkpoint.every, from save_steps");
  } else {
    im.set("checkpoint.every", "0", t_origin(save_strategy == "steps" ? "save_steps" : "save_strategy"));
    im.warn("checkpoint.every", t_origin(save_strategy == "steps" ? "save_steps" : "save_strategy"),
            save_strategy == "best"
                ? "shardlm checkpoints every checkpoint.every optimizer steps, every epoch (checkpoint.every_epoch) and "
                  "at the end, and keeps the best by eval loss with checkpoint.keep_best: only at the end here"
                : "a fraction of the run is not done: shardlm checkpoints every checkpoint.every optimizer steps and at "
                  "the end; only at the end here");
  }
  const json limit = t.get("save_total_limit");
  im.set("checkpoint.keep_last", limit.is_null() ? "0" : std::to_string(whole(limit, args_name + ": save_total_limit", 0)),
         t_origin("save_total_limit"));
  done_t.insert({"save_strategy", "save_steps", "save_total_limit"});
  if (!im.has("run.dir"))
    im.set("run.dir", text(t.get("output_dir"), args_name + ": output_dir"), t_origin("output_dir"));
  done_t.insert("output_dir");

  // ---- every other key: no deck key; a warning where it asks for what shardlm does not do ----
  auto rest = [&](const Source& s, const std::set<std::string>& done) {
    for (const auto& [key, v] : s.values.items()) {
      if (done.count(key)) continue;
      const ForeignKey* k = find_foreign_key(s.table, key);
      const std::string origin = concat(s.where, ": ", key, ": ", clip_for_message(shown(v), 80));
      // An empty value ("", [], {}, null) asks for nothing, whichever of them the default is spelled as.
      const auto empty = [](const json& x) {
        return x.is_null() || (x.is_string() && x.get<std::string>().empty()) || ((x.is_array() || x.is_object()) && x.empty());
      };
      bool is_default = v == json::parse(k->default_json) || (empty(v) && empty(json::parse(k->default_json))) ||
                        (key == "report_to" && (v == "none" || v == json::array() || v == json::array({"none"})));
      if (key == "compute_environment" && upper(shown(v)) != "LOCAL_MACHINE") is_default = false;
      if (k->use == ForeignKeyUse::NotDone && !is_default)
        im.warn("", origin, concat("not done: ", k->deck));
      else
        im.unused(origin, k->deck);
    }
  };
  rest(a, done_a);
  rest(t, done_t);

  // ---- what neither file says ----
  if (!im.has("model.dir") && !im.has("model.hidden_size"))
    im.warn("", "model", "neither file names the model: give --model.dir=PATH (a Hugging Face model directory) "
                         "before `shardlm train`, or edit the deck");
  if (!im.has("data.train_file"))
    im.warn("", "data", "neither file names the training data: give --data.train_file=FILE (and --data.format) "
                        "before `shardlm train`, or edit the deck");

  std::vector<std::string> header = {
      concat("Written by: ", command_line),
      concat("From the Accelerate config ", yaml_name,
             args_json.empty() ? std::string(" and Trainer's defaults (no TrainingArguments)") : concat(" and the TrainingArguments ", args_name),
             ". Each key says where it came from; \"warning:\" lines say what shardlm does differently."),
      concat("The batch is written for ", procs, " rank(s) (num_processes ", procs, " over num_machines ", machines,
             "): mpirun -np ", procs, " shardlm train THIS_DECK (one rank per GPU)"),
  };
  AccelerateImport out;
  out.deck = im.deck(header);
  out.warnings = im.warnings();
  out.ranks = static_cast<int>(procs);
  return out;
}

}  // namespace shardlm
