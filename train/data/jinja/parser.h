#ifndef LOOM_TRAIN_DATA_JINJA_PARSER_H_
#define LOOM_TRAIN_DATA_JINJA_PARSER_H_

#include <vector>

#include "train/data/jinja/ast.h"
#include "train/data/jinja/lexer.h"

namespace loom::jinja {

// Tokens -> statements, with Jinja's operator precedence (lowest first):
// `x if c else y`, or, and, not, comparisons and `in`, + -, ~, * / // %, **,
// unary - +, then postfix (.attr, [i], [a:b], calls), filters and `is`
// tests. Statements: if/elif/else, for (with `if` filter, else, loop.*,
// break/continue), set (a name, a namespace attribute), generation. Anything
// else (macro, call, include, import, extends, block, filter, with, set
// blocks, ...) throws TemplateError naming the construct and its line.
Body Parse(const std::vector<Token>& tokens);

}  // namespace loom::jinja

#endif  // LOOM_TRAIN_DATA_JINJA_PARSER_H_
