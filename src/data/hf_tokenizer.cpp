// HfTokenizer: reads tokenizer.json (and tokenizer_config.json beside it) into the pipeline of
// `tokenizers` (added tokens, normalizer, pre-tokenizer, BPE, post-processor, decoder) and runs it.
#include "hf_tokenizer.hpp"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <unordered_set>

#include "../core/input_file.hpp"
#include "shardlm/core.hpp"
#include "shardlm/data.hpp"

namespace shardlm {

namespace hf {

void JsonContext::fail(const std::string& path, const std::string& message) const {
  throw Error(path.empty() ? concat(source, ": ", message)
                           : concat(source, ": ", path, ": ", message));
}

const json& require_member(const JsonContext& ctx, const json& object, const std::string& path,
                           const char* key) {
  if (!object.is_object()) ctx.fail(path, "expected an object");
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) ctx.fail(child_path(path, key), "missing");
  return *it;
}

std::string require_string(const JsonContext& ctx, const json& object, const std::string& path,
                           const char* key) {
  const json& value = require_member(ctx, object, path, key);
  if (!value.is_string()) ctx.fail(child_path(path, key), "expected a string");
  return value.get<std::string>();
}

// object[key] as T where it is there and not null, else the fallback; `is_kind` checks its JSON type.
template <typename T>
static T optional_member(const JsonContext& ctx, const json& object, const std::string& path, const char* key,
                         const T& fallback, bool (json::*is_kind)() const noexcept, const char* expected) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  if (!((*it).*is_kind)()) ctx.fail(child_path(path, key), expected);
  return it->get<T>();
}

bool optional_bool(const JsonContext& ctx, const json& object, const std::string& path,
                   const char* key, bool fallback) {
  return optional_member(ctx, object, path, key, fallback, &json::is_boolean, "expected true or false");
}

std::string optional_string(const JsonContext& ctx, const json& object, const std::string& path,
                            const char* key, const std::string& fallback) {
  return optional_member(ctx, object, path, key, fallback, &json::is_string, "expected a string");
}

int64_t optional_int(const JsonContext& ctx, const json& object, const std::string& path,
                     const char* key, int64_t fallback) {
  return optional_member(ctx, object, path, key, fallback, &json::is_number_integer, "expected an integer");
}

std::string component_type(const JsonContext& ctx, const json& object, const std::string& path) {
  if (!object.is_object()) ctx.fail(path, "expected an object with a \"type\"");
  return require_string(ctx, object, path, "type");
}

void fail_unsupported(const JsonContext& ctx, const std::string& path, const std::string& type,
                      const char* supported) {
  ctx.fail(path, concat("'", type, "' is not supported (supported: ", supported, ")"));
}

std::string token_id_problem(const json& id) {
  if (!id.is_number_integer() || id.get<int64_t>() < 0) return "expected a non-negative integer id";
  const int64_t value = id.get<int64_t>();
  if (value <= kMaxTokenId) return "";
  // The id-to-token table alone: one std::string per id up to it.
  const double gib = static_cast<double>(value) * sizeof(std::string) / double(1 << 30);
  char need[32];
  std::snprintf(need, sizeof need, "%.1f", gib);
  return concat("id ", value, " is larger than the limit of ", kMaxTokenId, " (a table indexed by it would take ", need,
                " GiB)");
}

}  // namespace hf

namespace {

using hf::json;
using hf::JsonContext;

json parse_json_text(const JsonContext& ctx, const std::string& text) {
  try {
    return parse_json_bounded(text, ctx.source);
  } catch (const json::parse_error& e) {
    ctx.fail("", concat("not valid JSON: ", clip_for_message(e.what())));
  }
}

std::string read_file(const std::string& path, const char* what) { return read_input_file(path, what, kMaxTokenizerBytes); }

std::vector<hf::AddedToken> parse_added_tokens(const JsonContext& ctx, const json& root) {
  std::vector<hf::AddedToken> tokens;
  if (!root.contains("added_tokens") || root["added_tokens"].is_null()) return tokens;
  const json& list = root["added_tokens"];
  if (!list.is_array()) ctx.fail("added_tokens", "expected an array");
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string path = hf::index_path("added_tokens", i);
    const json& entry = list[i];
    hf::AddedToken t;
    const json& id = hf::require_member(ctx, entry, path, "id");
    const std::string problem = hf::token_id_problem(id);
    if (!problem.empty()) ctx.fail(hf::child_path(path, "id"), problem);
    t.id = static_cast<int32_t>(id.get<int64_t>());
    t.content = hf::require_string(ctx, entry, path, "content");
    if (t.content.empty()) ctx.fail(hf::child_path(path, "content"), "empty");
    t.special = hf::optional_bool(ctx, entry, path, "special", false);
    t.single_word = hf::optional_bool(ctx, entry, path, "single_word", false);
    t.lstrip = hf::optional_bool(ctx, entry, path, "lstrip", false);
    t.rstrip = hf::optional_bool(ctx, entry, path, "rstrip", false);
    t.normalized = hf::optional_bool(ctx, entry, path, "normalized", !t.special);
    tokens.push_back(std::move(t));
  }
  return tokens;
}

// The special token named by tokenizer_config.json's `key`: a string or {"content": ...}.
// Returns false when the key is absent; sets `id` (-1 for null or unknown).
bool config_token(const JsonContext& ctx, const json& config, const char* key,
                  const HfTokenizer& tok, int32_t& id) {
  const auto it = config.find(key);
  if (it == config.end()) return false;
  id = -1;
  if (it->is_null()) return true;
  std::string name;
  if (it->is_string()) {
    name = it->get<std::string>();
  } else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    name = (*it)["content"].get<std::string>();
  } else {
    ctx.fail(key, "expected a token string or {\"content\": ...}");
  }
  id = tok.token_to_id(name);
  return true;
}

int32_t first_known(const HfTokenizer& tok, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    const int32_t id = tok.token_to_id(name);
    if (id >= 0) return id;
  }
  return -1;
}

}  // namespace

HfTokenizer HfTokenizer::from_file(const std::string& path) {
  const std::string text = read_file(path, "tokenizer file");
  const std::filesystem::path config_path =
      std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  std::string config;
  if (std::filesystem::exists(config_path))
    config = read_file(config_path.string(), "tokenizer config");
  return from_json(text, path, config);
}

HfTokenizer HfTokenizer::from_json(const std::string& tokenizer_json, const std::string& source,
                                   const std::string& config_json) {
  const JsonContext ctx{source};
  const json root = parse_json_text(ctx, tokenizer_json);
  if (!root.is_object()) ctx.fail("", "expected a JSON object");
  auto impl = std::make_shared<Impl>();
  impl->source = source;

  const json& model = hf::require_member(ctx, root, "", "model");
  if (!model.is_object()) ctx.fail("model", "expected an object");
  // Some older files leave out the type of a BPE model.
  const std::string type =
      hf::optional_string(ctx, model, "model", "type", model.contains("merges") ? "BPE" : "");
  if (type != "BPE") hf::fail_unsupported(ctx, "model.type", type, "BPE");
  impl->model = std::make_unique<hf::BpeModel>(ctx, model, "model");

  const auto member = [&](const char* key) -> const json& {
    static const json null_value;
    const auto it = root.find(key);
    return it == root.end() ? null_value : *it;
  };
  impl->normalizer = hf::parse_normalizer(ctx, member("normalizer"), "normalizer");
  impl->pre_tokenizer = hf::parse_pre_tokenizer(ctx, member("pre_tokenizer"), "pre_tokenizer");
  impl->post_processor = hf::parse_post_processor(ctx, member("post_processor"), "post_processor");
  impl->decoder = hf::parse_decoder(ctx, member("decoder"), "decoder");

  impl->added = parse_added_tokens(ctx, root);
  int32_t max_id = impl->model->max_id();
  for (size_t i = 0; i < impl->added.size(); ++i) {
    const hf::AddedToken& t = impl->added[i];
    impl->added_by_content[t.content] = t.id;
    impl->added_by_id[t.id] = i;
    max_id = std::max(max_id, t.id);
  }
  impl->vocab_size = max_id + 1;
  // Special tokens are matched first, then the others, each in file order (as `tokenizers` does);
  // normalized ones against the normalized text, in their normalized form.
  std::vector<const hf::AddedToken*> raw, normalized;
  std::vector<std::string> raw_patterns, normalized_patterns;
  for (bool special : {true, false}) {
    for (const hf::AddedToken& t : impl->added) {
      if (t.special != special) continue;
      if (t.normalized) {
        std::string pattern = t.content;
        if (impl->normalizer) impl->normalizer->normalize(pattern);
        normalized.push_back(&t);
        normalized_patterns.push_back(std::move(pattern));
      } else {
        raw.push_back(&t);
        raw_patterns.push_back(t.content);
      }
    }
  }
  impl->raw_matcher =
      std::make_unique<hf::AddedTokenMatcher>(std::move(raw), std::move(raw_patterns));
  impl->normalized_matcher = std::make_unique<hf::AddedTokenMatcher>(
      std::move(normalized), std::move(normalized_patterns));

  HfTokenizer tok(impl);
  impl->unk = impl->model->unk_id();
  impl->bos = -1;
  impl->eos = -1;
  impl->pad = -1;
  bool have_bos = false, have_eos = false, have_pad = false;
  if (!config_json.empty()) {
    const JsonContext config_ctx{
        (std::filesystem::path(source).parent_path() / "tokenizer_config.json").string()};
    const json config = parse_json_text(config_ctx, config_json);
    if (!config.is_object()) config_ctx.fail("", "expected a JSON object");
    have_bos = config_token(config_ctx, config, "bos_token", tok, impl->bos);
    have_eos = config_token(config_ctx, config, "eos_token", tok, impl->eos);
    have_pad = config_token(config_ctx, config, "pad_token", tok, impl->pad);
    int32_t unk = -1;
    if (config_token(config_ctx, config, "unk_token", tok, unk) && unk >= 0) impl->unk = unk;
  }
  // Without a config: what the post-processor adds, else the usual names.
  if (!have_bos) {
    impl->bos = !impl->post_processor.prefix.empty()
                    ? impl->post_processor.prefix.front()
                    : first_known(tok, {"<s>", "<|begin_of_text|>", "<|startoftext|>", "<bos>",
                                        "<|endoftext|>"});
  }
  if (!have_eos) {
    impl->eos = !impl->post_processor.suffix.empty()
                    ? impl->post_processor.suffix.back()
                    : first_known(tok, {"</s>", "<|end_of_text|>", "<|endoftext|>", "<eos>"});
  }
  if (!have_pad) impl->pad = first_known(tok, {"<pad>", "[PAD]", "<|pad|>"});
  return tok;
}

std::vector<int32_t> HfTokenizer::encode(const std::string& text, bool add_special_tokens) const {
  const Impl& m = *impl_;
  const size_t bad = hf::find_invalid_utf8(text);
  SHARDLM_CHECK(bad == std::string::npos, "HfTokenizer (", m.source,
                "): the text to encode is not valid UTF-8 (byte ", bad, ")");

  // 1. Added tokens in the raw text; 2. each stretch between them normalized, then searched for
  // the normalized added tokens; 3. pre-tokenized; 4. each word through the model.
  std::vector<hf::Piece> pieces;
  hf::Piece whole;
  whole.text = text;
  whole.at_start = true;
  if (m.raw_matcher->empty()) {
    if (!whole.text.empty()) pieces.push_back(std::move(whole));
  } else {
    m.raw_matcher->split(std::move(whole), pieces);
  }
  if (m.normalizer || !m.normalized_matcher->empty()) {
    std::vector<hf::Piece> normalized;
    normalized.reserve(pieces.size());
    for (hf::Piece& piece : pieces) {
      if (piece.id >= 0) {
        normalized.push_back(std::move(piece));
        continue;
      }
      if (m.normalizer) m.normalizer->normalize(piece.text);
      if (piece.text.empty()) continue;
      if (m.normalized_matcher->empty()) {
        normalized.push_back(std::move(piece));
      } else {
        m.normalized_matcher->split(std::move(piece), normalized);
      }
    }
    pieces.swap(normalized);
  }
  if (m.pre_tokenizer) m.pre_tokenizer->pre_tokenize(pieces);

  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (add_special_tokens) ids = m.post_processor.prefix;
  for (const hf::Piece& piece : pieces) {
    if (piece.id >= 0) {
      ids.push_back(piece.id);
    } else {
      m.model->tokenize(piece.text, ids);
    }
  }
  if (add_special_tokens) {
    ids.insert(ids.end(), m.post_processor.suffix.begin(), m.post_processor.suffix.end());
  }
  return ids;
}

std::string HfTokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  const Impl& m = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    const auto added = m.added_by_id.find(id);
    const std::string* token =
        added != m.added_by_id.end() ? &m.added[added->second].content : m.model->id_to_token(id);
    if (!token) continue;
    // `tokenizers` skips by content: any token spelled like a special token.
    if (skip_special_tokens) {
      const auto special = m.added_by_content.find(*token);
      if (special != m.added_by_content.end() && is_special(special->second)) continue;
    }
    tokens.push_back(*token);
  }
  if (!m.decoder) {
    std::string joined;
    for (size_t i = 0; i < tokens.size(); ++i) joined += (i ? " " : "") + tokens[i];
    return joined;
  }
  m.decoder->decode_chain(tokens);
  std::string text;
  for (const std::string& t : tokens) text += t;
  return text;
}

int32_t HfTokenizer::token_to_id(const std::string& token) const {
  const auto it = impl_->added_by_content.find(token);
  if (it != impl_->added_by_content.end()) return it->second;
  return impl_->model->token_to_id(token);
}

std::string HfTokenizer::id_to_token(int32_t id) const {
  const auto it = impl_->added_by_id.find(id);
  if (it != impl_->added_by_id.end()) return impl_->added[it->second].content;
  const std::string* token = impl_->model->id_to_token(id);
  return token ? *token : std::string();
}

bool HfTokenizer::is_special(int32_t id) const {
  const auto it = impl_->added_by_id.find(id);
  return it != impl_->added_by_id.end() && impl_->added[it->second].special;
}

int32_t HfTokenizer::bos_id() const { return impl_->bos; }
int32_t HfTokenizer::eos_id() const { return impl_->eos; }
int32_t HfTokenizer::pad_id() const { return impl_->pad; }
int32_t HfTokenizer::unk_id() const { return impl_->unk; }
int32_t HfTokenizer::vocab_size() const { return impl_->vocab_size; }

}  // namespace shardlm
