#ifndef LOOM_TRAIN_DATA_JINJA_BUILTINS_H_
#define LOOM_TRAIN_DATA_JINJA_BUILTINS_H_

// Jinja's filters and tests, Python's string and dict methods, and the
// globals transformers gives chat templates. Each throws TemplateError
// naming itself when it does not know the name or gets arguments it does
// not support.

#include <string>
#include <utility>
#include <vector>

#include "train/data/jinja/value.h"

namespace loom::jinja {

using Kwargs = std::vector<std::pair<std::string, Value>>;

// trim, tojson (indent), length/count, upper, lower, capitalize, title,
// string, int, float, abs, first, last, join, default/d, list, safe,
// replace, items, reverse.
Value ApplyFilter(const std::string& name, const Value& input, const std::vector<Value>& args,
                  const Kwargs& kwargs);
// defined, undefined, none, string, number, integer, float, boolean, true,
// false, mapping, sequence, iterable, odd, even, divisibleby, eq/equalto/==,
// ne/!=, in.
bool ApplyTest(const std::string& name, const Value& input, const std::vector<Value>& args);
// Strings: strip, lstrip, rstrip, split, startswith, endswith, upper, lower,
// title, capitalize, replace. Dicts: items, keys, values, get.
Value CallMethod(const Value& object, const std::string& name, const std::vector<Value>& args,
                 const Kwargs& kwargs);
// raise_exception, namespace, range, dict.
Value CallGlobal(const std::string& name, const std::vector<Value>& args, const Kwargs& kwargs);

// Python's iteration: a list's items, a dict's keys, a string's characters.
List Iterate(const Value& v);
// Python's len().
int64_t Length(const Value& v);

}  // namespace loom::jinja

#endif  // LOOM_TRAIN_DATA_JINJA_BUILTINS_H_
