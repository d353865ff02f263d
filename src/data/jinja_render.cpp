// Jinja rendering: evaluating expressions and running statements over scopes as jinja2 does (a
// for loop's body gets a fresh scope each iteration, so `set` inside it does not leak; namespaces
// carry values out), with errors that name the template and line.
#include <map>

#include "jinja_ast.hpp"

namespace shardlm::jinja {

namespace {

struct Scope {
  std::map<std::string, Value> vars;
  const Scope* parent = nullptr;
  Value lookup(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent) {
      auto it = s->vars.find(name);
      if (it != s->vars.end()) return it->second;
    }
    return Value::undefined(name);
  }
};

enum class Flow { Normal, Break, Continue };

// Python's slice of a list or string (by code point).
Value slice(const Value& object, const Value& start_v, const Value& stop_v, const Value& step_v) {
  if (!object.is(Value::Kind::List) && !object.is(Value::Kind::String)) throw Error(concat("cannot slice ", object.repr()));
  const bool text = object.is(Value::Kind::String);
  const std::u32string chars = text ? utf8_decode(object.str()) : std::u32string();
  const int64_t n = static_cast<int64_t>(text ? chars.size() : object.items().size());
  const int64_t step = step_v.is_number() ? step_v.as_int() : 1;
  if (step == 0) throw Error("slice step cannot be zero");
  auto bound = [&](const Value& v, int64_t fallback) {
    if (!v.is_number()) return fallback;
    int64_t i = v.as_int();
    if (i < 0) i += n;
    if (step > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  const int64_t start = bound(start_v, step > 0 ? 0 : n - 1);
  const int64_t stop = bound(stop_v, step > 0 ? n : -1);
  std::u32string out_text;
  List out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (text) out_text.push_back(chars[static_cast<size_t>(i)]);
    else out.push_back(object.items()[static_cast<size_t>(i)]);
  }
  return text ? Value::string(utf8_encode(out_text)) : Value::list(out);
}

Value loop_value(size_t index, const std::vector<Value>& items) {
  const int64_t n = static_cast<int64_t>(items.size()), i = static_cast<int64_t>(index);
  Dict loop;
  loop.set("index", Value::integer(i + 1));
  loop.set("index0", Value::integer(i));
  loop.set("first", Value::boolean(i == 0));
  loop.set("last", Value::boolean(i == n - 1));
  loop.set("length", Value::integer(n));
  loop.set("revindex", Value::integer(n - i));
  loop.set("revindex0", Value::integer(n - i - 1));
  loop.set("depth", Value::integer(1));
  loop.set("depth0", Value::integer(0));
  if (i > 0) loop.set("previtem", items[index - 1]);
  if (i + 1 < n) loop.set("nextitem", items[index + 1]);
  loop.set("cycle", Value::function([i](Args& a) { return a.positional.empty() ? Value() : a.positional[static_cast<size_t>(i) % a.positional.size()]; }, "cycle"));
  return Value::dict(std::move(loop));
}

class Renderer {
 public:
  explicit Renderer(const std::string& source) : source_(source) {}

  Flow run(const Body& body, Scope& scope, std::string& out) {
    for (const NodePtr& node : body) {
      const Flow flow = run_node(*node, scope, out);
      if (flow != Flow::Normal) return flow;
    }
    return Flow::Normal;
  }

 private:
  Flow run_node(const Node& node, Scope& scope, std::string& out) {
    try {
      return run_statement(node, scope, out);
    } catch (const TemplateError&) {
      throw;
    } catch (const RaisedError& e) {
      throw TemplateError(source_, node.line, e.message, true);
    } catch (const Error& e) {
      throw TemplateError(source_, node.line, e.what());
    } catch (const std::exception& e) {  // std::stoll and friends on odd input
      throw TemplateError(source_, node.line, e.what());
    }
  }

  Flow run_statement(const Node& node, Scope& scope, std::string& out) {
    switch (node.kind) {
      case Node::Kind::Text: out += node.text; return Flow::Normal;
      case Node::Kind::Output: out += eval(*node.expr, scope).to_string(); return Flow::Normal;
      case Node::Kind::If:
        for (const auto& [condition, body] : node.branches)
          if (eval(*condition, scope).truthy()) return run(body, scope, out);
        return run(node.else_body, scope, out);
      case Node::Kind::For: return run_for(node, scope, out);
      case Node::Kind::Set: assign(node, eval(*node.expr, scope), scope); return Flow::Normal;
      case Node::Kind::SetBlock: {
        std::string text;
        run(node.body, scope, text);
        scope.vars[node.targets[0]] = Value::string(text);
        return Flow::Normal;
      }
      case Node::Kind::Macro: scope.vars[node.attr] = macro(node, scope); return Flow::Normal;
      case Node::Kind::Break: return Flow::Break;
      case Node::Kind::Continue: return Flow::Continue;
      case Node::Kind::Scope: return run(node.body, scope, out);
    }
    return Flow::Normal;
  }

  void bind(const std::vector<std::string>& targets, const Value& value, Scope& scope) {
    if (targets.size() == 1) {
      scope.vars[targets[0]] = value;
      return;
    }
    if (!value.is(Value::Kind::List) || value.items().size() != targets.size())
      throw Error(concat("cannot unpack ", value.repr(), " into ", targets.size(), " names"));
    for (size_t i = 0; i < targets.size(); ++i) scope.vars[targets[i]] = value.items()[i];
  }

  void assign(const Node& node, const Value& value, Scope& scope) {
    if (node.attr.empty()) return bind(node.targets, value, scope);
    const Value target = scope.lookup(node.targets[0]);
    if (!target.is(Value::Kind::Namespace))
      throw Error(concat("cannot assign attribute '", node.attr, "' on '", node.targets[0], "': not a namespace"));
    target.entries().set(node.attr, value);
  }

  Flow run_for(const Node& node, Scope& scope, std::string& out) {
    std::vector<Value> items;
    for (const Value& item : iterate(eval(*node.expr, scope))) {
      if (node.filter) {
        Scope probe{{}, &scope};
        bind(node.targets, item, probe);
        if (!eval(*node.filter, probe).truthy()) continue;
      }
      items.push_back(item);
    }
    if (items.empty()) {
      Scope inner{{}, &scope};
      run(node.else_body, inner, out);
      return Flow::Normal;
    }
    for (size_t i = 0; i < items.size(); ++i) {
      Scope inner{{}, &scope};
      bind(node.targets, items[i], inner);
      inner.vars["loop"] = loop_value(i, items);
      if (run(node.body, inner, out) == Flow::Break) break;
    }
    return Flow::Normal;
  }

  Value macro(const Node& node, const Scope& defined_in) {
    const Node* def = &node;
    const Scope* parent = &defined_in;
    return Value::function([this, def, parent](Args& args) {
      Scope scope{{}, parent};
      for (size_t i = 0; i < def->params.size(); ++i) {
        const auto& [name, fallback] = def->params[i];
        Value v = args.get(i, name, Value::undefined(name));
        if (!v.is_defined() && fallback) v = eval(*fallback, scope);
        scope.vars[name] = v;
      }
      std::string text;
      run(def->body, scope, text);
      return Value::string(text);
    }, node.attr);
  }

  Args arguments(const Expr& e, const Scope& scope) {
    Args args;
    for (size_t i = 1; i < e.args.size(); ++i) args.positional.push_back(eval(*e.args[i], scope));
    for (const auto& [k, v] : e.keywords) args.keywords.emplace_back(k, eval(*v, scope));
    return args;
  }

  Value compare(const Expr& e, const Scope& scope) {
    Value left = eval(*e.args[0], scope);
    for (size_t i = 0; i < e.ops.size(); ++i) {
      Value right = eval(*e.args[i + 1], scope);
      const std::string& op = e.ops[i];
      bool ok;
      if (op == "==") ok = left.equals(right);
      else if (op == "!=") ok = !left.equals(right);
      else if (op == "<") ok = less_than(left, right);
      else if (op == ">") ok = less_than(right, left);
      else if (op == "<=") ok = !less_than(right, left);
      else if (op == ">=") ok = !less_than(left, right);
      else if (op == "in") ok = contains(right, left);
      else ok = !contains(right, left);
      if (!ok) return Value::boolean(false);
      left = right;
    }
    return Value::boolean(true);
  }

  Value collection(const Expr& e, const Scope& scope) {
    if (e.kind == Expr::Kind::DictLit) {
      Dict d;
      for (size_t i = 0; i + 1 < e.args.size(); i += 2)
        d.set(eval(*e.args[i], scope).to_string(), eval(*e.args[i + 1], scope));
      return Value::dict(std::move(d));
    }
    List items;
    for (const ExprPtr& item : e.args) items.push_back(eval(*item, scope));
    return Value::list(std::move(items), e.kind == Expr::Kind::TupleLit);
  }

  Value eval(const Expr& e, const Scope& scope) {
    switch (e.kind) {
      case Expr::Kind::Literal: return e.literal;
      case Expr::Kind::Name: return scope.lookup(e.name);
      case Expr::Kind::Attr: return get_attr(eval(*e.args[0], scope), e.name);
      case Expr::Kind::Item: return get_item(eval(*e.args[0], scope), eval(*e.args[1], scope));
      case Expr::Kind::Slice: {
        auto part = [&](size_t i) { return e.args[i] ? eval(*e.args[i], scope) : Value::none(); };
        return slice(eval(*e.args[0], scope), part(1), part(2), part(3));
      }
      case Expr::Kind::Call: {
        const Value callee = eval(*e.args[0], scope);
        if (!callee.is(Value::Kind::Function))
          throw Error(callee.is_defined() ? concat(callee.repr(), " is not callable") : concat("'", callee.name(), "' is undefined"));
        Args args = arguments(e, scope);
        return callee.call()(args);
      }
      case Expr::Kind::Filter: {
        Args args = arguments(e, scope);
        return apply_filter(e.name, eval(*e.args[0], scope), args);
      }
      case Expr::Kind::Test: {
        Args args = arguments(e, scope);
        return Value::boolean(apply_test(e.name, eval(*e.args[0], scope), args) != e.negated);
      }
      case Expr::Kind::Neg: case Expr::Kind::Pos: {
        const Value v = eval(*e.args[0], scope);
        if (!v.is_number()) throw Error(concat("bad operand for unary ", e.kind == Expr::Kind::Neg ? "-" : "+", ": ", v.repr()));
        if (e.kind == Expr::Kind::Pos) return v;
        return v.is(Value::Kind::Float) ? Value::number(-v.as_float()) : Value::integer(-v.as_int());
      }
      case Expr::Kind::Not: return Value::boolean(!eval(*e.args[0], scope).truthy());
      case Expr::Kind::Binary: return binary_op(e.name, eval(*e.args[0], scope), eval(*e.args[1], scope));
      case Expr::Kind::And: {
        Value left = eval(*e.args[0], scope);
        return left.truthy() ? eval(*e.args[1], scope) : left;
      }
      case Expr::Kind::Or: {
        Value left = eval(*e.args[0], scope);
        return left.truthy() ? left : eval(*e.args[1], scope);
      }
      case Expr::Kind::Compare: return compare(e, scope);
      case Expr::Kind::Condition:
        if (eval(*e.args[0], scope).truthy()) return eval(*e.args[1], scope);
        return e.args[2] ? eval(*e.args[2], scope) : Value::undefined();
      default: return collection(e, scope);
    }
  }

  const std::string& source_;
};

// jinja2 refuses an unknown filter or test when it compiles the template, whether or not it runs, except
// in a "soft" frame: an `if` (its conditions and branches) or a conditional expression `a if c else b`
// (all three parts), where it is refused only when reached. A for loop's body, `if` filter and `else`,
// a macro, a block `set` and `generation` open a frame of their own that is not soft again; a for
// loop's iterable and a `set` value stay in the frame around them. (Templates keep tool-only branches,
// `{% if tools %}{{ tools | tojson | indent(4) }}{% endif %}`, that never run without tools.)
void check_names(const Expr& e, const std::string& source, int line, bool soft) {
  soft = soft || e.kind == Expr::Kind::Condition;
  if (!soft && e.kind == Expr::Kind::Filter && !has_filter(e.name))
    throw TemplateError(source, line, concat("no filter named '", e.name, "'"));
  if (!soft && e.kind == Expr::Kind::Test && !has_test(e.name))
    throw TemplateError(source, line, concat("no test named '", e.name, "'"));
  for (const ExprPtr& a : e.args)
    if (a) check_names(*a, source, line, soft);
  for (const auto& [k, v] : e.keywords) check_names(*v, source, line, soft);
}

void check_names(const Body& body, const std::string& source, bool soft) {
  for (const NodePtr& n : body) {
    if (n->kind == Node::Kind::If) {
      for (const auto& [condition, branch] : n->branches) {
        check_names(*condition, source, n->line, true);
        check_names(branch, source, true);
      }
      check_names(n->else_body, source, true);
      continue;
    }
    if (n->expr) check_names(*n->expr, source, n->line, soft);  // Output, Set, a For's iterable
    if (n->filter) check_names(*n->filter, source, n->line, false);
    for (const auto& [name, fallback] : n->params)
      if (fallback) check_names(*fallback, source, n->line, false);
    check_names(n->body, source, false);
    check_names(n->else_body, source, false);
  }
}

}  // namespace

Template::Template(const std::string& text, std::string source) : source_(std::move(source)) {
  root_ = parse_template(split_template(text, source_), source_);
  check_names(root_->body, source_, false);
}

std::string Template::render(const Dict& variables) const {
  Scope globals;
  for (auto& [k, v] : global_functions().items) globals.vars[k] = v;
  for (const auto& [k, v] : variables.items) globals.vars[k] = v;
  Scope root{{}, &globals};
  std::string out;
  Renderer(source_).run(root_->body, root, out);
  return out;
}

}  // namespace shardlm::jinja
