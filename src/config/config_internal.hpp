// config internals shared by src/config/*.cpp: value parsers/formatters and the table of deck keys.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "shardlm/config.hpp"

namespace shardlm::config_detail {

// ---- values (values.cpp) --------------------------------------------------------------------

// Throws Error "KEY = SHOWN: WHY"; SHOWN is the value as the user wrote it (quoted when textual).
[[noreturn]] void bad_value(const std::string& key, const std::string& shown, const std::string& why);
std::string quoted(const std::string& s);  // 'abc'
std::string lower(std::string s);
std::string trim(const std::string& s);

// Each parser throws bad_value naming `key` and the text when the text is not a valid value.
int parse_int(const std::string& key, const std::string& text, int min, const char* why_min);
uint64_t parse_unsigned(const std::string& key, const std::string& text);
double parse_double(const std::string& key, const std::string& text);  // finite only
float parse_float(const std::string& key, const std::string& text);    // finite only
bool parse_bool(const std::string& key, const std::string& text);

// "must be a, b or c" ("only a is supported" for one choice): the complaint for a word not in the list.
std::string choice_list(const std::vector<std::string>& choices);

// A comma-separated list of names, each trimmed ("" = none); Error naming `key` for an empty name
// between commas. join_names writes it back.
std::vector<std::string> split_names(const std::string& key, const std::string& text);
std::string join_names(const std::vector<std::string>& names);

// Shortest text that parses back to exactly the same value.
std::string format_double(double v);
std::string format_float(float v);

// The byte tokenizer's vocabulary: 256 byte values plus its special tokens (data's ByteTokenizer).
constexpr int kByteVocab = 259;

// ---- keys (keys.cpp, key_builders.hpp, keys_<section>.cpp) ---------------------------------

// One deck key, declared once (keys_<section>.cpp): its parser with the range it accepts, its resolved
// text, and what docs/deck.md's tables say of it. The type and the range of the reference come from the
// builder (key_builders.hpp) and the default from the field's initializer in config.hpp (what `get`
// gives for a default-constructed RunConfig), so neither is written twice.
struct KeySpec {
  using Setter = std::function<void(RunConfig&, const std::string& text, const std::string& base_dir)>;
  using Getter = std::function<std::string(const RunConfig&)>;
  KeySpec(std::string name, const char* required, Setter set, Getter get)
      : name(std::move(name)), required(required), set(std::move(set)), get(std::move(get)) {}

  std::string name;                  // "section.key"
  const char* required = nullptr;    // placeholder for the "is required" hint ("N"); null: optional
  // Parses `text` into the config; relative paths resolve against `base_dir`.
  Setter set;
  // The field's current value as text that `set` accepts back unchanged.
  Getter get;
  // Whether the resolved deck holds the key: null, always; a section that is off unless given (lora) says so here.
  bool (*written)(const RunConfig&) = nullptr;
  // Part of the model's shape, which model.dir's config.json gives instead (the key may then not be given).
  bool shape = false;
  // The reference's columns: the value's type and range ("int >= 1", "`host` \| `device`"), where it has an
  // effect ("both", "cuda"), the default when it is not the field's ("required" for a key its section
  // requires), and the meaning.
  std::string type;
  std::string backend = "both";
  std::string default_doc;
  std::string help;

  KeySpec&& of_shape() && { return shape = true, std::move(*this); }
  KeySpec&& cuda() && { return backend = "cuda", std::move(*this); }
  KeySpec&& on(std::string where) && { return backend = std::move(where), std::move(*this); }
  KeySpec&& shown_default(std::string text) && { return default_doc = std::move(text), std::move(*this); }
  KeySpec&& doc(std::string text) && { return help = std::move(text), std::move(*this); }
};

// A section of the deck: its keys in the resolved deck's order and the checks between them (or between
// them and other sections' keys, or the world size), which run once every key is read.
struct DeckSection {
  std::string name;  // "fsdp"
  void (*check)(const RunConfig&, int world_size) = nullptr;
  std::vector<KeySpec> keys;
};

// A section whose keys are declared in groups (a function each, as keys_fsdp.cpp's), in the groups' order.
inline DeckSection grouped_section(std::string name, void (*check)(const RunConfig&, int),
                                   std::initializer_list<std::vector<KeySpec>> groups) {
  DeckSection section{std::move(name), check, {}};
  for (const std::vector<KeySpec>& keys : groups) section.keys.insert(section.keys.end(), keys.begin(), keys.end());
  return section;
}

// The sections (keys_<section>.cpp), in the resolved deck's order: model, lora, data, train, fsdp, eval,
// dist, checkpoint, run.
DeckSection model_section();
DeckSection lora_section();
DeckSection data_section();
DeckSection train_section();
DeckSection fsdp_section();
DeckSection eval_section();
DeckSection dist_section();
DeckSection checkpoint_section();
DeckSection run_section();
const std::vector<DeckSection>& deck_sections();

// Every key, in the fixed order of `resolved`.
const std::vector<KeySpec>& key_table();

// The nearest valid key to an unknown one, or "" when none is close enough to suggest.
std::string nearest_key(const std::string& unknown);

// Whether key `name` names a file or folder its parser looks for (model.dir, data.train_file, ...): a smoke
// run may go on without it (synthetic data or a random model instead), and check_deck_value leaves it
// for the run.
bool key_names_a_path(const std::string& name);

// Whether the resolved deck (and RunConfig::resolved) holds key k for this config.
inline bool in_resolved_deck(const KeySpec& k, const RunConfig& cfg) { return !k.written || k.written(cfg); }

// Every section's checks, in the sections' order (keys.cpp).
void check_run_config(const RunConfig& cfg, int world_size);

// [lora] and model.adapter once the model's shape is known (lora.cpp): the adapter's
// adapter_config.json read, the deck's lora.* keys (`given`: those the deck or command line set)
// checked against it or required without it, the module names resolved for the family.
void resolve_run_lora(RunConfig& cfg, const std::set<std::string>& given);

// ---- smoke runs (smoke.cpp) -----------------------------------------------------------------

// A path key whose file or folder is not there: its text and its check's error.
struct SkippedPath {
  std::string text, error;
};

// The run shrunk for a smoke run on `world_size` ranks: the model to a tiny one of its family, the data
// to a few steps (synthetic where `missing` names its file), the run into its own folder; each change
// that is not obvious from run.smoke said in cfg.notes. `missing`: "key" -> each path key whose file or
// folder is not there; `given_on_cli`: the keys the command line set (kept as given).
void shrink_for_smoke(RunConfig& cfg, const std::map<std::string, SkippedPath>& missing,
                      const std::set<std::string>& given_on_cli, int world_size);

}  // namespace shardlm::config_detail
