// Jinja built-ins as jinja2 and transformers define them: the filters, tests, string and dict
// methods and global functions that chat templates call.
#include <algorithm>
#include <cfenv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <map>
#include <unicode/locid.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include "jinja_ast.hpp"

namespace shardlm::jinja {

namespace {

using Filter = Value (*)(const Value&, Args&);
using Test = bool (*)(const Value&, Args&);

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

// The test named by args[from] with the arguments after it (no name: truth).
bool run_named_test(const Value& v, Args& args, size_t from) {
  if (args.positional.size() <= from) return v.truthy();
  Args rest;
  rest.positional.assign(args.positional.begin() + static_cast<std::ptrdiff_t>(from) + 1, args.positional.end());
  return apply_test(args.positional[from].str(), v, rest);
}

Value select_items(const Value& input, Args& args, bool by_attribute, bool keep) {
  List out;
  for (const Value& item : iterate(input)) {
    const Value subject = by_attribute ? attribute_path(item, args.get(0, "attribute").str()) : item;
    if (run_named_test(subject, args, by_attribute ? 1 : 0) == keep) out.push_back(item);
  }
  return Value::list(out);
}

Value map_items(const Value& input, Args& args) {
  List out;
  const Value attribute = args.get(99, "attribute");
  for (const Value& item : iterate(input)) {
    if (attribute.is_defined()) {
      Value v = attribute_path(item, attribute.str());
      out.push_back(v.is_defined() ? v : args.get(99, "default", v));
      continue;
    }
    Args rest;
    rest.positional.assign(args.positional.begin() + 1, args.positional.end());
    out.push_back(apply_filter(args.positional.at(0).str(), item, rest));
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

Value to_int(const Value& v, const Value& fallback) {
  if (v.is_number()) return Value::integer(v.as_int());
  if (v.is(Value::Kind::String)) {
    const std::string s = strip(v.str(), Value(), true, true);
    char* end = nullptr;
    const long long i = std::strtoll(s.c_str(), &end, 10);
    if (!s.empty() && *end == '\0') return Value::integer(i);
    const double f = std::strtod(s.c_str(), &end);
    if (!s.empty() && *end == '\0') return Value::integer(static_cast<int64_t>(f));
  }
  return fallback;
}

Value to_float(const Value& v, const Value& fallback) {
  if (v.is_number()) return Value::number(v.as_float());
  if (v.is(Value::Kind::String)) {
    char* end = nullptr;
    const std::string s = strip(v.str(), Value(), true, true);
    const double f = std::strtod(s.c_str(), &end);
    if (!s.empty() && *end == '\0') return Value::number(f);
  }
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

Value unique(const Value& input) {
  List out;
  for (const Value& v : iterate(input))
    if (std::none_of(out.begin(), out.end(), [&](const Value& o) { return sort_key(o, false).equals(sort_key(v, false)); }))
      out.push_back(v);
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

const std::map<std::string, Filter>& filters() {
  static const std::map<std::string, Filter> table = {
      {"trim", [](const Value& v, Args& a) { return Value::string(strip(text_of(v), a.get(0, "chars"), true, true)); }},
      {"length", [](const Value& v, Args&) { return Value::integer(length_of(v)); }},
      {"count", [](const Value& v, Args&) { return Value::integer(length_of(v)); }},
      {"tojson", [](const Value& v, Args& a) {
         const Value indent = a.get(0, "indent", Value::none());
         return Value::string(to_json_text(v, indent.is_number() ? static_cast<int>(indent.as_int()) : -1,
                                           a.get(99, "sort_keys", Value::boolean(false)).truthy()));
       }},
      {"upper", [](const Value& v, Args&) { return Value::string(case_map(text_of(v), true)); }},
      {"lower", [](const Value& v, Args&) { return Value::string(case_map(text_of(v), false)); }},
      {"title", [](const Value& v, Args&) { return Value::string(title_filter(text_of(v))); }},
      {"capitalize", [](const Value& v, Args&) { return Value::string(capitalize(text_of(v))); }},
      {"default", [](const Value& v, Args& a) {
         const bool falsy = a.get(1, "boolean", Value::boolean(false)).truthy();
         return !v.is_defined() || (falsy && !v.truthy()) ? a.get(0, "default_value", Value::string("")) : v;
       }},
      {"first", [](const Value& v, Args&) { return sequence_end(v, true); }},
      {"last", [](const Value& v, Args&) { return sequence_end(v, false); }},
      {"join", [](const Value& v, Args& a) { return join(v, a); }},
      {"replace", [](const Value& v, Args& a) {
         return Value::string(replace(text_of(v), a.get(0, "old").to_string(), a.get(1, "new").to_string(),
                                      a.get(2, "count", Value::integer(-1)).as_int()));
       }},
      {"string", [](const Value& v, Args&) { return Value::string(text_of(v)); }},
      {"int", [](const Value& v, Args& a) { return to_int(v, a.get(0, "default", Value::integer(0))); }},
      {"float", [](const Value& v, Args& a) { return to_float(v, a.get(0, "default", Value::number(0))); }},
      {"list", [](const Value& v, Args&) { return Value::list(iterate(v)); }},
      {"items", [](const Value& v, Args&) { return items_of(v); }},
      {"dictsort", [](const Value& v, Args&) {
         List items = items_of(v).items();
         std::stable_sort(items.begin(), items.end(), [](const Value& x, const Value& y) {
           return less_than(sort_key(x.items()[0], false), sort_key(y.items()[0], false));
         });
         return Value::list(items);
       }},
      {"selectattr", [](const Value& v, Args& a) { return select_items(v, a, true, true); }},
      {"rejectattr", [](const Value& v, Args& a) { return select_items(v, a, true, false); }},
      {"select", [](const Value& v, Args& a) { return select_items(v, a, false, true); }},
      {"reject", [](const Value& v, Args& a) { return select_items(v, a, false, false); }},
      {"map", [](const Value& v, Args& a) { return map_items(v, a); }},
      {"abs", [](const Value& v, Args&) { return v.is(Value::Kind::Float) ? Value::number(std::fabs(v.as_float())) : Value::integer(std::llabs(v.as_int())); }},
      {"round", [](const Value& v, Args& a) { return round_value(v, a); }},
      {"sort", [](const Value& v, Args& a) { return sorted(v, a); }},
      {"sum", [](const Value& v, Args& a) { return sum(v, a); }},
      {"max", [](const Value& v, Args& a) { return extreme(v, a, true); }},
      {"min", [](const Value& v, Args& a) { return extreme(v, a, false); }},
      {"unique", [](const Value& v, Args&) { return unique(v); }},
      {"reverse", [](const Value& v, Args&) { return reversed(v); }},
      {"safe", [](const Value& v, Args&) { return v; }},
      {"attr", [](const Value& v, Args& a) { return get_attr(v, a.get(0, "name").str()); }},
  };
  return table;
}

bool number_test(const Value& v, bool want_int) {
  return want_int ? v.is(Value::Kind::Int) : v.is(Value::Kind::Float);
}

const std::map<std::string, Test>& tests() {
  static const std::map<std::string, Test> table = {
      {"defined", [](const Value& v, Args&) { return v.is_defined(); }},
      {"undefined", [](const Value& v, Args&) { return !v.is_defined(); }},
      {"none", [](const Value& v, Args&) { return v.is(Value::Kind::None); }},
      {"string", [](const Value& v, Args&) { return v.is(Value::Kind::String); }},
      {"number", [](const Value& v, Args&) { return v.is_number(); }},
      {"integer", [](const Value& v, Args&) { return number_test(v, true); }},
      {"float", [](const Value& v, Args&) { return number_test(v, false); }},
      {"boolean", [](const Value& v, Args&) { return v.is(Value::Kind::Bool); }},
      {"true", [](const Value& v, Args&) { return v.is(Value::Kind::Bool) && v.truthy(); }},
      {"false", [](const Value& v, Args&) { return v.is(Value::Kind::Bool) && !v.truthy(); }},
      {"mapping", [](const Value& v, Args&) { return v.is(Value::Kind::Dict); }},
      {"iterable", [](const Value& v, Args&) {
         return !v.is_defined() || v.is(Value::Kind::String) || v.is(Value::Kind::List) || v.is(Value::Kind::Dict);
       }},
      {"sequence", [](const Value& v, Args&) {
         return v.is(Value::Kind::String) || v.is(Value::Kind::List) || v.is(Value::Kind::Dict);
       }},
      {"callable", [](const Value& v, Args&) { return v.is(Value::Kind::Function); }},
      {"odd", [](const Value& v, Args&) { return v.as_int() % 2 != 0; }},
      {"even", [](const Value& v, Args&) { return v.as_int() % 2 == 0; }},
      {"divisibleby", [](const Value& v, Args& a) { return v.as_int() % a.get(0, "num").as_int() == 0; }},
      {"eq", [](const Value& v, Args& a) { return v.equals(a.get(0, "other")); }},
      {"ne", [](const Value& v, Args& a) { return !v.equals(a.get(0, "other")); }},
      {"lt", [](const Value& v, Args& a) { return less_than(v, a.get(0, "other")); }},
      {"gt", [](const Value& v, Args& a) { return less_than(a.get(0, "other"), v); }},
      {"le", [](const Value& v, Args& a) { return !less_than(a.get(0, "other"), v); }},
      {"ge", [](const Value& v, Args& a) { return !less_than(v, a.get(0, "other")); }},
      {"in", [](const Value& v, Args& a) { return contains(a.get(0, "seq"), v); }},
      {"lower", [](const Value& v, Args&) { return v.is(Value::Kind::String) && case_map(v.str(), false) == v.str(); }},
      {"upper", [](const Value& v, Args&) { return v.is(Value::Kind::String) && case_map(v.str(), true) == v.str(); }},
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

// str.format with positional {} and {0} fields only.
std::string format(const std::string& s, const Args& args) {
  std::string out;
  size_t next = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '{' && i + 1 < s.size() && s[i + 1] == '{') { out += '{'; ++i; continue; }
    if (s[i] == '}' && i + 1 < s.size() && s[i + 1] == '}') { out += '}'; ++i; continue; }
    if (s[i] != '{') { out += s[i]; continue; }
    const size_t close = s.find('}', i);
    if (close == std::string::npos) throw Error("format: '{' without '}'");
    const std::string field = s.substr(i + 1, close - i - 1);
    const size_t index = field.empty() ? next++ : static_cast<size_t>(std::stoul(field));
    out += args.get(index, "").to_string();
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
  return it->second(input, args);
}

bool apply_test(const std::string& name, const Value& input, Args& args) {
  auto it = tests().find(test_name(name));
  if (it == tests().end()) throw Error(concat("no test named '", name, "'"));
  return it->second(input, args);
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
