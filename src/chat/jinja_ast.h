// The parsed form of a chat template: a tree of statements and expressions, each node carrying
// the template line it starts on (for error messages). Internal to src/chat.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "chat/jinja.h"
#include "chat/jinja_value.h"

namespace hybridlm::chat {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

enum class ExprKind {
  Literal,    // value
  Name,       // name
  List,       // kids: items (also tuples)
  Dict,       // kids: key, value, key, value, ...
  Attr,       // kids[0].name
  Index,      // kids[0][kids[1]]
  Slice,      // kids[0][kids[1]:kids[2]:kids[3]] (null kids: omitted)
  Call,       // kids[0](kids[1..]); kw_names: names of the trailing keyword args; star: last positional is *x
  Filter,     // kids[0] | name(kids[1..]) with kw_names
  Test,       // kids[0] is [not] name(kids[1..]); negate
  Neg,        // -kids[0]
  Pos,        // +kids[0]
  Not,        // not kids[0]
  Binary,     // kids[0] op kids[1]: + - * / // % ** ~
  Compare,    // kids[0] ops[0] kids[1] ops[1] kids[2] ...: == != < <= > >= in notin
  And,
  Or,
  Cond,       // kids[1] if kids[0] else kids[2] (kids[2] null: undefined)
};

struct Expr {
  ExprKind kind;
  int line = 0;
  Value value;                         // Literal
  std::string name;                    // Name, Attr, Filter, Test; Binary: the operator
  std::vector<ExprPtr> kids;
  std::vector<std::string> kw_names;   // Call, Filter, Test: names of the last kw_names.size() args
  std::vector<std::string> ops;        // Compare
  bool negate = false;                 // Test
  bool star = false;                   // Call: last positional argument is *expr
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class StmtKind {
  Text,      // text
  Output,    // {{ expr }}
  If,        // branches: (cond, body)...; else_body
  For,       // targets in expr [if filter]: body [else else_body]
  Set,       // targets = expr, or ns.attr = expr (attr), or block set (body)
  Macro,     // macro
  Break,
  Continue,
  Generation,  // {% generation %}: renders its body (transformers' assistant-mask marker)
};

struct MacroNode {
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // per param; null: none
  Body body;
  int line = 0;
};

struct Stmt {
  StmtKind kind;
  int line = 0;
  std::string text;                                  // Text
  ExprPtr expr;                                      // Output, For (iterable), Set (value)
  std::vector<std::pair<ExprPtr, Body>> branches;    // If
  Body body;                                         // For, Set (block form), Generation
  Body else_body;                                    // If, For
  std::vector<std::string> targets;                  // For, Set
  std::string attr;                                  // Set: targets[0].attr = expr
  ExprPtr filter;                                    // For: `if` filter
  std::unique_ptr<MacroNode> macro;                  // Macro
};

struct Program {
  Body body;
  Limits limits;
};

// jinja_parse.cc: source to Program; throws Error("chat template line N: ...").
std::shared_ptr<const Program> parse_program(std::string_view source, const Limits& limits);

// jinja_builtins.cc: whether a filter / test of that name exists (checked when parsing).
bool is_known_filter(std::string_view name);
bool is_known_test(std::string_view name);

}  // namespace hybridlm::chat
