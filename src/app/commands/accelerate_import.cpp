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

// The deck's sections in the resolved deck's order.
const char* kSections[] = {"model", "lora", "data", "train", "fsdp", "eval", "dist", "checkpoint", "run"};

struct DeckEntry {
  std::string value;
  std::string origin;              // where the value came from
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
    e.origin = origin;
    e.notes.push_back(origin);
  }
  // A key given on the command line: kept whatever the files say.
  void give(const std::string& key, const std::string& value, const std::string& origin) {
    set(key, value, origin);
    given_.insert(key);
  }
  // Every key and value as `shardlm train` reads them (the deck's own key table and ranges), so no deck
  // is written that train refuses key by key: Error naming the key, and the file key it came from.
  void check() const {
    for (const auto& [key, e] : entries_) {
      if (given_.count(key)) {
        check_deck_value(key, e.value, "on the command line");
        continue;
      }
      try {
        check_deck_value(key, e.value, "in the deck");
      } catch (const Error& error) {
        throw Error(concat(e.origin, ": ", error.what()));
      }
    }
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
  // The FSDP version of Accelerate's fsdp_config, which a TrainingArguments fsdp_config without one keeps.
  long long fsdp_version = 1;
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

// The keys of one source in a file, each checked against its table (or tables): an unknown key is an
// error naming the nearest known one.
struct Source {
  Source(const char* table_, std::string where_, json values_, std::string prefix_, const char* also_ = nullptr)
      : table(table_), where(std::move(where_)), values(std::move(values_)), prefix(std::move(prefix_)), also(also_) {}
  const char* table;   // ForeignKey::source
  std::string where;   // "FILE" or "FILE fsdp_config" for messages
  json values;         // the file's object
  std::string prefix;  // added to a key before the table lookup (TrainingArguments' fsdp_config: "fsdp_")
  const char* also;    // a second table for the same file (TRL's SFTConfig keys beside TrainingArguments')
  // Defaults that replace the table's for absent keys (SFTConfig's own), each with whose default it is.
  std::map<std::string, std::pair<std::string, std::string>> defaults;

  const ForeignKey* find(const std::string& name) const {
    const ForeignKey* k = find_foreign_key(table, name);
    return k || !also ? k : find_foreign_key(also, name);
  }
  // The table's name of a key of the file ("" when the table has none): TrainingArguments'
  // fsdp_config takes its keys with or without the fsdp_ prefix, as Trainer does.
  std::string canonical(const std::string& key) const {
    if (find(key)) return key;
    if (!prefix.empty() && find(prefix + key)) return prefix + key;
    return "";
  }
  void check_keys() const {
    for (const auto& [key, v] : values.items()) {
      if (!canonical(key).empty()) continue;
      std::string best;
      size_t best_d = 4;
      for (const ForeignKey& k : foreign_keys()) {
        if (std::string(k.source) != table && (!also || std::string(k.source) != also)) continue;
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
  // Whether the file names a key of table `t`.
  bool names_any_of(const char* t) const {
    for (const auto& [key, v] : values.items())
      if (find_foreign_key(t, key)) return true;
    return false;
  }
  // The value, or the default when the key is absent.
  json get(const std::string& name) const {
    if (given(name)) return values.at(spelled(name));
    if (defaults.count(name)) return json::parse(defaults.at(name).first);
    return json::parse(find(name)->default_json);
  }
  // "FILE: key: value" or "FILE: key absent: Accelerate's default value".
  std::string origin(const std::string& name, const char* whose) const {
    if (given(name)) return concat(where, ": ", spelled(name), ": ", clip_for_message(shown(get(name)), 80));
    const std::string owner = defaults.count(name) ? defaults.at(name).second : std::string(whose);
    return concat(where, ": ", name, " absent: ", owner, "'s default ", shown(get(name)));
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

// One fsdp_config block into the deck. Trainer's fsdp_config changes only what it names; Accelerate's
// sets everything (absent keys: its defaults).
class FsdpConfigImport {
 public:
  FsdpConfigImport(Importer& im, const Source& fc, bool from_trainer) : im_(im), fc_(fc), from_trainer_(from_trainer) {}
  void run() {
    version_ = given("fsdp_version") || !from_trainer_ ? whole(fc_.get("fsdp_version"), fc_.where + ": fsdp_version", 1)
                                                       : im_.fsdp_version;
    if (version_ > 2) throw Error(concat(fc_.where, ": fsdp_version: expected 1 or 2, got ", version_));
    im_.fsdp_version = version_;
    strategy();
    offload_and_forward_prefetch();
    prefetch();
    checkpointing_and_gather_limit();
    wrapping();
    state_dict();
    rest();
  }

 private:
  Importer& im_;
  const Source& fc_;
  bool from_trainer_;
  long long version_ = 1;

  bool given(const char* k) const { return fc_.given(k); }
  std::string origin(const char* k) const { return fc_.origin(k, "Accelerate"); }
  bool touch(const char* k) const { return !from_trainer_ || given(k); }
  bool flag(const char* k) const { return truthy(fc_.get(k), fc_.where); }

  // fsdp_version 2 takes the strategy from fsdp_reshard_after_forward, version 1 from
  // fsdp_sharding_strategy (or, in Accelerate 1.6+, a strategy name in fsdp_reshard_after_forward).
  void strategy() {
    const long long version = version_;
    if (given("fsdp_version")) im_.unused(origin("fsdp_version"), "the FSDP version; the strategy below says what is sharded");
    if (given("fsdp_reshard_after_forward") || (version == 2 && !from_trainer_)) {
      const json v = fc_.get("fsdp_reshard_after_forward");
      const bool is_flag = v.is_boolean() || (v.is_string() && (upper(v.get<std::string>()) == "TRUE" ||
                                                                upper(v.get<std::string>()) == "FALSE"));
      const std::string s = is_flag ? (flag("fsdp_reshard_after_forward") ? "FULL_SHARD" : "SHARD_GRAD_OP")
                                    : strategy_name(v, fc_.where + ": fsdp_reshard_after_forward");
      im_.set("fsdp.strategy", s, origin("fsdp_reshard_after_forward"));
      if (given("fsdp_sharding_strategy"))
        im_.unused(origin("fsdp_sharding_strategy"), "fsdp_reshard_after_forward decides the strategy");
    } else if (touch("fsdp_sharding_strategy")) {
      im_.set("fsdp.strategy", strategy_name(fc_.get("fsdp_sharding_strategy"), fc_.where + ": fsdp_sharding_strategy"),
              origin("fsdp_sharding_strategy"));
    }
  }

  void offload_and_forward_prefetch() {
    if (touch("fsdp_offload_params"))
      im_.set("fsdp.cpu_offload", flag("fsdp_offload_params") ? "true" : "false", origin("fsdp_offload_params"));
    if (version_ == 2) {
      forward_prefetch_fsdp2();
      return;
    }
    if (touch("fsdp_forward_prefetch"))
      im_.set("fsdp.forward_prefetch", flag("fsdp_forward_prefetch") ? "true" : "false", origin("fsdp_forward_prefetch"));
  }

  // FSDP2 gathers a block when its forward needs it (prefetching the next forward only where a script
  // calls set_modules_to_forward_prefetch) and Accelerate does not implement fsdp_forward_prefetch for it
  // (its FSDP1-vs-FSDP2 guide): false, the way such a run goes.
  void forward_prefetch_fsdp2() {
    const char* why = "FSDP2 in Accelerate has no forward prefetch: each block is gathered when its forward needs it";
    if (!given("fsdp_forward_prefetch")) {
      if (!from_trainer_) im_.set("fsdp.forward_prefetch", "false", concat(fc_.where, ": fsdp_version 2: ", why));
      return;
    }
    im_.set("fsdp.forward_prefetch", "false", origin("fsdp_forward_prefetch"));
    if (flag("fsdp_forward_prefetch"))
      im_.warn("fsdp.forward_prefetch", origin("fsdp_forward_prefetch"),
               concat("not done with fsdp_version 2 (", why, "; Accelerate refuses or ignores the key): false here; "
                      "set fsdp.forward_prefetch = true to prefetch anyway"));
  }

  void checkpointing_and_gather_limit() {
    if (touch("fsdp_activation_checkpointing") && flag("fsdp_activation_checkpointing"))
      im_.set("fsdp.activation_checkpointing", "true", origin("fsdp_activation_checkpointing"));
    else if (given("fsdp_activation_checkpointing"))
      im_.unused(origin("fsdp_activation_checkpointing"), "off, as in the deck unless gradient_checkpointing turns it on");
    if (given("fsdp_limit_all_gathers")) {
      im_.set("fsdp.limit_all_gathers", "2", origin("fsdp_limit_all_gathers"));
      if (!flag("fsdp_limit_all_gathers"))
        im_.warn("fsdp.limit_all_gathers", origin("fsdp_limit_all_gathers"),
                 "shardlm always limits the gathered blocks in flight (fsdp.limit_all_gathers, 2 here); raise it for more overlap");
    }
  }

  void prefetch() {
    const char* key = given("fsdp_backward_prefetch_policy") && !given("fsdp_backward_prefetch")
                          ? "fsdp_backward_prefetch_policy" : "fsdp_backward_prefetch";
    if (version_ == 2) {
      backward_prefetch_fsdp2(key);
    } else if (touch(key)) {
      const json v = fc_.get(key);
      const std::string p = v.is_null() ? "NO_PREFETCH" : upper(text(v, fc_.where + ": " + key));
      const std::map<std::string, std::string> names = {{"BACKWARD_PRE", "pre"}, {"BACKWARD_POST", "post"},
                                                        {"NO_PREFETCH", "none"}, {"1", "pre"}, {"2", "post"}, {"3", "none"}};
      if (!names.count(p))
        throw Error(concat(fc_.where, ": ", key, ": unknown value '", clip_for_message(p),
                           "' (BACKWARD_PRE, BACKWARD_POST or NO_PREFETCH)"));
      im_.set("fsdp.backward_prefetch", names.at(p), origin(key));
    }
    if (given("fsdp_backward_prefetch_policy") && key != std::string("fsdp_backward_prefetch_policy"))
      im_.unused(origin("fsdp_backward_prefetch_policy"), "fsdp_backward_prefetch wins");
  }

  // FSDP2 has no backward prefetch setting: it always queues the next block's all-gather before the
  // current block's backward, which is FSDP1's BACKWARD_PRE, and Accelerate drops fsdp_backward_prefetch
  // with a warning (its FSDP1-vs-FSDP2 guide: removed, "FSDP2 uses BACKWARD_PRE by default").
  void backward_prefetch_fsdp2(const char* key) {
    const char* why = "FSDP2 always prefetches the next block before this block's backward, as FSDP1's BACKWARD_PRE";
    if (!given(key)) {
      if (!from_trainer_ || given("fsdp_version"))
        im_.set("fsdp.backward_prefetch", "pre", concat(fc_.where, ": fsdp_version 2: ", why));
      return;
    }
    im_.set("fsdp.backward_prefetch", "pre", origin(key));
    const json v = fc_.get(key);
    const std::string p = v.is_null() ? "" : upper(text(v, fc_.where + ": " + key));
    if (p != "BACKWARD_PRE" && p != "1")
      im_.warn("fsdp.backward_prefetch", origin(key),
               concat("ignored with fsdp_version 2 (Accelerate drops it with a warning): ", why, ", so pre here"));
  }

  // The classes fsdp_transformer_layer_cls_to_wrap names: a list, or one string split at commas.
  std::vector<std::string> wrap_classes() const {
    const json v = fc_.get("fsdp_transformer_layer_cls_to_wrap");
    const std::string what = fc_.where + ": fsdp_transformer_layer_cls_to_wrap";
    std::vector<std::string> classes;
    if (v.is_array())
      for (const json& c : v) classes.push_back(text(c, what));
    else
      for (std::istringstream in(text(v, what)); in.good();) {
        std::string c;
        std::getline(in, c, ',');
        c.erase(0, c.find_first_not_of(' '));
        c.erase(c.find_last_not_of(' ') + 1);
        if (!c.empty()) classes.push_back(c);
      }
    return classes;
  }

  // Wrapping: shardlm wraps each transformer block.
  void wrapping() {
    if (touch("fsdp_auto_wrap_policy")) {
      const json v = fc_.get("fsdp_auto_wrap_policy");
      const std::string policy = v.is_null() ? "NO_WRAP" : upper(text(v, fc_.where + ": fsdp_auto_wrap_policy"));
      if (policy == "TRANSFORMER_BASED_WRAP")
        im_.unused(origin("fsdp_auto_wrap_policy"), "shardlm wraps each transformer block, as this policy does");
      else if (policy == "SIZE_BASED_WRAP" || policy == "NO_WRAP")
        im_.warn("", origin("fsdp_auto_wrap_policy"),
                 "shardlm wraps each transformer block (TRANSFORMER_BASED_WRAP): per-rank memory and all-gather sizes "
                 "differ from this policy's");
      else
        throw Error(concat(fc_.where, ": fsdp_auto_wrap_policy: unknown policy '", clip_for_message(policy),
                           "' (TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP or NO_WRAP)"));
    }
    if (!given("fsdp_transformer_layer_cls_to_wrap")) return;
    const std::vector<std::string> classes = wrap_classes();
    bool all_blocks = !classes.empty();
    for (const std::string& c : classes)
      all_blocks = all_blocks && std::find(kBlockClasses.begin(), kBlockClasses.end(), c) != kBlockClasses.end();
    if (all_blocks)
      im_.unused(origin("fsdp_transformer_layer_cls_to_wrap"), "the block shardlm wraps for this family");
    else
      im_.warn("", origin("fsdp_transformer_layer_cls_to_wrap"),
               concat("shardlm wraps the transformer block of its families (", hf_block_class_names(),
                      "), whatever this names"));
  }

  // The checkpoint format.
  void state_dict() {
    if (!touch("fsdp_state_dict_type")) return;
    const std::string t = upper(text(fc_.get("fsdp_state_dict_type"), fc_.where + ": fsdp_state_dict_type"));
    if (t != "FULL_STATE_DICT" && t != "SHARDED_STATE_DICT" && t != "LOCAL_STATE_DICT")
      throw Error(concat(fc_.where, ": fsdp_state_dict_type: unknown type '", clip_for_message(t),
                         "' (FULL_STATE_DICT, SHARDED_STATE_DICT or LOCAL_STATE_DICT)"));
    im_.warn("", origin("fsdp_state_dict_type"),
             t == "FULL_STATE_DICT"
                 ? "shardlm's checkpoints are one HDF5 file with every rank's slices, not a full state dict gathered on "
                   "rank 0; `shardlm export` writes the full model as safetensors"
                 : "shardlm's checkpoints are one HDF5 file with every rank's slices (sharded, as asked), not "
                   "torch.distributed.checkpoint folders: Accelerate cannot load them; `shardlm export` writes safetensors");
  }

  // What no deck key needs, and what shardlm does not do: every other key of the block.
  void rest() {
    static const std::set<std::string> handled = {
        "fsdp_version", "fsdp_reshard_after_forward", "fsdp_sharding_strategy", "fsdp_offload_params",
        "fsdp_forward_prefetch", "fsdp_backward_prefetch", "fsdp_backward_prefetch_policy",
        "fsdp_activation_checkpointing", "fsdp_limit_all_gathers", "fsdp_auto_wrap_policy",
        "fsdp_transformer_layer_cls_to_wrap", "fsdp_state_dict_type"};
    for (const auto& [key, v] : fc_.values.items()) {
      const std::string name = fc_.canonical(key);
      if (handled.count(name)) continue;
      const ForeignKey* k = find_foreign_key("fsdp_config", name);
      if (k->use == ForeignKeyUse::NotDone && v != json::parse(k->default_json))
        im_.warn("", concat(fc_.where, ": ", key, ": ", shown(v)), concat("not done: ", k->deck));
      else
        im_.unused(concat(fc_.where, ": ", key, ": ", shown(v)), k->deck);
    }
  }
};

void import_fsdp_config(Importer& im, const Source& fc, bool from_trainer) { FsdpConfigImport(im, fc, from_trainer).run(); }

// ---- TrainingArguments (and TRL's SFTConfig) with the Accelerate config: one conversion ----------

// TRL's SFTConfig changes these TrainingArguments defaults (its docstring's note); they apply when the
// file names an SFTConfig key. bf16 is "true unless fp16" there: fp16's own default decides below.
const std::map<std::string, std::pair<std::string, std::string>> kSftDefaults = {
    {"learning_rate", {"2e-05", "SFTConfig"}},
    {"logging_steps", {"10", "SFTConfig"}},
    {"gradient_checkpointing", {"true", "SFTConfig"}}};

class Conversion {
 public:
  Conversion(const json& acc, const std::string& yaml_name, const json& ta, const std::string& args_name, bool no_args)
      : im_(yaml_name, args_name), a_{"accelerate", yaml_name, acc, ""},
        t_{"training_args", no_args ? "TrainingArguments" : args_name, ta, "", "sft_config"},
        yaml_(yaml_name), args_(args_name), no_args_(no_args) {
    a_.check_keys();
    t_.check_keys();
    sft_ = t_.names_any_of("sft_config");
    if (sft_) t_.defaults = kSftDefaults;
  }

  AccelerateImport run(const std::vector<std::string>& deck_keys, const std::string& command_line) {
    command_line_keys(deck_keys);
    launch();
    strategy();
    trainer_fsdp();
    precision();
    batch_and_epochs();
    schedule();
    warmup();
    optimizer_and_sampling();
    activation_checkpointing();
    logging();
    evaluation();
    best_model();
    checkpoints();
    if (sft_) sft_data();
    rest(a_, done_a_);
    rest(t_, done_t_);
    return result(command_line);
  }

 private:
  Importer im_;
  Source a_, t_;
  std::string yaml_, args_;
  bool no_args_, sft_ = false, cpu_ = false;
  long long procs_ = 1, machines_ = 1;
  std::set<std::string> done_a_, done_t_;  // keys handled by name; the rest go through the tables

  std::string a_origin(const char* k) const { return a_.origin(k, "Accelerate"); }
  std::string t_origin(const char* k) const {
    return no_args_ ? concat("no --training-args: Trainer's default ", k, " = ", shown(t_.get(k))) : t_.origin(k, "Trainer");
  }
  double t_number(const char* k) const { return number(t_.get(k), args_ + ": " + k); }
  bool t_flag(const char* k) const { return truthy(t_.get(k), args_ + ": " + k); }

  void command_line_keys(const std::vector<std::string>& deck_keys) {
    for (const std::string& kv : deck_keys) {
      size_t eq = kv.find('=');
      if (kv.rfind("--", 0) != 0 || eq == std::string::npos || kv.find('.') > eq)
        throw Error(concat("expected a deck key as --section.key=value, got '", clip_for_message(kv), "'"));
      im_.give(kv.substr(2, eq - 2), kv.substr(eq + 1), concat("command line: ", kv));
    }
  }

  // The launch: processes, machines, backend.
  void launch() {
    const std::string dist_type = upper(text(a_.get("distributed_type"), yaml_ + ": distributed_type"));
    if (dist_type != "FSDP" && dist_type != "MULTI_GPU" && dist_type != "NO" && dist_type != "MULTI_CPU")
      throw Error(concat(yaml_, ": distributed_type ", dist_type,
                         ": shardlm imports FSDP configs (and MULTI_GPU, NO, MULTI_CPU, as NO_SHARD); it has no counterpart "
                         "for this one"));
    procs_ = whole(a_.get("num_processes"), yaml_ + ": num_processes", 1);
    machines_ = whole(a_.get("num_machines"), yaml_ + ": num_machines", 1);
    done_a_.insert({"num_processes", "num_machines"});
    if (dist_type == "NO") procs_ = 1;
    if (a_.given("num_machines"))
      im_.unused(a_origin("num_machines"), machines_ > 1 ? "the job's nodes; HYBRID_SHARD's nodes are the real hosts"
                                                         : "one node");
    if (procs_ % machines_ != 0)
      throw Error(concat(yaml_, ": num_processes ", procs_, " is not a multiple of num_machines ", machines_));

    cpu_ = truthy(a_.get("use_cpu"), yaml_ + ": use_cpu") || dist_type == "MULTI_CPU";
    std::string cpu_origin = a_origin("use_cpu");
    for (const char* k : {"use_cpu", "no_cuda"})
      if (t_.given(k) && t_flag(k)) cpu_ = true, cpu_origin = t_origin(k);
    done_a_.insert("use_cpu");
    done_t_.insert({"use_cpu", "no_cuda"});
    if (!im_.has("run.backend")) im_.set("run.backend", cpu_ ? "cpu" : "cuda", cpu_origin);
  }

  // The strategy and FSDP settings of the Accelerate config.
  void strategy() {
    const std::string dist_type = upper(text(a_.get("distributed_type"), yaml_ + ": distributed_type"));
    done_a_.insert({"distributed_type", "fsdp_config"});
    if (dist_type == "FSDP") {
      im_.unused(a_origin("distributed_type"), "fully sharded data parallelism: the [fsdp] keys");
      Source fc{"fsdp_config", yaml_ + ": fsdp_config", a_.given("fsdp_config") ? a_.get("fsdp_config") : json::object(), ""};
      if (!fc.values.is_object()) throw Error(concat(yaml_, ": fsdp_config: expected a mapping of keys"));
      fc.check_keys();
      import_fsdp_config(im_, fc, false);
    } else {
      im_.set("fsdp.strategy", "NO_SHARD",
              concat(yaml_, ": distributed_type: ", dist_type, dist_type == "MULTI_GPU" ? " (DDP: every rank holds everything)" : ""));
      if (a_.given("fsdp_config")) im_.unused(a_origin("fsdp_config"), "distributed_type is not FSDP");
    }
  }

  // The words of TrainingArguments' fsdp ("full_shard offload auto_wrap", a list, or a boolean).
  std::vector<std::string> fsdp_words() const {
    std::vector<std::string> words;
    const json v = t_.get("fsdp");
    if (v.is_array())
      for (const json& w : v) words.push_back(text(w, args_ + ": fsdp"));
    else if (v.is_boolean())
      words.push_back(v.get<bool>() ? "full_shard" : "");
    else
      for (std::istringstream in(text(v, args_ + ": fsdp")); in.good();) {
        std::string w;
        in >> w;
        if (!w.empty()) words.push_back(w);
      }
    return words;
  }

  // TrainingArguments' own FSDP switches, applied over Accelerate's as Trainer does.
  void trainer_fsdp() {
    done_t_.insert({"fsdp", "fsdp_config"});
    const bool words = t_.given("fsdp") && !t_.get("fsdp").is_null() && shown(t_.get("fsdp")) != "" && t_.get("fsdp") != json::array();
    for (const std::string& w : words ? fsdp_words() : std::vector<std::string>{}) {
      if (w.empty()) continue;
      const std::string u = upper(w);
      if (u == "OFFLOAD") {
        im_.set("fsdp.cpu_offload", "true", t_origin("fsdp"));
      } else if (u == "AUTO_WRAP") {
      } else if (kStrategyNames.count(u) && u.size() > 1) {
        if (im_.has("fsdp.strategy") && im_.value("fsdp.strategy") != kStrategyNames.at(u))
          im_.warn("fsdp.strategy", t_origin("fsdp"), concat("replaces ", yaml_, "'s ", im_.value("fsdp.strategy"), ", as Trainer does"));
        im_.set("fsdp.strategy", kStrategyNames.at(u), t_origin("fsdp"));
      } else {
        throw Error(concat(args_, ": fsdp: unknown option '", clip_for_message(w),
                           "' (full_shard, shard_grad_op, hybrid_shard, hybrid_shard_zero2, no_shard, offload, auto_wrap)"));
      }
    }
    if (t_.given("fsdp_config") && !t_.get("fsdp_config").is_null()) {
      Source fc{"fsdp_config", args_ + ": fsdp_config", t_.get("fsdp_config"), "fsdp_"};
      if (!fc.values.is_object())
        throw Error(concat(args_, ": fsdp_config: expected an object (a path to a JSON file is not read: paste its keys)"));
      fc.check_keys();
      import_fsdp_config(im_, fc, true);
    }
    if (t_.given("fsdp_transformer_layer_cls_to_wrap")) {
      Source fc{"fsdp_config", args_, json{{"fsdp_transformer_layer_cls_to_wrap", t_.get("fsdp_transformer_layer_cls_to_wrap")}}, ""};
      import_fsdp_config(im_, fc, true);
      done_t_.insert("fsdp_transformer_layer_cls_to_wrap");
    }
    if (im_.value("fsdp.strategy").rfind("HYBRID", 0) == 0 && machines_ == 1)
      im_.warn("fsdp.strategy", a_origin("num_machines"),
               "HYBRID_SHARD on one machine shards over all its ranks and replicates nothing; give dist.ranks_per_node "
               "to emulate nodes");
    if (cpu_ && im_.value("fsdp.cpu_offload") == "true")
      im_.warn("fsdp.cpu_offload", "run.backend cpu", "CPU offload changes nothing on the CPU backend");
  }

  // Precision: TrainingArguments' bf16/fp16 win over Accelerate's mixed_precision, as in Trainer
  // (SFTConfig's bf16 is true unless fp16 is).
  void precision() {
    std::string mp = upper(text(a_.get("mixed_precision"), yaml_ + ": mixed_precision"));
    std::string dtype_origin = a_origin("mixed_precision");
    done_a_.insert("mixed_precision");
    const bool ta_fp16 = t_flag("fp16");
    const bool sft_bf16 = sft_ && !t_.given("bf16") && !ta_fp16;
    const bool ta_bf16 = sft_bf16 || t_flag("bf16");
    done_t_.insert({"bf16", "fp16"});
    if (ta_bf16 && ta_fp16) throw Error(concat(args_, ": bf16 and fp16 are both true (Trainer refuses this too)"));
    const std::string ta_origin = sft_bf16 ? concat(t_.where, ": bf16 absent: SFTConfig's default true (fp16 is not set)")
                                           : t_origin(ta_bf16 ? "bf16" : "fp16");
    if (ta_bf16 || ta_fp16) {
      const std::string want = ta_bf16 ? "BF16" : "FP16";
      if (a_.given("mixed_precision") && mp != "NO" && mp != want)
        im_.warn("", ta_origin, concat("replaces ", yaml_, "'s mixed_precision ", mp, ", as Trainer does"));
      mp = want;
      dtype_origin = ta_origin;
    }
    const std::string dtype = mp == "NO" ? "fp32" : mp == "BF16" ? "bf16" : mp == "FP16" ? "fp16" : mp == "FP8" ? "bf16" : "";
    if (dtype.empty())
      throw Error(concat(yaml_, ": mixed_precision: unknown value '", clip_for_message(mp), "' (no, fp16, bf16 or fp8)"));
    im_.set("fsdp.param_dtype", dtype, dtype_origin);
    im_.set("fsdp.reduce_dtype", dtype, dtype_origin);
    if (mp == "FP8" && cpu_)
      im_.warn("fsdp.param_dtype", dtype_origin, "the CPU backend has no FP8: bf16 throughout instead");
    else if (mp == "FP8")
      im_.set("model.fp8_linear", "true", concat(dtype_origin, ": the blocks' linear layers in FP8 (E4M3, per-tensor "
                                                 "current scaling), the rest in bf16, as Accelerate's fp8 recipes; "
                                                 "needs compute capability 8.9 or newer (H100, H200, L40S)"));
    if (dtype == "fp16")
      im_.set("train.loss_scale", "0", "fp16: dynamic loss scaling from 65536, doubling after 2000 good steps (Trainer's GradScaler)");
    if ((ta_bf16 || ta_fp16) && a_.given("mixed_precision"))
      im_.unused(a_origin("mixed_precision"), "TrainingArguments' bf16/fp16 decide, as in Trainer");
    if (dtype == "bf16" && !cpu_)
      im_.note("fsdp.param_dtype", "bf16 needs compute capability 8.0 or newer (A100, H100); on a V100: "
                                   "--fsdp.param_dtype=fp16 --fsdp.reduce_dtype=fp16 (loss scaling turns itself on)");
  }

  void batch_and_epochs() {
    const char* pdtbs = t_.given("per_gpu_train_batch_size") && !t_.get("per_gpu_train_batch_size").is_null()
                            ? "per_gpu_train_batch_size" : "per_device_train_batch_size";
    const long long micro = whole(t_.get(pdtbs), args_ + ": " + pdtbs, 1);
    const long long accum = whole(t_.get("gradient_accumulation_steps"), args_ + ": gradient_accumulation_steps", 1);
    done_t_.insert({"per_gpu_train_batch_size", "per_device_train_batch_size", "gradient_accumulation_steps"});
    im_.set("train.micro_batch_size", std::to_string(micro), t_origin(pdtbs));
    im_.set("train.batch_size", std::to_string(micro * accum * procs_),
            concat("per-device batch ", micro, " x gradient_accumulation_steps ", accum, " x num_processes ", procs_,
                   ": the global batch (", t_origin("gradient_accumulation_steps"), "; ", a_origin("num_processes"), ")"));

    const double epochs = t_number("num_train_epochs");
    if (!(epochs > 0)) throw Error(concat(args_, ": num_train_epochs must be > 0"));
    im_.set("train.epochs", std::to_string(static_cast<long long>(std::ceil(epochs))), t_origin("num_train_epochs"));
    if (epochs != std::ceil(epochs))
      im_.warn("train.epochs", t_origin("num_train_epochs"),
               "shardlm runs whole epochs: rounded up; set train.max_steps to stop inside the last one");
    const long long max_steps = whole(t_.get("max_steps"), args_ + ": max_steps", -1);
    im_.set("train.max_steps", std::to_string(std::max(0LL, max_steps)), t_origin("max_steps"));
    if (max_steps > 0)
      im_.warn("train.max_steps", t_origin("max_steps"),
               "Trainer runs max_steps steps whatever num_train_epochs says; shardlm also stops at the end of train.epochs: "
               "raise train.epochs if the data set is shorter than max_steps global batches");
    done_t_.insert({"num_train_epochs", "max_steps"});
  }

  // The learning rate, its schedule and the schedule's arguments.
  void schedule() {
    im_.set("train.lr", number_text(t_number("learning_rate")), t_origin("learning_rate"));
    const std::string sched = text(t_.get("lr_scheduler_type"), args_ + ": lr_scheduler_type");
    // The schedules shardlm computes as transformers does (tests/test_schedules.cpp); others become linear.
    static const std::set<std::string> kSchedules = {"linear", "constant", "constant_with_warmup", "cosine",
                                                     "cosine_with_restarts", "polynomial", "cosine_with_min_lr"};
    if (kSchedules.count(sched)) {
      im_.set("train.lr_schedule", sched, t_origin("lr_scheduler_type"));
    } else {
      im_.set("train.lr_schedule", "linear", t_origin("lr_scheduler_type"));
      im_.warn("train.lr_schedule", t_origin("lr_scheduler_type"),
               concat("shardlm has transformers' linear, constant, constant_with_warmup, cosine, cosine_with_restarts, "
                      "polynomial and cosine_with_min_lr schedules: linear decay instead of ", sched));
    }
    const json kwargs = t_.get("lr_scheduler_kwargs");
    if (kwargs.is_object()) {
      const double lr = t_number("learning_rate");
      for (const auto& [name, value] : kwargs.items()) {
        const std::string origin = concat(t_origin("lr_scheduler_kwargs"), ".", name);
        const double v = number(value, concat(args_, ": lr_scheduler_kwargs.", name));
        if (name == "num_cycles") im_.set("train.lr_num_cycles", number_text(v), origin);
        else if (name == "power") im_.set("train.lr_power", number_text(v), origin);
        else if (name == "lr_end") im_.set("train.lr_end", number_text(v), origin);
        else if (name == "min_lr_rate") im_.set("train.min_lr_ratio", number_text(v), origin);
        else if (name == "min_lr" && lr > 0) im_.set("train.min_lr_ratio", number_text(v / lr), concat(origin, " / learning_rate"));
        else im_.warn("", origin, "not done: shardlm's schedules take num_cycles, power, lr_end, min_lr_rate and min_lr");
      }
    }
    done_t_.insert({"learning_rate", "lr_scheduler_type", "lr_scheduler_kwargs"});
  }

  // Warm-up: steps, or a ratio of the run (warmup_ratio, or warmup_steps below 1 in transformers 5);
  // warmup_steps wins when both are set, as in Trainer.
  void warmup() {
    const std::string sched = text(t_.get("lr_scheduler_type"), args_ + ": lr_scheduler_type");
    const double warm = t_number("warmup_steps");
    const char* warm_key = "warmup_steps";
    double ratio = 0;
    if (warm > 0 && warm < 1) ratio = warm;
    if (t_.given("warmup_ratio") && !t_.get("warmup_ratio").is_null() && number(t_.get("warmup_ratio"), args_) > 0 && warm == 0)
      ratio = t_number("warmup_ratio"), warm_key = "warmup_ratio";
    if (warm < 0 || ratio < 0 || ratio > 1) throw Error(concat(args_, ": ", warm_key, " out of range"));
    if (sched == "constant" && (warm > 0 || ratio > 0)) {
      // Trainer's constant schedule ignores the warm-up; shardlm's deck refuses the pair.
      im_.set("train.warmup_steps", "0", t_origin(warm_key));
      im_.warn("train.warmup_steps", t_origin(warm_key),
               "Trainer's constant schedule ignores the warm-up, and so does this deck (use constant_with_warmup to warm up)");
    } else if (ratio > 0) {
      im_.set("train.warmup_steps", "0", t_origin(warm_key));
      im_.set("train.warmup_ratio", number_text(ratio), t_origin(warm_key));
    } else {
      if (warm != std::floor(warm)) throw Error(concat(args_, ": warmup_steps above 1 must be whole"));
      im_.set("train.warmup_steps", std::to_string(static_cast<long long>(warm)), t_origin("warmup_steps"));
    }
    done_t_.insert({"warmup_steps", "warmup_ratio"});
  }

  // A flag shardlm always behaves as if set: a warning where it is off, else nothing to do.
  void always_on(const char* key, const char* deck_key, const char* why_off) {
    if (!truthy(t_.get(key), args_))
      im_.warn(deck_key, t_origin(key), why_off);
    else
      im_.unused(t_origin(key), "what shardlm always does");
    done_t_.insert(key);
  }

  void optimizer_and_sampling() {
    // train.optim: Trainer's AdamW names are adamw_torch; bitsandbytes' 8-bit AdamW (paged or not: paging is
    // how bitsandbytes moves its state under memory pressure, not a different update) is adamw_8bit.
    const std::string optim = text(t_.get("optim"), args_ + ": optim");
    if (optim == "adamw_8bit" || optim == "adamw_bnb_8bit" || optim == "paged_adamw_8bit")
      im_.set("train.optim", "adamw_8bit", t_origin("optim"));
    else if (optim != "adamw_torch" && optim != "adamw_torch_fused" && optim != "adamw_hf" && optim != "adamw_apex_fused")
      im_.warn("train.optim", t_origin("optim"),
               concat("shardlm's optimizers are adamw_torch and adamw_8bit, not ", optim, ": the deck uses adamw_torch"));
    else if (t_.given("optim"))
      im_.set("train.optim", "adamw_torch", t_origin("optim"));
    else
      im_.unused(t_origin("optim"), "train.optim's default, adamw_torch");
    done_t_.insert("optim");
    const struct { const char* from; const char* to; } numbers[] = {
        {"weight_decay", "train.weight_decay"}, {"adam_beta1", "train.adam_beta1"}, {"adam_beta2", "train.adam_beta2"},
        {"adam_epsilon", "train.adam_eps"}};
    for (const auto& n : numbers) {
      im_.set(n.to, number_text(t_number(n.from)), t_origin(n.from));
      done_t_.insert(n.from);
    }
    // Trainer clips only when max_grad_norm > 0; the deck's "no clipping" is 0 (it refuses a negative norm).
    const double clip = t_number("max_grad_norm");
    im_.set("train.max_grad_norm", number_text(clip > 0 ? clip : 0), t_origin("max_grad_norm"));
    if (clip < 0) im_.note("train.max_grad_norm", "Trainer does not clip when max_grad_norm <= 0: 0 here, no clipping");
    done_t_.insert("max_grad_norm");
    always_on("average_tokens_across_devices", "",
              "shardlm's loss is always the mean over the loss tokens of the whole global batch");
    im_.set("train.seed", std::to_string(whole(t_.get("seed"), args_ + ": seed", 0)), t_origin("seed"));
    done_t_.insert("seed");
    const std::string sampling = text(t_.get("train_sampling_strategy"), args_ + ": train_sampling_strategy");
    const bool grouped = t_.given("group_by_length") && truthy(t_.get("group_by_length"), args_);
    im_.set("train.shuffle", sampling == "sequential" ? "false" : "true", t_origin("train_sampling_strategy"));
    if (t_.given("group_by_length")) im_.note("train.shuffle", t_origin("group_by_length"));
    if (sampling == "group_by_length" || grouped)
      im_.warn("train.shuffle", t_origin(grouped ? "group_by_length" : "train_sampling_strategy"),
               "shardlm draws samples in a seeded random order, not grouped by length");
    done_t_.insert({"train_sampling_strategy", "group_by_length"});
    always_on("dataloader_drop_last", "train.batch_size",
              "shardlm drops the last incomplete global batch of every epoch; Trainer runs it");
  }

  // gradient_checkpointing turns it on; off, it leaves fsdp_activation_checkpointing's choice.
  void activation_checkpointing() {
    const bool on = t_flag("gradient_checkpointing");
    if (on || !im_.has("fsdp.activation_checkpointing"))
      im_.set("fsdp.activation_checkpointing", on ? "true" : "false", t_origin("gradient_checkpointing"));
    done_t_.insert("gradient_checkpointing");
  }

  void logging() {
    const std::string log_strategy = text(t_.get("logging_strategy"), args_ + ": logging_strategy");
    const double log_steps = t_number("logging_steps");
    if (log_strategy == "steps" && log_steps >= 1 && log_steps == std::floor(log_steps)) {
      im_.set("train.log_every", std::to_string(static_cast<long long>(log_steps)), t_origin("logging_steps"));
      if (t_.given("logging_strategy")) im_.unused(t_origin("logging_strategy"), "train.log_every, from logging_steps");
    } else {
      const char* key = log_strategy == "steps" ? "logging_steps" : "logging_strategy";
      im_.set("train.log_every", "1", t_origin(key));
      im_.warn("train.log_every", t_origin(key), "shardlm logs every train.log_every optimizer steps: every step here");
    }
    done_t_.insert({"logging_strategy", "logging_steps"});
  }

  void evaluation() {
    const char* eval_key = t_.given("evaluation_strategy") && !t_.given("eval_strategy") ? "evaluation_strategy" : "eval_strategy";
    const std::string eval_strategy = text(t_.get(eval_key), args_ + ": " + eval_key);
    const bool eval_file = !im_.value("data.eval_file").empty();
    if (eval_strategy == "steps") {
      // eval_steps defaults to logging_steps in Trainer; a fraction below 1 is a ratio of the run.
      const json es = t_.get("eval_steps");
      const double steps = es.is_null() ? t_number("logging_steps") : number(es, args_ + ": eval_steps");
      const std::string origin = t_origin(es.is_null() ? "logging_steps" : "eval_steps");
      if (steps >= 1 && steps == std::floor(steps) && eval_file) {
        im_.set("eval.every_steps", std::to_string(static_cast<long long>(steps)), origin);
        im_.warn("eval.every_steps", origin, "shardlm also evaluates after each epoch");
      } else if (!eval_file) {
        im_.warn("", t_origin(eval_key), "evaluation needs data.eval_file: give --data.eval_file=FILE, then set eval.every_steps");
      } else {
        im_.warn("eval.every_steps", origin, "a fraction of the run is not done: set eval.every_steps to a step count");
      }
    } else if (eval_strategy == "no" && eval_file) {
      im_.warn("data.eval_file", t_origin(eval_key), "shardlm evaluates after each epoch when data.eval_file is set");
    } else if (eval_strategy == "epoch" && !eval_file) {
      im_.warn("", t_origin(eval_key), "evaluation needs data.eval_file: give --data.eval_file=FILE");
    } else if (eval_strategy == "epoch") {
      im_.unused(t_origin(eval_key), "evaluation after each epoch on data.eval_file");
    } else {
      im_.unused(t_origin(eval_key), "no evaluation: no data.eval_file");
    }
    done_t_.insert({"eval_steps", "eval_strategy", "evaluation_strategy"});
    const char* pdebs = t_.given("per_gpu_eval_batch_size") && !t_.get("per_gpu_eval_batch_size").is_null()
                            ? "per_gpu_eval_batch_size" : "per_device_eval_batch_size";
    im_.set("eval.batch_size", std::to_string(whole(t_.get(pdebs), args_ + ": " + pdebs, 1)), t_origin(pdebs));
    done_t_.insert({"per_device_eval_batch_size", "per_gpu_eval_batch_size"});
  }

  // load_best_model_at_end with the eval loss: the best checkpoint is kept (and named by DIR/best).
  void best_model() {
    done_t_.insert({"load_best_model_at_end", "metric_for_best_model"});
    if (!t_flag("load_best_model_at_end")) return;
    const bool eval_file = !im_.value("data.eval_file").empty();
    const json metric = t_.get("metric_for_best_model");
    const std::string m = metric.is_null() ? "loss" : text(metric, args_ + ": metric_for_best_model");
    if ((m == "loss" || m == "eval_loss") && eval_file) {
      im_.set("checkpoint.keep_best", "eval_loss", t_origin("load_best_model_at_end"));
      im_.warn("checkpoint.keep_best", t_origin("load_best_model_at_end"),
               "shardlm keeps the best checkpoint (DIR/best names it) instead of loading it at the end: export it "
               "with shardlm export");
    } else if (!eval_file) {
      im_.warn("", t_origin("load_best_model_at_end"), "the best model needs data.eval_file: give --data.eval_file=FILE");
    } else {
      im_.warn("", t_origin("metric_for_best_model"), concat("not done: shardlm keeps the best by eval_loss only, not ", m));
    }
  }

  void checkpoints() {
    const std::string save_strategy = text(t_.get("save_strategy"), args_ + ": save_strategy");
    const double save_steps = t_number("save_steps");
    if (save_strategy == "no") {
      im_.set("checkpoint.every", "0", t_origin("save_strategy"));
      im_.set("checkpoint.at_end", "false", t_origin("save_strategy"));
    } else if (save_strategy == "epoch") {
      im_.set("checkpoint.every", "0", t_origin("save_strategy"));
      im_.set("checkpoint.every_epoch", "true", t_origin("save_strategy"));
    } else if (save_strategy == "steps" && save_steps >= 1 && save_steps == std::floor(save_steps)) {
      im_.set("checkpoint.every", std::to_string(static_cast<long long>(save_steps)), t_origin("save_steps"));
      if (t_.given("save_strategy")) im_.unused(t_origin("save_strategy"), "checkpoint.every, from save_steps");
    } else {
      const char* key = save_strategy == "steps" ? "save_steps" : "save_strategy";
      im_.set("checkpoint.every", "0", t_origin(key));
      im_.warn("checkpoint.every", t_origin(key),
               save_strategy == "best"
                   ? "shardlm checkpoints every checkpoint.every optimizer steps, every epoch (checkpoint.every_epoch) and "
                     "at the end, and keeps the best by eval loss with checkpoint.keep_best: only at the end here"
                   : "a fraction of the run is not done: shardlm checkpoints every checkpoint.every optimizer steps and at "
                     "the end; only at the end here");
    }
    const json limit = t_.get("save_total_limit");
    im_.set("checkpoint.keep_last", limit.is_null() ? "0" : std::to_string(whole(limit, args_ + ": save_total_limit", 0)),
            t_origin("save_total_limit"));
    done_t_.insert({"save_strategy", "save_steps", "save_total_limit"});
    if (!im_.has("run.dir")) im_.set("run.dir", text(t_.get("output_dir"), args_ + ": output_dir"), t_origin("output_dir"));
    done_t_.insert("output_dir");
  }

  // TRL's SFTConfig: the data keys (length, packing, the chat template, which tokens take the loss).
  void sft_data() {
    const char* ml = t_.given("max_seq_length") && !t_.get("max_seq_length").is_null() ? "max_seq_length" : "max_length";
    if (t_.get(ml).is_null())
      im_.warn("", t_origin(ml), "shardlm cuts every sample at data.max_length (512 unless the deck says otherwise); "
                                 "set it to the longest sample you want whole");
    else
      im_.set("data.max_length", std::to_string(whole(t_.get(ml), args_ + ": " + ml, 1)), t_origin(ml));
    done_t_.insert({"max_length", "max_seq_length"});

    const bool packing = t_flag("packing");
    im_.set("data.packing", packing ? "true" : "false", t_origin("packing"));
    // TRL packs the data set before batching, so its batch counts rows; the deck's counts samples.
    if (packing)
      im_.warn("train.batch_size", t_origin("packing"),
               "TRL packs the data set into rows of max_length tokens before batching, so per_device_train_batch_size "
               "counts packed rows of several samples; train.batch_size counts samples (shardlm packs each step's "
               "samples into rows, and train.micro_batch_size counts rows, as TRL's). A TRL step takes about "
               "data.max_length / (mean tokens per sample) times more samples than this batch, and an epoch here has "
               "that many times more steps (what max_steps, warmup_steps, save_steps and eval_steps count): multiply "
               "train.batch_size by that ratio to train as TRL does (`shardlm preprocess DECK` gives the samples' tokens)");
    const std::string strategy = text(t_.get("packing_strategy"), args_ + ": packing_strategy");
    if (packing && strategy != "bfd")
      im_.warn("data.packing", t_origin("packing_strategy"),
               "shardlm packs whole samples, longest first, into the first row with room (as bfd does); it never "
               "splits a sample across rows");
    else
      im_.unused(t_origin("packing_strategy"), packing ? "shardlm packs longest first, whole samples, as bfd"
                                                       : "no packing");
    done_t_.insert({"packing", "packing_strategy"});

    if (t_.given("chat_template_path") && !t_.get("chat_template_path").is_null()) {
      std::string path = text(t_.get("chat_template_path"), args_ + ": chat_template_path");
      const std::string ext = path.size() >= 6 ? path.substr(path.size() - 6) : "";
      if (ext != ".jinja" && ext.substr(1) != ".json") {
        path = (path.back() == '/' ? path : path + "/") + "tokenizer_config.json";
        im_.note("data.chat_template", "a tokenizer folder: its tokenizer_config.json (name its chat_template.jinja instead "
                                       "if it has one; a Hub id must be downloaded first)");
      }
      im_.set("data.chat_template", path, t_origin("chat_template_path"));
    }
    done_t_.insert("chat_template_path");
    loss_tokens();
  }

  // assistant_only_loss (chat records) and completion_only_loss (prompt/completion records).
  void loss_tokens() {
    const bool assistant_only = t_flag("assistant_only_loss");
    im_.set("data.train_on_prompt", assistant_only ? "false" : "true", t_origin("assistant_only_loss"));
    if (!assistant_only)
      im_.note("data.train_on_prompt", "TRL trains on every token of a conversation unless assistant_only_loss is set; "
                                       "shardlm's own default is the assistant's turns only (data.train_on_prompt = false)");
    const json c = t_.get("completion_only_loss");
    if (!c.is_null() && !truthy(c, args_ + ": completion_only_loss"))
      im_.warn("", t_origin("completion_only_loss"),
               "not done: shardlm's {\"prompt\", \"completion\"} records always take the loss on the completion only");
    else
      im_.unused(t_origin("completion_only_loss"), "prompt/completion records take the loss on the completion, as here");
    // loss_type: nll and chunked_nll are both the mean token cross-entropy, shardlm's loss.
    const json loss = t_.get("loss_type");
    const std::string loss_name = loss.is_null() ? "chunked_nll" : text(loss, args_ + ": loss_type");
    if (loss_name == "nll" || loss_name == "chunked_nll")
      im_.unused(t_origin("loss_type"), "the mean token cross-entropy, shardlm's loss");
    else
      im_.warn("", t_origin("loss_type"), concat("not done: shardlm's loss is the mean token cross-entropy, not ", loss_name));
    done_t_.insert({"assistant_only_loss", "completion_only_loss", "loss_type"});
  }

  // Every other key: no deck key; a warning where it asks for what shardlm does not do.
  void rest(const Source& s, const std::set<std::string>& done) {
    for (const auto& [key, v] : s.values.items()) {
      if (done.count(key)) continue;
      const ForeignKey* k = s.find(key);
      const std::string origin = concat(s.where, ": ", key, ": ", clip_for_message(shown(v), 80));
      // An empty value ("", [], {}, null) asks for nothing, whichever of them the default is spelled as.
      const auto empty = [](const json& x) {
        return x.is_null() || (x.is_string() && x.get<std::string>().empty()) || ((x.is_array() || x.is_object()) && x.empty());
      };
      const json d = json::parse(k->default_json);
      bool is_default = v == d || (empty(v) && empty(d)) ||
                        (key == "report_to" && (v == "none" || v == json::array() || v == json::array({"none"})));
      if (key == "compute_environment" && upper(shown(v)) != "LOCAL_MACHINE") is_default = false;
      if (k->use == ForeignKeyUse::NotDone && !is_default)
        im_.warn("", origin, concat("not done: ", k->deck));
      else
        im_.unused(origin, k->deck);
    }
  }

  AccelerateImport result(const std::string& command_line) {
    im_.check();
    if (!im_.has("model.dir") && !im_.has("model.hidden_size"))
      im_.warn("", "model", "neither file names the model: give --model.dir=PATH (a Hugging Face model directory) "
                            "before `shardlm train`, or edit the deck");
    if (!im_.has("data.train_file"))
      im_.warn("", "data", "neither file names the training data: give --data.train_file=FILE (and --data.format) "
                           "before `shardlm train`, or edit the deck");
    const std::string args_said = no_args_ ? std::string(" and Trainer's defaults (no TrainingArguments)")
                                           : concat(sft_ ? " and TRL's SFTConfig " : " and the TrainingArguments ", args_);
    const std::vector<std::string> header = {
        concat("Written by: ", command_line),
        concat("From the Accelerate config ", yaml_, args_said,
               ". Each key says where it came from; \"warning:\" lines say what shardlm does differently."),
        concat("The batch is written for ", procs_, " rank(s) (num_processes ", procs_, " over num_machines ", machines_,
               "): mpirun -np ", procs_, " shardlm train THIS_DECK (one rank per GPU)"),
    };
    AccelerateImport out;
    out.deck = im_.deck(header);
    out.warnings = im_.warnings();
    out.ranks = static_cast<int>(procs_);
    return out;
  }
};

json read_accelerate_yaml(const std::string& yaml_text, const std::string& yaml_name) {
  try {
    YAML::Node root = YAML::Load(yaml_text);
    if (!root.IsMap()) throw Error(concat(yaml_name, ": expected an Accelerate config (a YAML mapping of keys)"));
    YamlBudget budget{yaml_name};
    return yaml_to_json(root, budget);
  } catch (const YAML::Exception& e) {
    throw Error(concat(yaml_name, ": not valid YAML: ", e.what()));
  }
}

json read_training_args(const std::string& args_json, const std::string& args_name) {
  if (args_json.empty()) return json::object();
  json ta;
  try {
    ta = parse_json_bounded(args_json, args_name);
  } catch (const json::exception& e) {
    throw Error(concat(args_name, ": not valid JSON: ", e.what()));
  }
  if (!ta.is_object()) throw Error(concat(args_name, ": expected a JSON object of TrainingArguments"));
  return ta;
}

}  // namespace

AccelerateImport import_accelerate(const std::string& yaml_text, const std::string& yaml_name,
                                   const std::string& args_json, const std::string& args_name,
                                   const std::vector<std::string>& deck_keys, const std::string& command_line) {
  const json acc = read_accelerate_yaml(yaml_text, yaml_name);
  const json ta = read_training_args(args_json, args_name);
  return Conversion(acc, yaml_name, ta, args_name, args_json.empty()).run(deck_keys, command_line);
}

}  // namespace shardlm
