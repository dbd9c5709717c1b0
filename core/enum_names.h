#ifndef LOOM_CORE_ENUM_NAMES_H_
#define LOOM_CORE_ENUM_NAMES_H_

// An enum's spellings, declared once next to the enum with
// LOOM_ENUM_NAMES(E, {E::kA, "a"}, {E::kB, "b"}). From them come
//   - the Abseil flag of that type (AbslParseFlag / AbslUnparseFlag), so a
//     misspelt value is refused while the command line is parsed, naming the
//     flag and the choices (core/cli.h prints it the way users type flags);
//   - the string a checkpoint manifest or a log line records (EnumName), and
//     reading it back with an error that lists the choices (ParseEnum);
//   - the help text's "a | b" (EnumChoices).
// Code past the flag boundary then switches on the enum, never on a string.

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace loom::core {

template <class E>
struct EnumSpelling {
  E value;
  absl::string_view name;
  bool alias = false;  // accepted, never written or listed ({E::kA, "a-old", true})
};

// Found by argument-dependent lookup: LOOM_ENUM_NAMES declares
// `Spellings(E)` in the enum's own namespace.
template <class E>
absl::string_view EnumName(E value) {
  for (const EnumSpelling<E>& s : Spellings(E{})) {
    if (s.value == value && !s.alias) return s.name;
  }
  return "?";  // a value cast from an integer outside the enum
}

// "a | b": the choices, in declaration order, aliases left out (an empty
// spelling, a flag's "unset", shows as "").
template <class E>
std::string EnumChoices() {
  std::string out;
  for (const EnumSpelling<E>& s : Spellings(E{})) {
    if (s.alias) continue;
    absl::StrAppend(&out, out.empty() ? "" : " | ", s.name.empty() ? "\"\"" : s.name);
  }
  return out;
}

// The value spelt `name` (exactly, case included: Megatron's flags are
// case-sensitive), or nullopt.
template <class E>
std::optional<E> FindEnum(absl::string_view name) {
  for (const EnumSpelling<E>& s : Spellings(E{})) {
    if (s.name == name) return s.value;
  }
  return std::nullopt;
}

// FindEnum with an error naming `what` (a flag, or a file's field) and the choices.
template <class E>
absl::StatusOr<E> ParseEnum(absl::string_view name, absl::string_view what) {
  if (std::optional<E> v = FindEnum<E>(name)) return *v;
  return absl::InvalidArgumentError(absl::StrCat(what, " is '", name, "'; expected one of ",
                                                 EnumChoices<E>()));
}

// Abseil's flag parsing hook for E (core/cli.h prefixes the flag and value).
template <class E>
bool ParseEnumFlag(absl::string_view text, E* value, std::string* error) {
  if (std::optional<E> v = FindEnum<E>(text)) {
    *value = *v;
    return true;
  }
  *error = absl::StrCat("expected one of ", EnumChoices<E>());
  return false;
}

}  // namespace loom::core

// In the enum's namespace: LOOM_ENUM_NAMES(Normalization,
//   {Normalization::kLayerNorm, "LayerNorm"}, {Normalization::kRMSNorm, "RMSNorm"})
#define LOOM_ENUM_NAMES(E, ...)                                                          \
  inline absl::Span<const ::loom::core::EnumSpelling<E>> Spellings(E) {                  \
    static constexpr ::loom::core::EnumSpelling<E> kSpellings[] = {__VA_ARGS__};         \
    return kSpellings;                                                                   \
  }                                                                                      \
  inline bool AbslParseFlag(absl::string_view text, E* value, std::string* error) {      \
    return ::loom::core::ParseEnumFlag(text, value, error);                              \
  }                                                                                      \
  inline std::string AbslUnparseFlag(E value) { return std::string(::loom::core::EnumName(value)); }

#endif  // LOOM_CORE_ENUM_NAMES_H_
