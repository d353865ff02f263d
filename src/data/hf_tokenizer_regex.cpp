// Patterns of HfTokenizer: Oniguruma regexes (what `tokenizers` compiles) run by PCRE2 with JIT,
// literal patterns, and NormalizedString::split's cutting of a piece at a pattern's matches.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "hf_tokenizer.hpp"

namespace shardlm::hf {

namespace {

// Unicode White_Space: Oniguruma's \s (PCRE2's own \s adds U+180E).
constexpr const char* kWhitespaceItems =
    "\\x{9}-\\x{D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}";

struct ClassItems {
  bool negated = false;
  std::string items;  // the class body without its brackets and ^
};

// Parses the class opening at p[i] == '[' up to its closing ']', flattening the nested classes
// Oniguruma allows ([a[bc]] is [abc]); `i` ends past the ']'.
ClassItems parse_class(const std::string& p, size_t& i) {
  ClassItems cls;
  ++i;
  if (i < p.size() && p[i] == '^') {
    cls.negated = true;
    ++i;
  }
  bool first = true;
  while (i < p.size()) {
    const char c = p[i];
    if (c == ']' && !first) {
      ++i;
      return cls;
    }
    first = false;
    if (c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // POSIX bracket, same in PCRE2
      const size_t end = p.find(":]", i + 2);
      if (end == std::string::npos) throw std::invalid_argument("unterminated POSIX bracket");
      cls.items.append(p, i, end + 2 - i);
      i = end + 2;
    } else if (c == '[') {
      const ClassItems nested = parse_class(p, i);
      if (nested.negated) {
        throw std::invalid_argument("a negated class inside a class is not supported");
      }
      cls.items += nested.items;
    } else if (c == '\\') {
      if (i + 1 >= p.size()) throw std::invalid_argument("pattern ends with a backslash");
      const char d = p[i + 1];
      if (d == 's') {
        cls.items += kWhitespaceItems;
      } else if (d == 'h') {
        cls.items += "0-9a-fA-F";
      } else if (d == 'H') {
        throw std::invalid_argument("\\H inside a class is not supported");
      } else {
        cls.items += '\\';
        cls.items += d;
      }
      i += 2;
    } else if (c == '&' && i + 1 < p.size() && p[i + 1] == '&') {
      throw std::invalid_argument("class intersection (&&) is not supported");
    } else {
      cls.items += c;
      ++i;
    }
  }
  throw std::invalid_argument("unterminated character class");
}

// Per-thread PCRE2 match state, with a JIT stack larger than the default 32 KiB so that long
// runs of whitespace or letters never exhaust it.
struct MatchScratch {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  MatchScratch() {
    data = pcre2_match_data_create(16, nullptr);
    context = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);
    if (context && stack) pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~MatchScratch() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

size_t utf8_char_length(std::string_view text, size_t pos) {
  const unsigned char lead = static_cast<unsigned char>(text[pos]);
  if (lead < 0x80) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return 4;
}

}  // namespace

std::string oniguruma_to_pcre2(const std::string& p) {
  std::string out;
  out.reserve(p.size() + 64);
  size_t i = 0;
  while (i < p.size()) {
    const char c = p[i];
    if (c == '\\') {
      if (i + 1 >= p.size()) throw std::invalid_argument("pattern ends with a backslash");
      const char d = p[i + 1];
      if (d == 's') {
        out += std::string("[") + kWhitespaceItems + "]";
      } else if (d == 'S') {
        out += std::string("[^") + kWhitespaceItems + "]";
      } else if (d == 'h') {
        out += "[0-9a-fA-F]";
      } else if (d == 'H') {
        out += "[^0-9a-fA-F]";
      } else {
        out += '\\';
        out += d;
      }
      i += 2;
    } else if (c == '[') {
      const ClassItems cls = parse_class(p, i);
      out += cls.negated ? "[^" : "[";
      out += cls.items;
      out += ']';
    } else if (c == '{' && i + 1 < p.size() && p[i + 1] == ',') {
      out += "{0";  // Oniguruma's {,n} is {0,n}; PCRE2 10.42 reads it as text
      ++i;
    } else {
      out += c;
      ++i;
    }
  }
  return out;
}

Regex::Regex(const std::string& oniguruma_pattern) {
  const std::string pattern = oniguruma_to_pcre2(oniguruma_pattern);
  int error = 0;
  PCRE2_SIZE offset = 0;
  // UCP: \p{..}, \w, \d and case folding by Unicode; MULTILINE: ^ and $ are line anchors, as in
  // Oniguruma's Ruby syntax.
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &error, &offset, nullptr);
  if (!code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    throw std::invalid_argument(std::string(reinterpret_cast<const char*>(message)) +
                                " at offset " + std::to_string(offset) + " of the PCRE2 form '" +
                                pattern + "'");
  }
  code_ = {code, [](void* c) { pcre2_code_free(static_cast<pcre2_code*>(c)); }};
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
}

void Regex::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
  thread_local MatchScratch scratch;
  auto* code = static_cast<pcre2_code*>(code_.get());
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  size_t last_match_end = std::string_view::npos;
  while (start <= text.size()) {
    // The text was checked to be UTF-8 once, in encode.
    const int rc =
        jit_ ? pcre2_jit_match(code, subject, text.size(), start, 0, scratch.data, scratch.context)
             : pcre2_match(code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, scratch.data,
                           scratch.context);
    if (rc == PCRE2_ERROR_NOMATCH) return;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      throw Error(
          concat("HfTokenizer: regex match failed: ", reinterpret_cast<const char*>(message)));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(scratch.data);
    const size_t s = ovector[0], e = ovector[1];
    // Oniguruma's find_iter skips an empty match right after the previous match.
    if (s == e && last_match_end == e) {
      if (start >= text.size()) return;
      start += utf8_char_length(text, start);
      continue;
    }
    out.emplace_back(s, e);
    start = e;
    last_match_end = e;
  }
}

void Pattern::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
  if (regex) {
    regex->find_all(text, out);
    return;
  }
  if (literal.empty()) return;
  size_t pos = 0;
  while ((pos = text.find(literal, pos)) != std::string_view::npos) {
    out.emplace_back(pos, pos + literal.size());
    pos += literal.size();
  }
}

void Pattern::replace_all(std::string& text, const std::string& content,
                          std::vector<std::pair<size_t, size_t>>& matches) const {
  matches.clear();
  find_all(text, matches);
  if (matches.empty()) return;
  std::string out;
  out.reserve(text.size() + matches.size() * content.size());
  size_t prev = 0;
  for (const auto& [s, e] : matches) {
    out.append(text, prev, s - prev);
    out += content;
    prev = e;
  }
  out.append(text, prev, std::string::npos);
  text.swap(out);
}

Pattern parse_pattern(const JsonContext& ctx, const json& object, const std::string& path) {
  if (!object.is_object()) ctx.fail(path, "expected {\"String\": ...} or {\"Regex\": ...}");
  Pattern pattern;
  if (object.contains("String")) {
    pattern.literal = require_string(ctx, object, path, "String");
  } else if (object.contains("Regex")) {
    const std::string source = require_string(ctx, object, path, "Regex");
    try {
      pattern.regex = std::make_shared<const Regex>(source);
    } catch (const std::invalid_argument& e) {
      ctx.fail(child_path(path, "Regex"),
               concat("regex '", source, "' is not supported: ", e.what()));
    }
  } else {
    ctx.fail(path, "expected {\"String\": ...} or {\"Regex\": ...}");
  }
  return pattern;
}

SplitBehavior parse_split_behavior(const JsonContext& ctx, const json& value,
                                   const std::string& path) {
  if (!value.is_string()) ctx.fail(path, "expected a string");
  const std::string name = value.get<std::string>();
  if (name == "Removed") return SplitBehavior::Removed;
  if (name == "Isolated") return SplitBehavior::Isolated;
  if (name == "MergedWithPrevious") return SplitBehavior::MergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::MergedWithNext;
  if (name == "Contiguous") return SplitBehavior::Contiguous;
  ctx.fail(path, concat("unknown split behavior '", name,
                        "' (Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous)"));
}

void split_piece(const Pattern& pattern, SplitBehavior behavior, bool invert, Piece piece,
                 std::vector<Piece>& out) {
  if (piece.text.empty()) return;
  thread_local std::vector<std::pair<size_t, size_t>> matches;
  matches.clear();
  pattern.find_all(piece.text, matches);

  // Every byte of the text in order: (start, end, is_match), as Pattern::find_matches gives them.
  struct Span {
    size_t start, end;
    bool is_match;
  };
  thread_local std::vector<Span> spans;
  spans.clear();
  size_t prev = 0;
  for (const auto& [s, e] : matches) {
    if (prev != s) spans.push_back({prev, s, invert});
    spans.push_back({s, e, !invert});
    prev = e;
  }
  if (prev != piece.text.size()) spans.push_back({prev, piece.text.size(), invert});

  // The parts to keep, by behavior (SplitDelimiterBehavior of `tokenizers`).
  thread_local std::vector<std::pair<size_t, size_t>> parts;
  parts.clear();
  switch (behavior) {
    case SplitBehavior::Isolated:
      for (const Span& s : spans) parts.emplace_back(s.start, s.end);
      break;
    case SplitBehavior::Removed:
      for (const Span& s : spans) {
        if (!s.is_match) parts.emplace_back(s.start, s.end);
      }
      break;
    case SplitBehavior::Contiguous:
    case SplitBehavior::MergedWithPrevious: {
      // A span joins the part before it: Contiguous, when it is of the previous span's kind;
      // MergedWithPrevious, when it is a match after a non-match.
      const bool contiguous = behavior == SplitBehavior::Contiguous;
      bool previous_match = false;
      for (const Span& s : spans) {
        const bool joins = contiguous ? s.is_match == previous_match : s.is_match && !previous_match;
        if (joins && !parts.empty()) {
          parts.back().second = s.end;
        } else {
          parts.emplace_back(s.start, s.end);
        }
        previous_match = s.is_match;
      }
      break;
    }
    case SplitBehavior::MergedWithNext: {
      bool previous_match = false;
      for (size_t k = spans.size(); k-- > 0;) {
        const Span& s = spans[k];
        if (s.is_match && !previous_match && !parts.empty()) {
          parts.back().first = s.start;
        } else {
          parts.emplace_back(s.start, s.end);
        }
        previous_match = s.is_match;
      }
      std::reverse(parts.begin(), parts.end());
      break;
    }
  }

  for (const auto& [s, e] : parts) {
    if (s == e) continue;
    Piece part;
    part.text.assign(piece.text, s, e - s);
    part.at_start = piece.at_start && s == 0;
    out.push_back(std::move(part));
  }
}

}  // namespace shardlm::hf
