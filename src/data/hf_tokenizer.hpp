// The parts of HfTokenizer (include/shardlm/data.hpp) and what src/data/hf_tokenizer*.cpp share:
// JSON access with error paths, UTF-8, the regex engine, and the pipeline stages of `tokenizers`
// (added tokens, normalizer, pre-tokenizer, BPE model, post-processor, decoder).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "shardlm/core.hpp"
#include "shardlm/data.hpp"

namespace shardlm::hf {

using nlohmann::json;

// The largest token id read: tables are indexed by id, so an id sizes them (the largest released
// vocabularies hold about 256k tokens); a larger one is refused naming it and the memory it would take.
constexpr int64_t kMaxTokenId = (int64_t{1} << 24) - 1;

// "expected a non-negative integer" or, past kMaxTokenId, how large a table the id would need.
std::string token_id_problem(const json& id);

// ---- JSON access: every error names the source and the JSON path ("model.merges[3]") -----------

struct JsonContext {
  std::string source;
  [[noreturn]] void fail(const std::string& path, const std::string& message) const;
};

inline std::string child_path(const std::string& path, const std::string& key) {
  return path.empty() ? key : path + "." + key;
}
inline std::string index_path(const std::string& path, size_t i) {
  return path + "[" + std::to_string(i) + "]";
}

// The member `key` of the object at `path`; fails when absent (null counts as absent).
const json& require_member(const JsonContext& ctx, const json& object, const std::string& path,
                           const char* key);
std::string require_string(const JsonContext& ctx, const json& object, const std::string& path,
                           const char* key);
// Optional members: the fallback when absent or null.
bool optional_bool(const JsonContext& ctx, const json& object, const std::string& path,
                   const char* key, bool fallback);
std::string optional_string(const JsonContext& ctx, const json& object, const std::string& path,
                            const char* key, const std::string& fallback);
int64_t optional_int(const JsonContext& ctx, const json& object, const std::string& path,
                     const char* key, int64_t fallback);
// The "type" of a component object, failing on a non-object.
std::string component_type(const JsonContext& ctx, const json& object, const std::string& path);
[[noreturn]] void fail_unsupported(const JsonContext& ctx, const std::string& path,
                                   const std::string& type, const char* supported);
// The steps of a "Sequence" component: its array `key`, each entry parsed by `parse` (null ones dropped).
template <typename Component, typename Parse>
std::vector<std::unique_ptr<Component>> parse_sequence_steps(const JsonContext& ctx, const json& object,
                                                             const std::string& path, const char* key, Parse parse) {
  const std::string list_path = child_path(path, key);
  const json& list = require_member(ctx, object, path, key);
  if (!list.is_array()) ctx.fail(list_path, "expected an array");
  std::vector<std::unique_ptr<Component>> steps;
  for (size_t i = 0; i < list.size(); ++i) {
    if (auto step = parse(ctx, list[i], index_path(list_path, i))) steps.push_back(std::move(step));
  }
  return steps;
}

// What parse_normalizer, parse_pre_tokenizer and parse_decoder share: nullptr for null, a Sequence
// of the `key` steps parsed by `parse`, else parse_type(ctx, value, path, type), and an error
// naming the `supported` types where that gives nullptr.
template <typename Component, typename Sequence, typename Parse, typename ParseType>
std::unique_ptr<Component> parse_component(const JsonContext& ctx, const json& value, const std::string& path,
                                           const char* key, Parse parse, ParseType parse_type, const char* supported) {
  if (value.is_null()) return nullptr;
  const std::string type = component_type(ctx, value, path);
  if (type == "Sequence")
    return std::make_unique<Sequence>(parse_sequence_steps<Component>(ctx, value, path, key, parse));
  if (auto component = parse_type(ctx, value, path, type)) return component;
  fail_unsupported(ctx, child_path(path, "type"), type, supported);
}

// ---- UTF-8 ------------------------------------------------------------------------------------

// Byte offset of the first invalid sequence, or npos when `text` is valid UTF-8.
size_t find_invalid_utf8(std::string_view text);
// The code point at `pos` of valid UTF-8, advancing `pos` past it.
uint32_t next_code_point(std::string_view text, size_t& pos);
void append_utf8(std::string& out, uint32_t code_point);
// Rust's String::from_utf8_lossy: each maximal invalid subpart becomes U+FFFD.
std::string utf8_lossy(std::string_view bytes);
// Unicode White_Space, what Rust's char::is_whitespace and Oniguruma's \s accept.
bool is_whitespace(uint32_t code_point);
// GPT-2's bytes_to_unicode: the printable code point standing for each byte, as UTF-8.
const std::array<std::string, 256>& byte_level_chars();
// The byte a byte-level code point stands for, or -1.
int byte_level_byte(uint32_t code_point);

// ---- regex (PCRE2, Oniguruma syntax) ------------------------------------------------------------

class Regex {
 public:
  // Throws std::invalid_argument with the reason when the pattern does not compile.
  explicit Regex(const std::string& oniguruma_pattern);
  // Non-overlapping matches [start, end) left to right, as Oniguruma's find_iter gives them.
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;

 private:
  std::unique_ptr<void, void (*)(void*)> code_{nullptr, nullptr};  // pcre2_code_8, kept out of this header
  bool jit_ = false;
};

// The pattern translated to PCRE2: \s and \S as Unicode White_Space, nested classes flattened,
// \h as a hex digit; throws std::invalid_argument for what PCRE2 cannot express.
std::string oniguruma_to_pcre2(const std::string& pattern);

// A split or replace pattern: {"String": literal} or {"Regex": pattern}.
struct Pattern {
  std::string literal;
  std::shared_ptr<const Regex> regex;
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;
  // Replaces every match in `text` by `content` (Replace normalizer and decoder); `matches` is scratch.
  void replace_all(std::string& text, const std::string& content,
                   std::vector<std::pair<size_t, size_t>>& matches) const;
};
Pattern parse_pattern(const JsonContext& ctx, const json& object, const std::string& path);

// ---- pieces of the input on their way to the model ---------------------------------------------

struct Piece {
  std::string text;
  int32_t id = -1;        // >= 0: an added token, which later stages leave alone
  bool at_start = false;  // begins at offset 0 of the input (Metaspace's prepend_scheme "first")
};

enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };
SplitBehavior parse_split_behavior(const JsonContext& ctx, const json& value,
                                   const std::string& path);
// NormalizedString::split: cuts `piece` at the pattern's matches (at every match of the inverse
// with invert) and appends the non-empty parts to `out`.
void split_piece(const Pattern& pattern, SplitBehavior behavior, bool invert, Piece piece,
                 std::vector<Piece>& out);

// ---- stages ---------------------------------------------------------------------------------

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& text) const = 0;
};
// nullptr for a null normalizer.
std::unique_ptr<Normalizer> parse_normalizer(const JsonContext& ctx, const json& value,
                                             const std::string& path);

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Splits and rewrites the pieces that are not added tokens.
  virtual void pre_tokenize(std::vector<Piece>& pieces) const = 0;
};
std::unique_ptr<PreTokenizer> parse_pre_tokenizer(const JsonContext& ctx, const json& value,
                                                  const std::string& path);

class Decoder {
 public:
  virtual ~Decoder() = default;
  // One step of a decoder chain (Decoder::decode_chain of `tokenizers`).
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};
std::unique_ptr<Decoder> parse_decoder(const JsonContext& ctx, const json& value,
                                       const std::string& path);

// What the "Sequence" normalizer, pre-tokenizer and decoder share: their steps, each applied in turn
// through `Apply` (Normalizer::normalize, ...) by `apply_each`, which the override calls.
template <typename Component, typename Arg, void (Component::*Apply)(Arg&) const>
class SequenceOf : public Component {
 public:
  explicit SequenceOf(std::vector<std::unique_ptr<Component>> steps) : steps_(std::move(steps)) {}

 protected:
  void apply_each(Arg& arg) const {
    for (const auto& step : steps_) ((*step).*Apply)(arg);
  }

 private:
  std::vector<std::unique_ptr<Component>> steps_;
};

// What the post-processor adds around the ids of one sequence when add_special_tokens is set.
struct PostProcessor {
  std::vector<int32_t> prefix;
  std::vector<int32_t> suffix;
};
PostProcessor parse_post_processor(const JsonContext& ctx, const json& value,
                                   const std::string& path);

// The BPE model: vocabulary, merges by rank, byte fallback, unknown token, and a word cache.
class BpeModel {
 public:
  BpeModel(const JsonContext& ctx, const json& model, const std::string& path);
  // Appends the ids of one pre-tokenized word.
  void tokenize(const std::string& word, std::vector<int32_t>& out) const;
  int32_t token_to_id(const std::string& token) const;
  const std::string* id_to_token(int32_t id) const;
  int32_t unk_id() const { return unk_id_; }
  int32_t max_id() const { return static_cast<int32_t>(id_to_token_.size()) - 1; }

 private:
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    uint32_t len;
  };
  void merge_word(const std::string& word, std::vector<int32_t>& out) const;
  void add_initial_symbols(const std::string& word, std::vector<Symbol>& symbols) const;
  const std::pair<int32_t, int32_t>* find_merge(int32_t left, int32_t right) const;

  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  std::unordered_map<uint32_t, int32_t> single_char_ids_;  // code point -> id of that one char
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;  // (left, right) -> rank, id
  std::array<int32_t, 256> byte_fallback_ids_{};                      // <0xNN> ids; -1 where absent
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  int32_t unk_id_ = -1;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;

  // Words shorter than kMaxCachedWord bytes; cleared when it holds kCacheCapacity of them.
  static constexpr size_t kMaxCachedWord = 256;
  static constexpr size_t kCacheCapacity = 1 << 17;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;
};

// Finds added tokens in text, leftmost-longest, with their single_word/lstrip/rstrip rules
// (AddedVocabulary::find_matches of `tokenizers`).
class AddedTokenMatcher {
 public:
  // `patterns[i]` is the text matched for `tokens[i]` (its content, normalized where it says so).
  AddedTokenMatcher(std::vector<const AddedToken*> tokens, std::vector<std::string> patterns);
  bool empty() const { return tokens_.empty(); }
  // Appends `piece` cut into added tokens (id set) and the text between them.
  void split(Piece piece, std::vector<Piece>& out) const;

 private:
  std::vector<const AddedToken*> tokens_;
  std::vector<std::string> patterns_;
  std::array<std::vector<size_t>, 256> by_first_byte_;  // indices, longest pattern first
};

}  // namespace shardlm::hf

namespace shardlm {

struct HfTokenizer::Impl {
  std::string source;
  std::vector<hf::AddedToken> added;
  std::unordered_map<std::string, int32_t> added_by_content;
  std::unordered_map<int32_t, size_t> added_by_id;            // id -> index in `added`
  std::unique_ptr<hf::AddedTokenMatcher> raw_matcher;         // normalized == false
  std::unique_ptr<hf::AddedTokenMatcher> normalized_matcher;  // normalized == true
  std::unique_ptr<hf::Normalizer> normalizer;
  std::unique_ptr<hf::PreTokenizer> pre_tokenizer;
  std::unique_ptr<hf::BpeModel> model;
  hf::PostProcessor post_processor;
  std::unique_ptr<hf::Decoder> decoder;
  int32_t bos = -1, eos = -1, pad = -1, unk = -1;
  int32_t vocab_size = 0;
};

}  // namespace shardlm
