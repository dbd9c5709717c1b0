#include "models/gpt/gpt_architecture.h"

#include <cmath>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"

namespace loom::layers {

std::string ArchitectureField::dashed() const {
  return absl::StrCat("--", absl::StrReplaceAll(flag, {{"_", "-"}}));
}

const std::vector<ArchitectureField>& ArchitectureFields() {
#define LOOM_FIELD_ROW(type, member, default_value, flag, sense, applies, defining, help) \
  ArchitectureField{                                                                       \
      #flag,                                                                               \
      help,                                                                                \
      kCompared##applies,                                                                  \
      &applies,                                                                            \
      [](const GptArchitecture& a) { return ToFieldValue<type>(sense(a.member)); },        \
      [](const GptArchitecture& a) { return ToFieldValue<type>(sense(a.defining)); },      \
      [](GptArchitecture& a, const FieldValue& v) {                                        \
        type value{};                                                                      \
        absl::Status s = FromFieldValue<type>(v, #flag, &value);                           \
        if (s.ok()) a.member = sense(value);                                               \
        return s;                                                                          \
      },                                                                                   \
      ChoicesOf<type>()},
  static const auto* fields =
      new std::vector<ArchitectureField>{LOOM_GPT_ARCHITECTURE_FIELDS(LOOM_FIELD_ROW)};
#undef LOOM_FIELD_ROW
  return *fields;
}

const ArchitectureField* FindArchitectureField(absl::string_view flag) {
  absl::ConsumePrefix(&flag, "--");
  const std::string name = absl::StrReplaceAll(flag, {{"-", "_"}});
  for (const ArchitectureField& f : ArchitectureFields()) {
    if (f.flag == name) return &f;
  }
  return nullptr;
}

std::string FieldValueString(const FieldValue& v) {
  struct {
    std::string operator()(int64_t x) const { return absl::StrCat(x); }
    // The shortest decimal that reads back as x, integers in full (1000000,
    // not StrCat's 1e+06, which also keeps only 6 digits: 1.2345678e-06 needs 8).
    std::string operator()(float x) const {
      if (x == std::floor(x) && std::fabs(x) < 1e15f) {
        return absl::StrCat(static_cast<int64_t>(x));
      }
      for (int digits = 6;; ++digits) {
        const std::string s = absl::StrFormat("%.*g", digits, x);
        if (digits >= 9 || std::strtof(s.c_str(), nullptr) == x) return s;
      }
    }
    std::string operator()(bool x) const { return x ? "true" : "false"; }
    std::string operator()(const std::string& x) const { return x; }
  } show;
  return std::visit(show, v);
}

FieldValue ZeroLike(const FieldValue& v) {
  return std::visit([](const auto& x) { return FieldValue(std::decay_t<decltype(x)>{}); }, v);
}

FieldValue DifferentValue(const ArchitectureField& f, const FieldValue& v) {
  if (!f.choices.empty()) {
    const std::string& now = std::get<std::string>(v);
    for (size_t i = 0; i < f.choices.size(); ++i) {
      if (f.choices[i] == now) return f.choices[(i + 1) % f.choices.size()];
    }
    return f.choices.front();
  }
  return std::visit(
      [](const auto& x) -> FieldValue {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, bool>) return !x;
        else if constexpr (std::is_same_v<T, std::string>) return x + "_other";
        else return static_cast<T>(x + 3);
      },
      v);
}

FieldValue ComparedValue(const ArchitectureField& f, const GptArchitecture& a) {
  const FieldValue v = f.defining(a);
  return f.applies(a) ? v : ZeroLike(v);
}

}  // namespace loom::layers
