// The BPE model of HfTokenizer, as `tokenizers` runs it: a word is split into characters (unknown
// ones go to <0xNN> byte tokens or the fused unknown token), then pairs merge lowest rank first,
// leftmost among equals. Results are cached per word.
#include <algorithm>
#include <cstdio>
#include <string>

#include "hf_tokenizer.hpp"

namespace shardlm::hf {

namespace {

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

// A merge waiting in the queue: the pair starting at symbol `pos`, by rank then position.
struct Merge {
  int32_t pos;
  int32_t rank;
  int32_t new_id;
};
struct MergeAfter {
  bool operator()(const Merge& a, const Merge& b) const {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  }
};

}  // namespace

BpeModel::BpeModel(const JsonContext& ctx, const json& model, const std::string& path) {
  byte_fallback_ids_.fill(-1);
  const json& dropout = model.contains("dropout") ? model["dropout"] : json();
  if (!dropout.is_null() && !(dropout.is_number() && dropout.get<double>() == 0.0)) {
    ctx.fail(child_path(path, "dropout"),
             "BPE dropout is not supported (it makes encoding random; set it to null)");
  }

  const std::string vocab_path = child_path(path, "vocab");
  const json& vocab = require_member(ctx, model, path, "vocab");
  if (!vocab.is_object()) ctx.fail(vocab_path, "expected an object of token: id");
  vocab_.reserve(vocab.size());
  int32_t max_id = -1;
  for (const auto& [token, id] : vocab.items()) {
    const std::string problem = token_id_problem(id);
    if (!problem.empty()) ctx.fail(child_path(vocab_path, token), problem);
    const auto value = static_cast<int32_t>(id.get<int64_t>());
    vocab_[token] = value;
    max_id = std::max(max_id, value);
  }
  id_to_token_.assign(static_cast<size_t>(max_id + 1), std::string());
  for (const auto& [token, id] : vocab_) {
    id_to_token_[static_cast<size_t>(id)] = token;
    size_t pos = 0;
    if (!token.empty() && find_invalid_utf8(token) == std::string::npos) {
      const uint32_t cp = next_code_point(token, pos);
      if (pos == token.size()) single_char_ids_[cp] = id;
    }
  }

  continuing_subword_prefix_ = optional_string(ctx, model, path, "continuing_subword_prefix", "");
  end_of_word_suffix_ = optional_string(ctx, model, path, "end_of_word_suffix", "");
  byte_fallback_ = optional_bool(ctx, model, path, "byte_fallback", false);
  fuse_unk_ = optional_bool(ctx, model, path, "fuse_unk", false);
  ignore_merges_ = optional_bool(ctx, model, path, "ignore_merges", false);
  if (model.contains("unk_token") && !model["unk_token"].is_null()) {
    const std::string unk = require_string(ctx, model, path, "unk_token");
    const auto it = vocab_.find(unk);
    if (it == vocab_.end()) {
      ctx.fail(child_path(path, "unk_token"), concat("'", unk, "' is not in model.vocab"));
    }
    unk_id_ = it->second;
  }
  if (byte_fallback_) {
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      const auto it = vocab_.find(name);
      if (it != vocab_.end()) byte_fallback_ids_[b] = it->second;
    }
  }

  // Merges: "left right" strings, or [left, right] pairs (tokenizers >= 0.20).
  const std::string merges_path = child_path(path, "merges");
  const json& merges = model.contains("merges") ? model["merges"] : json::array();
  if (!merges.is_array()) ctx.fail(merges_path, "expected an array");
  merges_.reserve(merges.size());
  const size_t prefix_len = continuing_subword_prefix_.size();
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const json& entry = merges[rank];
    const std::string entry_path = index_path(merges_path, rank);
    std::string left, right;
    if (entry.is_string()) {
      const std::string& line = entry.get_ref<const std::string&>();
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        ctx.fail(entry_path, concat("expected \"left right\" with one space, got '", line, "'"));
      }
      left = line.substr(0, space);
      right = line.substr(space + 1);
    } else if (entry.is_array() && entry.size() == 2 && entry[0].is_string() &&
               entry[1].is_string()) {
      left = entry[0].get<std::string>();
      right = entry[1].get<std::string>();
    } else {
      ctx.fail(entry_path, "expected \"left right\" or [\"left\", \"right\"]");
    }
    const auto l = vocab_.find(left);
    const auto r = vocab_.find(right);
    if (l == vocab_.end()) ctx.fail(entry_path, concat("'", left, "' is not in model.vocab"));
    if (r == vocab_.end()) ctx.fail(entry_path, concat("'", right, "' is not in model.vocab"));
    const std::string merged = left + right.substr(std::min(prefix_len, right.size()));
    const auto m = vocab_.find(merged);
    if (m == vocab_.end()) {
      ctx.fail(entry_path, concat("the merged token '", merged, "' is not in model.vocab"));
    }
    // A repeated pair keeps its last rank, as the HashMap of `tokenizers` does.
    merges_[pair_key(l->second, r->second)] = {static_cast<int32_t>(rank), m->second};
  }
}

int32_t BpeModel::token_to_id(const std::string& token) const {
  const auto it = vocab_.find(token);
  return it == vocab_.end() ? -1 : it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size()) return nullptr;
  const std::string& token = id_to_token_[static_cast<size_t>(id)];
  // An id with no token (a gap in the vocabulary) has an empty name; no vocabulary has "".
  if (token.empty() && vocab_.count(token) == 0) return nullptr;
  return &token;
}

const std::pair<int32_t, int32_t>* BpeModel::find_merge(int32_t left, int32_t right) const {
  const auto it = merges_.find(pair_key(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

void BpeModel::add_initial_symbols(const std::string& word, std::vector<Symbol>& symbols) const {
  const auto add = [&](int32_t id, size_t len) {
    const auto index = static_cast<int32_t>(symbols.size());
    if (!symbols.empty()) symbols.back().next = index;
    symbols.push_back({id, index - 1, -1, static_cast<uint32_t>(len)});
  };
  const bool plain = continuing_subword_prefix_.empty() && end_of_word_suffix_.empty();
  int32_t unk_pending = -1;  // an unknown token waiting to be added (fused with the next ones)
  size_t unk_len = 0;
  std::string s;
  size_t pos = 0;
  while (pos < word.size()) {
    const size_t start = pos;
    const uint32_t cp = next_code_point(word, pos);
    const size_t byte_len = pos - start;
    int32_t id = -1;
    if (plain) {
      const auto it = single_char_ids_.find(cp);
      if (it != single_char_ids_.end()) id = it->second;
      s.assign(word, start, byte_len);
    } else {
      s.clear();
      if (start != 0) s += continuing_subword_prefix_;
      s.append(word, start, byte_len);
      if (pos == word.size()) s += end_of_word_suffix_;
      id = token_to_id(s);
    }
    if (id >= 0) {
      if (unk_pending >= 0) {
        add(unk_pending, unk_len);
        unk_pending = -1;
      }
      add(id, byte_len);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (unsigned char b : s) all = all && byte_fallback_ids_[b] >= 0;
      if (all) {
        // As in `tokenizers`, a waiting unknown token is not flushed before byte tokens.
        for (unsigned char b : s) add(byte_fallback_ids_[b], 1);
        continue;
      }
    }
    if (unk_id_ >= 0) {
      if (unk_pending >= 0 && fuse_unk_) {
        unk_len += byte_len;
      } else {
        if (unk_pending >= 0) add(unk_pending, unk_len);
        unk_pending = unk_id_;
        unk_len = byte_len;
      }
    }
    // Without an unknown token the character is dropped, as `tokenizers` does.
  }
  if (unk_pending >= 0) add(unk_pending, unk_len);
}

void BpeModel::merge_word(const std::string& word, std::vector<int32_t>& out) const {
  thread_local std::vector<Symbol> symbols;
  thread_local std::vector<Merge> queue;  // a heap: lowest rank, then leftmost, on top
  symbols.clear();
  queue.clear();
  add_initial_symbols(word, symbols);
  const auto push = [](const Merge& m) {
    queue.push_back(m);
    std::push_heap(queue.begin(), queue.end(), MergeAfter());
  };
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const auto* m = find_merge(symbols[i].id, symbols[i + 1].id)) {
      push({static_cast<int32_t>(i), m->first, m->second});
    }
  }
  // Word::merge_all of `tokenizers`, step for step (its stale-entry test included).
  while (!queue.empty()) {
    std::pop_heap(queue.begin(), queue.end(), MergeAfter());
    const Merge top = queue.back();
    queue.pop_back();
    Symbol& current = symbols[static_cast<size_t>(top.pos)];
    if (current.len == 0 || current.next == -1) continue;
    const int32_t next_pos = current.next;
    const Symbol right = symbols[static_cast<size_t>(next_pos)];
    const auto* target = find_merge(current.id, right.id);
    if (!target || target->second != top.new_id) continue;

    current.id = top.new_id;
    current.len += right.len;
    current.next = right.next;
    symbols[static_cast<size_t>(next_pos)].len = 0;
    if (right.next >= 0 && static_cast<size_t>(right.next) < symbols.size()) {
      symbols[static_cast<size_t>(right.next)].prev = top.pos;
    }
    if (current.prev >= 0) {
      if (const auto* m = find_merge(symbols[static_cast<size_t>(current.prev)].id, current.id)) {
        push({current.prev, m->first, m->second});
      }
    }
    if (current.next >= 0 && static_cast<size_t>(current.next) < symbols.size()) {
      if (const auto* m = find_merge(current.id, symbols[static_cast<size_t>(current.next)].id)) {
        push({top.pos, m->first, m->second});
      }
    }
  }
  for (const Symbol& s : symbols) {
    if (s.len != 0) out.push_back(s.id);
  }
}

void BpeModel::tokenize(const std::string& word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    const auto it = vocab_.find(word);
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() < kMaxCachedWord;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    const auto it = cache_.find(word);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out.size();
  merge_word(word, out);
  if (cacheable) {
    std::vector<int32_t> ids(out.begin() + static_cast<std::ptrdiff_t>(first), out.end());
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() >= kCacheCapacity) cache_.clear();
    cache_.emplace(word, std::move(ids));
  }
}

}  // namespace shardlm::hf
