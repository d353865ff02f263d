// Jinja parsing: expressions by jinja2's precedence (condition, or, and, not, comparison, + -, ~,
// * / // %, **, unary with its filters and tests) and the statements chat templates use (if, for,
// set, macro, break, continue, generation).
#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "jinja_ast.hpp"

namespace shardlm::jinja {

namespace {

ExprPtr make(Expr::Kind kind, int line, std::vector<ExprPtr> args = {}, std::string name = "") {
  auto e = std::make_shared<Expr>();
  e->kind = kind;
  e->line = line;
  e->args = std::move(args);
  e->name = std::move(name);
  return e;
}

class ExpressionParser {
 public:
  ExpressionParser(std::vector<Token> tokens, const std::string& source, int line)
      : tokens_(std::move(tokens)), source_(source), line_(line) {}

  const Token& peek(size_t ahead = 0) const { return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)]; }
  bool at_end() const { return peek().kind == Token::Kind::End; }
  bool is_op(const std::string& op, size_t ahead = 0) const {
    return peek(ahead).kind == Token::Kind::Op && peek(ahead).text == op;
  }
  bool is_name(const std::string& name, size_t ahead = 0) const {
    return peek(ahead).kind == Token::Kind::Name && peek(ahead).text == name;
  }
  bool accept_op(const std::string& op) { return is_op(op) ? (++pos_, true) : false; }
  bool accept_name(const std::string& name) { return is_name(name) ? (++pos_, true) : false; }
  [[noreturn]] void fail(const std::string& what) const {
    const Token& t = peek();
    throw TemplateError(source_, line_, concat(what, ", got ", t.kind == Token::Kind::End ? "the end of the tag" : "'" + t.text + "'"));
  }
  void expect_op(const std::string& op) {
    if (!accept_op(op)) fail(concat("expected '", op, "'"));
  }
  std::string expect_name() {
    if (peek().kind != Token::Kind::Name) fail("expected a name");
    return tokens_[pos_++].text;
  }
  void expect_end() {
    if (!at_end()) fail("expected the end of the tag");
  }

  // A comma-separated list becomes a tuple; `with_condition` false leaves `x if y` to the caller.
  ExprPtr parse_tuple(bool with_condition = true) {
    ExprPtr first = with_condition ? parse_expression() : parse_or();
    if (!is_op(",")) return first;
    std::vector<ExprPtr> items{first};
    while (accept_op(",")) {
      if (at_end() || is_name("if")) break;
      items.push_back(with_condition ? parse_expression() : parse_or());
    }
    return make(Expr::Kind::TupleLit, line_, std::move(items));
  }

  ExprPtr parse_expression() {
    ExprPtr value = parse_or();
    while (accept_name("if")) {
      ExprPtr condition = parse_or();
      ExprPtr otherwise = accept_name("else") ? parse_expression() : nullptr;
      value = make(Expr::Kind::Condition, line_, {condition, value, otherwise});
    }
    return value;
  }

 private:
  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (accept_name("or")) left = make(Expr::Kind::Or, line_, {left, parse_and()});
    return left;
  }
  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (accept_name("and")) left = make(Expr::Kind::And, line_, {left, parse_not()});
    return left;
  }
  ExprPtr parse_not() {
    if (accept_name("not")) return make(Expr::Kind::Not, line_, {parse_not()});
    return parse_compare();
  }
  ExprPtr parse_compare() {
    ExprPtr first = parse_math1();
    auto e = std::make_shared<Expr>();
    e->kind = Expr::Kind::Compare;
    e->line = line_;
    e->args.push_back(first);
    for (;;) {
      const Token& t = peek();
      if (t.kind == Token::Kind::Op && (t.text == "==" || t.text == "!=" || t.text == "<" || t.text == ">" ||
                                        t.text == "<=" || t.text == ">=")) {
        e->ops.push_back(t.text);
        ++pos_;
      } else if (accept_name("in")) {
        e->ops.push_back("in");
      } else if (is_name("not") && is_name("in", 1)) {
        pos_ += 2;
        e->ops.push_back("not in");
      } else {
        break;
      }
      e->args.push_back(parse_math1());
    }
    return e->ops.empty() ? first : e;
  }
  ExprPtr parse_binary_level(int level) {
    static const std::vector<std::vector<std::string>> kLevels = {{"+", "-"}, {"~"}, {"*", "/", "//", "%"}, {"**"}};
    ExprPtr left = level + 1 < static_cast<int>(kLevels.size()) ? parse_binary_level(level + 1) : parse_unary(true);
    for (;;) {
      const auto& ops = kLevels[static_cast<size_t>(level)];
      auto it = std::find_if(ops.begin(), ops.end(), [&](const std::string& op) { return is_op(op); });
      if (it == ops.end()) return left;
      ++pos_;
      ExprPtr right = level + 1 < static_cast<int>(kLevels.size()) ? parse_binary_level(level + 1) : parse_unary(true);
      left = make(Expr::Kind::Binary, line_, {left, right}, *it);
    }
  }
  ExprPtr parse_math1() { return parse_binary_level(0); }

  ExprPtr parse_unary(bool with_filter) {
    ExprPtr node;
    if (accept_op("-")) {
      node = make(Expr::Kind::Neg, line_, {parse_unary(false)});
    } else if (accept_op("+")) {
      node = make(Expr::Kind::Pos, line_, {parse_unary(false)});
    } else {
      node = parse_primary();
    }
    node = parse_postfix(node);
    return with_filter ? parse_filters(node) : node;
  }

  ExprPtr parse_primary() {
    const Token t = peek();
    if (t.kind == Token::Kind::End) fail("expected an expression");
    ++pos_;
    if (t.kind == Token::Kind::Name) {
      if (t.text == "true" || t.text == "True") return literal(Value::boolean(true));
      if (t.text == "false" || t.text == "False") return literal(Value::boolean(false));
      if (t.text == "none" || t.text == "None") return literal(Value::none());
      return make(Expr::Kind::Name, line_, {}, t.text);
    }
    if (t.kind == Token::Kind::String) {
      std::string text = t.text;
      while (peek().kind == Token::Kind::String) text += tokens_[pos_++].text;  // adjacent strings join
      return literal(Value::string(text));
    }
    if (t.kind == Token::Kind::Int) {
      errno = 0;
      const long long value = std::strtoll(t.text.c_str(), nullptr, 10);
      if (errno == ERANGE)
        throw TemplateError(source_, line_, concat("the integer ", t.text, " does not fit in 64 bits (shardlm's integers are 64-bit)"));
      return literal(Value::integer(value));
    }
    if (t.kind == Token::Kind::Float) return literal(Value::number(std::strtod(t.text.c_str(), nullptr)));
    if (t.text == "(") return parse_parenthesized();
    if (t.text == "[") return make(Expr::Kind::ListLit, line_, parse_items("]"));
    if (t.text == "{") return parse_dict();
    --pos_;
    fail("expected an expression");
  }
  ExprPtr literal(Value v) {
    auto e = std::make_shared<Expr>();
    e->kind = Expr::Kind::Literal;
    e->line = line_;
    e->literal = std::move(v);
    return e;
  }
  ExprPtr parse_parenthesized() {
    if (accept_op(")")) return make(Expr::Kind::TupleLit, line_);
    ExprPtr first = parse_expression();
    if (accept_op(")")) return first;
    std::vector<ExprPtr> items{first};
    while (accept_op(",")) {
      if (is_op(")")) break;
      items.push_back(parse_expression());
    }
    expect_op(")");
    return make(Expr::Kind::TupleLit, line_, std::move(items));
  }
  std::vector<ExprPtr> parse_items(const std::string& close) {
    std::vector<ExprPtr> items;
    while (!accept_op(close)) {
      if (!items.empty()) expect_op(",");
      if (accept_op(close)) break;
      items.push_back(parse_expression());
    }
    return items;
  }
  ExprPtr parse_dict() {
    std::vector<ExprPtr> items;  // key, value, key, value...
    while (!accept_op("}")) {
      if (!items.empty()) expect_op(",");
      if (accept_op("}")) break;
      items.push_back(parse_expression());
      expect_op(":");
      items.push_back(parse_expression());
    }
    return make(Expr::Kind::DictLit, line_, std::move(items));
  }

  ExprPtr parse_postfix(ExprPtr node) {
    for (;;) {
      if (accept_op(".")) {
        const Token t = peek();
        ++pos_;
        if (t.kind == Token::Kind::Int) {
          node = make(Expr::Kind::Item, line_, {node, literal(Value::integer(std::atoll(t.text.c_str())))});
        } else if (t.kind == Token::Kind::Name) {
          node = make(Expr::Kind::Attr, line_, {node}, t.text);
        } else {
          --pos_;
          fail("expected an attribute name after '.'");
        }
      } else if (accept_op("[")) {
        node = parse_subscript(node);
      } else if (is_op("(")) {
        node = parse_call(node, Expr::Kind::Call, "");
      } else {
        return node;
      }
    }
  }
  ExprPtr parse_subscript(ExprPtr node) {
    ExprPtr parts[3];
    int colons = 0;
    for (;;) {
      if (accept_op("]")) break;
      if (accept_op(":")) {
        if (++colons > 2) fail("too many ':' in a slice");
        continue;
      }
      if (parts[colons]) fail("expected ']'");
      parts[colons] = parse_expression();
    }
    if (colons == 0) {
      if (!parts[0]) fail("expected an index");
      return make(Expr::Kind::Item, line_, {node, parts[0]});
    }
    return make(Expr::Kind::Slice, line_, {node, parts[0], parts[1], parts[2]});
  }
  // Arguments in parentheses (name=value for keywords) after `subject`.
  ExprPtr parse_call(ExprPtr subject, Expr::Kind kind, std::string name) {
    auto e = std::make_shared<Expr>();
    e->kind = kind;
    e->line = line_;
    e->name = std::move(name);
    e->args.push_back(subject);
    if (!accept_op("(")) return e;
    while (!accept_op(")")) {
      if (e->args.size() + e->keywords.size() > 1) expect_op(",");
      if (accept_op(")")) break;
      if (peek().kind == Token::Kind::Name && is_op("=", 1)) {
        std::string key = tokens_[pos_].text;
        pos_ += 2;
        e->keywords.emplace_back(key, parse_expression());
      } else {
        e->args.push_back(parse_expression());
      }
    }
    return e;
  }
  ExprPtr parse_filters(ExprPtr node) {
    for (;;) {
      if (accept_op("|")) {
        node = parse_call(node, Expr::Kind::Filter, expect_name());
      } else if (accept_name("is")) {
        const bool negated = accept_name("not");
        const std::string test = expect_name();
        auto e = std::const_pointer_cast<Expr>(parse_call(node, Expr::Kind::Test, test));
        e->negated = negated;
        if (e->args.size() == 1 && e->keywords.empty() && takes_bare_argument()) {
          e->args.push_back(parse_postfix(parse_primary()));
        }
        node = e;
      } else if (is_op("(")) {
        node = parse_call(node, Expr::Kind::Call, "");
      } else {
        return node;
      }
    }
  }
  // `x is divisibleby 3`: a test's one argument may follow without parentheses.
  bool takes_bare_argument() const {
    const Token& t = peek();
    if (t.kind == Token::Kind::Name) return t.text != "else" && t.text != "or" && t.text != "and";
    if (t.kind == Token::Kind::String || t.kind == Token::Kind::Int || t.kind == Token::Kind::Float) return true;
    return t.kind == Token::Kind::Op && (t.text == "[" || t.text == "{");
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  const std::string& source_;
  int line_;
};

// Statements: chunks into nodes, each block read up to the words that end it.
class StatementParser {
 public:
  StatementParser(const std::vector<Chunk>& chunks, const std::string& source) : chunks_(chunks), source_(source) {}

  NodePtr parse_root() {
    auto root = std::make_shared<Node>();
    root->kind = Node::Kind::Scope;
    root->body = parse_body({}, "", 0).first;
    return root;
  }

 private:
  // Nodes up to a statement that starts with one of `stops` (consumed; returned with its parser).
  std::pair<Body, std::string> parse_body(const std::vector<std::string>& stops, const std::string& opener, int line) {
    Body body;
    while (index_ < chunks_.size()) {
      const Chunk& chunk = chunks_[index_++];
      if (chunk.kind == Chunk::Kind::Text) {
        body.push_back(text_node(chunk));
        continue;
      }
      current_ = std::make_unique<ExpressionParser>(tokenize_expression(chunk.text, source_, chunk.line), source_,
                                                    chunk.line);
      if (chunk.kind == Chunk::Kind::Output) {
        body.push_back(output_node(chunk.line));
        continue;
      }
      const std::string word = current_->expect_name();
      if (std::find(stops.begin(), stops.end(), word) != stops.end()) return {std::move(body), word};
      body.push_back(statement(word, chunk.line));
    }
    if (!stops.empty())
      throw TemplateError(source_, line, concat("the '", opener, "' opened here is not closed (expected ",
                                                join_words(stops), " before the end of the template)"));
    return {std::move(body), ""};
  }
  static std::string join_words(const std::vector<std::string>& words) {
    std::string out;
    for (const auto& w : words) out += (out.empty() ? "'" : " or '") + w + "'";
    return out;
  }
  NodePtr text_node(const Chunk& chunk) {
    auto n = std::make_shared<Node>();
    n->kind = Node::Kind::Text;
    n->line = chunk.line;
    n->text = chunk.text;
    return n;
  }
  NodePtr output_node(int line) {
    auto n = std::make_shared<Node>();
    n->kind = Node::Kind::Output;
    n->line = line;
    n->expr = current_->parse_tuple();
    current_->expect_end();
    return n;
  }
  NodePtr statement(const std::string& word, int line) {
    auto n = std::make_shared<Node>();
    n->line = line;
    if (word == "if") return parse_if(n);
    if (word == "for") return parse_for(n);
    if (word == "set") return parse_set(n);
    if (word == "macro") return parse_macro(n);
    if (word == "break" || word == "continue") {
      n->kind = word == "break" ? Node::Kind::Break : Node::Kind::Continue;
      current_->expect_end();
      return n;
    }
    if (word == "generation") {  // transformers' assistant-mask marker: renders its body
      current_->expect_end();
      n->kind = Node::Kind::Scope;
      n->body = parse_body({"endgeneration"}, word, line).first;
      return n;
    }
    throw TemplateError(source_, line, concat("unknown or unsupported tag '", word, "'"));
  }
  NodePtr parse_if(std::shared_ptr<Node> n) {
    n->kind = Node::Kind::If;
    const int line = n->line;
    ExprPtr condition = current_->parse_tuple();
    for (;;) {
      current_->expect_end();
      auto [body, stop] = parse_body({"elif", "else", "endif"}, "if", line);
      n->branches.emplace_back(condition, std::move(body));
      if (stop == "elif") {
        condition = current_->parse_tuple();
        continue;
      }
      if (stop == "else") {
        current_->expect_end();
        n->else_body = parse_body({"endif"}, "if", line).first;
      }
      current_->expect_end();
      return n;
    }
  }
  NodePtr parse_for(std::shared_ptr<Node> n) {
    n->kind = Node::Kind::For;
    do {
      n->targets.push_back(current_->expect_name());
    } while (current_->accept_op(","));
    if (!current_->accept_name("in")) current_->fail("expected 'in'");
    n->expr = current_->parse_tuple(false);
    if (current_->accept_name("if")) n->filter = current_->parse_expression();
    current_->expect_end();
    auto [body, stop] = parse_body({"else", "endfor"}, "for", n->line);
    n->body = std::move(body);
    if (stop == "else") {
      current_->expect_end();
      n->else_body = parse_body({"endfor"}, "for", n->line).first;
    }
    current_->expect_end();
    return n;
  }
  NodePtr parse_set(std::shared_ptr<Node> n) {
    n->kind = Node::Kind::Set;
    n->targets.push_back(current_->expect_name());
    if (current_->accept_op(".")) {
      n->attr = current_->expect_name();
    } else {
      while (current_->accept_op(",")) n->targets.push_back(current_->expect_name());
    }
    if (current_->at_end() && n->attr.empty() && n->targets.size() == 1) {  // {% set x %}...{% endset %}
      n->kind = Node::Kind::SetBlock;
      n->body = parse_body({"endset"}, "set", n->line).first;
      current_->expect_end();
      return n;
    }
    current_->expect_op("=");
    n->expr = current_->parse_tuple();
    current_->expect_end();
    return n;
  }
  NodePtr parse_macro(std::shared_ptr<Node> n) {
    n->kind = Node::Kind::Macro;
    n->attr = current_->expect_name();
    current_->expect_op("(");
    while (!current_->accept_op(")")) {
      if (!n->params.empty()) current_->expect_op(",");
      if (current_->accept_op(")")) break;
      std::string name = current_->expect_name();
      ExprPtr fallback = current_->accept_op("=") ? current_->parse_expression() : nullptr;
      n->params.emplace_back(name, fallback);
    }
    current_->expect_end();
    n->body = parse_body({"endmacro"}, "macro", n->line).first;
    current_->expect_end();
    return n;
  }

  const std::vector<Chunk>& chunks_;
  const std::string& source_;
  size_t index_ = 0;
  std::unique_ptr<ExpressionParser> current_;
};

}  // namespace

NodePtr parse_template(const std::vector<Chunk>& chunks, const std::string& source) {
  return StatementParser(chunks, source).parse_root();
}

}  // namespace shardlm::jinja
