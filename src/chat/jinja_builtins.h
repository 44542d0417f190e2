// The library a chat template can call: filters (`x | trim`), tests (`x is defined`), str and
// dict methods (`s.strip()`, `d.get(k)`), global functions (raise_exception, strftime_now,
// range, namespace, dict) and attribute / item access. Internal to src/chat; errors are thrown
// as hybridlm::Error without a line (the renderer adds the line of the expression).
#pragma once

#include <cstdint>
#include <ctime>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "chat/jinja_value.h"

namespace hybridlm::chat {

struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};

// What builtins may consume: the size limit on any string or list they build, the loop budget
// (range()), and the clock of strftime_now.
struct BuiltinEnv {
  size_t max_bytes = 0;
  int64_t* loop_budget = nullptr;
  std::optional<std::time_t> now;
};

Value apply_filter(const BuiltinEnv& env, const std::string& name, const Value& v, const CallArgs& args);
bool apply_test(const std::string& name, const Value& v, const CallArgs& args);
// Calls obj.name(args) for a str or dict method; false when obj has no method of that name.
bool call_method(const BuiltinEnv& env, const Value& obj, const std::string& name, const CallArgs& args, Value* out);
bool is_global_function(const std::string& name);
Value call_global(const BuiltinEnv& env, const std::string& name, const CallArgs& args);

// obj.name and obj[key] as Jinja2's getattr / getitem: a missing key is undefined; access on an
// undefined value is an error ("'x' is undefined").
Value get_attr(const Value& obj, const std::string& name, const std::string& path);
Value get_item(const Value& obj, const Value& key, const std::string& path);
Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step, size_t max_bytes);

// Python's a < b (numbers, strings, lists): <0, 0, >0; throws for other types.
int compare_values(const Value& a, const Value& b);
// Python's `item in container` (substring, list element, dict key); undefined contains nothing.
bool contains(const Value& container, const Value& item);

// A readable name for an expression's value in messages ("message.content").
[[noreturn]] void throw_undefined(const Value& v);

}  // namespace hybridlm::chat
