// PCRE2 wrapper with JavaScript matchAll semantics, and the Oniguruma -> PCRE2 pattern rewrite.
// PCRE2 API: https://www.pcre.org/current/doc/html/pcre2api.html
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "base/error.h"
#include "io/tokenizer_internal.h"

namespace hybridlm::tokenizer_detail {
namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}

pcre2_code* as_code(void* p) { return static_cast<pcre2_code*>(p); }

constexpr uint32_t kRegexMatchLimit = 1000000;

// Word characters as the reference defines them for \w and \b (Oniguruma's Unicode word set).
constexpr const char* kWordChars = "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{B2}\\x{B3}\\x{B9}\\x{BC}-\\x{BE}";
constexpr const char* kHexChars = "0-9A-Fa-f";

bool is_ascii_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
char other_case(char c) { return c >= 'a' && c <= 'z' ? c - 'a' + 'A' : c - 'A' + 'a'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

// Rewrites Oniguruma escapes with the reference's meaning. `in_class`: inside [...], where only
// set-valued escapes can be inlined. Returns the PCRE2 text, or "" for escapes left unchanged.
std::string rewrite_escape(char e, bool in_class, const std::string& where) {
  const auto set = [&](const std::string& chars) { return in_class ? chars : "[" + chars + "]"; };
  const auto unsupported = [&](const char* what) -> std::string {
    throw Error(where + ": unsupported regex construct \\" + std::string(1, e) + " (" + what + ")");
  };
  switch (e) {
    case 's':
      return "\\p{White_Space}";
    case 'S':
      return "\\P{White_Space}";
    case 'd':
      return "\\p{Nd}";
    case 'D':
      return "\\P{Nd}";
    case 'w':
      return set(kWordChars);
    case 'h':
      return set(kHexChars);
    case 'v':
      return "\\x{0B}";  // Oniguruma \v is VT; PCRE2's \v is a class of vertical space
    case 'W':
      if (in_class) unsupported("negated set inside a character class");
      return std::string("[^") + kWordChars + "]";
    case 'H':
      if (in_class) unsupported("negated set inside a character class");
      return std::string("[^") + kHexChars + "]";
    case 'b':
    case 'B': {
      if (in_class) unsupported("word boundary inside a character class");
      const std::string w = std::string("[") + kWordChars + "]";
      if (e == 'b') return "(?:(?<!" + w + ")(?=" + w + ")|(?<=" + w + ")(?!" + w + "))";
      return "(?:(?<!" + w + ")(?!" + w + ")|(?<=" + w + ")(?=" + w + "))";
    }
    case 'G':
      return unsupported("search-start anchor");
    case 'n':
    case 'r':
    case 't':
    case 'f':
    case 'a':
    case 'e':
    case 'A':
    case 'z':
    case 'Z':
      return "";  // same meaning in PCRE2
    default:
      if (is_ascii_letter(e) && e != 'x' && e != 'u' && e != 'p' && e != 'P') {
        unsupported("unknown escape");
      }
      return "";
  }
}

}  // namespace

std::string pcre2_escape_literal(std::string_view literal) {
  std::string out;
  for (char c : literal) {
    const auto u = static_cast<uint8_t>(c);
    if (u < 0x80 && !is_ascii_letter(c) && !is_digit(c) && c != '_' && c != ' ') out += '\\';
    out += c;
  }
  return out;
}

std::string oniguruma_to_pcre2(std::string_view p, const std::string& where) {
  std::string out;
  std::vector<bool> fold_stack;  // ASCII case folding state outside each open group
  bool fold = false;             // inside (?i:...)
  bool after_interval = false;   // the last item was a {n,m} quantifier
  const auto fail = [&](const std::string& what) -> void {
    throw Error(where + ": unsupported regex construct: " + what + " in pattern " + std::string(p));
  };
  // Copies one escape starting at p[i] == '\\' into out; returns the index after it.
  const auto copy_escape = [&](size_t i, bool in_class) -> size_t {
    if (i + 1 >= p.size()) fail("trailing backslash");
    const char e = p[i + 1];
    if (e == 'u') {  // \uHHHH -> \x{HHHH}
      const std::string_view hex = p.substr(i + 2, 4);
      if (hex.size() != 4 || hex.find_first_not_of("0123456789abcdefABCDEF") != std::string_view::npos) {
        fail("malformed \\u escape");
      }
      out += "\\x{" + std::string(hex) + "}";
      return i + 6;
    }
    if ((e == 'x' || e == 'p' || e == 'P') && i + 2 < p.size() && p[i + 2] == '{') {
      const size_t close = p.find('}', i + 2);
      if (close == std::string_view::npos) fail("unterminated \\" + std::string(1, e) + "{");
      std::string body(p.substr(i + 3, close - i - 3));
      if ((e == 'p' || e == 'P') && body == "Word") {
        out += e == 'p' ? std::string("[") + kWordChars + "]" : std::string("[^") + kWordChars + "]";
        if (in_class) fail("\\p{Word} inside a character class");
      } else if (e == 'x' && (body.empty() || body.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)) {
        fail("malformed \\x{...} escape");  // found by fuzz_tokenizer_load: std::stoi threw on "\\x{L}"
      } else if (e == 'x' && fold && !in_class && body.size() <= 2) {
        const int v = std::stoi(body, nullptr, 16);
        if (v < 0x80 && is_ascii_letter(static_cast<char>(v))) {
          out += std::string("[") + static_cast<char>(v) + other_case(static_cast<char>(v)) + "]";
        } else {
          out += p.substr(i, close + 1 - i);
        }
      } else {
        out += p.substr(i, close + 1 - i);
      }
      return close + 1;
    }
    const std::string r = rewrite_escape(e, in_class, where);
    if (!r.empty()) {
      out += r;
    } else {
      out += p.substr(i, 2);
    }
    return i + 2;
  };

  size_t i = 0;
  while (i < p.size()) {
    const char c = p[i];
    const bool was_interval = after_interval;
    after_interval = false;
    if (c == '\\') {
      i = copy_escape(i, false);
      continue;
    }
    if (c == '[') {
      // A character class: copied through, with escapes rewritten and, under (?i:...), each
      // ASCII letter (and letter range) given its other case too.
      std::string extra;  // other-case letters to add
      out += '[';
      ++i;
      if (i < p.size() && p[i] == '^') out += p[i++];
      const size_t insert_at = out.size();  // extra goes first, where a '-' cannot follow it
      if (fold && i < p.size() && p[i] == ']') fail("']' first in a case-folded character class");
      bool first = true;
      while (i < p.size() && (p[i] != ']' || first)) {
        first = false;
        if (p[i] == '\\') {
          i = copy_escape(i, true);
          continue;
        }
        if (p[i] == '[') {
          const size_t close = p.find(":]", i);
          if (i + 1 < p.size() && p[i + 1] == ':' && close != std::string_view::npos) {
            out += p.substr(i, close + 2 - i);  // POSIX class such as [:alpha:]
            i = close + 2;
            continue;
          }
          fail("nested character class");
        }
        if (p[i] == '&' && i + 1 < p.size() && p[i + 1] == '&') fail("character-class intersection &&");
        if (fold && is_ascii_letter(p[i])) {
          if (i + 2 < p.size() && p[i + 1] == '-' && is_ascii_letter(p[i + 2])) {
            extra += std::string(1, other_case(p[i])) + "-" + other_case(p[i + 2]);
            out += p.substr(i, 3);
            i += 3;
            continue;
          }
          extra += other_case(p[i]);
        }
        out += p[i++];
      }
      if (i >= p.size()) fail("unterminated character class");
      out.insert(insert_at, extra);
      out += ']';
      ++i;
      continue;
    }
    if (c == '(') {
      fold_stack.push_back(fold);
      if (p.substr(i, 4) == "(?i:") {
        fold = true;
        out += "(?:";
        i += 4;
        continue;
      }
      if (p.substr(i, 2) == "(?") {
        static constexpr std::string_view kAllowed[] = {"(?:", "(?=", "(?!", "(?<=", "(?<!", "(?>", "(?<"};
        bool ok = false;
        for (std::string_view a : kAllowed) ok = ok || p.substr(i, a.size()) == a;
        if (!ok) fail("inline flag group " + std::string(p.substr(i, 4)));
      }
      out += c;
      ++i;
      continue;
    }
    if (c == ')') {
      if (!fold_stack.empty()) {
        fold = fold_stack.back();
        fold_stack.pop_back();
      }
      out += c;
      ++i;
      continue;
    }
    if (c == '{') {
      // {n}, {n,}, {n,m} and Oniguruma's {,m}; anything else is a literal brace.
      size_t j = i + 1;
      while (j < p.size() && (is_digit(p[j]) || p[j] == ',')) ++j;
      const std::string body(p.substr(i + 1, j - i - 1));
      const bool quantifier =
          j < p.size() && p[j] == '}' && !body.empty() && body != "," && body.find(',') == body.rfind(',');
      if (!quantifier) {
        out += "\\{";
        ++i;
        continue;
      }
      out += "{" + (body[0] == ',' ? "0" + body : body) + "}";
      i = j + 1;
      after_interval = true;
      continue;
    }
    if ((c == '+' || c == '*') && was_interval) fail("{n,m} followed by " + std::string(1, c));
    if (c == '.') {
      out += "[^\\n]";
    } else if (c == '^') {
      out += "(?:(?<![\\s\\S])|(?<=\\n))";
    } else if (c == '$') {
      out += "(?:(?=\\n)|(?![\\s\\S]))";
    } else if (fold && is_ascii_letter(c)) {
      out += std::string("[") + c + other_case(c) + "]";
    } else {
      out += c;
    }
    ++i;
  }
  return out;
}

Regex::Regex(const std::string& pattern, const std::string& where) : where_(where) {
  int err = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &err, &offset, nullptr);
  if (code == nullptr) {
    throw Error(where + ": cannot compile regex (" + pcre2_message(err) + " at offset " +
                std::to_string(offset) + "): " + pattern);
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // optional speed-up; the interpreter is the fallback
  code_ = code;
}

Regex::Regex(Regex&& other) noexcept : code_(other.code_), where_(std::move(other.where_)) {
  other.code_ = nullptr;
}

Regex& Regex::operator=(Regex&& other) noexcept {
  if (this != &other) {
    pcre2_code_free(as_code(code_));
    code_ = other.code_;
    where_ = std::move(other.where_);
    other.code_ = nullptr;
  }
  return *this;
}

Regex::~Regex() { pcre2_code_free(as_code(code_)); }

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view s) const {
  std::vector<std::pair<size_t, size_t>> matches;
  // Work limits per match attempt, so a pathological pattern from a stranger's tokenizer.json
  // fails with an error instead of backtracking for minutes. Real pre-tokenizer patterns need a
  // few hundred steps per match; the limits are orders of magnitude above that.
  struct Context {
    pcre2_match_context* p = pcre2_match_context_create(nullptr);
    ~Context() { pcre2_match_context_free(p); }
  } mc;
  if (mc.p == nullptr) throw Error(where_ + ": out of memory for a regex match context");
  pcre2_set_match_limit(mc.p, kRegexMatchLimit);
  pcre2_set_depth_limit(mc.p, kRegexMatchLimit);
  pcre2_set_heap_limit(mc.p, 64 * 1024);  // KiB
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(as_code(code_), nullptr);
  if (md == nullptr) throw Error(where_ + ": out of memory for regex match data");
  const auto subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  size_t start = 0;
  while (start <= s.size()) {
    // The subject is valid UTF-8 (sanitized on entry), so PCRE2's own check is skipped.
    int rc = pcre2_match(as_code(code_), subject, s.size(), start, PCRE2_NO_UTF_CHECK, md, mc.p);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {  // same pattern, interpreter: same result, more stack
      rc = pcre2_match(as_code(code_), subject, s.size(), start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md,
                       mc.p);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      pcre2_match_data_free(md);
      throw Error(where_ + ": regex match failed: " + pcre2_message(rc) +
                  (rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT || rc == PCRE2_ERROR_HEAPLIMIT
                       ? " (the pre-tokenizer pattern needs too much work on this input)"
                       : ""));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t b = ov[0], e = ov[1];
    matches.emplace_back(b, e);
    if (e > b) {
      start = e;
    } else {  // empty match: step over one character, as JavaScript does in unicode mode
      if (e >= s.size()) break;
      start = e + utf8_read(s, e).len;
    }
  }
  pcre2_match_data_free(md);
  return matches;
}

}  // namespace hybridlm::tokenizer_detail
