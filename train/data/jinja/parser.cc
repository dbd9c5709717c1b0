#include "train/data/jinja/parser.h"

#include <cstdlib>
#include <set>

#include "absl/strings/str_cat.h"

namespace loom::jinja {
namespace {

using T = Token::Type;

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : t_(tokens) {}

  Body Template() {
    std::string stop;
    Body body = Statements({}, &stop);
    return body;
  }

 private:
  const Token& Peek(size_t ahead = 0) const { return t_[std::min(i_ + ahead, t_.size() - 1)]; }
  const Token& Next() { return t_[i_ < t_.size() - 1 ? i_++ : i_]; }
  bool IsOp(const char* op, size_t ahead = 0) const {
    return Peek(ahead).type == T::kOp && Peek(ahead).text == op;
  }
  bool IsName(const char* name, size_t ahead = 0) const {
    return Peek(ahead).type == T::kName && Peek(ahead).text == name;
  }
  [[noreturn]] void Fail(const std::string& what) const { throw TemplateError(what, Peek().line); }
  void ExpectOp(const char* op) {
    if (!IsOp(op)) Fail(absl::StrCat("expected '", op, "', found ", Describe(Peek())));
    Next();
  }
  std::string ExpectName() {
    if (Peek().type != T::kName) Fail(absl::StrCat("expected a name, found ", Describe(Peek())));
    return Next().text;
  }
  void ExpectBlockEnd() {
    if (Peek().type != T::kBlockEnd) Fail(absl::StrCat("expected '%}', found ", Describe(Peek())));
    Next();
  }
  static std::string Describe(const Token& t) {
    switch (t.type) {
      case T::kText:
        return "text";
      case T::kVarBegin:
        return "'{{'";
      case T::kVarEnd:
        return "'}}'";
      case T::kBlockBegin:
        return "'{%'";
      case T::kBlockEnd:
        return "'%}'";
      case T::kEnd:
        return "the end of the template";
      case T::kString:
        return "a string";
      default:
        return absl::StrCat("'", t.text, "'");
    }
  }

  // Statements until a block tag whose keyword is in `stops` (consumed up to
  // the keyword, which is returned in *stop) or the end of the template.
  Body Statements(const std::set<std::string>& stops, std::string* stop) {
    Body body;
    while (true) {
      const Token& t = Peek();
      if (t.type == T::kEnd) {
        for (const std::string& end : stops) {
          if (end.rfind("end", 0) == 0) {
            Fail(absl::StrCat("the template ends inside a block: expected {% ", end, " %}"));
          }
        }
        return body;
      }
      if (t.type == T::kText) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kText;
        s->line = t.line;
        s->text = t.text;
        Next();
        body.push_back(std::move(s));
      } else if (t.type == T::kVarBegin) {
        Next();
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kOutput;
        s->line = t.line;
        s->expr = Expression();
        if (Peek().type != T::kVarEnd) Fail(absl::StrCat("expected '}}', found ", Describe(Peek())));
        Next();
        body.push_back(std::move(s));
      } else if (t.type == T::kBlockBegin) {
        Next();
        if (Peek().type != T::kName) Fail("expected a statement name after '{%'");
        std::string keyword = Peek().text;
        if (stops.count(keyword)) {
          Next();
          *stop = keyword;
          return body;
        }
        body.push_back(Statement());
      } else {
        Fail(absl::StrCat("unexpected ", Describe(t)));
      }
    }
  }

  std::unique_ptr<Stmt> Statement() {
    const int line = Peek().line;
    const std::string keyword = Next().text;
    auto s = std::make_unique<Stmt>();
    s->line = line;
    if (keyword == "if") {
      s->kind = Stmt::Kind::kIf;
      s->conditions.push_back(Expression());
      ExpectBlockEnd();
      std::string stop;
      s->bodies.push_back(Statements({"elif", "else", "endif"}, &stop));
      while (stop == "elif") {
        s->conditions.push_back(Expression());
        ExpectBlockEnd();
        s->bodies.push_back(Statements({"elif", "else", "endif"}, &stop));
      }
      if (stop == "else") {
        ExpectBlockEnd();
        s->else_body = Statements({"endif"}, &stop);
      }
      ExpectBlockEnd();
    } else if (keyword == "for") {
      s->kind = Stmt::Kind::kFor;
      s->targets.push_back(ExpectName());
      while (IsOp(",")) {
        Next();
        s->targets.push_back(ExpectName());
      }
      if (!IsName("in")) Fail("expected 'in' in {% for %}");
      Next();
      s->expr = Or();  // not a ternary: `if` here is the loop filter
      if (IsName("if")) {
        Next();
        s->filter = Or();
      }
      if (IsName("recursive")) Fail("unsupported construct {% for ... recursive %}");
      ExpectBlockEnd();
      std::string stop;
      s->bodies.push_back(Statements({"else", "endfor"}, &stop));
      if (stop == "else") {
        ExpectBlockEnd();
        s->else_body = Statements({"endfor"}, &stop);
      }
      ExpectBlockEnd();
    } else if (keyword == "set") {
      s->kind = Stmt::Kind::kSet;
      s->targets.push_back(ExpectName());
      if (IsOp(".")) {
        Next();
        s->attribute = ExpectName();
      }
      if (IsOp(",")) Fail("unsupported construct {% set a, b = ... %} (tuple assignment)");
      if (Peek().type == T::kBlockEnd) Fail("unsupported construct {% set %}...{% endset %} (block set)");
      ExpectOp("=");
      s->expr = Expression();
      ExpectBlockEnd();
    } else if (keyword == "generation") {
      s->kind = Stmt::Kind::kGeneration;
      ExpectBlockEnd();
      std::string stop;
      s->bodies.push_back(Statements({"endgeneration"}, &stop));
      ExpectBlockEnd();
    } else if (keyword == "break" || keyword == "continue") {
      s->kind = keyword == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
      ExpectBlockEnd();
    } else if (keyword.rfind("end", 0) == 0 || keyword == "elif" || keyword == "else") {
      throw TemplateError(absl::StrCat("{% ", keyword, " %} without an open block"), line);
    } else {
      throw TemplateError(absl::StrCat("unsupported construct {% ", keyword, " %}"), line);
    }
    return s;
  }

  ExprPtr Node(Expr::Kind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }
  ExprPtr Binary(std::string op, ExprPtr l, ExprPtr r) {
    auto e = Node(Expr::Kind::kBinary, l->line);
    e->name = std::move(op);
    e->args.push_back(std::move(l));
    e->args.push_back(std::move(r));
    return e;
  }

  ExprPtr Expression() {
    ExprPtr e = Or();
    while (IsName("if")) {
      Next();
      auto c = Node(Expr::Kind::kCondition, e->line);
      c->args.push_back(Or());
      c->args.push_back(std::move(e));
      if (IsName("else")) {
        Next();
        c->args.push_back(Or());
      } else {
        c->args.push_back(nullptr);
      }
      e = std::move(c);
    }
    return e;
  }
  ExprPtr Or() {
    ExprPtr e = And();
    while (IsName("or")) {
      Next();
      e = Binary("or", std::move(e), And());
    }
    return e;
  }
  ExprPtr And() {
    ExprPtr e = Not();
    while (IsName("and")) {
      Next();
      e = Binary("and", std::move(e), Not());
    }
    return e;
  }
  ExprPtr Not() {
    if (IsName("not")) {
      int line = Next().line;
      auto e = Node(Expr::Kind::kUnary, line);
      e->name = "not";
      e->args.push_back(Not());
      return e;
    }
    return Compare();
  }
  ExprPtr Compare() {
    ExprPtr e = Add();
    while (true) {
      std::string op;
      if (Peek().type == T::kOp &&
          (Peek().text == "==" || Peek().text == "!=" || Peek().text == "<" ||
           Peek().text == ">" || Peek().text == "<=" || Peek().text == ">=")) {
        op = Next().text;
      } else if (IsName("in")) {
        Next();
        op = "in";
      } else if (IsName("not") && IsName("in", 1)) {
        Next();
        Next();
        op = "not in";
      } else {
        return e;
      }
      e = Binary(op, std::move(e), Add());
    }
  }
  ExprPtr Add() {
    ExprPtr e = Concat();
    while (IsOp("+") || IsOp("-")) {
      std::string op = Next().text;
      e = Binary(op, std::move(e), Concat());
    }
    return e;
  }
  ExprPtr Concat() {
    ExprPtr e = Mul();
    while (IsOp("~")) {
      Next();
      e = Binary("~", std::move(e), Mul());
    }
    return e;
  }
  ExprPtr Mul() {
    ExprPtr e = Pow();
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      std::string op = Next().text;
      e = Binary(op, std::move(e), Pow());
    }
    return e;
  }
  ExprPtr Pow() {
    ExprPtr e = Unary(true);
    while (IsOp("**")) {
      Next();
      e = Binary("**", std::move(e), Unary(true));
    }
    return e;
  }
  ExprPtr Unary(bool with_filter) {
    ExprPtr e;
    if (IsOp("-") || IsOp("+")) {
      const Token& t = Next();
      e = Node(Expr::Kind::kUnary, t.line);
      e->name = t.text;
      e->args.push_back(Unary(false));
    } else {
      e = Primary();
    }
    e = Postfix(std::move(e));
    if (with_filter) e = FiltersAndTests(std::move(e));
    return e;
  }

  ExprPtr Primary() {
    const Token& t = Peek();
    if (t.type == T::kName) {
      Next();
      if (t.text == "true" || t.text == "True") return Literal(Value::Bool(true), t.line);
      if (t.text == "false" || t.text == "False") return Literal(Value::Bool(false), t.line);
      if (t.text == "none" || t.text == "None") return Literal(Value(), t.line);
      auto e = Node(Expr::Kind::kName, t.line);
      e->name = t.text;
      return e;
    }
    if (t.type == T::kString) {
      std::string s;
      int line = t.line;
      while (Peek().type == T::kString) s += Next().text;  // adjacent literals join
      return Literal(Value::String(s), line);
    }
    if (t.type == T::kInt) {
      Next();
      return Literal(Value::Int(std::strtoll(t.text.c_str(), nullptr, 10)), t.line);
    }
    if (t.type == T::kFloat) {
      Next();
      return Literal(Value::Float(std::strtod(t.text.c_str(), nullptr)), t.line);
    }
    if (IsOp("(")) {
      Next();
      if (IsOp(")")) {
        Next();
        return Node(Expr::Kind::kList, t.line);
      }
      ExprPtr e = Expression();
      if (IsOp(",")) {  // a tuple: behaves as a list here
        auto list = Node(Expr::Kind::kList, t.line);
        list->args.push_back(std::move(e));
        while (IsOp(",")) {
          Next();
          if (IsOp(")")) break;
          list->args.push_back(Expression());
        }
        e = std::move(list);
      }
      ExpectOp(")");
      return e;
    }
    if (IsOp("[")) {
      Next();
      auto list = Node(Expr::Kind::kList, t.line);
      while (!IsOp("]")) {
        list->args.push_back(Expression());
        if (!IsOp(",")) break;
        Next();
      }
      ExpectOp("]");
      return list;
    }
    if (IsOp("{")) {
      Next();
      auto dict = Node(Expr::Kind::kDict, t.line);
      while (!IsOp("}")) {
        ExprPtr key = Expression();
        ExpectOp(":");
        dict->kwargs.emplace_back("", std::move(key));
        dict->args.push_back(Expression());
        if (!IsOp(",")) break;
        Next();
      }
      ExpectOp("}");
      return dict;
    }
    Fail(absl::StrCat("expected an expression, found ", Describe(t)));
  }

  ExprPtr Literal(Value v, int line) {
    auto e = Node(Expr::Kind::kLiteral, line);
    e->value = std::move(v);
    return e;
  }

  ExprPtr Postfix(ExprPtr e) {
    while (true) {
      if (IsOp(".")) {
        Next();
        auto a = Node(Expr::Kind::kAttr, e->line);
        if (Peek().type == T::kInt) {  // foo.0 is foo[0] in Jinja
          a->kind = Expr::Kind::kItem;
          a->args.push_back(std::move(e));
          a->args.push_back(Literal(Value::Int(std::strtoll(Next().text.c_str(), nullptr, 10)),
                                    a->line));
        } else {
          a->name = ExpectName();
          a->args.push_back(std::move(e));
        }
        e = std::move(a);
      } else if (IsOp("[")) {
        Next();
        e = Subscript(std::move(e));
      } else if (IsOp("(")) {
        e = Call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr Subscript(ExprPtr object) {
    ExprPtr parts[3];
    int count = 0;
    bool slice = false;
    while (true) {
      if (!IsOp(":") && !IsOp("]")) parts[count] = Expression();
      if (IsOp(":")) {
        if (count == 2) Fail("a slice takes at most start:stop:step");
        slice = true;
        Next();
        ++count;
        continue;
      }
      break;
    }
    ExpectOp("]");
    auto e = Node(slice ? Expr::Kind::kSlice : Expr::Kind::kItem, object->line);
    e->args.push_back(std::move(object));
    if (!slice) {
      if (!parts[0]) Fail("empty subscript []");
      e->args.push_back(std::move(parts[0]));
    } else {
      for (auto& p : parts) e->args.push_back(std::move(p));
    }
    return e;
  }

  // Arguments of a call, filter or test: (a, b, key=c).
  void Arguments(Expr* e) {
    ExpectOp("(");
    while (!IsOp(")")) {
      if (Peek().type == T::kName && IsOp("=", 1)) {
        std::string key = Next().text;
        Next();
        e->kwargs.emplace_back(key, Expression());
      } else {
        if (!e->kwargs.empty()) Fail("a positional argument after a keyword argument");
        e->args.push_back(Expression());
      }
      if (!IsOp(",")) break;
      Next();
    }
    ExpectOp(")");
  }

  ExprPtr Call(ExprPtr callee) {
    auto e = Node(Expr::Kind::kCall, callee->line);
    if (callee->kind == Expr::Kind::kName) {
      e->name = callee->name;
    } else if (callee->kind == Expr::Kind::kAttr) {
      e->name = callee->name;
      e->method = true;
      e->args.push_back(std::move(callee->args[0]));
    } else {
      Fail("only a named function or a method can be called");
    }
    Arguments(e.get());
    return e;
  }

  ExprPtr FiltersAndTests(ExprPtr e) {
    while (true) {
      if (IsOp("|")) {
        Next();
        auto f = Node(Expr::Kind::kFilter, e->line);
        f->name = ExpectName();
        f->args.push_back(std::move(e));
        if (IsOp("(")) Arguments(f.get());
        e = std::move(f);
      } else if (IsName("is")) {
        Next();
        auto t = Node(Expr::Kind::kTest, e->line);
        if (IsName("not")) {
          Next();
          t->negated = true;
        }
        // `none`, `true`, `false` are names here, not literals.
        t->name = ExpectName();
        t->args.push_back(std::move(e));
        if (IsOp("(")) {
          Arguments(t.get());
        } else if (Peek().type == T::kString || Peek().type == T::kInt ||
                   Peek().type == T::kFloat || IsOp("[") || IsOp("{") ||
                   (Peek().type == T::kName && !IsName("and") && !IsName("or") &&
                    !IsName("if") && !IsName("else") && !IsName("in") && !IsName("is") &&
                    !IsName("not"))) {
          t->args.push_back(Unary(false));  // `is divisibleby 3`, `is sameas x`
        }
        e = std::move(t);
      } else {
        return e;
      }
    }
  }

  const std::vector<Token>& t_;
  size_t i_ = 0;
};

}  // namespace

Body Parse(const std::vector<Token>& tokens) { return Parser(tokens).Template(); }

}  // namespace loom::jinja
