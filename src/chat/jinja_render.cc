// The renderer: walks the tree of jinja_ast.h with Jinja2's scoping (a for loop's body and a
// macro call get their own scope; `if` does not; namespace() objects carry values out of loops),
// Python operator semantics, and the limits of Limits.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "base/error.h"
#include "chat/jinja.h"
#include "chat/jinja_ast.h"
#include "chat/jinja_builtins.h"

namespace hybridlm::chat {
namespace {

// An error already carrying its template line (raised by Renderer::fail).
class LocatedError : public Error {
 public:
  using Error::Error;
};

enum class Flow { Normal, Break, Continue };

// A namespace may not hold a namespace: that is how a cycle (ns.self = ns) would form.
bool holds_namespace(const Value& v) {
  if (v.is_namespace()) return true;
  if (v.is_array()) {
    for (const Value& x : v.as_array())
      if (holds_namespace(x)) return true;
  } else if (v.is_object()) {
    for (const auto& kv : v.as_object())
      if (holds_namespace(kv.second)) return true;
  }
  return false;
}

// A readable path for an expression (for "'message.content' is undefined").
std::string path_of(const Expr& e) {
  switch (e.kind) {
    case ExprKind::Name: return e.name;
    case ExprKind::Attr: return path_of(*e.kids[0]) + "." + e.name;
    case ExprKind::Index:
      if (e.kids[1]->kind == ExprKind::Literal) {
        const Value& k = e.kids[1]->value;
        return path_of(*e.kids[0]) + "[" + (k.is_string() ? "'" + k.as_string() + "'" : to_str(k)) + "]";
      }
      return path_of(*e.kids[0]) + "[...]";
    default: return "value";
  }
}

class Renderer {
 public:
  Renderer(const Program& p, const RenderOptions& opt) : p_(p), lim_(p.limits) {
    loop_budget_ = lim_.max_loop_iterations;
    env_.max_bytes = lim_.max_output_bytes;
    env_.loop_budget = &loop_budget_;
    env_.now = opt.now;
  }

  template <class Json>
  std::string run(const Json& context) {
    scopes_.push_back({});
    if (!context.is_object()) throw Error("chat template: the render context must be a JSON object");
    for (auto it = context.begin(); it != context.end(); ++it) {
      try {
        scopes_[0].vars.emplace_back(it.key(), from_json(it.value()));
      } catch (const Error& e) {
        throw Error(one_line("chat template context '" + it.key() + "': " + e.what()));
      }
    }
    std::string out;
    exec_body(p_.body, out);
    return out;
  }

 private:
  struct Scope {
    Object vars;
    bool barrier = false;  // a macro call: names resolve here, then in the template's top scope
  };

  struct Depth {
    Renderer& r;
    Depth(Renderer& renderer, int line) : r(renderer) {
      if (++r.depth_ > r.lim_.max_render_depth)
        r.fail(line, "rendering nests deeper than " + std::to_string(r.lim_.max_render_depth) + " levels");
    }
    ~Depth() { --r.depth_; }
  };

  [[noreturn]] void fail(int line, const std::string& msg) const {
    throw LocatedError(one_line("chat template line " + std::to_string(line) + ": " + msg));
  }

  // Runs f, giving an Error without a line the line of the node it came from.
  template <class F>
  auto located(int line, F&& f) -> decltype(f()) {
    try {
      return f();
    } catch (const LocatedError&) {
      throw;
    } catch (const Error& e) {
      fail(line, e.what());
    }
  }

  void emit(std::string& out, const std::string& s, int line) {
    if (out.size() + s.size() > lim_.max_output_bytes)
      fail(line, "output over the limit of " + std::to_string(lim_.max_output_bytes) + " bytes");
    out += s;
  }

  // ---- scopes

  const Value* lookup(const std::string& name) const {
    for (size_t i = scopes_.size(); i-- > 0;) {
      for (const auto& [k, v] : scopes_[i].vars)
        if (k == name) return &v;
      if (scopes_[i].barrier && i > 0) i = 1;  // continue with scopes_[0]
    }
    return nullptr;
  }

  void assign(const std::string& name, Value v) {
    Object& vars = scopes_.back().vars;
    for (auto& kv : vars)
      if (kv.first == name) {
        kv.second = std::move(v);
        return;
      }
    vars.emplace_back(name, std::move(v));
  }

  // ---- statements

  Flow exec_body(const Body& body, std::string& out) {
    for (const StmtPtr& s : body) {
      const Flow f = exec(*s, out);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  Flow exec(const Stmt& s, std::string& out) {
    Depth depth(*this, s.line);
    switch (s.kind) {
      case StmtKind::Text:
        emit(out, s.text, s.line);
        return Flow::Normal;
      case StmtKind::Output: {
        const Value v = eval(*s.expr);
        emit(out, to_str(v), s.line);
        return Flow::Normal;
      }
      case StmtKind::If:
        for (const auto& [cond, body] : s.branches)
          if (eval(*cond).truthy()) return exec_body(body, out);
        return exec_body(s.else_body, out);
      case StmtKind::For:
        return exec_for(s, out);
      case StmtKind::Set:
        exec_set(s, out);
        return Flow::Normal;
      case StmtKind::Macro:
        assign(s.macro->name, Value(Function{s.macro->name, s.macro.get()}));
        return Flow::Normal;
      case StmtKind::Break:
        return Flow::Break;
      case StmtKind::Continue:
        return Flow::Continue;
      case StmtKind::Generation:
        return exec_body(s.body, out);
    }
    return Flow::Normal;
  }

  void bind_targets(const std::vector<std::string>& targets, const Value& v, int line) {
    if (targets.size() == 1) {
      assign(targets[0], v);
      return;
    }
    Array items;
    if (v.is_array()) {
      items = v.as_array();
    } else if (v.is_string()) {
      for (auto& c : utf8_chars(v.as_string())) items.emplace_back(std::move(c));
    } else if (v.is_object()) {
      for (const auto& kv : v.as_object()) items.emplace_back(kv.first);
    } else {
      fail(line, std::string("cannot unpack a value of type ") + v.type_name());
    }
    if (items.size() != targets.size())
      fail(line, "cannot unpack " + std::to_string(items.size()) + " values into " + std::to_string(targets.size()) +
                     " names");
    for (size_t i = 0; i < targets.size(); ++i) assign(targets[i], items[i]);
  }

  Flow exec_for(const Stmt& s, std::string& out) {
    const Value seq = eval(*s.expr);
    Array items;
    if (seq.is_array()) {
      items = seq.as_array();
    } else if (seq.is_object()) {
      for (const auto& kv : seq.as_object()) items.emplace_back(kv.first);
    } else if (seq.is_string()) {
      for (auto& c : utf8_chars(seq.as_string())) items.emplace_back(std::move(c));
    } else if (!seq.is_undefined()) {
      fail(s.line, std::string("cannot loop over a value of type ") + seq.type_name());
    }
    scopes_.push_back({});
    if (s.filter) {
      Array kept;
      for (const Value& item : items) {
        count_iteration(s.line);
        bind_targets(s.targets, item, s.line);
        if (eval(*s.filter).truthy()) kept.push_back(item);
      }
      items = std::move(kept);
    }
    const int64_t n = static_cast<int64_t>(items.size());
    Flow result = Flow::Normal;
    for (int64_t i = 0; i < n; ++i) {
      count_iteration(s.line);
      bind_targets(s.targets, items[static_cast<size_t>(i)], s.line);
      Object loop = {
          {"index", Value(i + 1)},
          {"index0", Value(i)},
          {"revindex", Value(n - i)},
          {"revindex0", Value(n - i - 1)},
          {"first", Value(i == 0)},
          {"last", Value(i == n - 1)},
          {"length", Value(n)},
          {"depth", Value(int64_t{1})},
          {"depth0", Value(int64_t{0})},
          {"previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : Value::undefined("loop.previtem")},
          {"nextitem", i + 1 < n ? items[static_cast<size_t>(i + 1)] : Value::undefined("loop.nextitem")},
      };
      assign("loop", Value(std::move(loop)));
      const Flow f = exec_body(s.body, out);
      if (f == Flow::Break) break;
    }
    scopes_.pop_back();
    if (n == 0) result = exec_body(s.else_body, out);
    return result;
  }

  void count_iteration(int line) {
    if (--loop_budget_ < 0)
      fail(line, "loops ran more than " + std::to_string(lim_.max_loop_iterations) + " iterations in all");
  }

  void exec_set(const Stmt& s, std::string& out) {
    (void)out;
    Value v;
    if (s.expr) {
      v = eval(*s.expr);
    } else {
      std::string captured;
      exec_body(s.body, captured);
      v = Value(std::move(captured));
    }
    if (!s.attr.empty()) {
      const Value* target = lookup(s.targets[0]);
      if (!target || !target->is_namespace())
        fail(s.line, "cannot set '" + s.targets[0] + "." + s.attr + "': '" + s.targets[0] +
                         "' is not a namespace() object");
      if (holds_namespace(v)) fail(s.line, "a namespace attribute cannot hold a namespace");
      Object& attrs = target->as_namespace().attrs;
      for (auto& kv : attrs)
        if (kv.first == s.attr) {
          kv.second = std::move(v);
          return;
        }
      attrs.emplace_back(s.attr, std::move(v));
      return;
    }
    bind_targets(s.targets, v, s.line);
  }

  // ---- expressions

  Value eval(const Expr& e) {
    Depth depth(*this, e.line);
    switch (e.kind) {
      case ExprKind::Literal:
        return e.value;
      case ExprKind::Name: {
        if (const Value* v = lookup(e.name)) return *v;
        if (is_global_function(e.name)) return Value(Function{e.name, nullptr});
        return Value::undefined(e.name);
      }
      case ExprKind::List: {
        Array a;
        for (const ExprPtr& k : e.kids) a.push_back(eval(*k));
        return located(e.line, [&] { return Value(std::move(a)); });
      }
      case ExprKind::Dict: {
        Object o;
        for (size_t i = 0; i + 1 < e.kids.size(); i += 2) {
          const Value k = eval(*e.kids[i]);
          if (!k.is_string()) fail(e.line, std::string("dict keys must be strings, got ") + k.type_name());
          Value v = eval(*e.kids[i + 1]);
          bool found = false;
          for (auto& kv : o)
            if (kv.first == k.as_string()) {
              kv.second = v;
              found = true;
            }
          if (!found) o.emplace_back(k.as_string(), std::move(v));
        }
        return located(e.line, [&] { return Value(std::move(o)); });
      }
      case ExprKind::Attr: {
        const Value obj = eval(*e.kids[0]);
        return located(e.line, [&] { return get_attr(obj, e.name, path_of(e)); });
      }
      case ExprKind::Index: {
        const Value obj = eval(*e.kids[0]);
        const Value key = eval(*e.kids[1]);
        return located(e.line, [&] { return get_item(obj, key, path_of(e)); });
      }
      case ExprKind::Slice: {
        const Value obj = eval(*e.kids[0]);
        Value parts[3];
        for (int i = 0; i < 3; ++i)
          if (e.kids[static_cast<size_t>(i) + 1]) parts[i] = eval(*e.kids[static_cast<size_t>(i) + 1]);
        return located(e.line, [&] { return get_slice(obj, parts[0], parts[1], parts[2], lim_.max_output_bytes); });
      }
      case ExprKind::Call:
        return eval_call(e);
      case ExprKind::Filter: {
        const Value v = eval(*e.kids[0]);
        const CallArgs args = eval_args(e, 1);
        return located(e.line, [&] { return apply_filter(env_, e.name, v, args); });
      }
      case ExprKind::Test: {
        const Value v = eval(*e.kids[0]);
        const CallArgs args = eval_args(e, 1);
        const bool r = located(e.line, [&] { return apply_test(e.name, v, args); });
        return Value(r != e.negate);
      }
      case ExprKind::Neg:
      case ExprKind::Pos: {
        const Value v = eval(*e.kids[0]);
        if (v.is_undefined()) located(e.line, [&]() -> int { throw_undefined(v); });
        if (!v.is_number()) fail(e.line, std::string("bad operand type for unary ") + (e.kind == ExprKind::Neg ? "-" : "+") + ": '" + v.type_name() + "'");
        if (e.kind == ExprKind::Pos) return v.is_bool() ? Value(int64_t{v.as_bool()}) : v;
        if (v.is_float()) return Value(-v.as_float());
        const int64_t x = v.is_int() ? v.as_int() : v.as_bool();
        if (x == INT64_MIN) fail(e.line, "integer overflow");
        return Value(-x);
      }
      case ExprKind::Not:
        return Value(!eval(*e.kids[0]).truthy());
      case ExprKind::And: {
        Value l = eval(*e.kids[0]);
        return l.truthy() ? eval(*e.kids[1]) : l;
      }
      case ExprKind::Or: {
        Value l = eval(*e.kids[0]);
        return l.truthy() ? l : eval(*e.kids[1]);
      }
      case ExprKind::Cond:
        if (eval(*e.kids[0]).truthy()) return eval(*e.kids[1]);
        return e.kids[2] ? eval(*e.kids[2]) : Value::undefined("value of an if-expression without else");
      case ExprKind::Binary: {
        const Value l = eval(*e.kids[0]);
        const Value r = eval(*e.kids[1]);
        return located(e.line, [&] { return binary(e.name, l, r); });
      }
      case ExprKind::Compare: {
        Value l = eval(*e.kids[0]);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value r = eval(*e.kids[i + 1]);
          const bool ok = located(e.line, [&] { return compare(e.ops[i], l, r); });
          if (!ok) return Value(false);
          l = std::move(r);
        }
        return Value(true);
      }
    }
    fail(e.line, "internal error: unknown expression");
  }

  CallArgs eval_args(const Expr& e, size_t first) {
    CallArgs a;
    const size_t n_kw = e.kw_names.size();
    const size_t n_pos = e.kids.size() - first - n_kw;
    for (size_t i = 0; i < n_pos; ++i) {
      Value v = eval(*e.kids[first + i]);
      if (e.star && i + 1 == n_pos) {
        if (!v.is_array()) fail(e.line, std::string("*args must be a list, got ") + v.type_name());
        for (const Value& x : v.as_array()) a.pos.push_back(x);
      } else {
        a.pos.push_back(std::move(v));
      }
    }
    for (size_t i = 0; i < n_kw; ++i) a.kw.emplace_back(e.kw_names[i], eval(*e.kids[first + n_pos + i]));
    return a;
  }

  Value eval_call(const Expr& e) {
    const Expr& callee = *e.kids[0];
    // obj.method(...): str and dict methods.
    if (callee.kind == ExprKind::Attr) {
      const Value obj = eval(*callee.kids[0]);
      if (obj.is_undefined()) located(e.line, [&]() -> int { throw_undefined(obj); });
      if (obj.is_string() || obj.is_object()) {
        const CallArgs args = eval_args(e, 1);
        Value out;
        const bool found = located(e.line, [&] { return call_method(env_, obj, callee.name, args, &out); });
        if (found) return out;
        // A dict entry holding a macro, called as d.name(...), falls through.
        if (obj.is_string() || !obj.find(callee.name))
          fail(e.line, std::string("'") + obj.type_name() + "' object has no method '" + callee.name + "'");
      }
      const Value fn = located(e.line, [&] { return get_attr(obj, callee.name, path_of(callee)); });
      return call_value(fn, e, path_of(callee));
    }
    const Value fn = eval(callee);
    return call_value(fn, e, path_of(callee));
  }

  Value call_value(const Value& fn, const Expr& e, const std::string& what) {
    if (fn.is_undefined()) located(e.line, [&]() -> int { throw_undefined(fn); });
    if (!fn.is_function()) fail(e.line, "'" + what + "' (a " + fn.type_name() + ") is not callable");
    const CallArgs args = eval_args(e, 1);
    const Function& f = fn.as_function();
    if (!f.macro) return located(e.line, [&] { return call_global(env_, f.name, args); });
    return call_macro(*f.macro, args, e.line);
  }

  Value call_macro(const MacroNode& m, const CallArgs& args, int line) {
    if (args.pos.size() > m.params.size())
      fail(line, "macro '" + m.name + "' takes " + std::to_string(m.params.size()) + " arguments, got " +
                     std::to_string(args.pos.size()));
    Scope scope;
    scope.barrier = true;
    std::vector<bool> set(m.params.size(), false);
    for (size_t i = 0; i < args.pos.size(); ++i) {
      scope.vars.emplace_back(m.params[i], args.pos[i]);
      set[i] = true;
    }
    for (const auto& [k, v] : args.kw) {
      const auto it = std::find(m.params.begin(), m.params.end(), k);
      if (it == m.params.end()) fail(line, "macro '" + m.name + "' has no argument '" + k + "'");
      const size_t i = static_cast<size_t>(it - m.params.begin());
      if (set[i]) fail(line, "macro '" + m.name + "' got argument '" + k + "' twice");
      scope.vars.emplace_back(k, v);
      set[i] = true;
    }
    scopes_.push_back(std::move(scope));
    for (size_t i = 0; i < m.params.size(); ++i) {
      if (set[i]) continue;
      Value v = m.defaults[i] ? eval(*m.defaults[i]) : Value::undefined(m.params[i]);
      scopes_.back().vars.emplace_back(m.params[i], std::move(v));
    }
    std::string out;
    exec_body(m.body, out);
    scopes_.pop_back();
    return Value(std::move(out));
  }

  // ---- operators (Python semantics)

  static bool intlike(const Value& v) { return v.is_int() || v.is_bool(); }
  static int64_t ival(const Value& v) { return v.is_int() ? v.as_int() : v.as_bool(); }

  [[noreturn]] static void bad_operands(const std::string& op, const Value& l, const Value& r) {
    if (l.is_undefined()) throw_undefined(l);
    if (r.is_undefined()) throw_undefined(r);
    throw Error("unsupported operand types for " + op + ": '" + l.type_name() + "' and '" + r.type_name() + "'");
  }

  void check_size(size_t n) const {
    if (n > lim_.max_output_bytes)
      throw Error("a value of " + std::to_string(n) + " bytes or items, more than the limit of " +
                  std::to_string(lim_.max_output_bytes));
  }

  Value binary(const std::string& op, const Value& l, const Value& r) const {
    if (op == "~") {
      const std::string a = to_str(l), b = to_str(r);
      check_size(a.size() + b.size());
      return Value(a + b);
    }
    if (op == "+") {
      if (l.is_string() && r.is_string()) {
        check_size(l.as_string().size() + r.as_string().size());
        return Value(l.as_string() + r.as_string());
      }
      if (l.is_array() && r.is_array()) {
        check_size(l.as_array().size() + r.as_array().size());
        Array a = l.as_array();
        a.insert(a.end(), r.as_array().begin(), r.as_array().end());
        return Value(std::move(a));
      }
    }
    if (op == "*") {
      const bool ls = l.is_string() || l.is_array(), rs = r.is_string() || r.is_array();
      if ((ls && intlike(r)) || (rs && intlike(l))) {
        const Value& seq = ls ? l : r;
        const int64_t n = std::max<int64_t>(0, ival(ls ? r : l));
        const size_t unit = seq.is_string() ? seq.as_string().size() : seq.as_array().size();
        if (unit && static_cast<uint64_t>(n) > lim_.max_output_bytes / unit) check_size(SIZE_MAX);
        if (seq.is_string()) {
          std::string s;
          for (int64_t i = 0; i < n; ++i) s += seq.as_string();
          return Value(std::move(s));
        }
        Array a;
        for (int64_t i = 0; i < n; ++i) a.insert(a.end(), seq.as_array().begin(), seq.as_array().end());
        return Value(std::move(a));
      }
    }
    if (!l.is_number() || !r.is_number()) bad_operands(op, l, r);
    if (intlike(l) && intlike(r)) {
      const int64_t a = ival(l), b = ival(r);
      int64_t out = 0;
      if (op == "+") {
        if (__builtin_add_overflow(a, b, &out)) throw Error("integer overflow");
        return Value(out);
      }
      if (op == "-") {
        if (__builtin_sub_overflow(a, b, &out)) throw Error("integer overflow");
        return Value(out);
      }
      if (op == "*") {
        if (__builtin_mul_overflow(a, b, &out)) throw Error("integer overflow");
        return Value(out);
      }
      if (op == "//" || op == "%") {
        if (b == 0) throw Error("integer division or modulo by zero");
        if (a == INT64_MIN && b == -1) throw Error("integer overflow");
        int64_t q = a / b, m = a % b;
        if (m != 0 && ((m < 0) != (b < 0))) {
          --q;
          m += b;
        }
        return Value(op == "//" ? q : m);
      }
      if (op == "**" && b >= 0) {
        int64_t acc = 1;
        for (int64_t i = 0; i < b; ++i) {
          if (__builtin_mul_overflow(acc, a, &acc)) throw Error("integer overflow");
          if (acc == 0 || acc == 1) break;
          if (acc == -1) {
            acc = (b % 2 == 0) ? 1 : -1;
            break;
          }
        }
        return Value(acc);
      }
    }
    const double a = l.as_double(), b = r.as_double();
    if (op == "+") return Value(a + b);
    if (op == "-") return Value(a - b);
    if (op == "*") return Value(a * b);
    if (op == "/") {
      if (b == 0) throw Error("division by zero");
      return Value(a / b);
    }
    if (op == "//" || op == "%") {
      if (b == 0) throw Error("float division or modulo by zero");
      const double m = std::fmod(a, b);
      const double mod = (m != 0 && ((m < 0) != (b < 0))) ? m + b : m;
      if (op == "%") return Value(mod);
      const double div = (a - mod) / b;
      double fd = std::floor(div);
      if (div - fd > 0.5) fd += 1.0;
      return Value(fd);
    }
    if (op == "**") {
      if (a == 0 && b < 0) throw Error("zero to a negative power");
      return Value(std::pow(a, b));
    }
    bad_operands(op, l, r);
  }

  static bool compare(const std::string& op, const Value& l, const Value& r) {
    if (op == "==") return equals(l, r);
    if (op == "!=") return !equals(l, r);
    if (op == "in") return contains(r, l);
    if (op == "notin") return !contains(r, l);
    const int c = compare_values(l, r);
    if (op == "<") return c < 0;
    if (op == "<=") return c <= 0;
    if (op == ">") return c > 0;
    return c >= 0;
  }

  const Program& p_;
  const Limits& lim_;
  BuiltinEnv env_;
  int64_t loop_budget_ = 0;
  int depth_ = 0;
  std::vector<Scope> scopes_;
};

}  // namespace

Template Template::parse(std::string_view source, const Limits& limits) {
  return Template(parse_program(source, limits));
}

std::string Template::render(const nlohmann::ordered_json& context, const RenderOptions& options) const {
  Renderer r(*program_, options);
  return r.run(context);
}

std::string Template::render(const nlohmann::json& context, const RenderOptions& options) const {
  Renderer r(*program_, options);
  return r.run(context);
}

}  // namespace hybridlm::chat
