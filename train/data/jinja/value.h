#ifndef LOOM_TRAIN_DATA_JINJA_VALUE_H_
#define LOOM_TRAIN_DATA_JINJA_VALUE_H_

// The values a chat template computes with, with Python's semantics where a
// template can see them (Jinja runs on Python objects): str() of None is
// "None", dicts keep insertion order, lengths and slices of strings count
// code points.

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "nlohmann/json.hpp"

namespace loom::jinja {

// Raised anywhere inside the interpreter and turned into an absl::Status at
// its boundary (Template::Parse / Render): errors unwind a deep recursion.
// `line` is the template line (0: not known here; the caller adds it).
class TemplateError : public std::runtime_error {
 public:
  explicit TemplateError(const std::string& what, int line = 0)
      : std::runtime_error(what), line(line) {}
  int line;
};

class Value;
using List = std::vector<Value>;
// Keys are strings (what JSON and namespace() give); insertion order kept.
using Dict = std::vector<std::pair<std::string, Value>>;

class Value {
 public:
  // kNamespace: namespace(...)'s object, the one value `set x.y = ...` may change.
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kNamespace };

  Value() : kind_(Kind::kNone) {}
  static Value Undefined(std::string name);
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double f);
  static Value String(std::string s);
  static Value MakeList(List items);
  static Value MakeDict(Dict items);
  static Value MakeNamespace(Dict items);
  // JSON (objects keep their order with nlohmann::ordered_json).
  static Value FromJson(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_mapping() const { return kind_ == Kind::kDict || kind_ == Kind::kNamespace; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return i_; }
  double as_number() const { return kind_ == Kind::kInt ? static_cast<double>(i_) : f_; }
  const std::string& as_string() const { return s_; }
  // For an undefined value: the expression that named it ("message.tool_calls").
  const std::string& undefined_name() const { return s_; }
  const List& list() const { return *list_; }
  const Dict& dict() const { return *dict_; }
  Dict& mutable_dict() const { return *dict_; }

  // Member of a mapping; nullptr when absent.
  const Value* Find(const std::string& key) const;
  // Python's truth value; undefined is false (Jinja's default Undefined).
  bool Truthy() const;
  // The type name errors use ("string", "list", "undefined", ...).
  std::string TypeName() const;

 private:
  Kind kind_;
  bool b_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::string s_;
  std::shared_ptr<List> list_;
  std::shared_ptr<Dict> dict_;
};

// Python's str(): None -> "None", True -> "True", 1.5 -> "1.5". Lists and
// dicts are refused (their repr is not something a template should print).
std::string Str(const Value& v);
// Python's ==, with 1 == 1.0.
bool Equal(const Value& a, const Value& b);
// json.dumps(v, ensure_ascii=False, indent=indent) as transformers' tojson
// filter calls it (indent < 0: None, one line with ", " and ": ").
std::string ToJson(const Value& v, int indent);
// UTF-8 <-> code points, for lengths and slices as Python counts them.
std::u32string DecodeUtf8(const std::string& s);
std::string EncodeUtf8(const std::u32string& s);

}  // namespace loom::jinja

#endif  // LOOM_TRAIN_DATA_JINJA_VALUE_H_
