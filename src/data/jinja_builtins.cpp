// Jinja built-ins as jinja2 and transformers define them: the filters, tests, string and dict
// methods and global functions that chat templates call.
#include <algorithm>
#include <cfenv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <map>
#include <optional>
#include <unicode/locid.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include "jinja_ast.hpp"

namespace shardlm::jinja {

namespace {

using Filter = Value (*)(const Value&, Args&);
using Test = bool (*)(const Value&, Args&);

// A filter or test with the parameters it takes after its subject, as jinja2 (transformers for tojson)
// declares them: the first `required` must be given; a `variadic` one passes the rest on to the test
// or filter it names; a `positional` one (Python's operator.eq and kin) takes no keyword. jinja2
// refuses a call that does not fit (a Python TypeError); so does shardlm, rather than ignore an
// argument it does not know.
template <class Fn>
struct Builtin {
  Builtin(Fn f, std::vector<std::string> names = {}, size_t must = 0, bool rest = false, bool positional_only = false)
      : fn(f), params(std::move(names)), required(must), variadic(rest), positional(positional_only) {}
  Fn fn;
  std::vector<std::string> params;
  size_t required;
  bool variadic;
  bool positional;

  void check(const char* what, const std::string& name, const Args& args) const;
};

template <class Fn>
void Builtin<Fn>::check(const char* what, const std::string& name, const Args& args) const {
  if (positional && !args.keywords.empty())
    throw Error(concat(what, " '", name, "' takes no keyword arguments (got '", args.keywords[0].first, "')"));
  auto takes = [&] {
    std::string list;
    for (const std::string& p : params) list += (list.empty() ? "" : ", ") + p;
    return params.empty() ? std::string("it takes none") : "it takes " + list;
  };
  if (!variadic && args.positional.size() > params.size())
    throw Error(concat(what, " '", name, "' takes ", params.size(), " argument", params.size() == 1 ? "" : "s", ", got ",
                       args.positional.size(), " (", takes(), ")"));
  for (const auto& [key, value] : args.keywords) {
    const auto at = std::find(params.begin(), params.end(), key);
    if (at == params.end()) {
      if (variadic) continue;
      throw Error(concat(what, " '", name, "' got an unexpected keyword argument '", key, "' (", takes(), ")"));
    }
    if (static_cast<size_t>(at - params.begin()) < args.positional.size())
      throw Error(concat(what, " '", name, "' got multiple values for argument '", key, "'"));
  }
  for (size_t i = args.positional.size(); i < required; ++i)
    if (std::none_of(args.keywords.begin(), args.keywords.end(), [&](const auto& kv) { return kv.first == params[i]; }))
      throw Error(concat(what, " '", name, "' is missing its argument '", params[i], "'"));
}

std::string case_map(const std::string& s, bool upper) {
  icu::UnicodeString u = icu::UnicodeString::fromUTF8(s);
  if (upper) u.toUpper(icu::Locale::getRoot()); else u.toLower(icu::Locale::getRoot());
  std::string out;
  u.toUTF8String(out);
  return out;
}

// Python's str.strip family: `chars` (a Value string) or whitespace, from the left and/or right.
std::string strip(const std::string& s, const Value& chars, bool left, bool right) {
  const std::u32string text = utf8_decode(s);
  const std::u32string set = chars.is(Value::Kind::String) ? utf8_decode(chars.str()) : std::u32string();
  auto strip_it = [&](char32_t c) { return chars.is(Value::Kind::String) ? set.find(c) != std::u32string::npos : is_python_space(c); };
  size_t b = 0, e = text.size();
  while (left && b < e && strip_it(text[b])) ++b;
  while (right && e > b && strip_it(text[e - 1])) --e;
  return utf8_encode(text.substr(b, e - b));
}

// Python's str.split: on `sep`, or on runs of whitespace when it is None, at most `max` times.
Value split(const std::string& s, const Value& sep, int64_t max) {
  List parts;
  if (sep.is(Value::Kind::String)) {
    if (sep.str().empty()) throw Error("split: empty separator");
    size_t pos = 0;
    for (;;) {
      const size_t next = s.find(sep.str(), pos);
      if (next == std::string::npos || (max >= 0 && static_cast<int64_t>(parts.size()) >= max)) break;
      parts.push_back(Value::string(s.substr(pos, next - pos)));
      pos = next + sep.str().size();
    }
    parts.push_back(Value::string(s.substr(pos)));
    return Value::list(parts);
  }
  const std::u32string text = utf8_decode(s);
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && is_python_space(text[i])) ++i;
    if (i >= text.size()) break;
    size_t j = i;
    if (max >= 0 && static_cast<int64_t>(parts.size()) >= max) {  // the rest as it is, trailing spaces too
      parts.push_back(Value::string(utf8_encode(text.substr(i))));
      break;
    }
    while (j < text.size() && !is_python_space(text[j])) ++j;
    parts.push_back(Value::string(utf8_encode(text.substr(i, j - i))));
    i = j;
  }
  return Value::list(parts);
}

std::string replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  if (from.empty()) return s;
  std::string out;
  size_t pos = 0;
  for (int64_t n = 0; count < 0 || n < count; ++n) {
    const size_t next = s.find(from, pos);
    if (next == std::string::npos) break;
    out += s.substr(pos, next - pos) + to;
    pos = next + from.size();
  }
  return out + s.substr(pos);
}

// First letter of each word upper, the rest lower; `word_start` says where a word begins.
std::string recase(const std::string& s, const std::function<bool(char32_t prev, size_t i)>& word_start) {
  std::u32string text = utf8_decode(s);
  for (size_t i = 0; i < text.size(); ++i) {
    const bool start = word_start(i ? text[i - 1] : U' ', i);
    text[i] = static_cast<char32_t>(start ? u_totitle(static_cast<UChar32>(text[i])) : u_tolower(static_cast<UChar32>(text[i])));
  }
  return utf8_encode(text);
}
// jinja2's title filter: words start after '-', whitespace, '(', '{', '[' or '<'.
std::string title_filter(const std::string& s) {
  return recase(s, [](char32_t prev, size_t) {
    return prev == U'-' || prev == U'(' || prev == U'{' || prev == U'[' || prev == U'<' || is_python_space(prev);
  });
}
// Python's str.title: words start after any character that is not a letter.
std::string title_method(const std::string& s) {
  return recase(s, [](char32_t prev, size_t) { return !u_isalpha(static_cast<UChar32>(prev)); });
}
std::string capitalize(const std::string& s) { return recase(s, [](char32_t, size_t i) { return i == 0; }); }

std::string text_of(const Value& v) { return v.to_string(); }

bool starts_or_ends(const std::string& s, const Value& what, bool start) {
  auto one = [&](const std::string& p) {
    return p.size() <= s.size() && (start ? s.compare(0, p.size(), p) == 0 : s.compare(s.size() - p.size(), p.size(), p) == 0);
  };
  if (what.is(Value::Kind::List)) {
    for (const Value& p : what.items())
      if (one(p.str())) return true;
    return false;
  }
  return one(what.str());
}

// `attribute` may be dotted ("function.name"); a number part indexes a list.
Value attribute_path(const Value& item, const std::string& path) {
  Value v = item;
  size_t pos = 0;
  while (pos <= path.size()) {
    const size_t dot = path.find('.', pos);
    const std::string part = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    const bool number = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    v = number ? get_item(v, Value::integer(std::stoll(part))) : get_item(v, Value::string(part));
    if (dot == std::string::npos) break;
    pos = dot + 1;
  }
  return v;
}

Value sequence_end(const Value& v, bool first) {
  std::vector<Value> items = iterate(v);
  if (items.empty()) return Value::undefined();
  return first ? items.front() : items.back();
}

// The test named by args[from] with the arguments after it and the keyword ones (no name: truth).
bool run_named_test(const Value& v, Args& args, size_t from) {
  if (args.positional.size() <= from) return v.truthy();
  Args rest;
  rest.positional.assign(args.positional.begin() + static_cast<std::ptrdiff_t>(from) + 1, args.positional.end());
  rest.keywords = args.keywords;
  return apply_test(args.positional[from].str(), v, rest);
}

Value select_items(const Value& input, Args& args, bool by_attribute, bool keep) {
  if (by_attribute && args.positional.empty()) throw Error("selectattr/rejectattr: Missing parameter for attribute name");
  List out;
  for (const Value& item : iterate(input)) {
    const Value subject = by_attribute ? attribute_path(item, args.get(0, "attribute").str()) : item;
    if (run_named_test(subject, args, by_attribute ? 1 : 0) == keep) out.push_back(item);
  }
  return Value::list(out);
}

// jinja2's map: map(attribute=..., default=...) or map(filter, *args, **kwargs).
Value map_items(const Value& input, Args& args) {
  List out;
  if (args.positional.empty()) {
    const Value attribute = args.get(99, "attribute");
    for (const auto& [key, value] : args.keywords)
      if (key != "attribute" && key != "default") throw Error(concat("map: Unexpected keyword argument '", key, "'"));
    if (!attribute.is_defined()) throw Error("map: Map requires a filter argument");
    for (const Value& item : iterate(input)) {
      Value v = attribute_path(item, attribute.str());
      out.push_back(v.is_defined() ? v : args.get(99, "default", v));
    }
    return Value::list(out);
  }
  for (const Value& item : iterate(input)) {
    Args rest;
    rest.positional.assign(args.positional.begin() + 1, args.positional.end());
    rest.keywords = args.keywords;
    out.push_back(apply_filter(args.positional[0].str(), item, rest));
  }
  return Value::list(out);
}

int64_t length_of(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::String: return static_cast<int64_t>(utf8_decode(v.str()).size());
    case Value::Kind::List: return static_cast<int64_t>(v.items().size());
    case Value::Kind::Dict: case Value::Kind::Namespace: return static_cast<int64_t>(v.entries().items.size());
    case Value::Kind::Undefined: return 0;
    default: throw Error(concat("object of type ", v.repr(), " has no len()"));
  }
}

// Python's numeric text: surrounding whitespace, and '_' only between two digits (PEP 515); the text
// without its underscores, or nullopt.
std::optional<std::string> python_number_text(const std::string& text) {
  const std::string s = strip(text, Value(), true, true);
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '_') { out.push_back(s[i]); continue; }
    if (i == 0 || i + 1 == s.size() || !std::isxdigit(static_cast<unsigned char>(s[i - 1])) ||
        !std::isxdigit(static_cast<unsigned char>(s[i + 1])))
      return std::nullopt;
  }
  if (out.empty()) return std::nullopt;
  return out;
}

// Python's int(text, base) (base 0: from the prefix), or nullopt where it raises ValueError. Past 64
// bits Python's int goes on; shardlm refuses rather than wrap.
std::optional<int64_t> python_int(const std::string& text, int64_t base) {
  if (base != 0 && (base < 2 || base > 36)) throw Error("int: base must be >= 2 and <= 36, or 0");
  std::optional<std::string> digits = python_number_text(text);
  if (!digits) return std::nullopt;
  std::string s = *digits;
  const bool negative = s[0] == '-';
  if (s[0] == '-' || s[0] == '+') s.erase(0, 1);
  const auto prefixed = [&](char p) { return s.size() > 1 && s[0] == '0' && std::tolower(static_cast<unsigned char>(s[1])) == p; };
  for (const auto& [p, b] : {std::pair<char, int64_t>{'x', 16}, {'o', 8}, {'b', 2}})
    if (prefixed(p) && (base == 0 || base == b)) s.erase(0, 2), base = b;
  if (base == 0) {
    if (s.size() > 1 && s.find_first_not_of('0') != std::string::npos && s[0] == '0') return std::nullopt;  // "012"
    base = 10;
  }
  if (s.empty()) return std::nullopt;
  const uint64_t limit = (uint64_t{1} << 63) - (negative ? 0 : 1), radix = static_cast<uint64_t>(base);
  uint64_t value = 0;
  bool too_big = false;
  for (char c : s) {
    const unsigned char u = static_cast<unsigned char>(c);
    const int d = std::isdigit(u) ? c - '0' : std::isalpha(u) ? std::tolower(u) - 'a' + 10 : 99;
    if (d >= base) return std::nullopt;
    too_big = too_big || value > (limit - static_cast<uint64_t>(d)) / radix;
    if (!too_big) value = value * radix + static_cast<uint64_t>(d);
  }
  if (too_big) throw Error(concat("int: '", text, "' does not fit in 64 bits (shardlm's integers are 64-bit)"));
  return negative ? static_cast<int64_t>(0 - value) : static_cast<int64_t>(value);
}

// Python's float(text), or nullopt where it raises ValueError (strtod's hex floats and nan(...) too).
std::optional<double> python_float_of(const std::string& text) {
  const std::optional<std::string> s = python_number_text(text);
  if (!s || s->find_first_of("xX(") != std::string::npos) return std::nullopt;
  char* end = nullptr;
  const double f = std::strtod(s->c_str(), &end);
  if (*end != '\0') return std::nullopt;
  return f;
}

int64_t int_of_float(double f) {
  if (!(std::fabs(f) < 9223372036854775808.0))
    throw Error(concat("int: ", python_float(f), " does not fit in 64 bits (shardlm's integers are 64-bit)"));
  return static_cast<int64_t>(f);
}

// jinja2's int(value, default=0, base=10): a string read in that base, else as a float cut to an
// integer ("42.23" is 42), else the default.
Value to_int(const Value& v, const Value& fallback, const Value& base) {
  if (v.is(Value::Kind::Float)) {
    if (std::isnan(v.as_float())) return fallback;
    return Value::integer(int_of_float(v.as_float()));
  }
  if (v.is_number()) return Value::integer(v.as_int());
  if (v.is(Value::Kind::String)) {
    if (const std::optional<int64_t> i = python_int(v.str(), base.as_int())) return Value::integer(*i);
    if (const std::optional<double> f = python_float_of(v.str()); f && !std::isnan(*f)) return Value::integer(int_of_float(*f));
  }
  return fallback;
}

Value to_float(const Value& v, const Value& fallback) {
  if (v.is_number()) return Value::number(v.as_float());
  if (v.is(Value::Kind::String))
    if (const std::optional<double> f = python_float_of(v.str())) return Value::number(*f);
  return fallback;
}

// Sort keys: strings compare case-insensitively unless asked (jinja2's sort, dictsort, min, max).
Value sort_key(const Value& v, bool case_sensitive) {
  return v.is(Value::Kind::String) && !case_sensitive ? Value::string(case_map(v.str(), false)) : v;
}

Value sorted(const Value& input, Args& args) {
  const bool reverse = args.get(0, "reverse", Value::boolean(false)).truthy();
  const bool cs = args.get(1, "case_sensitive", Value::boolean(false)).truthy();
  const Value attribute = args.get(2, "attribute");
  List items = iterate(input);
  auto key = [&](const Value& v) { return sort_key(attribute.is_defined() ? attribute_path(v, attribute.str()) : v, cs); };
  std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
    return reverse ? less_than(key(b), key(a)) : less_than(key(a), key(b));
  });
  return Value::list(items);
}

Value extreme(const Value& input, Args& args, bool want_max) {
  const bool cs = args.get(0, "case_sensitive", Value::boolean(false)).truthy();
  const Value attribute = args.get(1, "attribute");
  List items = iterate(input);
  if (items.empty()) return Value::undefined();
  auto key = [&](const Value& v) { return sort_key(attribute.is_defined() ? attribute_path(v, attribute.str()) : v, cs); };
  Value best = items[0];
  for (const Value& v : items)
    if (want_max ? less_than(key(best), key(v)) : less_than(key(v), key(best))) best = v;
  return best;
}

// Python's round(x, n): halves to even.
Value round_value(const Value& input, Args& args) {
  const int64_t precision = args.get(0, "precision", Value::integer(0)).as_int();
  const std::string method = args.get(1, "method", Value::string("common")).str();
  if (method != "common" && method != "ceil" && method != "floor") throw Error("round: method must be common, ceil or floor");
  if (method == "common" && !input.is(Value::Kind::Float) && input.is_number()) {
    // Python's round of an int is an int: the same at precision >= 0, else to a power of ten, halves to even.
    int64_t x = input.as_int();
    if (precision >= 0) return Value::integer(x);
    if (precision < -18) return Value::integer(0);
    int64_t unit = 1;
    for (int64_t i = 0; i < -precision; ++i) unit *= 10;
    const int64_t rest = (x % unit + unit) % unit;  // above the multiple of unit at or below x
    int64_t low = 0, r = 0;
    const bool over = __builtin_sub_overflow(x, rest, &low);
    const bool up = !over && (2 * rest > unit || (2 * rest == unit && (low / unit) % 2 != 0));
    r = low;
    if (over || (up && __builtin_add_overflow(low, unit, &r)))
      throw Error(concat("round: ", x, " rounded does not fit in 64 bits (shardlm's integers are 64-bit)"));
    return Value::integer(r);
  }
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double x = input.as_float() * scale;
  double r;
  if (method == "ceil") r = std::ceil(x);
  else if (method == "floor") r = std::floor(x);
  else if (precision >= 0 && precision <= 400 && std::isfinite(x)) {
    // Python's round(): the value's exact binary expansion rounded half to even, as printf rounds it.
    const int saved = std::fegetround();
    std::fesetround(FE_TONEAREST);
    const int digits = static_cast<int>(precision);
    std::vector<char> text(static_cast<size_t>(std::snprintf(nullptr, 0, "%.*f", digits, input.as_float())) + 1);
    std::snprintf(text.data(), text.size(), "%.*f", digits, input.as_float());
    std::fesetround(saved);
    return Value::number(std::strtod(text.data(), nullptr));
  } else {
    const int saved = std::fegetround();
    std::fesetround(FE_TONEAREST);
    r = std::nearbyint(x);
    std::fesetround(saved);
  }
  return Value::number(r / scale);
}

Value items_of(const Value& v) {
  List out;
  if (!v.is_defined()) return Value::list(out);
  if (!v.is(Value::Kind::Dict) && !v.is(Value::Kind::Namespace)) throw Error("items: expected a mapping");
  for (const auto& [k, val] : v.entries().items) out.push_back(Value::list({Value::string(k), val}, true));
  return Value::list(out);
}

// jinja2's unique(value, case_sensitive=False, attribute=None): the first of each key, in order.
Value unique(const Value& input, Args& args) {
  const bool cs = args.get(0, "case_sensitive", Value::boolean(false)).truthy();
  const Value attribute = args.get(1, "attribute");
  auto key = [&](const Value& v) { return sort_key(attribute.is_defined() ? attribute_path(v, attribute.str()) : v, cs); };
  List out;
  for (const Value& v : iterate(input))
    if (std::none_of(out.begin(), out.end(), [&](const Value& o) { return key(o).equals(key(v)); })) out.push_back(v);
  return Value::list(out);
}

Value join(const Value& input, Args& args) {
  const std::string sep = args.get(0, "d", Value::string("")).to_string();
  const Value attribute = args.get(1, "attribute");
  std::string out;
  bool first = true;
  for (const Value& v : iterate(input)) {
    out += (first ? "" : sep) + (attribute.is_defined() ? attribute_path(v, attribute.str()) : v).to_string();
    first = false;
  }
  return Value::string(out);
}

Value reversed(const Value& input) {
  if (input.is(Value::Kind::String)) {
    std::u32string t = utf8_decode(input.str());
    std::reverse(t.begin(), t.end());
    return Value::string(utf8_encode(t));
  }
  List items = iterate(input);
  std::reverse(items.begin(), items.end());
  return Value::list(items);
}

Value sum(const Value& input, Args& args) {
  const Value attribute = args.get(0, "attribute");
  Value total = args.get(1, "start", Value::integer(0));
  for (const Value& v : iterate(input)) total = binary_op("+", total, attribute.is_defined() ? attribute_path(v, attribute.str()) : v);
  return total;
}

// transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False): json.dumps's
// options, with its default separators (', ' between items on one line, ',' when indented).
JsonStyle json_style(const Args& a) {
  JsonStyle style;
  style.ensure_ascii = a.get(0, "ensure_ascii", Value::boolean(false)).truthy();
  const Value indent = a.get(1, "indent", Value::none());
  if (indent.is(Value::Kind::String)) style.indent = indent.str();
  else if (indent.is(Value::Kind::Int) || indent.is(Value::Kind::Bool))
    style.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, indent.as_int())), ' ');
  else if (!indent.is(Value::Kind::None))
    throw Error(concat("tojson: indent must be an integer or a string, got ", indent.repr()));
  if (style.indent) style.item_separator = ",";
  const Value separators = a.get(2, "separators", Value::none());
  if (!separators.is(Value::Kind::None)) {
    if (!separators.is(Value::Kind::List) || separators.items().size() != 2 ||
        !separators.items()[0].is(Value::Kind::String) || !separators.items()[1].is(Value::Kind::String))
      throw Error(concat("tojson: separators must be two strings (between items, between a key and its value), got ",
                         separators.repr()));
    style.item_separator = separators.items()[0].str();
    style.key_separator = separators.items()[1].str();
  }
  style.sort_keys = a.get(3, "sort_keys", Value::boolean(false)).truthy();
  return style;
}

// jinja2's dictsort(value, case_sensitive=False, by='key', reverse=False).
Value dictsort(const Value& v, Args& a) {
  const bool cs = a.get(0, "case_sensitive", Value::boolean(false)).truthy();
  const Value by = a.get(1, "by", Value::string("key"));
  if (!by.is(Value::Kind::String) || (by.str() != "key" && by.str() != "value"))
    throw Error("dictsort: You can only sort by either 'key' or 'value'");
  const size_t part = by.str() == "key" ? 0 : 1;
  const bool reverse = a.get(2, "reverse", Value::boolean(false)).truthy();
  List items = items_of(v).items();
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    const Value kx = sort_key(x.items()[part], cs), ky = sort_key(y.items()[part], cs);
    return reverse ? less_than(ky, kx) : less_than(kx, ky);
  });
  return Value::list(items);
}

const std::map<std::string, Builtin<Filter>>& filters() {
  static const std::map<std::string, Builtin<Filter>> table = {
      {"trim", {[](const Value& v, Args& a) { return Value::string(strip(text_of(v), a.get(0, "chars"), true, true)); }, {"chars"}}},
      {"length", {[](const Value& v, Args&) { return Value::integer(length_of(v)); }}},
      {"count", {[](const Value& v, Args&) { return Value::integer(length_of(v)); }}},
      {"tojson", {[](const Value& v, Args& a) { return Value::string(to_json_text(v, json_style(a))); },
                  {"ensure_ascii", "indent", "separators", "sort_keys"}}},
      {"upper", {[](const Value& v, Args&) { return Value::string(case_map(text_of(v), true)); }}},
      {"lower", {[](const Value& v, Args&) { return Value::string(case_map(text_of(v), false)); }}},
      {"title", {[](const Value& v, Args&) { return Value::string(title_filter(text_of(v))); }}},
      {"capitalize", {[](const Value& v, Args&) { return Value::string(capitalize(text_of(v))); }}},
      {"default", {[](const Value& v, Args& a) {
         const bool falsy = a.get(1, "boolean", Value::boolean(false)).truthy();
         return !v.is_defined() || (falsy && !v.truthy()) ? a.get(0, "default_value", Value::string("")) : v;
       }, {"default_value", "boolean"}}},
      {"first", {[](const Value& v, Args&) { return sequence_end(v, true); }}},
      {"last", {[](const Value& v, Args&) { return sequence_end(v, false); }}},
      {"join", {[](const Value& v, Args& a) { return join(v, a); }, {"d", "attribute"}}},
      {"replace", {[](const Value& v, Args& a) {
         return Value::string(replace(text_of(v), a.get(0, "old").to_string(), a.get(1, "new").to_string(),
                                      a.get(2, "count", Value::integer(-1)).as_int()));
       }, {"old", "new", "count"}, 2}},
      {"string", {[](const Value& v, Args&) { return Value::string(text_of(v)); }}},
      {"int", {[](const Value& v, Args& a) {
         return to_int(v, a.get(0, "default", Value::integer(0)), a.get(1, "base", Value::integer(10)));
       }, {"default", "base"}}},
      {"float", {[](const Value& v, Args& a) { return to_float(v, a.get(0, "default", Value::number(0))); }, {"default"}}},
      {"list", {[](const Value& v, Args&) { return Value::list(iterate(v)); }}},
      {"items", {[](const Value& v, Args&) { return items_of(v); }}},
      {"dictsort", {[](const Value& v, Args& a) { return dictsort(v, a); }, {"case_sensitive", "by", "reverse"}}},
      {"selectattr", {[](const Value& v, Args& a) { return select_items(v, a, true, true); }, {}, 0, true}},
      {"rejectattr", {[](const Value& v, Args& a) { return select_items(v, a, true, false); }, {}, 0, true}},
      {"select", {[](const Value& v, Args& a) { return select_items(v, a, false, true); }, {}, 0, true}},
      {"reject", {[](const Value& v, Args& a) { return select_items(v, a, false, false); }, {}, 0, true}},
      {"map", {[](const Value& v, Args& a) { return map_items(v, a); }, {}, 0, true}},
      {"abs", {[](const Value& v, Args&) {
         return v.is(Value::Kind::Float) ? Value::number(std::fabs(v.as_float())) : Value::integer(std::llabs(v.as_int()));
       }}},
      {"round", {[](const Value& v, Args& a) { return round_value(v, a); }, {"precision", "method"}}},
      {"sort", {[](const Value& v, Args& a) { return sorted(v, a); }, {"reverse", "case_sensitive", "attribute"}}},
      {"sum", {[](const Value& v, Args& a) { return sum(v, a); }, {"attribute", "start"}}},
      {"max", {[](const Value& v, Args& a) { return extreme(v, a, true); }, {"case_sensitive", "attribute"}}},
      {"min", {[](const Value& v, Args& a) { return extreme(v, a, false); }, {"case_sensitive", "attribute"}}},
      {"unique", {[](const Value& v, Args& a) { return unique(v, a); }, {"case_sensitive", "attribute"}}},
      {"reverse", {[](const Value& v, Args&) { return reversed(v); }}},
      {"safe", {[](const Value& v, Args&) { return v; }}},
      {"attr", {[](const Value& v, Args& a) { return get_attr(v, a.get(0, "name").str()); }, {"name"}, 1}},
  };
  return table;
}

bool number_test(const Value& v, bool want_int) {
  return want_int ? v.is(Value::Kind::Int) : v.is(Value::Kind::Float);
}

const std::map<std::string, Builtin<Test>>& tests() {
  static const std::map<std::string, Builtin<Test>> table = {
      {"defined", {[](const Value& v, Args&) { return v.is_defined(); }}},
      {"undefined", {[](const Value& v, Args&) { return !v.is_defined(); }}},
      {"none", {[](const Value& v, Args&) { return v.is(Value::Kind::None); }}},
      {"string", {[](const Value& v, Args&) { return v.is(Value::Kind::String); }}},
      {"number", {[](const Value& v, Args&) { return v.is_number(); }}},
      {"integer", {[](const Value& v, Args&) { return number_test(v, true); }}},
      {"float", {[](const Value& v, Args&) { return number_test(v, false); }}},
      {"boolean", {[](const Value& v, Args&) { return v.is(Value::Kind::Bool); }}},
      {"true", {[](const Value& v, Args&) { return v.is(Value::Kind::Bool) && v.truthy(); }}},
      {"false", {[](const Value& v, Args&) { return v.is(Value::Kind::Bool) && !v.truthy(); }}},
      {"mapping", {[](const Value& v, Args&) { return v.is(Value::Kind::Dict); }}},
      {"iterable", {[](const Value& v, Args&) {
         return !v.is_defined() || v.is(Value::Kind::String) || v.is(Value::Kind::List) || v.is(Value::Kind::Dict);
       }}},
      {"sequence", {[](const Value& v, Args&) {
         return v.is(Value::Kind::String) || v.is(Value::Kind::List) || v.is(Value::Kind::Dict);
       }}},
      {"callable", {[](const Value& v, Args&) { return v.is(Value::Kind::Function); }}},
      {"odd", {[](const Value& v, Args&) { return v.as_int() % 2 != 0; }}},
      {"even", {[](const Value& v, Args&) { return v.as_int() % 2 == 0; }}},
      {"divisibleby", {[](const Value& v, Args& a) {
         const int64_t num = a.get(0, "num").as_int();
         if (num == 0) throw Error("divisibleby: integer modulo by zero");
         return v.as_int() % num == 0;
       }, {"num"}, 1}},
      {"eq", {[](const Value& v, Args& a) { return v.equals(a.get(0, "other")); }, {"other"}, 1, false, true}},
      {"ne", {[](const Value& v, Args& a) { return !v.equals(a.get(0, "other")); }, {"other"}, 1, false, true}},
      {"lt", {[](const Value& v, Args& a) { return less_than(v, a.get(0, "other")); }, {"other"}, 1, false, true}},
      {"gt", {[](const Value& v, Args& a) { return less_than(a.get(0, "other"), v); }, {"other"}, 1, false, true}},
      {"le", {[](const Value& v, Args& a) { return !less_than(a.get(0, "other"), v); }, {"other"}, 1, false, true}},
      {"ge", {[](const Value& v, Args& a) { return !less_than(v, a.get(0, "other")); }, {"other"}, 1, false, true}},
      {"in", {[](const Value& v, Args& a) { return contains(a.get(0, "seq"), v); }, {"seq"}, 1}},
      {"lower", {[](const Value& v, Args&) { return v.is(Value::Kind::String) && case_map(v.str(), false) == v.str(); }}},
      {"upper", {[](const Value& v, Args&) { return v.is(Value::Kind::String) && case_map(v.str(), true) == v.str(); }}},
  };
  return table;
}

const std::map<std::string, std::string>& test_aliases() {
  static const std::map<std::string, std::string> aliases = {
      {"equalto", "eq"}, {"==", "eq"}, {"!=", "ne"}, {"<", "lt"}, {">", "gt"}, {"<=", "le"}, {">=", "ge"},
      {"greaterthan", "gt"}, {"lessthan", "lt"}, {"sameas", "eq"}};
  return aliases;
}

std::string test_name(const std::string& name) {
  auto it = test_aliases().find(name);
  return it == test_aliases().end() ? name : it->second;
}

std::string filter_name(const std::string& name) { return name == "d" ? "default" : name; }

// Python's str.format: fields {} (numbered in turn), {0} and {name} (a keyword argument), each with
// .attr and [key] lookups and !s / !r; a format spec (":>10") is refused, naming the field.
std::string format(const std::string& s, const Args& args) {
  std::string out;
  size_t next = 0;
  bool automatic = false, manual = false;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '{' && i + 1 < s.size() && s[i + 1] == '{') { out += '{'; ++i; continue; }
    if (s[i] == '}') {
      if (i + 1 < s.size() && s[i + 1] == '}') { out += '}'; ++i; continue; }
      throw Error("format: Single '}' encountered in format string");
    }
    if (s[i] != '{') { out += s[i]; continue; }
    const size_t close = s.find('}', i);
    if (close == std::string::npos) throw Error("format: Single '{' encountered in format string");
    const std::string field = s.substr(i + 1, close - i - 1);
    std::string name = field, conversion;
    if (const size_t colon = name.find(':'); colon != std::string::npos)
      throw Error(concat("format: the field '{", field, "}' has the format spec '", name.substr(colon + 1),
                         "', which shardlm's templates do not support (only {}, {0}, {name}, .attr, [key], !s, !r)"));
    if (const size_t bang = name.find('!'); bang != std::string::npos) {
      conversion = name.substr(bang + 1), name.resize(bang);
      if (conversion != "s" && conversion != "r")
        throw Error(concat("format: the field '{", field, "}' has the conversion '!", conversion, "' (only !s and !r)"));
    }
    const size_t end = std::min(name.find('.'), name.find('['));
    const std::string arg = name.substr(0, end);
    Value v;
    if (arg.empty() || std::all_of(arg.begin(), arg.end(), ::isdigit)) {
      (arg.empty() ? automatic : manual) = true;
      if (automatic && manual) throw Error("format: cannot switch between automatic field numbering ({}) and numbered fields ({0})");
      const size_t index = arg.empty() ? next++ : static_cast<size_t>(std::stoull(arg.substr(0, 18)));
      if (index >= args.positional.size())
        throw Error(concat("format: the field '{", field, "}' asks for positional argument ", index, ", and there are ",
                           args.positional.size()));
      v = args.positional[index];
    } else {
      const auto it = std::find_if(args.keywords.begin(), args.keywords.end(), [&](const auto& kv) { return kv.first == arg; });
      if (it == args.keywords.end()) throw Error(concat("format: the field '{", field, "}' names no keyword argument"));
      v = it->second;
    }
    for (size_t at = end; at < name.size();) {  // .attr and [key] after the argument
      if (name[at] == '.') {
        const size_t stop = std::min(name.find('.', at + 1), name.find('[', at + 1));
        v = get_attr(v, name.substr(at + 1, stop - at - 1));
        at = stop;
      } else {
        const size_t stop = name.find(']', at);
        if (stop == std::string::npos) throw Error(concat("format: the field '{", field, "}' is missing ']'"));
        const std::string key = name.substr(at + 1, stop - at - 1);
        const bool number = !key.empty() && std::all_of(key.begin(), key.end(), ::isdigit);
        v = get_item(v, number ? Value::integer(std::stoll(key.substr(0, 18))) : Value::string(key));
        at = stop + 1;
      }
    }
    out += conversion == "r" ? v.repr() : v.to_string();
    i = close;
  }
  return out;
}

Value string_method(const std::string& s, const std::string& name, Args& a) {
  if (name == "startswith" || name == "endswith") return Value::boolean(starts_or_ends(s, a.get(0, "prefix"), name == "startswith"));
  if (name == "strip") return Value::string(strip(s, a.get(0, "chars"), true, true));
  if (name == "lstrip") return Value::string(strip(s, a.get(0, "chars"), true, false));
  if (name == "rstrip") return Value::string(strip(s, a.get(0, "chars"), false, true));
  if (name == "split") return split(s, a.get(0, "sep", Value::none()), a.get(1, "maxsplit", Value::integer(-1)).as_int());
  if (name == "replace") return Value::string(replace(s, a.get(0, "old").str(), a.get(1, "new").str(), a.get(2, "count", Value::integer(-1)).as_int()));
  if (name == "upper" || name == "lower") return Value::string(case_map(s, name == "upper"));
  if (name == "title") return Value::string(title_method(s));
  if (name == "capitalize") return Value::string(capitalize(s));
  if (name == "format") return Value::string(format(s, a));
  if (name == "join") {
    Args separator{{Value::string(s)}, {}};
    return join(a.get(0, "iterable"), separator);
  }
  const size_t at = s.find(a.get(0, "sub").str());
  if (name == "find") return Value::integer(at == std::string::npos ? -1 : static_cast<int64_t>(utf8_decode(s.substr(0, at)).size()));
  throw Error(concat("str has no method '", name, "'"));
}

Value dict_method(const Value& self, const std::string& name, Args& a) {
  if (name == "items") return items_of(self);
  List out;
  if (name == "get") {
    const Value* v = self.entries().find(a.get(0, "key").str());
    return v ? *v : a.get(1, "default", Value::none());
  }
  for (const auto& [k, v] : self.entries().items) out.push_back(name == "keys" ? Value::string(k) : v);
  return Value::list(out);
}

}  // namespace

bool has_filter(const std::string& name) { return filters().count(filter_name(name)) != 0; }
bool has_test(const std::string& name) { return tests().count(test_name(name)) != 0; }

Value apply_filter(const std::string& name, const Value& input, Args& args) {
  auto it = filters().find(filter_name(name));
  if (it == filters().end()) throw Error(concat("no filter named '", name, "'"));
  it->second.check("filter", name, args);
  return it->second.fn(input, args);
}

bool apply_test(const std::string& name, const Value& input, Args& args) {
  auto it = tests().find(test_name(name));
  if (it == tests().end()) throw Error(concat("no test named '", name, "'"));
  it->second.check("test", name, args);
  return it->second.fn(input, args);
}

Value bound_method(const Value& self, const std::string& name) {
  static const char* kString[] = {"startswith", "endswith", "strip", "lstrip", "rstrip", "split", "replace", "upper",
                                  "lower", "title", "capitalize", "format", "join", "find"};
  static const char* kDict[] = {"items", "keys", "values", "get"};
  if (self.is(Value::Kind::String)) {
    for (const char* m : kString)
      if (name == m) return Value::function([s = self.str(), name](Args& a) { return string_method(s, name, a); }, name);
  } else if (self.is(Value::Kind::Dict)) {
    for (const char* m : kDict)
      if (name == m) return Value::function([self, name](Args& a) { return dict_method(self, name, a); }, name);
  }
  return Value::undefined(name);
}

Dict global_functions() {
  Dict g;
  g.set("range", Value::function([](Args& a) {
    int64_t start = 0, stop = a.get(0, "stop").as_int(), step = 1;
    if (a.positional.size() >= 2) start = a.positional[0].as_int(), stop = a.positional[1].as_int();
    if (a.positional.size() >= 3) step = a.positional[2].as_int();
    if (step == 0) throw Error("range() arg 3 must not be zero");
    List out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(Value::integer(i));
    return Value::list(out);
  }, "range"));
  auto keywords_dict = [](Args& a) {
    Dict d;
    if (!a.positional.empty() && a.positional[0].is(Value::Kind::Dict)) d = a.positional[0].entries();
    for (auto& [k, v] : a.keywords) d.set(k, v);
    return d;
  };
  g.set("namespace", Value::function([keywords_dict](Args& a) { return Value::name_space(keywords_dict(a)); }, "namespace"));
  g.set("dict", Value::function([keywords_dict](Args& a) { return Value::dict(keywords_dict(a)); }, "dict"));
  g.set("raise_exception", Value::function([](Args& a) -> Value { throw RaisedError{a.get(0, "message").to_string()}; },
                                           "raise_exception"));
  g.set("strftime_now", Value::function([](Args& a) {
    const std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    char buf[256];
    const size_t n = std::strftime(buf, sizeof buf, a.get(0, "format").str().c_str(), &local);
    return Value::string(std::string(buf, n));
  }, "strftime_now"));
  return g;
}

}  // namespace shardlm::jinja
