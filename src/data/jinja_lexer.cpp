// Jinja lexing: the template into text, {{ }} and {% %} chunks with jinja2's whitespace rules as
// transformers sets them (trim_blocks, lstrip_blocks), and an expression into tokens.
#include <cctype>

#include "jinja_ast.hpp"

namespace shardlm::jinja {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// jinja2 reads the source with its lines split and joined by "\n": \r\n and \r become \n and one
// trailing newline goes (keep_trailing_newline is off).
std::string normalize_newlines(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < text.size() && text[i + 1] == '\n') ++i;
    } else {
      out.push_back(text[i]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

int count_lines(const std::string& text, size_t begin, size_t end) {
  int n = 0;
  for (size_t i = begin; i < end; ++i) n += text[i] == '\n';
  return n;
}

// lstrip_blocks: spaces and tabs between a line's start and a block or comment tag go.
void strip_line_start(std::string& text, bool line_starting) {
  const size_t newline = text.rfind('\n');
  const size_t from = newline == std::string::npos ? 0 : newline + 1;
  if (newline == std::string::npos && !line_starting) return;
  for (size_t i = from; i < text.size(); ++i)
    if (!is_space(text[i])) return;
  text.erase(from);
}

// The end of the tag opened at `pos` (the index of its closer), skipping quoted strings in {{ }}
// and {% %} and, as jinja2's lexer, closers inside brackets (`{{ {'a': {'b': 1}} }}`); npos when it is not
// closed. With unbalanced brackets, the first closer (the parser then names the real fault).
size_t find_closer(const std::string& text, size_t pos, char kind) {
  const std::string closer = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
  if (kind == '#') return text.find(closer, pos);
  size_t first = std::string::npos;
  int depth = 0;
  for (size_t i = pos; i + 1 < text.size(); ++i) {
    const char c = text[i];
    if (c == '\'' || c == '"') {
      for (++i; i < text.size() && text[i] != c; ++i)
        if (text[i] == '\\') ++i;
      continue;
    }
    if (text.compare(i, 2, closer) == 0) {
      if (depth == 0) return i;
      if (first == std::string::npos) first = i;
    }
    if (c == '(' || c == '[' || c == '{') ++depth;
    else if ((c == ')' || c == ']' || c == '}') && depth > 0) --depth;
  }
  return first;
}

}  // namespace

std::vector<Chunk> split_template(const std::string& raw, const std::string& source) {
  const std::string text = normalize_newlines(raw);
  std::vector<Chunk> chunks;
  size_t pos = 0;
  int line = 1;
  bool strip_next = false;  // the previous tag ended with '-'
  while (pos <= text.size()) {
    size_t open = text.find('{', pos);
    while (open != std::string::npos && open + 1 < text.size() && text[open + 1] != '{' &&
           text[open + 1] != '%' && text[open + 1] != '#')
      open = text.find('{', open + 1);
    if (open + 1 >= text.size()) open = std::string::npos;
    std::string literal = text.substr(pos, open == std::string::npos ? std::string::npos : open - pos);
    bool line_starting = pos == 0 || text[pos - 1] == '\n';
    if (strip_next) {  // '-' took the whitespace after the last tag (jinja2 counts it as that tag's)
      size_t first = 0;
      while (first < literal.size() && is_space(literal[first])) ++first;
      if (first > 0) line_starting = literal[first - 1] == '\n';
      literal.erase(0, first);
    }
    const int literal_line = line;
    line += count_lines(text, pos, open == std::string::npos ? text.size() : open);
    if (open == std::string::npos) {
      if (!literal.empty()) chunks.push_back({Chunk::Kind::Text, literal, literal_line});
      break;
    }
    const char kind = text[open + 1];
    size_t inner = open + 2;
    const char modifier = inner < text.size() ? text[inner] : '\0';
    if (modifier == '-') {
      while (!literal.empty() && is_space(literal.back())) literal.pop_back();
    } else if (modifier != '+' && kind != '{') {
      strip_line_start(literal, line_starting);
    }
    if (modifier == '-' || modifier == '+') ++inner;
    if (!literal.empty()) chunks.push_back({Chunk::Kind::Text, literal, literal_line});
    const size_t close = find_closer(text, inner, kind);
    if (close == std::string::npos)
      throw TemplateError(source, line, kind == '#' ? "unclosed comment" : "a tag is not closed");
    const bool minus_end = close > inner && text[close - 1] == '-';
    const bool plus_end = close > inner && text[close - 1] == '+' && kind != '{';
    const std::string body = text.substr(inner, close - inner - (minus_end || plus_end ? 1 : 0));
    if (kind != '#')
      chunks.push_back({kind == '{' ? Chunk::Kind::Output : Chunk::Kind::Statement, body, line});
    line += count_lines(text, open, close + 2);
    pos = close + 2;
    strip_next = minus_end;
    // trim_blocks: the first newline after a block or comment tag goes.
    if (!minus_end && !plus_end && kind != '{' && pos < text.size() && text[pos] == '\n') {
      ++pos;
      ++line;
    }
  }
  return chunks;
}

namespace {

void append_utf8(std::string& out, uint32_t cp) { out += utf8_encode(std::u32string(1, static_cast<char32_t>(cp))); }

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// A quoted string literal from text[pos] (the quote); Python's escapes. Returns the end.
size_t read_string(const std::string& text, size_t pos, std::string& out, const std::string& source, int line) {
  const char quote = text[pos];
  size_t i = pos + 1;
  for (; i < text.size() && text[i] != quote; ++i) {
    if (text[i] != '\\' || i + 1 >= text.size()) {
      out.push_back(text[i]);
      continue;
    }
    const char e = text[++i];
    switch (e) {
      case 'n': out.push_back('\n'); break;
      case 't': out.push_back('\t'); break;
      case 'r': out.push_back('\r'); break;
      case 'b': out.push_back('\b'); break;
      case 'f': out.push_back('\f'); break;
      case 'v': out.push_back('\v'); break;
      case 'a': out.push_back('\a'); break;
      case '0': out.push_back('\0'); break;
      case '\\': case '\'': case '"': out.push_back(e); break;
      case '\n': break;
      case 'x': case 'u': case 'U': {
        const size_t digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        uint32_t cp = 0;
        for (size_t k = 0; k < digits; ++k) {
          const int h = i + 1 + k < text.size() ? hex_value(text[i + 1 + k]) : -1;
          if (h < 0) throw TemplateError(source, line, "a bad \\" + std::string(1, e) + " escape in a string");
          cp = cp * 16 + static_cast<uint32_t>(h);
        }
        i += digits;
        append_utf8(out, cp);
        break;
      }
      default: out.push_back('\\'); out.push_back(e);
    }
  }
  if (i >= text.size()) throw TemplateError(source, line, "a string is not closed");
  return i + 1;
}

// A number from text[pos]: digits with underscores, an optional fraction and exponent.
size_t read_number(const std::string& text, size_t pos, Token& token) {
  size_t i = pos;
  bool is_float = false;
  auto digits = [&] {
    while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '_')) {
      if (text[i] != '_') token.text.push_back(text[i]);
      ++i;
    }
  };
  digits();
  if (i + 1 < text.size() && text[i] == '.' && std::isdigit(static_cast<unsigned char>(text[i + 1]))) {
    is_float = true;
    token.text.push_back(text[i++]);
    digits();
  }
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    size_t j = i + 1;
    if (j < text.size() && (text[j] == '+' || text[j] == '-')) ++j;
    if (j < text.size() && std::isdigit(static_cast<unsigned char>(text[j]))) {
      is_float = true;
      token.text += text.substr(i, j - i);
      i = j;
      digits();
    }
  }
  token.kind = is_float ? Token::Kind::Float : Token::Kind::Int;
  return i;
}

}  // namespace

std::vector<Token> tokenize_expression(const std::string& text, const std::string& source, int line) {
  static const char* kTwoChar[] = {"//", "**", "==", "!=", "<=", ">="};
  std::vector<Token> tokens;
  size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (is_space(c)) {
      line += c == '\n';
      ++i;
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < text.size() && (std::isalnum(static_cast<unsigned char>(text[j])) || text[j] == '_')) ++j;
      tokens.push_back({Token::Kind::Name, text.substr(i, j - i)});
      i = j;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      Token t{Token::Kind::Int, ""};
      i = read_number(text, i, t);
      tokens.push_back(t);
    } else if (c == '\'' || c == '"') {
      Token t{Token::Kind::String, ""};
      i = read_string(text, i, t.text, source, line);
      tokens.push_back(t);
    } else {
      std::string op(1, c);
      for (const char* two : kTwoChar)
        if (text.compare(i, 2, two) == 0) op = two;
      if (std::string("+-*/%~<>=()[]{},.:|").find(c) == std::string::npos && op.size() == 1)
        throw TemplateError(source, line, concat("unexpected character '", std::string(1, c), "'"));
      tokens.push_back({Token::Kind::Op, op});
      i += op.size();
    }
  }
  tokens.push_back({Token::Kind::End, ""});
  return tokens;
}

}  // namespace shardlm::jinja
