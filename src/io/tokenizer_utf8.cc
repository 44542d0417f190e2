// UTF-8 reading with the WHATWG replacement rule, and JavaScript's whitespace set.
// Spec: https://encoding.spec.whatwg.org/#utf-8-decoder (one U+FFFD per maximal subpart).
#include "io/tokenizer_internal.h"

namespace hybridlm::tokenizer_detail {

Utf8Char utf8_read(std::string_view s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t b0 = byte(i);
  if (b0 < 0x80) return {Utf8Char::kOk, b0, 1};
  size_t need;                   // continuation bytes that follow the lead byte
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the first continuation byte
  char32_t cp;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1, cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2, cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;  // no overlong forms
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3, cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;  // no overlong forms
    if (b0 == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return {Utf8Char::kInvalid, 0, 1};  // stray continuation byte, C0, C1 or F5..FF
  }
  for (size_t k = 1; k <= need; ++k) {
    if (i + k >= s.size()) return {Utf8Char::kIncomplete, 0, k};
    const uint8_t b = byte(i + k);
    const uint8_t min = k == 1 ? lo : 0x80, max = k == 1 ? hi : 0xBF;
    if (b < min || b > max) return {Utf8Char::kInvalid, 0, k};  // b itself starts afresh
    cp = (cp << 6) | (b & 0x3F);
  }
  return {Utf8Char::kOk, cp, need + 1};
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string utf8_sanitize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const Utf8Char c = utf8_read(s, i);
    if (c.status == Utf8Char::kOk) {
      out.append(s.substr(i, c.len));
    } else {
      utf8_append(out, 0xFFFD);
    }
    i += c.len;
  }
  return out;
}

std::u32string utf8_to_u32(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const Utf8Char c = utf8_read(s, i);
    out += c.status == Utf8Char::kOk ? c.cp : char32_t{0xFFFD};
    i += c.len;
  }
  return out;
}

bool is_js_whitespace(char32_t cp) {
  switch (cp) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:  // ASCII
    case 0xA0:
    case 0x1680:
    case 0x202F:
    case 0x205F:
    case 0x3000:  // other Zs
    case 0x2028:
    case 0x2029:  // LS, PS
    case 0xFEFF:  // BOM
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;  // Zs block
  }
}

std::string_view js_trim_start(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const Utf8Char c = utf8_read(s, i);
    if (c.status != Utf8Char::kOk || !is_js_whitespace(c.cp)) break;
    i += c.len;
  }
  return s.substr(i);
}

std::string_view js_trim_end(std::string_view s) {
  // Walk forwards (UTF-8 is not self-describing backwards for invalid input; ours is valid) and
  // remember where the trailing whitespace run begins.
  size_t i = 0, keep = 0;
  while (i < s.size()) {
    const Utf8Char c = utf8_read(s, i);
    i += c.len;
    if (c.status != Utf8Char::kOk || !is_js_whitespace(c.cp)) keep = i;
  }
  return s.substr(0, keep);
}

}  // namespace hybridlm::tokenizer_detail
