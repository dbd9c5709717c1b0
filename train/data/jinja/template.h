#ifndef LOOM_TRAIN_DATA_JINJA_TEMPLATE_H_
#define LOOM_TRAIN_DATA_JINJA_TEMPLATE_H_

// A Jinja2 subset interpreter for Hugging Face chat templates, rendering as
// transformers does (its environment: trim_blocks, lstrip_blocks, loop
// controls, the {% generation %} tag, the tojson filter and the
// raise_exception / namespace globals). What is supported, beyond text and
// {{ }}: if/elif/else, for (loop.index0/index/first/last/length/revindex/
// revindex0/previtem/nextitem, `for a, b in ...`, `if` filters, else,
// break/continue), set (names, namespace attributes), generation; literals,
// subscripts, slices, attributes, calls of raise_exception/namespace/range/
// dict and of string and dict methods (strip, split, startswith, items,
// get, ...); the operators of Jinja; the filters and tests in builtins.h.
//
// Anything else is refused with an error naming the construct, the file and
// the line; nothing is rendered differently from Jinja. Undefined values:
// a variable that is not defined is an error naming it unless it is only
// tested (`is defined`) or given a `default`; a missing dict key or
// attribute (`message.tool_calls`) is Jinja's undefined, false in a
// condition and an error (naming it) when printed or computed with.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "train/data/jinja/ast.h"
#include "train/data/jinja/value.h"

namespace loom::jinja {

struct Rendered {
  std::string text;
  // Byte ranges [begin, end) of `text` that {% generation %} blocks wrote,
  // in order (what transformers' return_assistant_tokens_mask reads).
  std::vector<std::pair<size_t, size_t>> generation_spans;
};

class Template {
 public:
  // `file` names the template in errors ("chat_template.jinja:12: ...").
  static absl::StatusOr<Template> Parse(const std::string& source, const std::string& file);

  absl::StatusOr<Rendered> Render(const Dict& variables) const;
  const std::string& file() const { return file_; }

 private:
  std::string file_;
  std::shared_ptr<const Body> body_;
};

}  // namespace loom::jinja

#endif  // LOOM_TRAIN_DATA_JINJA_TEMPLATE_H_
