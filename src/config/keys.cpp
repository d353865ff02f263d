// The deck's sections in order, the table of every key they declare, their checks run together, and
// the key kinds that are not templates (key_builders.hpp).
//
// Adding a key: its field with its default in the section's struct (include/shardlm/config.hpp), one entry
// in keys_<section>.cpp (the builder states the type and range; .cuda() where it acts on the CUDA backend
// only; .of_shape() for a model key that config.json gives; .doc() the meaning docs/deck.md shows), a check
// in that file if it constrains other keys, the code that uses it, then `shardlm deck-reference
// docs/deck.md`. The parser, the range errors, the resolved deck, the nearest-key hint and the reference
// follow from the entry; [fsdp] keys reach the engine through FsdpOptions (which derives from FsdpSection).
#include <filesystem>
#include <fstream>

#include "key_builders.hpp"

namespace shardlm::config_detail {

namespace fs = std::filesystem;

std::string word_list(const std::vector<std::string>& words) {
  std::string list;
  for (const std::string& w : words) list += concat(list.empty() ? "" : " \\| ", "`", w, "`");
  return list;
}

std::string absolute_path(const std::string& base_dir, const std::string& path) {
  return fs::absolute(fs::path(base_dir) / fs::path(path)).lexically_normal().string();
}

void check_data_file(const char* name, const std::string& text, const std::string& abs) {
  std::string where = text == abs ? "" : concat(" (looked for '", abs, "')");
  std::error_code ec;
  const fs::file_status st = fs::status(abs, ec);
  if (!fs::exists(st)) bad_value(name, quoted(text), "file not found" + where);
  if (fs::is_directory(st)) bad_value(name, quoted(text), "is a directory, not a file" + where);
  // Opening a pipe would wait for a writer, and a device need not end: neither is opened.
  const fs::file_type type = st.type();
  if (type != fs::file_type::regular)
    bad_value(name, quoted(text),
              concat("is ", type == fs::file_type::fifo ? "a pipe (FIFO)" : type == fs::file_type::socket ? "a socket"
                            : type == fs::file_type::character || type == fs::file_type::block ? "a device"
                                                                                                : "not a regular file",
                     ", not a regular file", where));
  std::ifstream f(abs, std::ios::binary);
  if (!f) bad_value(name, quoted(text), "file cannot be opened, check its permissions" + where);
}

void check_folder(const char* name, const std::string& text, const std::string& abs,
                  const std::vector<std::string>& files, const char* kind) {
  std::error_code ec;
  if (!fs::is_directory(abs, ec)) bad_value(name, quoted(text), "is not a directory (" + abs + ")");
  for (const std::string& f : files)
    if (!fs::exists(fs::path(abs) / f, ec)) bad_value(name, quoted(text), concat("has no ", f, " (", kind, " is expected)"));
}

bool key_names_a_path(const std::string& name) {
  return name == "model.dir" || name == "model.adapter" || name == "data.train_file" || name == "data.eval_file" ||
         name == "data.tokenizer" || name == "data.chat_template";
}

KeySpec strategy_key(const char* name) {
  KeySpec k{name, nullptr,
            [=](RunConfig& c, const std::string& t, const std::string&) {
              try {
                c.fsdp.strategy = parse_strategy(trim(t));
              } catch (const Error&) {
                bad_value(name, quoted(t),
                          "must be FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD, HYBRID_SHARD_ZERO2 or NO_SHARD");
              }
            },
            [](const RunConfig& c) { return std::string(strategy_name(c.fsdp.strategy)); }};
  k.type = word_list({"FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2", "NO_SHARD"});
  return k;
}

KeySpec tokenizer_key(const char* name) {
  KeySpec k{name, nullptr,
            [=](RunConfig& c, const std::string& t, const std::string& base_dir) {
              const std::string v = trim(t);
              const std::string l = lower(v);
              c.data.tokenizer_file.clear();
              if (l == "auto") return void(c.data.tokenizer = TokenizerSource::Auto);
              if (l == "byte") return void(c.data.tokenizer = TokenizerSource::Byte);
              if (v.empty()) bad_value(name, quoted(t), "must be auto, byte or a tokenizer.json path");
              fs::path p = absolute_path(base_dir, v);
              std::error_code ec;
              if (fs::is_directory(p, ec)) p /= "tokenizer.json";
              if (!fs::exists(p, ec))
                bad_value(name, quoted(t),
                          "file not found (" + p.string() + "); expected a tokenizer.json or a folder holding one");
              c.data.tokenizer = TokenizerSource::File;
              c.data.tokenizer_file = p.string();
            },
            [](const RunConfig& c) { return tokenizer_text(c.data); }};
  k.type = word_list({"auto", "byte"}) + " \\| path";
  return k;
}

KeySpec resume_key(const char* name) {
  KeySpec k{name, nullptr,
            [=](RunConfig& c, const std::string& t, const std::string&) {
              std::string v = trim(t);
              if (v.empty()) bad_value(name, quoted(t), "must be none, auto or a checkpoint path");
              std::string l = lower(v);
              c.checkpoint.resume = l == "none" ? ResumeFrom::None : l == "auto" ? ResumeFrom::Auto : ResumeFrom::Path;
              c.checkpoint.resume_path = c.checkpoint.resume == ResumeFrom::Path ? v : "";
            },
            [](const RunConfig& c) { return resume_text(c.checkpoint); }};
  k.type = word_list({"none", "auto"}) + " \\| path";
  return k;
}

const std::vector<DeckSection>& deck_sections() {
  static const std::vector<DeckSection> sections = {model_section(), lora_section(),  data_section(),
                                                    train_section(), fsdp_section(),  eval_section(),
                                                    dist_section(),  checkpoint_section(), run_section()};
  return sections;
}

const std::vector<KeySpec>& key_table() {
  static const std::vector<KeySpec> table = [] {
    std::vector<KeySpec> keys;
    for (const DeckSection& s : deck_sections()) keys.insert(keys.end(), s.keys.begin(), s.keys.end());
    return keys;
  }();
  return table;
}

void check_run_config(const RunConfig& cfg, int world_size) {
  for (const DeckSection& s : deck_sections())
    if (s.check) s.check(cfg, world_size);
}

}  // namespace shardlm::config_detail
