// Jinja values with Python's semantics: truth, str() and repr(), equality and order, arithmetic,
// indexing and slicing by code point, attribute lookup, and json.dumps for the tojson filter.
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "hf_tokenizer.hpp"
#include "jinja_ast.hpp"

namespace shardlm::jinja {

const Value* Dict::find(const std::string& key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void Dict::set(const std::string& key, Value value) {
  for (auto& [k, v] : items)
    if (k == key) {
      v = std::move(value);
      return;
    }
  items.emplace_back(key, std::move(value));
}

Value Value::list(List items, bool tuple) {
  Value v;
  v.kind_ = Kind::List;
  v.tuple_ = tuple;
  v.list_ = std::make_shared<List>(std::move(items));
  return v;
}

Value Value::dict(Dict d) {
  Value v;
  v.kind_ = Kind::Dict;
  v.dict_ = std::make_shared<Dict>(std::move(d));
  return v;
}

Value Value::name_space(Dict d) {
  Value v = dict(std::move(d));
  v.kind_ = Kind::Namespace;
  return v;
}

Value Value::function(Function f, std::string name) {
  Value v;
  v.kind_ = Kind::Function;
  v.fn_ = std::make_shared<Function>(std::move(f));
  v.name_ = std::move(name);
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return none();
    case nlohmann::ordered_json::value_t::boolean: return boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
    case nlohmann::ordered_json::value_t::number_unsigned: return integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_float: return number(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      for (const auto& item : j) items.push_back(from_json(item));
      return list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      for (const auto& [k, item] : j.items()) d.items.emplace_back(k, from_json(item));
      return dict(std::move(d));
    }
    default: return none();
  }
}

Value Args::get(size_t index, const std::string& key, Value fallback) const {
  if (index < positional.size()) return positional[index];
  for (const auto& [k, v] : keywords)
    if (k == key) return v;
  return fallback;
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::Undefined: case Kind::None: return false;
    case Kind::Bool: case Kind::Int: return int_ != 0;
    case Kind::Float: return float_ != 0;
    case Kind::String: return !str_.empty();
    case Kind::List: return !list_->empty();
    case Kind::Dict: return !dict_->items.empty();
    default: return true;
  }
}

std::string python_float(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buf[64];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*e", precision - 1, value);
    if (std::strtod(buf, nullptr) == value) break;
  }
  // buf is [-]d[.ddd]e[+-]XX: Python writes it positionally when -4 <= exponent < 16.
  std::string text(buf);
  const size_t e = text.find('e');
  const int exponent = std::atoi(text.c_str() + e + 1);
  const bool negative = text[0] == '-';
  std::string digits;
  for (size_t i = negative ? 1 : 0; i < e; ++i)
    if (text[i] != '.') digits.push_back(text[i]);
  std::string out = negative ? "-" : "";
  if (exponent < -4 || exponent >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    std::snprintf(buf, sizeof buf, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    return out + buf;
  }
  if (exponent < 0) return out + "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
  const size_t point = static_cast<size_t>(exponent) + 1;
  if (digits.size() <= point) return out + digits + std::string(point - digits.size(), '0') + ".0";
  return out + digits.substr(0, point) + "." + digits.substr(point);
}

namespace {

std::string python_string_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const char quote = has_single && s.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == static_cast<unsigned char>(quote)) out += std::string("\\") + static_cast<char>(c);
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else out.push_back(static_cast<char>(c));
  }
  return out + quote;
}

// Python's json string escapes; with ensure_ascii, every character outside ' '..'~' as \uXXXX (a
// surrogate pair above U+FFFF), as json.dumps writes it.
void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  auto escape = [&out](char32_t unit) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(unit));
    out += buf;
  };
  // One byte of the UTF-8 text, or with ensure_ascii one code point.
  auto put = [&](char32_t c) {
    switch (c) {
      case '"': out += "\\\""; return;
      case '\\': out += "\\\\"; return;
      case '\n': out += "\\n"; return;
      case '\r': out += "\\r"; return;
      case '\t': out += "\\t"; return;
      case '\b': out += "\\b"; return;
      case '\f': out += "\\f"; return;
    }
    if (c < 0x20 || (ensure_ascii && c >= 0x7F && c <= 0xFFFF)) {
      escape(c);
    } else if (ensure_ascii && c > 0xFFFF) {
      escape(0xD800 + ((c - 0x10000) >> 10));
      escape(0xDC00 + ((c - 0x10000) & 0x3FF));
    } else {
      out.push_back(static_cast<char>(c));
    }
  };
  out.push_back('"');
  if (ensure_ascii) {
    for (char32_t c : utf8_decode(s)) put(c);
  } else {
    for (unsigned char c : s) put(c);
  }
  out.push_back('"');
}

void json_dump(std::string& out, const Value& v, const JsonStyle& style, int depth) {
  std::string newline, close;
  if (style.indent) {
    newline = "\n", close = "\n";
    for (int i = 0; i <= depth; ++i) newline += *style.indent;
    for (int i = 0; i < depth; ++i) close += *style.indent;
  }
  const std::string& comma = style.item_separator;
  switch (v.kind()) {
    case Value::Kind::None: out += "null"; return;
    case Value::Kind::Bool: out += v.truthy() ? "true" : "false"; return;
    case Value::Kind::Int: out += std::to_string(v.as_int()); return;
    case Value::Kind::Float: {
      const double f = v.as_float();
      out += std::isnan(f) ? "NaN" : std::isinf(f) ? (f > 0 ? "Infinity" : "-Infinity") : python_float(f);
      return;
    }
    case Value::Kind::String: json_string(out, v.str(), style.ensure_ascii); return;
    case Value::Kind::List: {
      if (v.items().empty()) { out += "[]"; return; }
      out += "[";
      for (size_t i = 0; i < v.items().size(); ++i) {
        out += (i ? comma : "") + newline;
        json_dump(out, v.items()[i], style, depth + 1);
      }
      out += close + "]";
      return;
    }
    case Value::Kind::Dict: case Value::Kind::Namespace: {
      auto entries = v.entries().items;
      if (entries.empty()) { out += "{}"; return; }
      if (style.sort_keys) std::stable_sort(entries.begin(), entries.end(), [](auto& a, auto& b) { return a.first < b.first; });
      out += "{";
      for (size_t i = 0; i < entries.size(); ++i) {
        out += (i ? comma : "") + newline;
        json_string(out, entries[i].first, style.ensure_ascii);
        out += style.key_separator;
        json_dump(out, entries[i].second, style, depth + 1);
      }
      out += close + "}";
      return;
    }
    default: throw Error(concat("tojson: a value of this kind is not JSON serializable: ", v.repr()));
  }
}

}  // namespace

std::string to_json_text(const Value& value, const JsonStyle& style) {
  std::string out;
  json_dump(out, value, style, 0);
  return out;
}

std::string Value::repr() const {
  switch (kind_) {
    case Kind::Undefined: return "Undefined";
    case Kind::String: return python_string_repr(str_);
    case Kind::List: {
      std::string out = tuple_ ? "(" : "[";
      for (size_t i = 0; i < list_->size(); ++i) out += (i ? ", " : "") + (*list_)[i].repr();
      if (tuple_ && list_->size() == 1) out += ",";
      return out + (tuple_ ? ")" : "]");
    }
    case Kind::Dict: {
      std::string out = "{";
      for (size_t i = 0; i < dict_->items.size(); ++i)
        out += (i ? ", " : "") + python_string_repr(dict_->items[i].first) + ": " + dict_->items[i].second.repr();
      return out + "}";
    }
    default: return to_string();
  }
}

std::string Value::to_string() const {
  switch (kind_) {
    case Kind::Undefined: return "";
    case Kind::None: return "None";
    case Kind::Bool: return int_ ? "True" : "False";
    case Kind::Int: return std::to_string(int_);
    case Kind::Float: return python_float(float_);
    case Kind::String: return str_;
    case Kind::Namespace: return "<Namespace>";
    case Kind::Function: return "<function " + name_ + ">";
    default: return repr();
  }
}

bool Value::equals(const Value& other) const {
  if (is_number() && other.is_number()) {
    if (kind_ == Kind::Float || other.kind_ == Kind::Float) return as_float() == other.as_float();
    return int_ == other.int_;
  }
  if (kind_ != other.kind_) return false;
  switch (kind_) {
    case Kind::Undefined: case Kind::None: return true;
    case Kind::String: return str_ == other.str_;
    case Kind::List: {
      if (list_->size() != other.list_->size()) return false;
      for (size_t i = 0; i < list_->size(); ++i)
        if (!(*list_)[i].equals((*other.list_)[i])) return false;
      return true;
    }
    case Kind::Dict: {
      if (dict_->items.size() != other.dict_->items.size()) return false;
      for (const auto& [k, v] : dict_->items) {
        const Value* o = other.dict_->find(k);
        if (!o || !v.equals(*o)) return false;
      }
      return true;
    }
    default: return dict_ == other.dict_ && fn_ == other.fn_;
  }
}

std::u32string utf8_decode(const std::string& text) {
  std::u32string out;
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    const int extra = c < 0x80 ? 0 : c < 0xE0 ? 1 : c < 0xF0 ? 2 : 3;
    char32_t cp = extra == 0 ? c : extra == 1 ? (c & 0x1F) : extra == 2 ? (c & 0x0F) : (c & 0x07);
    for (int k = 1; k <= extra && i + static_cast<size_t>(k) < text.size(); ++k)
      cp = (cp << 6) | (static_cast<unsigned char>(text[i + static_cast<size_t>(k)]) & 0x3F);
    out.push_back(cp);
    i += static_cast<size_t>(extra) + 1;
  }
  return out;
}

std::string utf8_encode(const std::u32string& text) {
  std::string out;
  for (char32_t cp : text) hf::append_utf8(out, static_cast<uint32_t>(cp));  // the tokenizer's encoder
  return out;
}

bool is_python_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

std::vector<Value> iterate(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::Undefined: return {};
    case Value::Kind::List: return value.items();
    case Value::Kind::String: {
      std::vector<Value> chars;
      for (char32_t c : utf8_decode(value.str())) chars.push_back(Value::string(utf8_encode(std::u32string(1, c))));
      return chars;
    }
    case Value::Kind::Dict: {
      std::vector<Value> keys;
      for (const auto& [k, v] : value.entries().items) keys.push_back(Value::string(k));
      return keys;
    }
    default: throw Error(concat("'", value.repr(), "' is not iterable"));
  }
}

namespace {

[[noreturn]] void fail_undefined(const Value& v) {
  throw Error(v.name().empty() ? std::string("a value is undefined") : concat("'", v.name(), "' is undefined"));
}

int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

Value repeat(const Value& seq, int64_t n) {
  if (seq.is(Value::Kind::String)) {
    std::string out;
    for (int64_t i = 0; i < n; ++i) out += seq.str();
    return Value::string(out);
  }
  List out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.items().begin(), seq.items().end());
  return Value::list(out);
}

Value numeric_op(const std::string& op, const Value& a, const Value& b) {
  const bool ints = !a.is(Value::Kind::Float) && !b.is(Value::Kind::Float);
  if (op == "/") {
    if (b.as_float() == 0) throw Error("division by zero");
    return Value::number(a.as_float() / b.as_float());
  }
  if ((op == "//" || op == "%") && b.as_float() == 0) throw Error("integer division or modulo by zero");
  if (ints) {
    // Python's integers do not overflow; shardlm's are 64-bit and refuse to rather than wrap.
    const int64_t x = a.as_int(), y = b.as_int();
    int64_t r = 0;
    bool overflow = false;
    if (op == "+") overflow = __builtin_add_overflow(x, y, &r);
    else if (op == "-") overflow = __builtin_sub_overflow(x, y, &r);
    else if (op == "*") overflow = __builtin_mul_overflow(x, y, &r);
    else if (op == "//" || op == "%") overflow = x == INT64_MIN && y == -1;
    else if (op == "**" && y >= 0) {
      r = 1;
      for (int64_t base = x, e = y; e > 0 && !overflow; e >>= 1) {  // by squaring: 2 ** 10**9 ends at once
        if (e & 1) overflow = __builtin_mul_overflow(r, base, &r);
        if (e > 1 && !overflow) overflow = __builtin_mul_overflow(base, base, &base);
      }
    }
    if (overflow)
      throw Error(concat(a.repr(), " ", op, " ", b.repr(), " does not fit in 64 bits (shardlm's integers are 64-bit)"));
    if (op == "//") return Value::integer(floor_div(x, y));
    if (op == "%") return Value::integer(x - floor_div(x, y) * y);
    if (op != "**" || y >= 0) return Value::integer(r);
  }
  const double x = a.as_float(), y = b.as_float();
  if (op == "+") return Value::number(x + y);
  if (op == "-") return Value::number(x - y);
  if (op == "*") return Value::number(x * y);
  if (op == "//") return Value::number(std::floor(x / y));
  if (op == "%") return Value::number(x - std::floor(x / y) * y);
  return Value::number(std::pow(x, y));
}

}  // namespace

Value binary_op(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") return Value::string(a.to_string() + b.to_string());
  if (!a.is_defined()) fail_undefined(a);
  if (!b.is_defined()) fail_undefined(b);
  if (a.is_number() && b.is_number()) return numeric_op(op, a, b);
  if (op == "+" && a.kind() == b.kind() && a.is(Value::Kind::String)) return Value::string(a.str() + b.str());
  if (op == "+" && a.kind() == b.kind() && a.is(Value::Kind::List)) {
    List out = a.items();
    out.insert(out.end(), b.items().begin(), b.items().end());
    return Value::list(out);
  }
  const bool seq_a = a.is(Value::Kind::String) || a.is(Value::Kind::List);
  const bool seq_b = b.is(Value::Kind::String) || b.is(Value::Kind::List);
  if (op == "*" && seq_a && b.is(Value::Kind::Int)) return repeat(a, b.as_int());
  if (op == "*" && seq_b && a.is(Value::Kind::Int)) return repeat(b, a.as_int());
  throw Error(concat("unsupported operand types for ", op, ": ", a.repr(), " and ", b.repr()));
}

bool less_than(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return a.as_float() < b.as_float();
  if (a.is(Value::Kind::String) && b.is(Value::Kind::String)) return a.str() < b.str();
  if (a.is(Value::Kind::List) && b.is(Value::Kind::List)) {
    const List &x = a.items(), &y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (less_than(x[i], y[i])) return true;
      if (less_than(y[i], x[i])) return false;
    }
    return x.size() < y.size();
  }
  throw Error(concat("'<' is not supported between ", a.repr(), " and ", b.repr()));
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::String:
      if (!item.is(Value::Kind::String)) throw Error("'in <string>' requires a string as left operand");
      return container.str().find(item.str()) != std::string::npos;
    case Value::Kind::List:
      for (const Value& v : container.items())
        if (v.equals(item)) return true;
      return false;
    case Value::Kind::Dict: case Value::Kind::Namespace:
      return item.is(Value::Kind::String) && container.entries().find(item.str()) != nullptr;
    case Value::Kind::Undefined: return false;  // as jinja2's Undefined, which iterates as empty
    default: throw Error(concat("argument of type ", container.repr(), " is not iterable"));
  }
}

Value get_item(const Value& object, const Value& key) {
  switch (object.kind()) {
    case Value::Kind::Undefined: fail_undefined(object);
    case Value::Kind::Dict: case Value::Kind::Namespace: {
      if (!key.is(Value::Kind::String)) return Value::undefined();
      const Value* v = object.entries().find(key.str());
      return v ? *v : get_attr(object, key.str());
    }
    case Value::Kind::List: case Value::Kind::String: {
      if (!key.is(Value::Kind::Int) && !key.is(Value::Kind::Bool)) return Value::undefined();
      const bool text = object.is(Value::Kind::String);
      const std::u32string chars = text ? utf8_decode(object.str()) : std::u32string();
      const int64_t n = static_cast<int64_t>(text ? chars.size() : object.items().size());
      int64_t i = key.as_int();
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::undefined();
      if (text) return Value::string(utf8_encode(std::u32string(1, chars[static_cast<size_t>(i)])));
      return object.items()[static_cast<size_t>(i)];
    }
    default: return Value::undefined();
  }
}

Value get_attr(const Value& object, const std::string& name) {
  if (!object.is_defined()) fail_undefined(object);
  if (object.is(Value::Kind::Namespace)) {
    const Value* v = object.entries().find(name);
    return v ? *v : Value::undefined(name);
  }
  Value method = bound_method(object, name);  // jinja2 tries the Python attribute first
  if (method.is_defined()) return method;
  if (object.is(Value::Kind::Dict)) {
    const Value* v = object.entries().find(name);
    if (v) return *v;
  }
  return Value::undefined(name);
}

}  // namespace shardlm::jinja
