#include "train/data/jinja/builtins.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace loom::jinja {
namespace {

void Require(bool ok, const std::string& what) {
  if (!ok) throw TemplateError(what);
}

void NoKwargs(const std::string& where, const Kwargs& kwargs) {
  if (!kwargs.empty()) {
    throw TemplateError(absl::StrCat(where, ": unsupported keyword argument '", kwargs[0].first,
                                     "'"));
  }
}

const std::string& StringArg(const std::string& where, const Value& v) {
  if (v.is_undefined()) throw TemplateError(absl::StrCat("'", v.undefined_name(), "' is undefined"));
  Require(v.is_string(), absl::StrCat(where, ": expected a string, got ", v.TypeName()));
  return v.as_string();
}

bool IsAscii(const std::string& s) {
  for (unsigned char c : s) {
    if (c >= 0x80) return false;
  }
  return true;
}

// Case mapping is ASCII here; Python maps all of Unicode, so other text is
// refused rather than mapped differently.
std::string MapCase(const std::string& where, const std::string& s, int (*f)(int)) {
  Require(IsAscii(s), absl::StrCat(where, " of non-ASCII text is not supported"));
  std::string out = s;
  for (char& c : out) c = static_cast<char>(f(static_cast<unsigned char>(c)));
  return out;
}

std::string Capitalize(const std::string& s) {
  std::string out = MapCase("capitalize", s, ::tolower);
  if (!out.empty()) out[0] = static_cast<char>(::toupper(static_cast<unsigned char>(out[0])));
  return out;
}

std::string Title(const std::string& s) {
  std::string out = MapCase("title", s, ::tolower);
  bool start = true;
  for (char& c : out) {
    bool alpha = std::isalpha(static_cast<unsigned char>(c));
    if (alpha && start) c = static_cast<char>(::toupper(static_cast<unsigned char>(c)));
    start = !alpha;
  }
  return out;
}

bool IsPythonSpace(char32_t c) {
  return c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F) || c == 0x85 ||
         c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// str.strip / lstrip / rstrip: whitespace (Python's, Unicode) or the given characters.
std::string Strip(const std::string& s, const Value* chars, bool left, bool right) {
  std::u32string u = DecodeUtf8(s);
  std::u32string set;
  if (chars != nullptr && !chars->is_none()) set = DecodeUtf8(StringArg("strip", *chars));
  auto strip = [&](char32_t c) {
    return chars == nullptr || chars->is_none() ? IsPythonSpace(c)
                                                : set.find(c) != std::u32string::npos;
  };
  size_t b = 0, e = u.size();
  if (left) {
    while (b < e && strip(u[b])) ++b;
  }
  if (right) {
    while (e > b && strip(u[e - 1])) --e;
  }
  return EncodeUtf8(u.substr(b, e - b));
}

Value Split(const std::string& s, const std::vector<Value>& args) {
  List out;
  int64_t maxsplit = args.size() > 1 ? args[1].as_int() : -1;
  if (args.empty() || args[0].is_none()) {  // runs of whitespace, no empty pieces
    std::u32string u = DecodeUtf8(s);
    size_t i = 0;
    while (true) {
      while (i < u.size() && IsPythonSpace(u[i])) ++i;
      if (i == u.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        std::u32string rest = u.substr(i);
        while (!rest.empty() && IsPythonSpace(rest.back())) rest.pop_back();
        out.push_back(Value::String(EncodeUtf8(rest)));
        break;
      }
      size_t j = i;
      while (j < u.size() && !IsPythonSpace(u[j])) ++j;
      out.push_back(Value::String(EncodeUtf8(u.substr(i, j - i))));
      i = j;
    }
    return Value::MakeList(std::move(out));
  }
  const std::string& sep = StringArg("split", args[0]);
  Require(!sep.empty(), "split: empty separator");
  size_t start = 0;
  while (true) {
    size_t at = s.find(sep, start);
    if (at == std::string::npos || (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit)) {
      out.push_back(Value::String(s.substr(start)));
      break;
    }
    out.push_back(Value::String(s.substr(start, at - start)));
    start = at + sep.size();
  }
  return Value::MakeList(std::move(out));
}

std::string Replace(const std::string& s, const std::string& from, const std::string& to,
                    int64_t count) {
  Require(!from.empty(), "replace: an empty pattern is not supported");
  std::string out;
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t at = s.find(from, start);
    if (at == std::string::npos) break;
    out += s.substr(start, at - start);
    out += to;
    start = at + from.size();
    ++done;
  }
  return out + s.substr(start);
}

// startswith / endswith take a string or a tuple of strings.
bool Affix(const std::string& s, const Value& arg, bool prefix) {
  List options = arg.is_list() ? arg.list() : List{arg};
  for (const Value& o : options) {
    const std::string& a = StringArg(prefix ? "startswith" : "endswith", o);
    if (a.size() <= s.size() &&
        (prefix ? s.compare(0, a.size(), a) == 0 : s.compare(s.size() - a.size(), a.size(), a) == 0)) {
      return true;
    }
  }
  return false;
}

void ArgCount(const std::string& where, const std::vector<Value>& args, size_t lo, size_t hi) {
  if (args.size() < lo || args.size() > hi) {
    throw TemplateError(absl::StrCat(where, ": takes ", lo == hi ? absl::StrCat(lo) : absl::StrCat(lo, "-", hi),
                                     " arguments, got ", args.size()));
  }
}

}  // namespace

List Iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kList:
      return v.list();
    case Value::Kind::kDict:
    case Value::Kind::kNamespace: {
      List keys;
      for (const auto& [k, e] : v.dict()) keys.push_back(Value::String(k));
      return keys;
    }
    case Value::Kind::kString: {
      List chars;
      for (char32_t c : DecodeUtf8(v.as_string())) chars.push_back(Value::String(EncodeUtf8({c})));
      return chars;
    }
    case Value::Kind::kUndefined:
      throw TemplateError(absl::StrCat("'", v.undefined_name(), "' is undefined"));
    default:
      throw TemplateError(absl::StrCat("a ", v.TypeName(), " is not iterable"));
  }
}

int64_t Length(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kList:
      return static_cast<int64_t>(v.list().size());
    case Value::Kind::kDict:
    case Value::Kind::kNamespace:
      return static_cast<int64_t>(v.dict().size());
    case Value::Kind::kString:
      return static_cast<int64_t>(DecodeUtf8(v.as_string()).size());
    case Value::Kind::kUndefined:
      throw TemplateError(absl::StrCat("'", v.undefined_name(), "' is undefined"));
    default:
      throw TemplateError(absl::StrCat("length of a ", v.TypeName()));
  }
}

Value ApplyFilter(const std::string& name, const Value& input, const std::vector<Value>& args,
                  const Kwargs& kwargs) {
  const std::string where = absl::StrCat("filter '", name, "'");
  if (name == "default" || name == "d") {
    NoKwargs(where, kwargs);
    ArgCount(where, args, 0, 2);
    bool boolean = args.size() > 1 && args[1].Truthy();
    bool use_default = input.is_undefined() || (boolean && !input.Truthy());
    if (!use_default) return input;
    return args.empty() ? Value::String("") : args[0];
  }
  if (input.is_undefined()) {
    throw TemplateError(absl::StrCat("'", input.undefined_name(), "' is undefined (", where, ")"));
  }
  if (name == "tojson") {
    int indent = -1;
    for (const auto& [k, v] : kwargs) {
      Require(k == "indent", absl::StrCat(where, ": unsupported keyword argument '", k, "'"));
      if (!v.is_none()) indent = static_cast<int>(v.as_int());
    }
    if (!args.empty() && !args[0].is_none()) indent = static_cast<int>(args[0].as_int());
    return Value::String(ToJson(input, indent));
  }
  NoKwargs(where, kwargs);
  if (name == "trim") {
    ArgCount(where, args, 0, 1);
    return Value::String(Strip(StringArg(where, input), args.empty() ? nullptr : &args[0], true, true));
  }
  if (name == "length" || name == "count") return Value::Int(Length(input));
  if (name == "upper") return Value::String(MapCase(where, StringArg(where, input), ::toupper));
  if (name == "lower") return Value::String(MapCase(where, StringArg(where, input), ::tolower));
  if (name == "capitalize") return Value::String(Capitalize(StringArg(where, input)));
  if (name == "title") return Value::String(Title(StringArg(where, input)));
  if (name == "string") return input.is_string() ? input : Value::String(Str(input));
  if (name == "safe") return input;
  if (name == "int") {
    if (input.kind() == Value::Kind::kInt) return input;
    if (input.kind() == Value::Kind::kFloat) return Value::Int(static_cast<int64_t>(input.as_number()));
    if (input.kind() == Value::Kind::kBool) return Value::Int(input.as_bool() ? 1 : 0);
    throw TemplateError(absl::StrCat(where, " of a ", input.TypeName(), " is not supported"));
  }
  if (name == "float") {
    Require(input.is_number(), absl::StrCat(where, " of a ", input.TypeName(), " is not supported"));
    return Value::Float(input.as_number());
  }
  if (name == "abs") {
    Require(input.is_number(), absl::StrCat(where, ": expected a number"));
    return input.kind() == Value::Kind::kInt ? Value::Int(std::llabs(input.as_int()))
                                             : Value::Float(std::fabs(input.as_number()));
  }
  if (name == "first" || name == "last") {
    List items = Iterate(input);
    if (items.empty()) return Value::Undefined(absl::StrCat(name, " of an empty sequence"));
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") return Value::MakeList(Iterate(input));
  if (name == "reverse") {
    if (input.is_string()) {
      std::u32string u = DecodeUtf8(input.as_string());
      return Value::String(EncodeUtf8(std::u32string(u.rbegin(), u.rend())));
    }
    List items = Iterate(input);
    return Value::MakeList(List(items.rbegin(), items.rend()));
  }
  if (name == "join") {
    ArgCount(where, args, 0, 1);
    std::string sep = args.empty() ? "" : StringArg(where, args[0]);
    std::vector<std::string> parts;
    for (const Value& v : Iterate(input)) parts.push_back(Str(v));
    return Value::String(absl::StrJoin(parts, sep));
  }
  if (name == "replace") {
    ArgCount(where, args, 2, 3);
    return Value::String(Replace(StringArg(where, input), StringArg(where, args[0]),
                                 StringArg(where, args[1]), args.size() > 2 ? args[2].as_int() : -1));
  }
  if (name == "items") {
    Require(input.is_mapping(), absl::StrCat(where, ": expected a dict"));
    return CallMethod(input, "items", {}, {});
  }
  throw TemplateError(absl::StrCat("unsupported filter '", name, "'"));
}

bool ApplyTest(const std::string& name, const Value& input, const std::vector<Value>& args) {
  const std::string where = absl::StrCat("test '", name, "'");
  if (name == "defined") return !input.is_undefined();
  if (name == "undefined") return input.is_undefined();
  if (name == "none") return input.is_none();
  if (name == "string") return input.is_string();
  if (name == "number") return input.is_number() || input.kind() == Value::Kind::kBool;
  if (name == "integer") return input.kind() == Value::Kind::kInt;
  if (name == "float") return input.kind() == Value::Kind::kFloat;
  if (name == "boolean") return input.kind() == Value::Kind::kBool;
  if (name == "true") return input.kind() == Value::Kind::kBool && input.as_bool();
  if (name == "false") return input.kind() == Value::Kind::kBool && !input.as_bool();
  if (name == "mapping") return input.kind() == Value::Kind::kDict;
  if (name == "sequence" || name == "iterable") {
    return input.is_list() || input.is_string() || input.kind() == Value::Kind::kDict;
  }
  if (input.is_undefined()) {
    throw TemplateError(absl::StrCat("'", input.undefined_name(), "' is undefined (", where, ")"));
  }
  if (name == "odd" || name == "even" || name == "divisibleby") {
    Require(input.kind() == Value::Kind::kInt, absl::StrCat(where, ": expected an integer"));
    int64_t by = name == "divisibleby" ? (ArgCount(where, args, 1, 1), args[0].as_int()) : 2;
    Require(by != 0, absl::StrCat(where, ": division by zero"));
    bool divisible = input.as_int() % by == 0;
    return name == "odd" ? !divisible : divisible;
  }
  if (name == "eq" || name == "equalto" || name == "==" || name == "ne" || name == "!=") {
    ArgCount(where, args, 1, 1);
    bool eq = Equal(input, args[0]);
    return name == "ne" || name == "!=" ? !eq : eq;
  }
  if (name == "in") {
    ArgCount(where, args, 1, 1);
    for (const Value& v : Iterate(args[0])) {
      if (Equal(v, input)) return true;
    }
    return false;
  }
  throw TemplateError(absl::StrCat("unsupported test '", name, "'"));
}

Value CallMethod(const Value& object, const std::string& name, const std::vector<Value>& args,
                 const Kwargs& kwargs) {
  if (object.is_undefined()) {
    throw TemplateError(absl::StrCat("'", object.undefined_name(), "' is undefined (calling .",
                                     name, "())"));
  }
  const std::string where = absl::StrCat(object.TypeName(), ".", name, "()");
  NoKwargs(where, kwargs);
  if (object.is_string()) {
    const std::string& s = object.as_string();
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      ArgCount(where, args, 0, 1);
      return Value::String(Strip(s, args.empty() ? nullptr : &args[0], name != "rstrip",
                                 name != "lstrip"));
    }
    if (name == "split") {
      ArgCount(where, args, 0, 2);
      return Split(s, args);
    }
    if (name == "startswith" || name == "endswith") {
      ArgCount(where, args, 1, 1);
      return Value::Bool(Affix(s, args[0], name == "startswith"));
    }
    if (name == "upper") return Value::String(MapCase(where, s, ::toupper));
    if (name == "lower") return Value::String(MapCase(where, s, ::tolower));
    if (name == "title") return Value::String(Title(s));
    if (name == "capitalize") return Value::String(Capitalize(s));
    if (name == "replace") {
      ArgCount(where, args, 2, 3);
      return Value::String(Replace(s, StringArg(where, args[0]), StringArg(where, args[1]),
                                   args.size() > 2 ? args[2].as_int() : -1));
    }
  } else if (object.kind() == Value::Kind::kDict) {
    if (name == "items") {
      List items;
      for (const auto& [k, v] : object.dict()) items.push_back(Value::MakeList({Value::String(k), v}));
      return Value::MakeList(std::move(items));
    }
    if (name == "keys") return Value::MakeList(Iterate(object));
    if (name == "values") {
      List values;
      for (const auto& [k, v] : object.dict()) values.push_back(v);
      return Value::MakeList(std::move(values));
    }
    if (name == "get") {
      ArgCount(where, args, 1, 2);
      const Value* v = object.Find(StringArg(where, args[0]));
      return v != nullptr ? *v : args.size() > 1 ? args[1] : Value();
    }
  }
  throw TemplateError(absl::StrCat("unsupported method ", where));
}

Value CallGlobal(const std::string& name, const std::vector<Value>& args, const Kwargs& kwargs) {
  if (name == "raise_exception") {
    ArgCount(name, args, 1, 1);
    throw TemplateError(absl::StrCat("the template raised an exception: ", Str(args[0])));
  }
  if (name == "namespace" || name == "dict") {
    ArgCount(name, args, 0, 1);
    Dict items;
    if (!args.empty()) {
      Require(args[0].kind() == Value::Kind::kDict, absl::StrCat(name, "(): expected a dict"));
      items = args[0].dict();
    }
    for (const auto& [k, v] : kwargs) {
      bool replaced = false;
      for (auto& [key, value] : items) {
        if (key == k) {
          value = v;
          replaced = true;
        }
      }
      if (!replaced) items.emplace_back(k, v);
    }
    return name == "namespace" ? Value::MakeNamespace(std::move(items))
                               : Value::MakeDict(std::move(items));
  }
  if (name == "range") {
    NoKwargs(name, kwargs);
    ArgCount(name, args, 1, 3);
    for (const Value& a : args) Require(a.kind() == Value::Kind::kInt, "range(): expected integers");
    int64_t start = args.size() > 1 ? args[0].as_int() : 0;
    int64_t stop = args.size() > 1 ? args[1].as_int() : args[0].as_int();
    int64_t step = args.size() > 2 ? args[2].as_int() : 1;
    Require(step != 0, "range(): step must not be zero");
    List out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(Value::Int(i));
    return Value::MakeList(std::move(out));
  }
  if (name == "strftime_now") {
    throw TemplateError("strftime_now() is not supported: the rendered text would depend on the clock");
  }
  throw TemplateError(absl::StrCat("unsupported function '", name, "'"));
}

}  // namespace loom::jinja
