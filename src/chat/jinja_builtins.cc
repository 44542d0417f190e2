// Filters, tests, methods and globals, with Jinja2 / Python semantics (jinja2/filters.py,
// jinja2/tests.py, Python's str and dict) as transformers renders chat templates. Case mapping
// (upper, lower, title, capitalize) is ASCII only; other characters are kept as they are.
#include "chat/jinja_builtins.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <cstring>
#include <string_view>

#include "base/error.h"

namespace hybridlm::chat {

bool is_known_test_name(const std::string& n);

namespace {

const Value* arg(const CallArgs& a, size_t i, const char* name) {
  for (const auto& [k, v] : a.kw)
    if (k == name) return &v;
  return i < a.pos.size() ? &a.pos[i] : nullptr;
}

void check_args(const CallArgs& a, size_t max_pos, std::initializer_list<const char*> kw, const std::string& what) {
  if (a.pos.size() > max_pos)
    throw_error(what, " takes at most ", max_pos, " positional argument", max_pos == 1 ? "" : "s", ", got ",
                a.pos.size());
  for (const auto& [k, v] : a.kw) {
    bool ok = false;
    for (const char* n : kw) ok = ok || k == n;
    if (!ok) throw_error(what, " got an unexpected keyword argument '", k, "'");
  }
}

void check_size(size_t n, size_t max, const char* what) {
  if (n > max) throw_error(what, " would be ", n, " bytes or items, more than the limit of ", max);
}

const std::string& need_string(const Value* v, const std::string& what) {
  if (!v || !v->is_string()) throw_error(what, " must be a string, got ", v ? v->type_name() : "nothing");
  return v->as_string();
}

int64_t need_int(const Value* v, const std::string& what) {
  if (v && v->is_int()) return v->as_int();
  if (v && v->is_bool()) return v->as_bool();
  throw_error(what, " must be an integer, got ", v ? v->type_name() : "nothing");
}

// Text of a value as Jinja2's soft_str: undefined is "", None is "None".
std::string text_of(const Value& v) { return to_str(v); }

bool ascii_space(uint32_t c) { return c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f); }

char up(char c) { return c >= 'a' && c <= 'z' ? static_cast<char>(c - 32) : c; }
char low(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c; }
bool ascii_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

std::string upper(std::string s) {
  for (char& c : s) c = up(c);
  return s;
}
std::string lower(std::string s) {
  for (char& c : s) c = low(c);
  return s;
}
std::string capitalize(const std::string& s) {
  std::string out = lower(s);
  if (!out.empty()) out[0] = up(out[0]);
  return out;
}
// Python's str.title(): a letter after a non-letter is upper-cased, others lower-cased.
// Non-ASCII bytes count as letters (and are kept).
std::string title_method(const std::string& s) {
  std::string out = s;
  bool prev_cased = false;
  for (char& c : out) {
    const bool non_ascii = static_cast<unsigned char>(c) >= 0x80;
    if (ascii_alpha(c)) c = prev_cased ? low(c) : up(c);
    prev_cased = ascii_alpha(c) || non_ascii;
  }
  return out;
}
// Jinja2's title filter: each word (split at runs of whitespace, '-', '(', '{', '[', '<') gets
// its first character upper-cased and the rest lower-cased.
std::string title_filter(const std::string& s) {
  std::string out;
  size_t i = 0;
  const auto sep = [](char c) { return ascii_space(static_cast<unsigned char>(c)) || std::strchr("-({[<", c); };
  while (i < s.size()) {
    size_t j = i;
    const bool is_sep = sep(s[i]) && s[i] != '\0';
    while (j < s.size() && (sep(s[j]) && s[j] != '\0') == is_sep) ++j;
    std::string piece = s.substr(i, j - i);
    if (!is_sep) piece = capitalize(piece);
    out += piece;
    i = j;
  }
  return out;
}

// str.strip / lstrip / rstrip with Python's default (whitespace) or a set of characters.
std::string strip(const std::string& s, const Value* chars, bool left, bool right) {
  std::vector<std::string> cs = utf8_chars(s);
  std::vector<std::string> set;
  const bool custom = chars && !chars->is_none() && !chars->is_undefined();
  if (custom) set = utf8_chars(need_string(chars, "strip() argument"));
  const auto drop = [&](const std::string& c) {
    if (custom) return std::find(set.begin(), set.end(), c) != set.end();
    return c.size() == 1 && ascii_space(static_cast<unsigned char>(c[0]));
  };
  size_t a = 0, b = cs.size();
  if (left)
    while (a < b && drop(cs[a])) ++a;
  if (right)
    while (b > a && drop(cs[b - 1])) --b;
  std::string out;
  for (size_t k = a; k < b; ++k) out += cs[k];
  return out;
}

Array split(const std::string& s, const Value* sep_v, int64_t maxsplit) {
  Array out;
  if (!sep_v || sep_v->is_none()) {
    // Runs of whitespace separate; no empty strings.
    size_t i = 0;
    while (true) {
      while (i < s.size() && ascii_space(static_cast<unsigned char>(s[i]))) ++i;
      if (i >= s.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        size_t e = s.size();
        while (e > i && ascii_space(static_cast<unsigned char>(s[e - 1]))) --e;
        out.emplace_back(s.substr(i, e - i));
        break;
      }
      size_t j = i;
      while (j < s.size() && !ascii_space(static_cast<unsigned char>(s[j]))) ++j;
      out.emplace_back(s.substr(i, j - i));
      i = j;
    }
    return out;
  }
  const std::string& sep = need_string(sep_v, "split() separator");
  if (sep.empty()) throw Error("split(): empty separator");
  size_t i = 0;
  while (true) {
    const size_t j = (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) ? std::string::npos : s.find(sep, i);
    if (j == std::string::npos) {
      out.emplace_back(s.substr(i));
      return out;
    }
    out.emplace_back(s.substr(i, j - i));
    i = j + sep.size();
  }
}

std::string replace(const std::string& s, const std::string& old, const std::string& repl, int64_t count,
                    size_t max_bytes) {
  std::string out;
  int64_t done = 0;
  if (old.empty()) {
    // Python inserts repl before every character and at the end.
    const std::vector<std::string> cs = utf8_chars(s);
    for (size_t k = 0; k <= cs.size(); ++k) {
      if (count < 0 || done < count) {
        out += repl;
        ++done;
      }
      if (k < cs.size()) out += cs[k];
      check_size(out.size(), max_bytes, "replace() result");
    }
    return out;
  }
  size_t i = 0;
  while (true) {
    const size_t j = (count >= 0 && done >= count) ? std::string::npos : s.find(old, i);
    if (j == std::string::npos) break;
    out.append(s, i, j - i);
    out += repl;
    check_size(out.size(), max_bytes, "replace() result");
    ++done;
    i = j + old.size();
  }
  out.append(s, i, std::string::npos);
  check_size(out.size(), max_bytes, "replace() result");
  return out;
}

bool starts_or_ends(const std::string& s, const Value* what, bool start, const char* name) {
  const auto one = [&](const Value& p) {
    const std::string& x = need_string(&p, std::string(name) + "() argument");
    if (x.size() > s.size()) return false;
    return start ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (what && what->is_array()) {
    for (const Value& p : what->as_array())
      if (one(p)) return true;
    return false;
  }
  return one(what ? *what : Value());
}

// The items of an iterable (list; str: characters; dict: keys; undefined: nothing).
Array items_of(const Value& v, const char* what) {
  if (v.is_array()) return v.as_array();
  if (v.is_undefined()) return {};
  if (v.is_string()) {
    Array out;
    for (auto& c : utf8_chars(v.as_string())) out.emplace_back(std::move(c));
    return out;
  }
  if (v.is_object()) {
    Array out;
    for (const auto& kv : v.as_object()) out.emplace_back(kv.first);
    return out;
  }
  throw_error(what, ": a value of type ", v.type_name(), " is not iterable");
}

Value dict_items(const Value& v) {
  Array out;
  for (const auto& [k, x] : v.as_object()) out.emplace_back(Array{Value(k), x});
  return Value(std::move(out));
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

// Python int(x) for the int filter; nullopt when it does not convert.
std::optional<int64_t> to_int(const Value& v, int64_t base) {
  if (v.is_int()) return v.as_int();
  if (v.is_bool()) return v.as_bool() ? 1 : 0;
  if (v.is_float()) {
    const double d = v.as_float();
    if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return std::nullopt;
    return static_cast<int64_t>(d);
  }
  if (v.is_string()) {
    std::string s = strip(v.as_string(), nullptr, true, true);
    std::string digits;
    for (char c : s)
      if (c != '_') digits += c;
    if (digits.empty()) return std::nullopt;
    errno = 0;
    char* end = nullptr;
    const long long x = std::strtoll(digits.c_str(), &end, static_cast<int>(base));
    if (errno == 0 && end && *end == '\0') return x;
    // Jinja2 then tries int(float(s)).
    errno = 0;
    const double d = std::strtod(digits.c_str(), &end);
    if (errno == 0 && end && *end == '\0' && std::isfinite(d) && std::fabs(d) < 9.2e18) return static_cast<int64_t>(d);
  }
  return std::nullopt;
}

std::string join(const Array& items, const std::string& sep, size_t max_bytes) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    out += text_of(items[i]);
    check_size(out.size(), max_bytes, "join() result");
  }
  return out;
}

// Calls a test by name with the remaining arguments (select, reject, selectattr, rejectattr).
bool run_test(const std::string& test, const Value& v, const std::vector<Value>& rest) {
  CallArgs a;
  a.pos = rest;
  return apply_test(test, v, a);
}

Value select(const Value& seq, const CallArgs& args, bool attr, bool keep) {
  const char* what = attr ? (keep ? "selectattr" : "rejectattr") : (keep ? "select" : "reject");
  size_t k = 0;
  std::string attribute;
  if (attr) attribute = need_string(arg(args, k++, "attribute"), std::string(what) + "() attribute");
  std::string test;
  if (args.pos.size() > k) test = need_string(&args.pos[k++], std::string(what) + "() test name");
  if (!test.empty() && !is_known_test_name(test)) throw_error(what, "(): unknown test '", test, "'");
  const std::vector<Value> rest(args.pos.begin() + static_cast<std::ptrdiff_t>(std::min(k, args.pos.size())),
                                args.pos.end());
  Array out;
  for (const Value& item : items_of(seq, what)) {
    const Value v = attr ? get_attr(item, attribute, attribute) : item;
    const bool pass = test.empty() ? v.truthy() : run_test(test, v, rest);
    if (pass == keep) out.push_back(item);
  }
  return Value(std::move(out));
}

}  // namespace

// ---- tests

static const char* const kTests[] = {
    "defined", "undefined", "none",  "string",  "number",  "integer", "float", "boolean", "true",
    "false",   "mapping",   "iterable", "sequence", "callable", "equalto", "eq", "==", "ne", "!=",
    "lt",      "<",         "le",    "<=",      "gt",      ">",       "ge",    ">=",      "in",
    "odd",     "even",      "divisibleby", "sameas", "lower", "upper", "escaped"};

bool is_known_test_name(const std::string& n) {
  for (const char* t : kTests)
    if (n == t) return true;
  return false;
}

bool is_known_test(std::string_view name) { return is_known_test_name(std::string(name)); }

bool apply_test(const std::string& name, const Value& v, const CallArgs& args) {
  const Value* other = arg(args, 0, "value");
  const auto need_other = [&]() -> const Value& {
    if (!other) throw_error("test '", name, "' needs an argument");
    return *other;
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "mapping") return v.is_object();
  // Jinja2's Undefined is iterable (as empty) and has a length.
  if (name == "iterable" || name == "sequence") return v.is_string() || v.is_array() || v.is_object() || v.is_undefined();
  if (name == "callable") return v.is_function();
  if (name == "equalto" || name == "eq" || name == "==") return equals(v, need_other());
  if (name == "ne" || name == "!=") return !equals(v, need_other());
  if (name == "lt" || name == "<") return compare_values(v, need_other()) < 0;
  if (name == "le" || name == "<=") return compare_values(v, need_other()) <= 0;
  if (name == "gt" || name == ">") return compare_values(v, need_other()) > 0;
  if (name == "ge" || name == ">=") return compare_values(v, need_other()) >= 0;
  if (name == "in") return contains(need_other(), v);
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (!v.is_int() && !v.is_bool()) throw_error("test '", name, "' needs an integer, got ", v.type_name());
    const int64_t x = v.is_int() ? v.as_int() : v.as_bool();
    if (name == "odd") return x % 2 != 0;
    if (name == "even") return x % 2 == 0;
    const int64_t d = need_int(&need_other(), "divisibleby argument");
    if (d == 0) throw Error("divisibleby 0");
    if (d == -1) return true;
    return x % d == 0;
  }
  if (name == "sameas") {
    const Value& o = need_other();
    if (v.is_none() || v.is_bool() || v.is_undefined() || o.is_none() || o.is_bool()) return equals(v, o) && std::string(v.type_name()) == o.type_name();
    return equals(v, o);
  }
  if (name == "lower" || name == "upper") {
    const std::string s = text_of(v);
    return name == "lower" ? lower(s) == s : upper(s) == s;
  }
  if (name == "escaped") return false;
  throw_error("unknown test '", name, "'");
}

int compare_values(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    const double x = a.as_double(), y = b.as_double();
    if ((a.is_int() || a.is_bool()) && (b.is_int() || b.is_bool())) {
      const int64_t p = a.is_int() ? a.as_int() : a.as_bool(), q = b.is_int() ? b.as_int() : b.as_bool();
      return p < q ? -1 : p > q ? 1 : 0;
    }
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.as_string().compare(b.as_string());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_array() && b.is_array()) {
    const Array &x = a.as_array(), &y = b.as_array();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (equals(x[i], y[i])) continue;
      return compare_values(x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  if (a.is_undefined() || b.is_undefined()) throw_undefined(a.is_undefined() ? a : b);
  throw_error("cannot compare ", a.type_name(), " with ", b.type_name());
}

bool contains(const Value& container, const Value& item) {
  if (container.is_string()) {
    if (!item.is_string()) throw_error("'in <string>' needs a string on the left, got ", item.type_name());
    return container.as_string().find(item.as_string()) != std::string::npos;
  }
  if (container.is_array()) {
    for (const Value& e : container.as_array())
      if (equals(e, item)) return true;
    return false;
  }
  if (container.is_object()) return item.is_string() && container.find(item.as_string()) != nullptr;
  if (container.is_undefined()) return false;
  throw_error("argument of type '", container.type_name(), "' is not iterable");
}

[[noreturn]] void throw_undefined(const Value& v) {
  const std::string& n = v.undefined_name();
  throw_error("'", n.empty() ? std::string("value") : n, "' is undefined");
}

// ---- attribute and item access

Value get_attr(const Value& obj, const std::string& name, const std::string& path) {
  if (obj.is_undefined()) throw_undefined(obj);
  if (const Value* v = obj.find(name)) return *v;
  return Value::undefined(path);
}

Value get_item(const Value& obj, const Value& key, const std::string& path) {
  if (obj.is_undefined()) throw_undefined(obj);
  if (key.is_string() && (obj.is_object() || obj.is_namespace())) return get_attr(obj, key.as_string(), path);
  if ((key.is_int() || key.is_bool()) && (obj.is_array() || obj.is_string())) {
    int64_t i = key.is_int() ? key.as_int() : key.as_bool();
    if (obj.is_array()) {
      const Array& a = obj.as_array();
      const int64_t n = static_cast<int64_t>(a.size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::undefined(path);
      return a[static_cast<size_t>(i)];
    }
    const std::vector<std::string> cs = utf8_chars(obj.as_string());
    const int64_t n = static_cast<int64_t>(cs.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value::undefined(path);
    return Value(cs[static_cast<size_t>(i)]);
  }
  return Value::undefined(path);
}

Value get_slice(const Value& obj, const Value& start_v, const Value& stop_v, const Value& step_v, size_t max_bytes) {
  if (obj.is_undefined()) throw_undefined(obj);
  const auto given = [](const Value& v) { return !v.is_undefined() && !v.is_none(); };
  int64_t step = given(step_v) ? need_int(&step_v, "slice step") : 1;
  if (step == 0) throw Error("slice step cannot be zero");
  std::vector<std::string> chars;
  const bool is_str = obj.is_string();
  if (is_str) chars = utf8_chars(obj.as_string());
  else if (!obj.is_array()) throw_error("cannot slice a value of type ", obj.type_name());
  const int64_t n = static_cast<int64_t>(is_str ? chars.size() : obj.as_array().size());
  const auto adjust = [&](const Value& v, int64_t dflt) {
    if (!given(v)) return dflt;
    int64_t x = need_int(&v, "slice index");
    if (x < 0) {
      x = x < -n ? (step < 0 ? -1 : 0) : x + n;
    } else if (x >= n) {
      x = step < 0 ? n - 1 : n;
    }
    return x;
  };
  const int64_t start = adjust(start_v, step > 0 ? 0 : n - 1);
  const int64_t stop = adjust(stop_v, step > 0 ? n : -1);
  Array out;
  std::string s;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (is_str) s += chars[static_cast<size_t>(i)];
    else out.push_back(obj.as_array()[static_cast<size_t>(i)]);
    if (step > 0 ? i > INT64_MAX - step : i < INT64_MIN - step) break;
  }
  check_size(is_str ? s.size() : out.size(), max_bytes, "slice");
  return is_str ? Value(std::move(s)) : Value(std::move(out));
}

// ---- filters

static const char* const kFilters[] = {
    "trim",  "tojson",  "length",     "count",      "upper",  "lower",   "title",  "capitalize", "default",
    "d",     "join",    "first",      "last",       "list",   "string",  "int",    "float",      "abs",
    "round", "replace", "items",      "selectattr", "rejectattr", "select", "reject", "map",   "safe",
    "e",     "escape",  "reverse",    "unique",     "dictsort"};

bool is_known_filter(std::string_view name) {
  for (const char* f : kFilters)
    if (name == f) return true;
  return false;
}

Value apply_filter(const BuiltinEnv& env, const std::string& name, const Value& v, const CallArgs& args) {
  const std::string what = "filter '" + name + "'";
  if (name == "trim") {
    check_args(args, 1, {"chars"}, what);
    return Value(strip(text_of(v), arg(args, 0, "chars"), true, true));
  }
  if (name == "tojson") {
    check_args(args, 4, {"ensure_ascii", "indent", "separators", "sort_keys"}, what);
    JsonStyle st;
    // Positional order of transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
    if (const Value* a = arg(args, 0, "ensure_ascii")) st.ensure_ascii = a->truthy();
    if (const Value* a = arg(args, 1, "indent"); a && !a->is_none()) {
      st.indent = static_cast<int>(std::clamp<int64_t>(need_int(a, "tojson indent"), 0, 1000));
      st.item_sep = std::string(1, ',');  // json.dumps with indent: "," between items
    }
    if (const Value* a = arg(args, 2, "separators"); a && !a->is_none()) {
      if (!a->is_array() || a->as_array().size() != 2) throw Error("tojson separators must be a pair of strings");
      st.item_sep = need_string(&a->as_array()[0], "tojson separator");
      st.key_sep = need_string(&a->as_array()[1], "tojson separator");
    }
    if (const Value* a = arg(args, 3, "sort_keys")) st.sort_keys = a->truthy();
    st.max_bytes = env.max_bytes;
    return Value(to_json_text(v, st));
  }
  if (name == "length" || name == "count") {
    check_args(args, 0, {}, what);
    if (v.is_string()) return Value(static_cast<int64_t>(utf8_length(v.as_string())));
    if (v.is_array()) return Value(static_cast<int64_t>(v.as_array().size()));
    if (v.is_object()) return Value(static_cast<int64_t>(v.as_object().size()));
    if (v.is_namespace()) return Value(static_cast<int64_t>(v.as_namespace().attrs.size()));
    if (v.is_undefined()) return Value(int64_t{0});
    throw_error("object of type '", v.type_name(), "' has no len()");
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    check_args(args, 0, {}, what);
    const std::string s = text_of(v);
    if (name == "upper") return Value(upper(s));
    if (name == "lower") return Value(lower(s));
    if (name == "title") return Value(title_filter(s));
    return Value(capitalize(s));
  }
  if (name == "default" || name == "d") {
    check_args(args, 2, {"default_value", "boolean"}, what);
    const Value* dflt = arg(args, 0, "default_value");
    const Value* boolean = arg(args, 1, "boolean");
    const bool use = (boolean && boolean->truthy()) ? !v.truthy() : v.is_undefined();
    return use ? (dflt ? *dflt : Value("")) : v;
  }
  if (name == "join") {
    check_args(args, 2, {"d", "attribute"}, what);
    const Value* sep = arg(args, 0, "d");
    const Value* attr = arg(args, 1, "attribute");
    Array items = items_of(v, "join");
    if (attr && !attr->is_none()) {
      const std::string a = text_of(*attr);
      for (Value& x : items) x = get_attr(x, a, a);
    }
    return Value(join(items, sep ? text_of(*sep) : "", env.max_bytes));
  }
  if (name == "first" || name == "last") {
    check_args(args, 0, {}, what);
    const Array items = items_of(v, name.c_str());
    if (items.empty()) return Value::undefined("first item of an empty sequence");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") {
    check_args(args, 0, {}, what);
    return Value(items_of(v, "list"));
  }
  if (name == "string") {
    check_args(args, 0, {}, what);
    return Value(text_of(v));
  }
  if (name == "int") {
    check_args(args, 2, {"default", "base"}, what);
    const Value* dflt = arg(args, 0, "default");
    const Value* base = arg(args, 1, "base");
    const int64_t b = base ? need_int(base, "int base") : 10;
    if (b < 2 || b > 36) throw Error("int base must be 2..36");
    if (auto x = to_int(v, b)) return Value(*x);
    return dflt ? *dflt : Value(int64_t{0});
  }
  if (name == "float") {
    check_args(args, 1, {"default"}, what);
    if (v.is_number()) return Value(v.as_double());
    if (v.is_string()) {
      const std::string s = strip(v.as_string(), nullptr, true, true);
      char* end = nullptr;
      const double d = std::strtod(s.c_str(), &end);
      if (!s.empty() && end && *end == '\0') return Value(d);
    }
    const Value* dflt = arg(args, 0, "default");
    return dflt ? *dflt : Value(0.0);
  }
  if (name == "abs") {
    check_args(args, 0, {}, what);
    if (v.is_int()) {
      if (v.as_int() == INT64_MIN) throw Error("integer overflow in abs");
      return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
    }
    if (v.is_bool()) return Value(int64_t{v.as_bool()});
    if (v.is_float()) return Value(std::fabs(v.as_float()));
    throw_error("bad operand type for abs(): '", v.type_name(), "'");
  }
  if (name == "round") {
    check_args(args, 2, {"precision", "method"}, what);
    const Value* p = arg(args, 0, "precision");
    const Value* m = arg(args, 1, "method");
    const int64_t prec = std::clamp<int64_t>(p ? need_int(p, "round precision") : 0, -300, 300);
    const std::string method = m ? need_string(m, "round method") : "common";
    if (!v.is_number()) throw_error("round needs a number, got ", v.type_name());
    const double scale = std::pow(10.0, static_cast<double>(prec));
    const double x = v.as_double() * scale;
    double r;
    if (method == "common") r = std::round(x);
    else if (method == "ceil") r = std::ceil(x);
    else if (method == "floor") r = std::floor(x);
    else throw Error("round method must be common, ceil or floor");
    return Value(r / scale);
  }
  if (name == "replace") {
    check_args(args, 3, {"old", "new", "count"}, what);
    const Value* o = arg(args, 0, "old");
    const Value* n = arg(args, 1, "new");
    const Value* c = arg(args, 2, "count");
    if (!o || !n) throw Error("replace needs the old and the new text");
    return Value(replace(text_of(v), text_of(*o), text_of(*n), c && !c->is_none() ? need_int(c, "replace count") : -1,
                         env.max_bytes));
  }
  if (name == "items") {
    check_args(args, 0, {}, what);
    if (v.is_undefined()) return Value(Array{});
    if (!v.is_object()) throw_error("items: expected a dict, got ", v.type_name());
    return dict_items(v);
  }
  if (name == "dictsort") {
    check_args(args, 0, {}, what);
    if (!v.is_object()) throw_error("dictsort: expected a dict, got ", v.type_name());
    Object o = v.as_object();
    std::stable_sort(o.begin(), o.end(), [](const auto& a, const auto& b) { return lower(a.first) < lower(b.first); });
    return dict_items(Value(std::move(o)));
  }
  if (name == "selectattr" || name == "rejectattr") return select(v, args, true, name == "selectattr");
  if (name == "select" || name == "reject") return select(v, args, false, name == "select");
  if (name == "map") {
    Array out;
    const Value* attribute = nullptr;
    for (const auto& [k, x] : args.kw) {
      if (k == "attribute") attribute = &x;
      else if (k != "default") throw_error("map() got an unexpected keyword argument '", k, "'");
    }
    if (attribute) {
      const std::string a = text_of(*attribute);
      const Value* dflt = nullptr;
      for (const auto& [k, x] : args.kw)
        if (k == "default") dflt = &x;
      for (const Value& item : items_of(v, "map")) {
        Value x = get_attr(item, a, a);
        out.push_back(x.is_undefined() && dflt ? *dflt : std::move(x));
      }
      return Value(std::move(out));
    }
    if (args.pos.empty()) throw Error("map() needs a filter name or attribute=");
    const std::string f = need_string(&args.pos[0], "map() filter name");
    if (!is_known_filter(f) || f == "map") throw_error("map(): unknown filter '", f, "'");
    CallArgs rest;
    rest.pos.assign(args.pos.begin() + 1, args.pos.end());
    for (const Value& item : items_of(v, "map")) out.push_back(apply_filter(env, f, item, rest));
    return Value(std::move(out));
  }
  if (name == "safe") return v;
  if (name == "e" || name == "escape") return Value(html_escape(text_of(v)));
  if (name == "reverse") {
    if (v.is_string()) {
      std::vector<std::string> cs = utf8_chars(v.as_string());
      std::string out;
      for (size_t k = cs.size(); k-- > 0;) out += cs[k];
      return Value(std::move(out));
    }
    Array items = items_of(v, "reverse");
    std::reverse(items.begin(), items.end());
    return Value(std::move(items));
  }
  if (name == "unique") {
    Array out;
    for (const Value& x : items_of(v, "unique")) {
      bool seen = false;
      for (const Value& y : out) seen = seen || equals(x, y);
      if (!seen) out.push_back(x);
    }
    return Value(std::move(out));
  }
  throw_error("unknown filter '", name, "'");
}

// ---- methods

bool call_method(const BuiltinEnv& env, const Value& obj, const std::string& name, const CallArgs& args, Value* out) {
  const std::string what = name + "()";
  if (obj.is_string()) {
    const std::string& s = obj.as_string();
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      check_args(args, 1, {}, what);
      *out = Value(strip(s, arg(args, 0, "chars"), name != "rstrip", name != "lstrip"));
    } else if (name == "split") {
      check_args(args, 2, {"sep", "maxsplit"}, what);
      const Value* m = arg(args, 1, "maxsplit");
      *out = Value(split(s, arg(args, 0, "sep"), m ? need_int(m, "split maxsplit") : -1));
    } else if (name == "startswith" || name == "endswith") {
      check_args(args, 1, {}, what);
      *out = Value(starts_or_ends(s, arg(args, 0, "prefix"), name == "startswith", name.c_str()));
    } else if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
      check_args(args, 0, {}, what);
      *out = Value(name == "upper" ? upper(s) : name == "lower" ? lower(s) : name == "title" ? title_method(s) : capitalize(s));
    } else if (name == "replace") {
      check_args(args, 3, {}, what);
      const Value* c = arg(args, 2, "count");
      *out = Value(replace(s, need_string(arg(args, 0, "old"), "replace() old"),
                           need_string(arg(args, 1, "new"), "replace() new"), c ? need_int(c, "replace count") : -1,
                           env.max_bytes));
    } else if (name == "join") {
      check_args(args, 1, {}, what);
      const Value* items = arg(args, 0, "iterable");
      if (!items) throw Error("join() needs an iterable");
      const Array a = items_of(*items, "join");
      for (const Value& x : a)
        if (!x.is_string()) throw_error("join(): expected str items, got ", x.type_name());
      *out = Value(join(a, s, env.max_bytes));
    } else {
      return false;
    }
    return true;
  }
  if (obj.is_object()) {
    if (name == "items") {
      check_args(args, 0, {}, what);
      *out = dict_items(obj);
    } else if (name == "keys" || name == "values") {
      check_args(args, 0, {}, what);
      Array a;
      for (const auto& [k, v] : obj.as_object()) a.push_back(name == "keys" ? Value(k) : v);
      *out = Value(std::move(a));
    } else if (name == "get") {
      check_args(args, 2, {}, what);
      const Value* key = arg(args, 0, "key");
      if (!key) throw Error("get() needs a key");
      const Value* found = key->is_string() ? obj.find(key->as_string()) : nullptr;
      const Value* dflt = arg(args, 1, "default");
      *out = found ? *found : dflt ? *dflt : Value::none();
    } else {
      return false;
    }
    return true;
  }
  return false;
}

// ---- globals

bool is_global_function(const std::string& name) {
  return name == "raise_exception" || name == "strftime_now" || name == "range" || name == "namespace" ||
         name == "dict";
}

Value call_global(const BuiltinEnv& env, const std::string& name, const CallArgs& args) {
  if (name == "raise_exception") {
    const Value* m = arg(args, 0, "message");
    // The renderer writes control characters of the message as \n, \xNN (one line).
    throw Error(m ? text_of(*m) : "raise_exception() called");
  }
  if (name == "strftime_now") {
    check_args(args, 1, {}, "strftime_now()");
    const std::string fmt = need_string(arg(args, 0, "format"), "strftime_now() format");
    const std::time_t t = env.now ? *env.now : std::time(nullptr);
    std::tm tm{};
    localtime_r(&t, &tm);
    // strftime with an unknown conversion is undefined behaviour in C; allow the common ones.
    for (size_t i = 0; i < fmt.size(); ++i) {
      if (fmt[i] != '%') continue;
      const char c = i + 1 < fmt.size() ? fmt[i + 1] : '\0';
      if (!c || !std::strchr("aAbBcdHIjmMpSUwWxXyYZz%eDFRTn", c))
        throw_error("strftime_now(): unsupported format directive '%", std::string(1, c), "'");
      ++i;
    }
    if (fmt.size() > 256) throw Error("strftime_now(): format longer than 256 bytes");
    char buf[4096];
    const size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
    return Value(std::string(buf, n));
  }
  if (name == "range") {
    check_args(args, 3, {}, "range()");
    if (args.pos.empty()) throw Error("range() needs at least one argument");
    int64_t start = 0, stop, step = 1;
    if (args.pos.size() == 1) {
      stop = need_int(&args.pos[0], "range() argument");
    } else {
      start = need_int(&args.pos[0], "range() argument");
      stop = need_int(&args.pos[1], "range() argument");
      if (args.pos.size() == 3) step = need_int(&args.pos[2], "range() step");
    }
    if (step == 0) throw Error("range() step must not be zero");
    Array out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
      if (--*env.loop_budget < 0) throw Error("loop iterations over the limit (range())");
      out.emplace_back(i);
      if (step > 0 ? i > INT64_MAX - step : i < INT64_MIN - step) break;
      i += step;
    }
    return Value(std::move(out));
  }
  if (name == "namespace" || name == "dict") {
    Object o;
    if (args.pos.size() > 1) throw_error(name, "() takes at most 1 positional argument");
    const auto put = [&](const std::string& k, const Value& v) {
      for (auto& kv : o)
        if (kv.first == k) {
          kv.second = v;
          return;
        }
      o.emplace_back(k, v);
    };
    if (!args.pos.empty()) {
      if (!args.pos[0].is_object()) throw_error(name, "() positional argument must be a dict");
      for (const auto& [k, v] : args.pos[0].as_object()) put(k, v);
    }
    for (const auto& [k, v] : args.kw) put(k, v);
    if (name == "dict") return Value(std::move(o));
    auto ns = std::make_shared<Namespace>();
    ns->attrs = std::move(o);
    return Value(std::move(ns));
  }
  throw_error("unknown function '", name, "'");
}

}  // namespace hybridlm::chat
