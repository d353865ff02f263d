// Text -> typed value parsers for deck values, with errors naming the key, and round-trip formatting.
#include <cctype>
#include <charconv>
#include <climits>
#include <cmath>

#include "config_internal.hpp"

namespace shardlm::config_detail {

void bad_value(const std::string& key, const std::string& shown, const std::string& why) {
  throw Error(concat(key, " = ", shown, ": ", why));
}

std::string quoted(const std::string& s) { return concat("'", s, "'"); }

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

// from_chars takes no leading '+'; users write "+1" now and then, so drop it before a digit.
static std::string unsigned_text(const std::string& text) {
  std::string t = trim(text);
  if (t.size() > 1 && t[0] == '+' && (std::isdigit(static_cast<unsigned char>(t[1])) || t[1] == '.'))
    t.erase(0, 1);
  return t;
}

int parse_int(const std::string& key, const std::string& text, int min, const char* why_min) {
  std::string t = unsigned_text(text);
  long long v = 0;
  auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  if (t.empty() || (ec != std::errc() && ec != std::errc::result_out_of_range) ||
      end != t.data() + t.size())
    bad_value(key, quoted(text), "not an integer");
  if (ec == std::errc::result_out_of_range || v > INT_MAX || v < INT_MIN)
    bad_value(key, text, "out of range");
  if (v < min) bad_value(key, text, why_min);
  return static_cast<int>(v);
}

uint64_t parse_unsigned(const std::string& key, const std::string& text) {
  std::string t = unsigned_text(text);
  bool negative = !t.empty() && t[0] == '-';
  uint64_t v = 0;
  const char* first = t.data() + (negative ? 1 : 0);
  auto [end, ec] = std::from_chars(first, t.data() + t.size(), v);
  if (first == t.data() + t.size() || (ec != std::errc() && ec != std::errc::result_out_of_range) ||
      end != t.data() + t.size())
    bad_value(key, quoted(text), "not an integer");
  if (negative && v != 0) bad_value(key, text, "must be >= 0");
  if (ec == std::errc::result_out_of_range) bad_value(key, text, "out of range");
  return v;
}

// Locale-independent (from_chars), whole-text, finite-only parse of a float or double.
template <typename T>
static T parse_real(const std::string& key, const std::string& text) {
  std::string t = unsigned_text(text);
  T v = 0;
  auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  if (t.empty() || (ec != std::errc() && ec != std::errc::result_out_of_range) ||
      end != t.data() + t.size())
    bad_value(key, quoted(text), "not a number");
  if (ec == std::errc::result_out_of_range) bad_value(key, text, "out of range");
  if (!std::isfinite(v)) bad_value(key, text, "must be finite");
  return v;
}

double parse_double(const std::string& key, const std::string& text) {
  return parse_real<double>(key, text);
}

float parse_float(const std::string& key, const std::string& text) {
  return parse_real<float>(key, text);
}

bool parse_bool(const std::string& key, const std::string& text) {
  std::string t = lower(trim(text));
  if (t == "true" || t == "1" || t == "yes") return true;
  if (t == "false" || t == "0" || t == "no") return false;
  bad_value(key, quoted(text), "must be true or false (or 1/0, yes/no)");
}

std::vector<std::string> split_names(const std::string& key, const std::string& text) {
  std::vector<std::string> names;
  if (trim(text).empty()) return names;
  size_t begin = 0;
  for (;;) {
    const size_t comma = text.find(',', begin);
    names.push_back(trim(text.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin)));
    if (names.back().empty()) bad_value(key, quoted(text), "an empty name in the list (names are separated by commas)");
    if (comma == std::string::npos) return names;
    begin = comma + 1;
  }
}

std::string join_names(const std::vector<std::string>& names) {
  std::string text;
  for (const std::string& n : names) text += (text.empty() ? "" : ",") + n;
  return text;
}

// Shortest round-trip text (C++17 to_chars): "0.002", "1e-08", never a lossy "%g".
template <typename T>
static std::string format_real(T v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return ec == std::errc() ? std::string(buf, end) : std::string("nan");
}

std::string format_double(double v) { return format_real(v); }
std::string format_float(float v) { return format_real(v); }

}  // namespace shardlm::config_detail
