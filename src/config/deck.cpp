// load_run_config: the INI deck and the --section.key overrides read with Boost.Program_options,
// turned into a checked RunConfig; resolved_deck_ini writes the result back as a deck, and
// ini_values reads such a deck's values back (a checkpoint stores one).
#include <boost/program_options.hpp>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "config_internal.hpp"
#include "key_builders.hpp"

namespace shardlm {

namespace po = boost::program_options;
namespace fs = std::filesystem;
using namespace config_detail;

// Every key as a string option: typing is ours, so each bad value gets a message naming its key.
static po::options_description deck_options() {
  po::options_description desc("shardlm input deck");
  for (const KeySpec& k : key_table()) desc.add_options()(k.name.c_str(), po::value<std::string>());
  return desc;
}

static std::string unknown_key_message(const std::string& key, const std::string& where) {
  std::string hint = nearest_key(key);
  return concat("unknown key '", key, "' ", where,
                hint.empty() ? std::string() : concat(" (did you mean '", hint, "'?)"));
}

void check_deck_value(const std::string& key, const std::string& value, const std::string& where) {
  for (const KeySpec& k : key_table()) {
    if (k.name != key) continue;
    if (key_names_a_path(key)) return;  // the file may not be there yet: the run looks for it
    RunConfig scratch;
    k.set(scratch, value, fs::current_path().string());
    return;
  }
  throw Error(unknown_key_message(key, where));
}

static std::string read_file_text(const std::string& path) { return read_input_file(path, "input deck", kMaxDeckBytes); }

// Boost's INI reader knows '#' comments only, gives no line numbers and takes a repeated key to a
// late multiple_occurrences; so strip ';' comments here and report bad lines and repeats by line.
static std::string clean_deck(const std::string& path, const std::string& raw) {
  std::istringstream in(raw);
  std::ostringstream out;
  std::string line, section;
  std::map<std::string, int> first_line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (n == 1 && line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);  // UTF-8 byte order mark
    std::string s = trim(line.substr(0, line.find_first_of("#;")));
    std::string at = concat("input deck '", path, "' line ", n, ": ");
    if (s.empty()) {
      out << '\n';
    } else if (s.front() == '[') {
      section = s.back() == ']' ? trim(s.substr(1, s.size() - 2)) : "";
      while (!section.empty() && section.back() == '.') section.pop_back();
      if (section.empty()) throw Error(concat(at, "bad section header '", s, "'"));
      out << '[' << section << "]\n";
    } else {
      size_t eq = s.find('=');
      std::string key = eq == std::string::npos ? "" : trim(s.substr(0, eq));
      if (key.empty()) throw Error(concat(at, "expected 'key = value' or '[section]', got '", s, "'"));
      std::string name = section.empty() ? key : section + "." + key;
      auto [it, fresh] = first_line.emplace(name, n);
      if (!fresh)
        throw Error(concat(name, " is given twice in input deck '", path, "' (lines ", it->second,
                           " and ", n, ")"));
      const std::string value = trim(s.substr(eq + 1));
      // Values are bare: quotes would be taken as part of them (dir = "runs/x" names a folder '"runs').
      if (value.size() >= 2 && (value.front() == '"' || value.front() == '\'') && value.back() == value.front())
        throw Error(concat(at, name, " = ", value, ": deck values are written without quotes (", key, " = ",
                           value.substr(1, value.size() - 2), ")"));
      out << key << " = " << value << '\n';
    }
  }
  return out.str();
}

// The deck's options (`raw`, the text of the deck `path`); unknown keys are errors with a hint.
static po::parsed_options parse_deck(const std::string& path, const std::string& raw,
                                     const po::options_description& desc) {
  std::istringstream text(clean_deck(path, raw));
  po::parsed_options parsed(&desc);
  try {
    parsed = po::parse_config_file(text, desc, /*allow_unregistered=*/true);
  } catch (const po::error& e) {  // clean_deck already rejects what Boost would; keep the context
    throw Error(concat("cannot read input deck '", path, "': ", e.what()));
  }
  for (const po::option& o : parsed.options)
    if (o.unregistered) throw Error(unknown_key_message(o.string_key, concat("in ", path)));
  return parsed;
}

// The overrides, "--section.key=value" or "--section.key value"; no short options, no prefix
// guessing: an abbreviated key must not silently select some other key.
static po::parsed_options parse_overrides(const std::vector<std::string>& args,
                                          const po::options_description& desc) {
  namespace st = po::command_line_style;
  // Boost rejects "--key=" (empty after '='); "--key" "" means the same and it takes that.
  std::vector<std::string> tokens;
  for (const std::string& a : args) {
    bool empty_value = a.size() > 3 && a.rfind("--", 0) == 0 && a.find('=') == a.size() - 1;
    if (!empty_value) {
      tokens.push_back(a);
    } else {
      tokens.push_back(a.substr(0, a.size() - 1));
      tokens.emplace_back();
    }
  }
  po::parsed_options parsed(&desc);
  try {
    parsed = po::command_line_parser(tokens)
                 .options(desc)
                 .style(st::allow_long | st::long_allow_adjacent | st::long_allow_next)
                 .allow_unregistered()
                 .run();
  } catch (const po::invalid_command_line_syntax& e) {
    std::string key = e.get_option_name();
    key.erase(0, key.find_first_not_of('-'));
    if (e.kind() == po::invalid_command_line_syntax::missing_parameter)
      throw Error(concat(key, " needs a value on the command line (write --", key, "=VALUE)"));
    throw Error(concat("cannot read the overrides on the command line at ", key, ": ", e.what()));
  } catch (const po::error& e) {
    throw Error(concat("cannot read the overrides on the command line: ", e.what()));
  }
  std::set<std::string> seen;
  for (const po::option& o : parsed.options) {
    if (o.string_key.empty()) {  // a bare word: Boost's positional argument
      std::string tok = o.original_tokens.empty() ? "" : o.original_tokens.front();
      throw Error(concat("unexpected argument '", tok,
                         "' on the command line (overrides look like --section.key=value)"));
    }
    if (o.unregistered) throw Error(unknown_key_message(o.string_key, "on the command line"));
    if (!seen.insert(o.string_key).second)
      throw Error(concat(o.string_key, " is given twice on the command line"));
  }
  return parsed;
}

// What the error for a missing key suggests as its value ("N", "PATH").
static std::string placeholder(const std::string& key) {
  for (const KeySpec& k : key_table())
    if (k.name == key && k.required) return k.required;
  return "PATH";  // model.dir
}

// The one error for the required keys that are missing: each with the section it goes under. A deck
// that names no model is pointed at model.dir (what an imported deck lacks), not at a random model's shape.
static std::string missing_keys_message(const std::string& deck_path, const std::vector<std::string>& keys) {
  if (keys.size() == 1 && keys[0] != "model.dir")
    return concat(keys[0], " is required (set it in the deck or with --", keys[0], "=", placeholder(keys[0]), ")");
  std::string names, add, flags;
  for (const std::string& k : keys) {
    names += concat(names.empty() ? "" : ", ", k);
    const size_t dot = k.find('.');
    add += concat(add.empty() ? "" : ", ", k.substr(dot + 1), " = ", placeholder(k), " under [", k.substr(0, dot), "]");
    flags += concat(" --", k, "=", placeholder(k));
  }
  const bool no_model = keys[0] == "model.dir";
  return concat("input deck '", deck_path, "' is missing ", names, ": add ", add, " (or give", flags, ")",
                no_model ? "; model.dir is a Hugging Face model folder, whose config.json gives the shape (a random "
                           "model takes model.arch, vocab_size, hidden_size, num_layers and num_heads instead)"
                         : "");
}

RunConfig load_run_config(const std::string& deck_path, const std::vector<std::string>& overrides,
                          int world_size, bool check_data_files) {
  // Deck paths are relative to the deck's folder.
  return load_run_config_text(read_file_text(deck_path), deck_path,
                              fs::absolute(deck_path).lexically_normal().parent_path().string(), overrides, world_size,
                              check_data_files);
}

// The parsed deck and overrides: each key's text (the command line's wins) and where it came from.
struct GivenKeys {
  po::variables_map vm;
  std::set<std::string> from_cli;
  std::string deck_dir;  // deck paths are relative to it, override paths to the current directory
  bool given(const std::string& key) const { return vm.count(key) > 0; }
  std::string text(const std::string& key) const { return given(key) ? vm[key].as<std::string>() : std::string(); }
  std::string base_dir(const std::string& key) const {
    return from_cli.count(key) ? fs::current_path().string() : deck_dir;
  }
};

static GivenKeys given_keys(const std::string& text, const std::string& deck_path, const std::string& deck_dir,
                            const std::vector<std::string>& overrides) {
  const po::options_description desc = deck_options();
  po::parsed_options deck = parse_deck(deck_path, text, desc);
  po::parsed_options cli = parse_overrides(overrides, desc);
  GivenKeys g;
  g.deck_dir = deck_dir;
  for (const po::option& o : cli.options) g.from_cli.insert(o.string_key);
  // The first store() of a key wins in Boost: overrides first, so they take precedence.
  try {
    po::store(cli, g.vm);
    po::store(deck, g.vm);
    po::notify(g.vm);
  } catch (const po::error& e) {  // repeats and unknowns were rejected above; keep the context
    throw Error(concat("cannot combine input deck '", deck_path, "' and the overrides: ", e.what()));
  }
  return g;
}

// What reading the keys found beside their values.
struct KeysRead {
  std::set<std::string> given_lora;            // [lora] is on when any of its keys is given
  std::vector<std::string> overridden_shape;   // the deck's shape keys model.dir on the command line replaced
  std::vector<std::string> missing;            // required keys neither the deck nor the command line gives
  std::map<std::string, SkippedPath> skipped;  // smoke: paths that are not there
};

// Every given key parsed into cfg through its declaration. With model.dir the model's shape comes from its
// config.json: shape keys may not be given too, except that model.dir on the command line replaces the
// deck's shape (said in cfg.notes).
static KeysRead set_keys(RunConfig& cfg, const GivenKeys& g, bool smoke, bool check_data_files) {
  KeysRead r;
  const bool from_model_dir = !trim(g.text("model.dir")).empty();
  const bool model_dir_on_cli = from_model_dir && g.from_cli.count("model.dir") > 0;
  bool model_named = from_model_dir;  // model.dir or some shape key of the model
  for (const KeySpec& k : key_table())
    if (k.required && k.shape && !trim(g.text(k.name)).empty()) model_named = true;
  for (const KeySpec& k : key_table()) {
    const bool given = g.given(k.name);
    if (given && k.name.rfind("lora.", 0) == 0) r.given_lora.insert(k.name);
    const std::string value = g.text(k.name);
    if (from_model_dir && k.shape) {
      if (given && (!model_dir_on_cli || g.from_cli.count(k.name)))
        throw Error(concat(k.name, " is read from model.dir's config.json; remove it from the ",
                           g.from_cli.count(k.name) ? "command line" : "deck", " (or remove model.dir)"));
      if (given) r.overridden_shape.push_back(k.name);
      continue;
    }
    // Data files that will not be read (plan, generate): neither required nor checked, but kept as paths, so that
    // what depends on an evaluation file being named (eval.every_steps, checkpoint.keep_best, early stopping)
    // reads the deck as train does.
    if (!check_data_files && (k.name == "data.train_file" || k.name == "data.eval_file")) {
      std::string& field = k.name == "data.train_file" ? cfg.data.train_file : cfg.data.eval_file;
      if (!trim(value).empty()) field = absolute_path(g.base_dir(k.name), trim(value));
      continue;
    }
    if (k.required && trim(value).empty()) {
      const bool shape = k.shape;
      if (smoke && (shape || k.name == "data.train_file" || k.name == "train.batch_size")) continue;  // the smoke run's
      const std::string key = shape && !model_named ? "model.dir" : k.name;
      if (std::find(r.missing.begin(), r.missing.end(), key) == r.missing.end()) r.missing.push_back(key);
      continue;
    }
    if (!given) continue;
    if (smoke && key_names_a_path(k.name)) {
      try {
        k.set(cfg, value, g.base_dir(k.name));
      } catch (const Error& e) {
        r.skipped[k.name] = {trim(value), e.what()};
      }
      continue;
    }
    k.set(cfg, value, g.base_dir(k.name));
  }
  return r;
}

// The model's shape from model.dir's config.json, keeping the deck's values of every [model] key that is not
// part of it (KeySpec::shape; each one's text round-trips through get and set) and the deck's [lora].
static void take_model_dir_shape(RunConfig& cfg) {
  const std::string path = (fs::path(cfg.model.dir) / "config.json").string();
  const std::string config_text = read_input_file(path, "model.dir's config.json", kMaxDeckBytes);
  const RunConfig deck = cfg;
  static_cast<ModelConfig&>(cfg.model) = model_config_from_hf(config_text, path);
  for (const KeySpec& k : key_table())
    if (k.name.rfind("model.", 0) == 0 && !k.shape) {
      const std::string value = k.get(deck);
      if (value != k.get(cfg)) k.set(cfg, value, "");
    }
  cfg.model.lora = deck.model.lora;
}

std::string missing_tokenizer_message(const std::string& model_dir) {
  return concat("data.tokenizer = auto: model.dir ", model_dir,
                " has no tokenizer.json; set data.tokenizer to a tokenizer.json (or byte)");
}

RunConfig load_run_config_text(const std::string& text, const std::string& deck_path, const std::string& deck_dir,
                               const std::vector<std::string>& overrides, int world_size, bool check_data_files) {
  const GivenKeys g = given_keys(text, deck_path, deck_dir, overrides);
  const bool smoke = g.given("run.smoke") && parse_bool("run.smoke", g.text("run.smoke"));

  RunConfig cfg;
  // The environment's (SHARDLM_NCCL_TIMEOUT), read only when neither the deck nor the command line sets it: the key
  // wins, so a malformed variable then stops nothing.
  if (!g.given("dist.timeout")) cfg.dist.timeout = default_dist_timeout();
  const KeysRead r = set_keys(cfg, g, smoke, check_data_files);
  if (!r.missing.empty()) throw Error(missing_keys_message(deck_path, r.missing));
  if (!r.overridden_shape.empty()) {
    std::string keys;
    for (const std::string& k : r.overridden_shape) keys += (keys.empty() ? "" : ", ") + k;
    cfg.notes.push_back(concat("model.dir from the command line: its config.json gives the model's shape; the deck's ",
                               keys, " are not used"));
  }
  if (!cfg.model.dir.empty()) take_model_dir_shape(cfg);
  if (smoke) shrink_for_smoke(cfg, r.skipped, g.from_cli, world_size);
  if (cfg.data.tokenizer == TokenizerSource::Auto) {
    cfg.data.tokenizer_file = cfg.tokenizer_json();
    cfg.data.tokenizer = cfg.data.tokenizer_file.empty() ? TokenizerSource::Byte : TokenizerSource::File;
    SHARDLM_CHECK(cfg.data.tokenizer_file.empty() || fs::exists(cfg.data.tokenizer_file),
                  missing_tokenizer_message(cfg.model.dir));
  }
  cfg.model.packed = cfg.data.packing;  // the model sizes its packed-attention buffers by it
  check_run_config(cfg, world_size);
  resolve_run_lora(cfg, r.given_lora);  // needs the model's family and a valid shape, known only now

  for (const KeySpec& k : key_table())
    if (in_resolved_deck(k, cfg)) cfg.resolved.emplace_back(k.name, k.get(cfg));
  return cfg;
}

bool is_model_shape_key(const std::string& name) {
  for (const KeySpec& k : key_table())
    if (k.name == name) return k.shape;
  return false;
}

std::vector<std::string> cuda_only_settings(const RunConfig& cfg, const std::vector<std::string>& except) {
  const RunConfig defaults;
  std::vector<std::string> set;
  for (const KeySpec& k : key_table()) {
    if (k.backend != "cuda" || std::find(except.begin(), except.end(), k.name) != except.end()) continue;
    // (dist.timeout set by SHARDLM_NCCL_TIMEOUT counts too: a CPU run does not read it either.)
    const std::string value = k.get(cfg);
    if (value != k.get(defaults)) set.push_back(concat(k.name, " = ", value));
  }
  return set;
}

std::string resolved_deck_ini(const RunConfig& cfg) {
  // Written from the fields (not cfg.resolved) so the text always matches the struct.
  std::ostringstream os;
  // One header line, in the file and in the log alike: which shardlm resolved it.
  os << "# shardlm " SHARDLM_VERSION ": resolved input deck\n";
  std::string section;
  // With model.dir its config.json gives the shape, which a deck may not set beside it: shown as comments, so
  // the text runs again as it is (shardlm generate, a rerun of deck.resolved.ini).
  const bool shape_from_dir = !cfg.model.dir.empty();
  for (const KeySpec& k : key_table()) {
    if (!in_resolved_deck(k, cfg)) continue;
    size_t dot = k.name.find('.');
    std::string sec = k.name.substr(0, dot);
    if (sec != section) os << "\n[" << (section = sec) << "]\n";
    if (shape_from_dir && k.shape) os << "# ";
    // run.overwrite is a one-time permission: kept, a rerun of this text would replace this run unasked.
    if (k.name == "run.overwrite" && cfg.run.overwrite) {
      os << "# overwrite = true was given for this run: a rerun replaces it only if told again\noverwrite = false\n";
      continue;
    }
    os << k.name.substr(dot + 1) << " = " << k.get(cfg) << (shape_from_dir && k.shape ? "  (config.json)" : "") << '\n';
  }
  return os.str();
}

std::map<std::string, std::string> ini_values(const std::string& text, const std::string& where) {
  std::map<std::string, std::string> values;
  std::string section, line;
  std::istringstream in(text);
  for (size_t number = 1; std::getline(in, line); ++number) {
    line = trim(line.substr(0, line.find_first_of("#;")));
    if (line.empty()) continue;
    if (line.front() == '[') {
      SHARDLM_CHECK(line.back() == ']', where, ":", number, ": a section header needs a closing ']'");
      section = trim(line.substr(1, line.size() - 2));
      continue;
    }
    const size_t eq = line.find('=');
    SHARDLM_CHECK(eq != std::string::npos, where, ":", number, ": expected 'key = value', got '", line, "'");
    values[section + "." + trim(line.substr(0, eq))] = trim(line.substr(eq + 1));
  }
  return values;
}

}  // namespace shardlm
