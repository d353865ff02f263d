// jinja: the Jinja2 interpreter that renders Hugging Face chat templates as transformers renders them
// (jinja2 with trim_blocks, lstrip_blocks, loop controls, {% generation %}, tojson without ASCII
// escapes, raise_exception and strftime_now). Values, the template (parse once, render many) and the
// error that names the template and line. The subset real chat templates use: docs/data.md.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "shardlm/core.hpp"

namespace shardlm::jinja {

class Value;
using List = std::vector<Value>;
using Keywords = std::vector<std::pair<std::string, Value>>;

// A dict keeps its insertion order, as Python's does (tojson and items() show it).
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(const std::string& key) const;
  void set(const std::string& key, Value value);
};

struct Args;
using Function = std::function<Value(Args&)>;

// A template value: Python's types as jinja2 sees them. Lists and dicts are shared (a namespace is a
// dict that `set ns.attr` changes in place); Undefined is jinja2's default Undefined (falsy, renders
// empty, an error when its attribute or item is taken or it takes part in arithmetic).
class Value {
 public:
  enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Function };

  Value() = default;
  static Value undefined(std::string name = "") { Value v; v.name_ = std::move(name); return v; }
  static Value none() { Value v; v.kind_ = Kind::None; return v; }
  static Value boolean(bool b) { Value v; v.kind_ = Kind::Bool; v.int_ = b; return v; }
  static Value integer(int64_t i) { Value v; v.kind_ = Kind::Int; v.int_ = i; return v; }
  static Value number(double f) { Value v; v.kind_ = Kind::Float; v.float_ = f; return v; }
  static Value string(std::string s) { Value v; v.kind_ = Kind::String; v.str_ = std::move(s); return v; }
  static Value list(List items, bool tuple = false);
  static Value dict(Dict d = {});
  static Value name_space(Dict d = {});
  static Value function(Function f, std::string name);
  static Value from_json(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  bool is(Kind k) const { return kind_ == k; }
  bool is_defined() const { return kind_ != Kind::Undefined; }
  bool is_number() const { return kind_ == Kind::Int || kind_ == Kind::Float || kind_ == Kind::Bool; }
  bool is_tuple() const { return tuple_; }
  int64_t as_int() const { return kind_ == Kind::Float ? static_cast<int64_t>(float_) : int_; }
  double as_float() const { return kind_ == Kind::Float ? float_ : static_cast<double>(int_); }
  const std::string& str() const { return str_; }   // Kind::String (or the name of an Undefined / Function)
  const std::string& name() const { return name_; }
  List& items() const { return *list_; }            // Kind::List
  Dict& entries() const { return *dict_; }          // Kind::Dict and Kind::Namespace
  const Function& call() const { return *fn_; }

  bool truthy() const;
  std::string to_string() const;  // str(value): what {{ value }} prints
  std::string repr() const;       // repr(value): inside a printed list or dict
  bool equals(const Value& other) const;

 private:
  Kind kind_ = Kind::Undefined;
  bool tuple_ = false;
  int64_t int_ = 0;
  double float_ = 0;
  std::string str_;
  std::string name_;
  std::shared_ptr<List> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<Function> fn_;
};

// A call's arguments, positional then keyword.
struct Args {
  List positional;
  Keywords keywords;
  // The argument at `index` or named `key`, else `fallback`.
  Value get(size_t index, const std::string& key, Value fallback = Value()) const;
};

// Python's repr of a float (the shortest text that reads back the same).
std::string python_float(double value);
// json.dumps's options, as transformers' tojson filter passes them: indent (none: one line), the
// separators between items and between a key and its value, sort_keys, ensure_ascii.
struct JsonStyle {
  std::optional<std::string> indent;  // what one level indents by (json.dumps: indent spaces, or the string)
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};
// json.dumps(value, ...) with these options.
std::string to_json_text(const Value& value, const JsonStyle& style = {});

// A template error: "SOURCE:LINE: message". `raised` marks a raise_exception() call (the template
// refusing its input), whose text is `message`.
class TemplateError : public Error {
 public:
  TemplateError(const std::string& source, int line, const std::string& message, bool raised = false)
      : Error(concat(source, ":", line, ": ", raised ? "the template refuses the input: " : "", message)),
        message_(message), line_(line), raised_(raised) {}
  const std::string& message() const { return message_; }
  int line() const { return line_; }
  bool raised() const { return raised_; }

 private:
  std::string message_;
  int line_;
  bool raised_;
};

struct Node;  // jinja_ast.hpp

// A parsed template. `source` names it in errors (a file path, "tokenizer_config.json chat_template").
class Template {
 public:
  Template(const std::string& text, std::string source);
  // Renders with these variables (plus the globals: range, namespace, dict, raise_exception,
  // strftime_now). Throws TemplateError.
  std::string render(const Dict& variables) const;
  const std::string& source() const { return source_; }

 private:
  std::shared_ptr<const Node> root_;
  std::string source_;
};

}  // namespace shardlm::jinja
