#ifndef LOOM_TRAIN_DATA_JINJA_LEXER_H_
#define LOOM_TRAIN_DATA_JINJA_LEXER_H_

// Template source -> tokens, with the whitespace rules transformers compiles
// chat templates with: trim_blocks (the newline after a block or comment tag
// goes), lstrip_blocks (spaces and tabs before one on its line go), `-`
// markers ({%- -%} {{- -}} {#- -#}) strip all whitespace on their side, `+`
// markers keep it, and one trailing newline of the source is dropped
// (keep_trailing_newline=False).

#include <string>
#include <vector>

namespace loom::jinja {

struct Token {
  enum class Type {
    kText,        // literal output
    kVarBegin,    // {{
    kVarEnd,      // }}
    kBlockBegin,  // {%
    kBlockEnd,    // %}
    kName,
    kString,  // text: the decoded string
    kInt,
    kFloat,
    kOp,  // text: the operator, e.g. "==", "(", "|"
    kEnd,
  };
  Type type;
  std::string text;
  int line;
};

// Throws TemplateError (with the line) on an unterminated tag or string, a
// character no expression uses, or {% raw %}.
std::vector<Token> Lex(const std::string& source);

}  // namespace loom::jinja

#endif  // LOOM_TRAIN_DATA_JINJA_LEXER_H_
