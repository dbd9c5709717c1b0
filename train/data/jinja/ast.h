#ifndef LOOM_TRAIN_DATA_JINJA_AST_H_
#define LOOM_TRAIN_DATA_JINJA_AST_H_

// The parsed template: statements holding expressions. Each node keeps the
// template line it came from, for errors found while rendering.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "train/data/jinja/value.h"

namespace loom::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,    // value
    kName,       // name
    kAttr,       // args[0].name
    kItem,       // args[0][args[1]]
    kSlice,      // args[0][args[1]:args[2]:args[3]] (null args: omitted)
    kCall,       // name(args..., kwargs...) or args[0].name(args[1..]...)
    kFilter,     // args[0] | name(args[1..], kwargs)
    kTest,       // args[0] is [not] name args[1..]  (negated)
    kUnary,      // op args[0]: "not", "-", "+"
    kBinary,     // args[0] op args[1]
    kCondition,  // args[1] if args[0] else args[2] (args[2] may be null)
    kList,       // [args...] (also tuples)
    kDict,       // {keys[i]: args[i]}
  };
  Kind kind;
  int line = 0;
  Value value;
  std::string name;  // name, attribute, filter, test, function or operator
  bool negated = false;
  bool method = false;  // kCall: args[0] is the object the method is called on
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

struct Stmt {
  enum class Kind {
    kText,        // text
    kOutput,      // {{ expr }}
    kIf,          // conditions[i] -> bodies[i]; else_body
    kFor,         // {% for targets in expr [if filter] %} bodies[0] {% else %} else_body
    kSet,         // {% set targets[0][.attribute] = expr %}
    kGeneration,  // {% generation %} bodies[0] {% endgeneration %}
    kBreak,
    kContinue,
  };
  Kind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr filter;
  std::vector<std::string> targets;
  std::string attribute;
  std::vector<ExprPtr> conditions;
  std::vector<Body> bodies;
  Body else_body;
};

}  // namespace loom::jinja

#endif  // LOOM_TRAIN_DATA_JINJA_AST_H_
