#include "train/data/jinja/template.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "train/data/jinja/builtins.h"
#include "train/data/jinja/lexer.h"
#include "train/data/jinja/parser.h"

namespace loom::jinja {
namespace {

// The expression as the template wrote it, roughly, for naming undefined
// values ("message.tool_calls", "messages[0]['role']").
std::string Describe(const Expr& e) {
  switch (e.kind) {
    case Expr::Kind::kName:
      return e.name;
    case Expr::Kind::kAttr:
      return absl::StrCat(Describe(*e.args[0]), ".", e.name);
    case Expr::Kind::kItem: {
      const Expr& index = *e.args[1];
      std::string i = index.kind != Expr::Kind::kLiteral ? Describe(index)
                      : index.value.is_string()          ? absl::StrCat("'", index.value.as_string(), "'")
                                                         : Str(index.value);
      return absl::StrCat(Describe(*e.args[0]), "[", i, "]");
    }
    case Expr::Kind::kLiteral:
      return e.value.is_string() ? absl::StrCat("'", e.value.as_string(), "'") : "literal";
    default:
      return "expression";
  }
}

[[noreturn]] void Undefined(const Value& v, const std::string& what) {
  throw TemplateError(absl::StrCat("'", v.undefined_name(), "' is undefined (", what, ")"));
}

// Python's slice index rules (PySlice_AdjustIndices) over n items.
std::vector<int64_t> SliceIndices(int64_t n, const Value* start, const Value* stop,
                                  const Value* step) {
  auto as_int = [](const Value* v, const char* what) -> const Value* {
    if (v == nullptr || v->is_none()) return nullptr;
    if (v->kind() != Value::Kind::kInt) throw TemplateError(absl::StrCat("slice ", what, ": expected an integer"));
    return v;
  };
  start = as_int(start, "start");
  stop = as_int(stop, "stop");
  step = as_int(step, "step");
  int64_t s = step ? step->as_int() : 1;
  if (s == 0) throw TemplateError("slice step cannot be zero");
  auto adjust = [&](const Value* v, int64_t dflt) {
    if (v == nullptr) return dflt;
    int64_t i = v->as_int();
    if (i < 0) {
      i += n;
      if (i < 0) i = s < 0 ? -1 : 0;
    } else if (i >= n) {
      i = s < 0 ? n - 1 : n;
    }
    return i;
  };
  int64_t b = adjust(start, s < 0 ? n - 1 : 0);
  int64_t e = adjust(stop, s < 0 ? -1 : n);
  std::vector<int64_t> out;
  for (int64_t i = b; s > 0 ? i < e : i > e; i += s) out.push_back(i);
  return out;
}

int Compare(const Value& a, const Value& b, const std::string& op) {
  if (a.is_number() && b.is_number()) {
    double x = a.as_number(), y = b.as_number();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) return a.as_string().compare(b.as_string());
  throw TemplateError(absl::StrCat("'", op, "' between a ", a.TypeName(), " and a ", b.TypeName()));
}

Value Arithmetic(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") return Value::String(Str(a) + Str(b));
  if (a.is_undefined()) Undefined(a, absl::StrCat("operator ", op));
  if (b.is_undefined()) Undefined(b, absl::StrCat("operator ", op));
  if (op == "+") {
    if (a.is_string() && b.is_string()) return Value::String(a.as_string() + b.as_string());
    if (a.is_list() && b.is_list()) {
      List items = a.list();
      items.insert(items.end(), b.list().begin(), b.list().end());
      return Value::MakeList(std::move(items));
    }
  }
  if (op == "*" && a.is_string() && b.kind() == Value::Kind::kInt) {
    std::string out;
    for (int64_t i = 0; i < b.as_int(); ++i) out += a.as_string();
    return Value::String(out);
  }
  if (!a.is_number() || !b.is_number()) {
    throw TemplateError(absl::StrCat("operator '", op, "' between a ", a.TypeName(), " and a ",
                                     b.TypeName(), " is not supported"));
  }
  const bool ints = a.kind() == Value::Kind::kInt && b.kind() == Value::Kind::kInt;
  const double x = a.as_number(), y = b.as_number();
  if (op == "/") {
    if (y == 0) throw TemplateError("division by zero");
    return Value::Float(x / y);
  }
  if (ints) {
    int64_t i = a.as_int(), j = b.as_int();
    if (op == "+") return Value::Int(i + j);
    if (op == "-") return Value::Int(i - j);
    if (op == "*") return Value::Int(i * j);
    if (op == "//" || op == "%") {
      if (j == 0) throw TemplateError("division by zero");
      int64_t q = i / j, r = i % j;
      if (r != 0 && ((r < 0) != (j < 0))) {  // Python floors
        --q;
        r += j;
      }
      return Value::Int(op == "//" ? q : r);
    }
    if (op == "**" && j >= 0) {
      int64_t p = 1;
      for (int64_t k = 0; k < j; ++k) p *= i;
      return Value::Int(p);
    }
  }
  if (op == "+") return Value::Float(x + y);
  if (op == "-") return Value::Float(x - y);
  if (op == "*") return Value::Float(x * y);
  if (op == "**") return Value::Float(std::pow(x, y));
  if (y == 0) throw TemplateError("division by zero");
  if (op == "//") return Value::Float(std::floor(x / y));
  if (op == "%") return Value::Float(x - y * std::floor(x / y));
  throw TemplateError(absl::StrCat("unsupported operator '", op, "'"));
}

class Renderer {
 public:
  Renderer(const Dict& variables, Rendered* out) : globals_(variables), out_(out) {}

  enum class Flow { kNormal, kBreak, kContinue };

  Flow Run(const Body& body) {
    for (const auto& s : body) {
      Flow f = WithLine(s->line, [&] { return Exec(*s); });
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

 private:
  template <typename F>
  static auto WithLine(int line, F f) -> decltype(f()) {
    try {
      return f();
    } catch (TemplateError& e) {
      if (e.line == 0) e.line = line;
      throw;
    }
  }

  Flow Exec(const Stmt& s) {
    switch (s.kind) {
      case Stmt::Kind::kText:
        out_->text += s.text;
        return Flow::kNormal;
      case Stmt::Kind::kOutput: {
        Value v = Eval(*s.expr);
        if (v.is_undefined()) Undefined(v, "printed");
        out_->text += Str(v);
        return Flow::kNormal;
      }
      case Stmt::Kind::kIf:
        for (size_t i = 0; i < s.conditions.size(); ++i) {
          if (Truth(*s.conditions[i])) return Run(s.bodies[i]);
        }
        return Run(s.else_body);
      case Stmt::Kind::kFor:
        return For(s);
      case Stmt::Kind::kSet:
        Set(s);
        return Flow::kNormal;
      case Stmt::Kind::kGeneration: {
        size_t begin = out_->text.size();
        Flow f = Run(s.bodies[0]);
        out_->generation_spans.emplace_back(begin, out_->text.size());
        return f;
      }
      case Stmt::Kind::kBreak:
        if (loop_depth_ == 0) throw TemplateError("{% break %} outside a loop");
        return Flow::kBreak;
      case Stmt::Kind::kContinue:
        if (loop_depth_ == 0) throw TemplateError("{% continue %} outside a loop");
        return Flow::kContinue;
    }
    return Flow::kNormal;
  }

  Flow For(const Stmt& s) {
    Value iterable = Eval(*s.expr);
    if (iterable.is_undefined()) Undefined(iterable, "iterated by {% for %}");
    List all = Iterate(iterable);
    scopes_.emplace_back();
    List items;
    for (const Value& item : all) {  // the `if` filter sees the loop variables
      Bind(s, item);
      if (!s.filter || Truth(*s.filter)) items.push_back(item);
    }
    const int64_t n = static_cast<int64_t>(items.size());
    ++loop_depth_;
    for (int64_t i = 0; i < n; ++i) {
      scopes_.back().clear();  // each iteration starts from the loop's own scope
      Bind(s, items[i]);
      Dict loop = {{"index0", Value::Int(i)},
                   {"index", Value::Int(i + 1)},
                   {"revindex0", Value::Int(n - 1 - i)},
                   {"revindex", Value::Int(n - i)},
                   {"first", Value::Bool(i == 0)},
                   {"last", Value::Bool(i == n - 1)},
                   {"length", Value::Int(n)},
                   {"previtem", i > 0 ? items[i - 1] : Value::Undefined("loop.previtem")},
                   {"nextitem", i + 1 < n ? items[i + 1] : Value::Undefined("loop.nextitem")}};
      scopes_.back().emplace_back("loop", Value::MakeDict(std::move(loop)));
      if (Run(s.bodies[0]) == Flow::kBreak) break;
    }
    --loop_depth_;
    scopes_.pop_back();
    if (n == 0) return Run(s.else_body);
    return Flow::kNormal;
  }

  void Bind(const Stmt& s, const Value& item) {
    if (s.targets.size() == 1) {
      Assign(s.targets[0], item);
      return;
    }
    List parts = Iterate(item);
    if (parts.size() != s.targets.size()) {
      throw TemplateError(absl::StrCat("{% for %} unpacks ", s.targets.size(), " names from ",
                                       parts.size(), " values"));
    }
    for (size_t i = 0; i < parts.size(); ++i) Assign(s.targets[i], parts[i]);
  }

  void Assign(const std::string& name, Value v) {
    auto& scope = scopes_.empty() ? top_ : scopes_.back();
    for (auto& [k, old] : scope) {
      if (k == name) {
        old = std::move(v);
        return;
      }
    }
    scope.emplace_back(name, std::move(v));
  }

  void Set(const Stmt& s) {
    Value v = Eval(*s.expr);
    if (s.attribute.empty()) {
      Assign(s.targets[0], std::move(v));
      return;
    }
    const Value* ns = Lookup(s.targets[0]);
    if (ns == nullptr) throw TemplateError(absl::StrCat("undefined variable '", s.targets[0], "'"));
    if (ns->kind() != Value::Kind::kNamespace) {
      throw TemplateError(absl::StrCat("{% set ", s.targets[0], ".", s.attribute,
                                       " %}: only a namespace() takes attribute assignment, '",
                                       s.targets[0], "' is a ", ns->TypeName()));
    }
    Dict& d = ns->mutable_dict();
    for (auto& [k, old] : d) {
      if (k == s.attribute) {
        old = std::move(v);
        return;
      }
    }
    d.emplace_back(s.attribute, std::move(v));
  }

  const Value* Lookup(const std::string& name) const {
    for (auto scope = scopes_.rbegin(); scope != scopes_.rend(); ++scope) {
      for (const auto& [k, v] : *scope) {
        if (k == name) return &v;
      }
    }
    for (const auto* scope : {&top_, &globals_}) {
      for (const auto& [k, v] : *scope) {
        if (k == name) return &v;
      }
    }
    return nullptr;
  }

  bool Truth(const Expr& e) { return Eval(e).Truthy(); }

  // Evaluates `e`; a name that is not defined is an error unless `lenient`
  // (the operand of `is defined` or `| default`), where it is undefined.
  Value Eval(const Expr& e, bool lenient = false) {
    return WithLine(e.line, [&] { return EvalAt(e, lenient); });
  }

  std::vector<Value> EvalArgs(const Expr& e, size_t from) {
    std::vector<Value> args;
    for (size_t i = from; i < e.args.size(); ++i) args.push_back(Eval(*e.args[i]));
    return args;
  }
  Kwargs EvalKwargs(const Expr& e) {
    Kwargs kwargs;
    for (const auto& [k, v] : e.kwargs) kwargs.emplace_back(k, Eval(*v));
    return kwargs;
  }

  Value EvalAt(const Expr& e, bool lenient) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.value;
      case Expr::Kind::kName: {
        const Value* v = Lookup(e.name);
        if (v != nullptr) return *v;
        if (lenient) return Value::Undefined(e.name);
        throw TemplateError(absl::StrCat("undefined variable '", e.name, "'"));
      }
      case Expr::Kind::kAttr:
      case Expr::Kind::kItem:
        return Member(e, lenient);
      case Expr::Kind::kSlice:
        return Slice(e);
      case Expr::Kind::kCall: {
        if (!e.method) return CallGlobal(e.name, EvalArgs(e, 0), EvalKwargs(e));
        Value object = Eval(*e.args[0]);
        return CallMethod(object, e.name, EvalArgs(e, 1), EvalKwargs(e));
      }
      case Expr::Kind::kFilter: {
        bool is_default = e.name == "default" || e.name == "d";
        Value input = Eval(*e.args[0], is_default);
        return ApplyFilter(e.name, input, EvalArgs(e, 1), EvalKwargs(e));
      }
      case Expr::Kind::kTest: {
        bool is_defined = e.name == "defined" || e.name == "undefined";
        Value input = Eval(*e.args[0], is_defined);
        if (!e.kwargs.empty()) throw TemplateError("a test takes no keyword arguments");
        bool r = ApplyTest(e.name, input, EvalArgs(e, 1));
        return Value::Bool(e.negated ? !r : r);
      }
      case Expr::Kind::kUnary: {
        Value v = Eval(*e.args[0]);
        if (e.name == "not") return Value::Bool(!v.Truthy());
        if (v.is_undefined()) Undefined(v, absl::StrCat("unary ", e.name));
        if (!v.is_number()) throw TemplateError(absl::StrCat("unary '", e.name, "' of a ", v.TypeName()));
        if (e.name == "+") return v;
        return v.kind() == Value::Kind::kInt ? Value::Int(-v.as_int()) : Value::Float(-v.as_number());
      }
      case Expr::Kind::kBinary:
        return BinaryOp(e);
      case Expr::Kind::kCondition:
        if (Truth(*e.args[0])) return Eval(*e.args[1]);
        // Jinja: `x if c` without else is undefined when c is false.
        return e.args[2] ? Eval(*e.args[2]) : Value::Undefined("an if-expression without else");
      case Expr::Kind::kList: {
        List items;
        for (const auto& a : e.args) items.push_back(Eval(*a));
        return Value::MakeList(std::move(items));
      }
      case Expr::Kind::kDict: {
        Dict items;
        for (size_t i = 0; i < e.args.size(); ++i) {
          Value key = Eval(*e.kwargs[i].second);
          if (!key.is_string()) throw TemplateError("dict literal keys must be strings here");
          items.emplace_back(key.as_string(), Eval(*e.args[i]));
        }
        return Value::MakeDict(std::move(items));
      }
    }
    throw TemplateError("unknown expression");
  }

  // obj.name and obj[index]: a missing key or an index out of range is
  // Jinja's undefined, named after the expression.
  Value Member(const Expr& e, bool lenient) {
    Value object = Eval(*e.args[0], lenient);
    if (object.is_undefined()) {
      if (lenient) return Value::Undefined(Describe(e));
      Undefined(object, absl::StrCat("reading ", Describe(e)));
    }
    Value key = e.kind == Expr::Kind::kAttr ? Value::String(e.name) : Eval(*e.args[1]);
    if (object.is_mapping() && key.is_string()) {
      const Value* v = object.Find(key.as_string());
      return v != nullptr ? *v : Value::Undefined(Describe(e));
    }
    if ((object.is_list() || object.is_string()) && key.kind() == Value::Kind::kInt) {
      List items = object.is_list() ? object.list() : Iterate(object);
      int64_t i = key.as_int();
      int64_t n = static_cast<int64_t>(items.size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::Undefined(Describe(e));
      return items[i];
    }
    if (e.kind == Expr::Kind::kAttr) return Value::Undefined(Describe(e));
    throw TemplateError(absl::StrCat("cannot subscript a ", object.TypeName(), " with a ",
                                     key.TypeName(), " (", Describe(e), ")"));
  }

  Value Slice(const Expr& e) {
    Value object = Eval(*e.args[0]);
    if (object.is_undefined()) Undefined(object, "sliced");
    Value parts[3];
    const Value* p[3] = {nullptr, nullptr, nullptr};
    for (int i = 0; i < 3; ++i) {
      if (e.args[i + 1]) {
        parts[i] = Eval(*e.args[i + 1]);
        p[i] = &parts[i];
      }
    }
    if (object.is_list()) {
      List out;
      for (int64_t i : SliceIndices(object.list().size(), p[0], p[1], p[2])) out.push_back(object.list()[i]);
      return Value::MakeList(std::move(out));
    }
    if (object.is_string()) {
      std::u32string u = DecodeUtf8(object.as_string()), out;
      for (int64_t i : SliceIndices(u.size(), p[0], p[1], p[2])) out.push_back(u[i]);
      return Value::String(EncodeUtf8(out));
    }
    throw TemplateError(absl::StrCat("cannot slice a ", object.TypeName()));
  }

  Value BinaryOp(const Expr& e) {
    const std::string& op = e.name;
    if (op == "and" || op == "or") {  // Python: the deciding operand itself
      Value a = Eval(*e.args[0]);
      if ((op == "and") != a.Truthy()) return a;
      return Eval(*e.args[1]);
    }
    Value a = Eval(*e.args[0]);
    Value b = Eval(*e.args[1]);
    if (op == "==" || op == "!=") {
      // Jinja's undefined equals only another undefined.
      bool eq = (a.is_undefined() || b.is_undefined()) ? a.is_undefined() && b.is_undefined()
                                                       : Equal(a, b);
      return Value::Bool(op == "==" ? eq : !eq);
    }
    if (op == "in" || op == "not in") {
      if (a.is_undefined()) Undefined(a, op);
      if (b.is_undefined()) Undefined(b, op);
      bool found = false;
      if (b.is_string()) {
        if (!a.is_string()) throw TemplateError(absl::StrCat("'", op, "' a string needs a string"));
        found = b.as_string().find(a.as_string()) != std::string::npos;
      } else if (b.is_mapping()) {
        found = a.is_string() && b.Find(a.as_string()) != nullptr;
      } else {
        for (const Value& v : Iterate(b)) found = found || Equal(v, a);
      }
      return Value::Bool(op == "in" ? found : !found);
    }
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      if (a.is_undefined()) Undefined(a, op);
      if (b.is_undefined()) Undefined(b, op);
      int c = Compare(a, b, op);
      return Value::Bool(op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0);
    }
    return Arithmetic(op, a, b);
  }

  const Dict& globals_;
  Dict top_;  // {% set %} outside any loop
  std::vector<Dict> scopes_;
  int loop_depth_ = 0;
  Rendered* out_;
};

std::string Located(const std::string& file, int line, const std::string& what) {
  return line > 0 ? absl::StrCat(file, ":", line, ": ", what) : absl::StrCat(file, ": ", what);
}

}  // namespace

absl::StatusOr<Template> Template::Parse(const std::string& source, const std::string& file) {
  Template t;
  t.file_ = file;
  try {
    t.body_ = std::make_shared<const Body>(jinja::Parse(Lex(source)));
  } catch (const TemplateError& e) {
    return absl::InvalidArgumentError(Located(file, e.line, e.what()));
  }
  return t;
}

absl::StatusOr<Rendered> Template::Render(const Dict& variables) const {
  Rendered out;
  try {
    Renderer(variables, &out).Run(*body_);
  } catch (const TemplateError& e) {
    return absl::InvalidArgumentError(Located(file_, e.line, e.what()));
  }
  return out;
}

}  // namespace loom::jinja
