// Added tokens of HfTokenizer: found in the text before normalization (or after it, for tokens
// marked normalized) leftmost-longest, with the single_word, lstrip and rstrip rules of
// `tokenizers`' AddedVocabulary::find_matches.
#include <algorithm>
#include <string>

#include "hf_tokenizer.hpp"

namespace shardlm::hf {

namespace {

// Rust regex's \w: alphabetic, marks, decimal digits, connector punctuation, joiners.
bool is_word_char(std::string_view text, size_t pos) {
  static const Regex word("^[\\p{L}\\p{Nl}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}]");
  size_t end = pos;
  next_code_point(text, end);
  std::vector<std::pair<size_t, size_t>> matches;
  word.find_all(text.substr(pos, end - pos), matches);
  return !matches.empty();
}

size_t last_char_start(std::string_view text) {
  size_t start = text.size() - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  return start;
}

bool ends_with_word(std::string_view text) {
  return !text.empty() && is_word_char(text, last_char_start(text));
}

bool starts_with_word(std::string_view text) { return !text.empty() && is_word_char(text, 0); }

// Start of the whitespace run that ends `text`.
size_t trailing_space_start(std::string_view text) {
  size_t end = text.size();
  while (end > 0) {
    const size_t start = last_char_start(text.substr(0, end));
    size_t pos = start;
    if (!is_whitespace(next_code_point(text, pos))) break;
    end = start;
  }
  return end;
}

// Length of the whitespace run that starts `text`.
size_t leading_space_length(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t next = pos;
    if (!is_whitespace(next_code_point(text, next))) break;
    pos = next;
  }
  return pos;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<const AddedToken*> tokens,
                                     std::vector<std::string> patterns)
    : tokens_(std::move(tokens)), patterns_(std::move(patterns)) {
  for (size_t i = 0; i < patterns_.size(); ++i) {
    if (!patterns_[i].empty()) {
      by_first_byte_[static_cast<unsigned char>(patterns_[i][0])].push_back(i);
    }
  }
  // Longest first; among equal patterns the first given wins, as in aho-corasick.
  for (auto& bucket : by_first_byte_) {
    std::stable_sort(bucket.begin(), bucket.end(),
                     [&](size_t a, size_t b) { return patterns_[a].size() > patterns_[b].size(); });
  }
}

void AddedTokenMatcher::split(Piece piece, std::vector<Piece>& out) const {
  const std::string& text = piece.text;
  const size_t n = text.size();
  const auto push_text = [&](size_t s, size_t e) {
    if (s >= e) return;
    Piece part;
    part.text.assign(text, s, e - s);
    part.at_start = piece.at_start && s == 0;
    out.push_back(std::move(part));
  };
  size_t start_offset = 0;  // end of what has been emitted
  size_t search = 0;        // where the next match may begin
  while (search < n) {
    // The leftmost position where a pattern matches, and the longest pattern there.
    size_t match_start = n, match_index = 0;
    for (size_t i = search; i < n && match_start == n; ++i) {
      for (size_t index : by_first_byte_[static_cast<unsigned char>(text[i])]) {
        const std::string& p = patterns_[index];
        if (text.compare(i, p.size(), p) == 0) {
          match_start = i;
          match_index = index;
          break;
        }
      }
    }
    if (match_start == n) break;
    const AddedToken& token = *tokens_[match_index];
    size_t start = match_start;
    size_t stop = match_start + patterns_[match_index].size();
    search = stop;
    const std::string_view view(text);
    if (token.single_word) {
      const bool start_space = start == 0 || !ends_with_word(view.substr(0, start));
      const bool stop_space = stop == n || !starts_with_word(view.substr(stop));
      if (!start_space || !stop_space) continue;
    }
    if (token.lstrip) start = std::max(trailing_space_start(view.substr(0, start)), start_offset);
    if (token.rstrip) stop += leading_space_length(view.substr(stop));
    push_text(start_offset, start);
    Piece added;
    added.text = token.content;
    added.id = token.id;
    out.push_back(std::move(added));
    start_offset = stop;
  }
  push_text(start_offset, n);
}

}  // namespace shardlm::hf
