#include "chat/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "base/error.h"

namespace hybridlm::chat {

namespace {
template <class Items, class Get>
int nested_depth(const Items& items, Get get) {
  int d = 0;
  for (const auto& x : items) d = std::max(d, get(x).depth());
  if (d + 1 > Value::kMaxValueDepth)
    throw Error("a list or dict nested deeper than " + std::to_string(Value::kMaxValueDepth) + " levels");
  return d + 1;
}
}  // namespace

Value::Value(Array a) : depth_(nested_depth(a, [](const Value& v) -> const Value& { return v; })) {
  v_ = std::make_shared<const Array>(std::move(a));
}

Value::Value(Object o)
    : depth_(nested_depth(o, [](const std::pair<std::string, Value>& kv) -> const Value& { return kv.second; })) {
  v_ = std::make_shared<const Object>(std::move(o));
}

double Value::as_double() const {
  if (is_bool()) return as_bool() ? 1.0 : 0.0;
  if (is_int()) return static_cast<double>(as_int());
  return as_float();
}

bool Value::truthy() const {
  if (is_undefined() || is_none()) return false;
  if (is_bool()) return as_bool();
  if (is_int()) return as_int() != 0;
  if (is_float()) return as_float() != 0.0;
  if (is_string()) return !as_string().empty();
  if (is_array()) return !as_array().empty();
  if (is_object()) return !as_object().empty();
  return true;  // namespace, function
}

const char* Value::type_name() const {
  if (is_undefined()) return "undefined";
  if (is_none()) return "NoneType";
  if (is_bool()) return "bool";
  if (is_int()) return "int";
  if (is_float()) return "float";
  if (is_string()) return "str";
  if (is_array()) return "list";
  if (is_object()) return "dict";
  if (is_namespace()) return "namespace";
  return "function";
}

const Value* Value::find(const std::string& key) const {
  const Object* o = is_object() ? &as_object() : is_namespace() ? &as_namespace().attrs : nullptr;
  if (!o) return nullptr;
  for (const auto& [k, v] : *o)
    if (k == key) return &v;
  return nullptr;
}

namespace {
template <class Json>
Value value_of(const Json& j) {
  using T = nlohmann::json::value_t;
  switch (j.type()) {
    case T::null:
      return Value::none();
    case T::boolean:
      return Value(j.template get<bool>());
    case T::number_integer:
      return Value(j.template get<int64_t>());
    case T::number_unsigned: {
      const uint64_t u = j.template get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<double>(u));
      return Value(static_cast<int64_t>(u));
    }
    case T::number_float:
      return Value(j.template get<double>());
    case T::string:
      return Value(j.template get<std::string>());
    case T::array: {
      Array a;
      a.reserve(j.size());
      for (const auto& e : j) a.push_back(value_of(e));
      return Value(std::move(a));
    }
    case T::object: {
      Object o;
      o.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) o.emplace_back(it.key(), value_of(it.value()));
      return Value(std::move(o));
    }
    default:
      return Value::none();  // binary / discarded: not produced by parse()
  }
}
}  // namespace

Value from_json(const nlohmann::json& j) { return value_of(j); }
Value from_json(const nlohmann::ordered_json& j) { return value_of(j); }

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  // Shortest round-trip digits in scientific form, then laid out as Python's repr does:
  // positional for exponents -4 <= e < 16, else d.ddde+XX.
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  const size_t epos = sci.find('e');
  std::string mant = sci.substr(0, epos);
  const int exp = std::stoi(sci.substr(epos + 1));
  std::string sign;
  if (mant[0] == '-') {
    sign = "-";
    mant.erase(0, 1);
  }
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  if (exp < -4 || exp >= 16) {
    std::string out = sign + digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char e[16];
    std::snprintf(e, sizeof e, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    return out + e;
  }
  std::string out;
  if (exp < 0) {
    out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  } else {
    const size_t int_len = static_cast<size_t>(exp) + 1;
    if (digits.size() <= int_len) {
      out = digits + std::string(int_len - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, int_len) + "." + digits.substr(int_len);
    }
  }
  return sign + out;
}

namespace {

// c as Python writes it in a string literal: \n, \r (and \t when `tab`), other control
// characters as \xNN, the rest as is.
void append_escaped(std::string& out, unsigned char c, bool tab) {
  if (c == '\n') {
    out += "\\n";
  } else if (c == '\r') {
    out += "\\r";
  } else if (c == '\t' && tab) {
    out += "\\t";
  } else if (c < 0x20 || c == 0x7f) {
    char b[8];
    std::snprintf(b, sizeof b, "\\x%02x", c);
    out += b;
  } else {
    out += static_cast<char>(c);
  }
}

// Python's repr(str): single quotes unless the text has ' and no ".
std::string str_repr(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == q || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else {
      append_escaped(out, c, true);
    }
  }
  return out + q;
}

std::string repr(const Value& v) {
  if (v.is_string()) return str_repr(v.as_string());
  if (v.is_undefined()) return "";
  return to_str(v);
}

}  // namespace

std::string to_str(const Value& v) {
  if (v.is_undefined()) return "";
  if (v.is_none()) return "None";
  if (v.is_bool()) return v.as_bool() ? "True" : "False";
  if (v.is_int()) return std::to_string(v.as_int());
  if (v.is_float()) return float_repr(v.as_float());
  if (v.is_string()) return v.as_string();
  if (v.is_array()) {
    std::string out = "[";
    bool first = true;
    for (const Value& e : v.as_array()) {
      if (!first) out += ", ";
      first = false;
      out += repr(e);
    }
    return out + "]";
  }
  if (v.is_object()) {
    std::string out = "{";
    bool first = true;
    for (const auto& [k, e] : v.as_object()) {
      if (!first) out += ", ";
      first = false;
      out += str_repr(k) + ": " + repr(e);
    }
    return out + "}";
  }
  if (v.is_namespace()) return "<Namespace>";
  return "<function " + v.as_function().name + ">";
}

namespace {

// Decodes one UTF-8 code point at s[i] (advancing i); invalid bytes decode as themselves.
uint32_t next_code_point(const std::string& s, size_t& i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = byte(i);
  const size_t n = c < 0x80 ? 0 : (c & 0xe0) == 0xc0 ? 1 : (c & 0xf0) == 0xe0 ? 2 : (c & 0xf8) == 0xf0 ? 3 : 0;
  if (n == 0 || i + n >= s.size()) {
    ++i;
    return c;
  }
  uint32_t cp = c & (0x3fu >> n);
  for (size_t k = 1; k <= n; ++k) {
    if ((byte(i + k) & 0xc0) != 0x80) {
      ++i;
      return c;
    }
    cp = (cp << 6) | (byte(i + k) & 0x3f);
  }
  i += n + 1;
  return cp;
}

void json_string(const std::string& s, bool ensure_ascii, std::string& out) {
  out += '"';
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        default:
          if (c < 0x20) {
            char b[8];
            std::snprintf(b, sizeof b, "\\u%04x", c);
            out += b;
          } else {
            out += static_cast<char>(c);
          }
      }
      continue;
    }
    const size_t start = i;
    const uint32_t cp = next_code_point(s, i);
    if (!ensure_ascii) {
      out.append(s, start, i - start);
      continue;
    }
    char b[16];
    if (cp >= 0x10000) {
      const uint32_t v = cp - 0x10000;
      std::snprintf(b, sizeof b, "\\u%04x\\u%04x", 0xd800 + (v >> 10), 0xdc00 + (v & 0x3ff));
    } else {
      std::snprintf(b, sizeof b, "\\u%04x", cp);
    }
    out += b;
  }
  out += '"';
}

void json_value(const Value& v, const JsonStyle& st, int level, std::string& out) {
  if (out.size() > st.max_bytes)
    throw Error("tojson: output over the limit of " + std::to_string(st.max_bytes) + " bytes");
  const auto newline = [&](int lvl) {
    out += '\n';
    const size_t n = static_cast<size_t>(st.indent) * static_cast<size_t>(lvl);
    if (out.size() + n > st.max_bytes)
      throw Error("tojson: output over the limit of " + std::to_string(st.max_bytes) + " bytes");
    out.append(n, ' ');
  };
  if (v.is_none()) {
    out += "null";
  } else if (v.is_bool()) {
    out += v.as_bool() ? "true" : "false";
  } else if (v.is_int()) {
    out += std::to_string(v.as_int());
  } else if (v.is_float()) {
    const double d = v.as_float();
    out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : float_repr(d);
  } else if (v.is_string()) {
    json_string(v.as_string(), st.ensure_ascii, out);
  } else if (v.is_array()) {
    const Array& a = v.as_array();
    if (a.empty()) {
      out += "[]";
      return;
    }
    out += '[';
    for (size_t i = 0; i < a.size(); ++i) {
      if (i) out += st.item_sep;
      if (st.indent >= 0) newline(level + 1);
      json_value(a[i], st, level + 1, out);
    }
    if (st.indent >= 0) newline(level);
    out += ']';
  } else if (v.is_object() || v.is_namespace()) {
    if (v.is_namespace()) throw Error("tojson: a namespace is not JSON serializable");
    const Object& o = v.as_object();
    if (o.empty()) {
      out += "{}";
      return;
    }
    std::vector<const std::pair<std::string, Value>*> items;
    for (const auto& kv : o) items.push_back(&kv);
    if (st.sort_keys)
      std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
    out += '{';
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += st.item_sep;
      if (st.indent >= 0) newline(level + 1);
      json_string(items[i]->first, st.ensure_ascii, out);
      out += st.key_sep;
      json_value(items[i]->second, st, level + 1, out);
    }
    if (st.indent >= 0) newline(level);
    out += '}';
  } else {
    throw Error(std::string("tojson: a value of type ") + v.type_name() + " is not JSON serializable");
  }
}

}  // namespace

std::string to_json_text(const Value& v, const JsonStyle& style) {
  std::string out;
  json_value(v, style, 0, out);
  if (out.size() > style.max_bytes)
    throw Error("tojson: output over the limit of " + std::to_string(style.max_bytes) + " bytes");
  return out;
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if ((a.is_int() || a.is_bool()) && (b.is_int() || b.is_bool())) {
      const int64_t x = a.is_int() ? a.as_int() : a.as_bool();
      const int64_t y = b.is_int() ? b.as_int() : b.as_bool();
      return x == y;
    }
    return a.as_double() == b.as_double();
  }
  if (a.is_string() && b.is_string()) return a.as_string() == b.as_string();
  if (a.is_none() && b.is_none()) return true;
  if (a.is_undefined() && b.is_undefined()) return true;
  if (a.is_array() && b.is_array()) {
    const Array &x = a.as_array(), &y = b.as_array();
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i)
      if (!equals(x[i], y[i])) return false;
    return true;
  }
  if (a.is_object() && b.is_object()) {
    const Object &x = a.as_object(), &y = b.as_object();
    if (x.size() != y.size()) return false;
    for (const auto& [k, v] : x) {
      const Value* w = b.find(k);
      if (!w || !equals(v, *w)) return false;
    }
    return true;
  }
  if (a.is_namespace() && b.is_namespace()) return &a.as_namespace() == &b.as_namespace();
  if (a.is_function() && b.is_function()) return &a.as_function() == &b.as_function();
  return false;
}

std::string one_line(const std::string& msg) {
  std::string out;
  for (unsigned char c : msg) append_escaped(out, c, false);
  return out;
}

std::vector<std::string> utf8_chars(const std::string& s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < s.size()) {
    const size_t start = i;
    next_code_point(s, i);
    out.push_back(s.substr(start, i - start));
  }
  return out;
}

size_t utf8_length(const std::string& s) {
  size_t n = 0, i = 0;
  while (i < s.size()) {
    next_code_point(s, i);
    ++n;
  }
  return n;
}

}  // namespace hybridlm::chat
