// The values a chat template computes with: Python's types as Jinja2 sees them (None, bool,
// int, float, str, list, dict) plus Jinja's Undefined, namespace() objects and callables
// (macros and the global functions). Lists and dicts are immutable once built (transformers
// renders in an ImmutableSandboxedEnvironment) and shared; a namespace is the one mutable value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

namespace hybridlm::chat {

class Value;
using Array = std::vector<Value>;
// A dict keeps insertion order (as Python's does); keys are strings.
using Object = std::vector<std::pair<std::string, Value>>;

struct Undefined {
  std::string name;  // what was looked up, for error messages ("message.content")
};
struct NoneType {};
struct Namespace {
  Object attrs;
};
struct MacroNode;  // jinja_ast.h
// A callable: one of the global functions (by name) or a macro.
struct Function {
  std::string name;
  const MacroNode* macro = nullptr;
};

class Value {
 public:
  Value() : v_(Undefined{}) {}
  static Value undefined(std::string name) { return Value(Undefined{std::move(name)}); }
  static Value none() { return Value(NoneType{}); }
  Value(bool b) : v_(b) {}
  Value(int64_t i) : v_(i) {}
  Value(int i) : v_(int64_t{i}) {}
  Value(double d) : v_(d) {}
  Value(std::string s) : v_(std::move(s)) {}
  Value(const char* s) : v_(std::string(s)) {}
  // Lists and dicts nest at most kMaxValueDepth deep (Error otherwise): printing, tojson,
  // comparison and destruction recurse.
  static constexpr int kMaxValueDepth = 512;
  Value(Array a);
  Value(Object o);
  Value(std::shared_ptr<Namespace> ns) : v_(std::move(ns)) {}
  Value(Function f) : v_(std::make_shared<const Function>(std::move(f))) {}

  bool is_undefined() const { return std::holds_alternative<Undefined>(v_); }
  bool is_none() const { return std::holds_alternative<NoneType>(v_); }
  bool is_bool() const { return std::holds_alternative<bool>(v_); }
  bool is_int() const { return std::holds_alternative<int64_t>(v_); }
  bool is_float() const { return std::holds_alternative<double>(v_); }
  // Python's numbers.Number: bool is an int.
  bool is_number() const { return is_bool() || is_int() || is_float(); }
  bool is_string() const { return std::holds_alternative<std::string>(v_); }
  bool is_array() const { return std::holds_alternative<std::shared_ptr<const Array>>(v_); }
  bool is_object() const { return std::holds_alternative<std::shared_ptr<const Object>>(v_); }
  bool is_namespace() const { return std::holds_alternative<std::shared_ptr<Namespace>>(v_); }
  bool is_function() const { return std::holds_alternative<std::shared_ptr<const Function>>(v_); }

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const { return std::get<int64_t>(v_); }
  double as_float() const { return std::get<double>(v_); }
  // A number as double (bool, int or float).
  double as_double() const;
  const std::string& as_string() const { return std::get<std::string>(v_); }
  const Array& as_array() const { return *std::get<std::shared_ptr<const Array>>(v_); }
  const Object& as_object() const { return *std::get<std::shared_ptr<const Object>>(v_); }
  Namespace& as_namespace() const { return *std::get<std::shared_ptr<Namespace>>(v_); }
  const Function& as_function() const { return *std::get<std::shared_ptr<const Function>>(v_); }
  const std::string& undefined_name() const { return std::get<Undefined>(v_).name; }
  // Nesting of lists and dicts: 0 for a scalar, 1 for a list of scalars, ...
  int depth() const { return depth_; }

  // Python truthiness (undefined is false).
  bool truthy() const;
  // Python's type name, for error messages: "str", "int", "list", "dict", "undefined", ...
  const char* type_name() const;
  // Looks up key in a dict (or namespace); nullptr when absent or not a dict.
  const Value* find(const std::string& key) const;

 private:
  explicit Value(Undefined u) : v_(std::move(u)) {}
  explicit Value(NoneType n) : v_(n) {}
  std::variant<Undefined, NoneType, bool, int64_t, double, std::string, std::shared_ptr<const Array>,
               std::shared_ptr<const Object>, std::shared_ptr<Namespace>, std::shared_ptr<const Function>>
      v_;
  int depth_ = 0;
};

// JSON input to values: null is None, objects keep their key order.
Value from_json(const nlohmann::json& j);
Value from_json(const nlohmann::ordered_json& j);

// str(v) as Jinja2 prints it: None, True, 1.5, ['a', 1], {'k': 'v'}; undefined prints nothing.
std::string to_str(const Value& v);
// Python's repr(float): the shortest text that reads back, "1.0", "1e-05", "1e+16", "inf".
std::string float_repr(double d);

struct JsonStyle {
  int indent = -1;  // < 0: one line
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool ensure_ascii = false;
  bool sort_keys = false;
  size_t max_bytes = SIZE_MAX;  // longer output throws Error
};
// json.dumps(v, ensure_ascii, indent, separators, sort_keys) as transformers' tojson calls it.
// Throws Error (no line) for values JSON cannot hold (undefined, callables).
std::string to_json_text(const Value& v, const JsonStyle& style);

// Python ==: numbers by value (True == 1), containers element by element.
bool equals(const Value& a, const Value& b);

// An error message on one line: newlines and other control characters (which a template can put
// into names it quotes) written as \n, \r, \xNN.
std::string one_line(const std::string& msg);

// UTF-8 helpers: strings index, slice and count by code point, as Python's str does.
std::vector<std::string> utf8_chars(const std::string& s);
size_t utf8_length(const std::string& s);

}  // namespace hybridlm::chat
