// The Jinja interpreter's inside: the template's pieces after lexing (text, {{ }}, {% %} with
// whitespace control applied), expression tokens, the syntax tree, and the built-in filters, tests
// and methods the renderer calls. Only the jinja_*.cpp files include it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "jinja.hpp"

namespace shardlm::jinja {

// A piece of the template: literal text, an expression to print, or a statement's inside.
struct Chunk {
  enum class Kind { Text, Output, Statement } kind;
  std::string text;
  int line;
};
// The template split into chunks, with trim_blocks, lstrip_blocks, `-` and `+` applied and one
// trailing newline dropped, as jinja2's lexer does. Throws TemplateError for an unclosed tag.
std::vector<Chunk> split_template(const std::string& text, const std::string& source);

struct Token {
  enum class Kind { Name, String, Int, Float, Op, End } kind;
  std::string text;  // the name, the decoded string, the operator or the number's digits
};
// The tokens of an expression or statement (ending with one End token).
std::vector<Token> tokenize_expression(const std::string& text, const std::string& source, int line);

struct Expr;
using ExprPtr = std::shared_ptr<const Expr>;

struct Expr {
  enum class Kind {
    Literal, Name, Attr, Item, Slice, Call, Filter, Test, Neg, Pos, Not, Binary, And, Or, Compare,
    Condition, ListLit, TupleLit, DictLit
  } kind;
  int line = 0;
  Value literal;                 // Literal
  std::string name;              // Name, Attr, Filter, Test; Binary's operator
  std::vector<ExprPtr> args;     // operands; Call/Filter/Test arguments after the subject
  std::vector<std::pair<std::string, ExprPtr>> keywords;  // Call/Filter/Test keyword arguments
  std::vector<std::string> ops;  // Compare: the operators between args
  bool negated = false;          // Test: `is not`
};

struct Node;
using NodePtr = std::shared_ptr<const Node>;
using Body = std::vector<NodePtr>;

struct Node {
  enum class Kind { Text, Output, If, For, Set, SetBlock, Macro, Break, Continue, Scope } kind;
  int line = 0;
  std::string text;                                  // Text
  ExprPtr expr;                                      // Output, Set value, For iterable
  ExprPtr filter;                                    // For: `if` filter
  std::vector<std::string> targets;                  // For/Set names; Set with attr: {namespace}
  std::string attr;                                  // Set ns.attr
  std::vector<std::pair<ExprPtr, Body>> branches;    // If (elif ...)
  Body body, else_body;                              // For, If's else, SetBlock, Macro, Scope
  std::vector<std::pair<std::string, ExprPtr>> params;  // Macro (default may be null)
};

// The statements of a template, from its chunks.
NodePtr parse_template(const std::vector<Chunk>& chunks, const std::string& source);

// Built-ins (jinja_builtins.cpp). Each throws Error with a message; the renderer adds the line.
bool has_filter(const std::string& name);
bool has_test(const std::string& name);
Value apply_filter(const std::string& name, const Value& input, Args& args);
bool apply_test(const std::string& name, const Value& input, Args& args);
// The method `name` of a string or dict bound to it, or Undefined.
Value bound_method(const Value& self, const std::string& name);
// The global functions: range, namespace, dict, raise_exception (throws RaisedError), strftime_now.
Dict global_functions();
struct RaisedError {
  std::string message;
};

// Python semantics shared by the renderer and the built-ins.
std::vector<Value> iterate(const Value& value);         // list items, string characters, dict keys
Value binary_op(const std::string& op, const Value& a, const Value& b);
bool less_than(const Value& a, const Value& b);
bool contains(const Value& container, const Value& item);
Value get_item(const Value& object, const Value& key);  // [] on lists, strings and dicts
Value get_attr(const Value& object, const std::string& name);
// UTF-8 helpers: code points, and Python's str.isspace set.
std::u32string utf8_decode(const std::string& text);
std::string utf8_encode(const std::u32string& text);
bool is_python_space(char32_t c);

}  // namespace shardlm::jinja
