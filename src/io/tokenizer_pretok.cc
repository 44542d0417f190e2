// Pre-tokenizers: ByteLevel, Split, Metaspace, Sequence. Component reference:
// https://huggingface.co/docs/tokenizers/components#pretokenizers
#include "base/error.h"
#include "io/tokenizer_internal.h"

namespace hybridlm::tokenizer_detail {
namespace {

using nlohmann::json;

// JavaScript's \s as a character-class body (the reference runs GPT-2's pattern as a JavaScript
// regex, so its \s — unlike Unicode White_Space — includes U+FEFF and excludes U+0085).
constexpr const char* kJsSpace = "\\t\\n\\x{0B}\\f\\r\\p{Zs}\\x{2028}\\x{2029}\\x{FEFF}";

// GPT-2's pattern: contractions, letters, numbers, other symbols (each optionally after one
// space), then whitespace, keeping the last space of a run for the next word ("\s+(?!\S)").
std::string gpt2_pattern() {
  const std::string s = std::string("[") + kJsSpace + "]";
  const std::string not_s = std::string("[^") + kJsSpace + "]";
  return "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" + std::string(kJsSpace) + "\\p{L}\\p{N}]+|" + s +
         "+(?!" + not_s + ")|" + s + "+";
}

bool get_bool(const json& j, const char* key, bool fallback, const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_boolean()) throw Error(where + ": \"" + key + "\" must be true or false");
  return j[key].get<bool>();
}

// Maps each byte of a piece to its printable stand-in; optionally splits with GPT-2's regex
// first (use_regex) and prefixes a space to every piece that lacks one (add_prefix_space).
class ByteLevel final : public PreTokenizer {
 public:
  ByteLevel(const json& j, const std::string& where)
      : add_prefix_space_(get_bool(j, "add_prefix_space", false, where)),
        use_regex_(get_bool(j, "use_regex", true, where)) {
    if (use_regex_) regex_.emplace(gpt2_pattern(), where + ": ByteLevel pre-tokenizer");
  }

  void apply(std::vector<std::string>& pieces, bool /*first_section*/) const override {
    const auto& table = byte_to_unicode();
    std::vector<std::string> out;
    out.reserve(pieces.size());
    for (std::string& piece : pieces) {
      if (add_prefix_space_ && (piece.empty() || piece[0] != ' ')) piece = std::string(1, ' ') + piece;
      const auto encode = [&](std::string_view text) {
        std::string mapped;
        mapped.reserve(text.size() * 2);
        for (char c : text) mapped += table[static_cast<uint8_t>(c)];
        out.push_back(std::move(mapped));
      };
      if (!use_regex_) {
        encode(piece);
        continue;
      }
      // Only the matches are kept (text no alternative matches would be dropped; GPT-2's
      // pattern matches everything).
      for (const auto& [b, e] : regex_->find_all(piece)) {
        if (e > b) encode(std::string_view(piece).substr(b, e - b));
      }
    }
    pieces = std::move(out);
  }

 private:
  bool add_prefix_space_;
  bool use_regex_;
  std::optional<Regex> regex_;
};

// Splits on a pattern. Only behaviour "Isolated" with invert false: every match becomes its own
// piece and so does the text between matches; empty pieces are dropped.
class Split final : public PreTokenizer {
 public:
  Split(const json& j, const std::string& where) {
    const std::string what = where + ": Split pre-tokenizer";
    if (!j.contains("pattern") || !j["pattern"].is_object()) throw Error(what + " has no \"pattern\" object");
    const json& pat = j["pattern"];
    std::string pcre;
    if (pat.contains("Regex") && pat["Regex"].is_string()) {
      pcre = oniguruma_to_pcre2(pat["Regex"].get<std::string>(), what);
    } else if (pat.contains("String") && pat["String"].is_string()) {
      pcre = pcre2_escape_literal(pat["String"].get<std::string>());
    } else {
      throw Error(what + ": \"pattern\" must hold a \"Regex\" or \"String\" string");
    }
    const std::string behavior = j.value("behavior", std::string("Isolated"));
    if (behavior != "Isolated") {
      throw Error(what + ": unsupported behavior \"" + behavior + "\" (only \"Isolated\" is supported)");
    }
    if (get_bool(j, "invert", false, what)) throw Error(what + ": unsupported \"invert\": true");
    regex_.emplace(pcre, what);
  }

  void apply(std::vector<std::string>& pieces, bool /*first_section*/) const override {
    std::vector<std::string> out;
    out.reserve(pieces.size());
    for (const std::string& piece : pieces) {
      size_t prev = 0;
      for (const auto& [b, e] : regex_->find_all(piece)) {
        if (b > prev) out.push_back(piece.substr(prev, b - prev));
        if (e > b) out.push_back(piece.substr(b, e - b));
        prev = e;
      }
      if (prev < piece.size()) out.push_back(piece.substr(prev));
    }
    pieces = std::move(out);
  }

 private:
  std::optional<Regex> regex_;
};

// SentencePiece's word marking: every space becomes the replacement character ("▁"), and a
// piece that does not start with one gets one in front (prepend_scheme "always"; "first": only in
// the first section of the input; "never"). With split, each "▁" then starts a new piece
// ("a▁b▁▁c" -> "a", "▁b", "▁", "▁c").
//
// The reference (@huggingface/tokenizers 0.2.0) ignores "split" and never splits; the Rust crate
// splits as above. We follow the Rust crate there (tests/tokenizer/compare.mjs gives the
// reference the same split as a Split pre-tokenizer it does implement), and the reference
// everywhere else: a missing prepend_scheme is "always", "first" means the first section.
class Metaspace final : public PreTokenizer {
 public:
  Metaspace(const json& j, const std::string& where) {
    const std::string what = where + ": Metaspace pre-tokenizer";
    if (!j.contains("replacement") || j["replacement"].is_null()) {
      replacement_ = "\xE2\x96\x81";
    } else if (!j["replacement"].is_string() || utf8_to_u32(j["replacement"].get<std::string>()).size() != 1) {
      throw Error(what + ": \"replacement\" must be one character");
    } else {
      replacement_ = j["replacement"].get<std::string>();
    }
    if (j.contains("prepend_scheme") && !j["prepend_scheme"].is_null()) {
      const std::string scheme = j["prepend_scheme"].is_string() ? j["prepend_scheme"].get<std::string>() : "";
      if (scheme == "always") scheme_ = kAlways;
      else if (scheme == "first") scheme_ = kFirst;
      else if (scheme == "never") scheme_ = kNever;
      else throw Error(what + ": \"prepend_scheme\" must be \"always\", \"first\" or \"never\"");
    } else if (j.contains("add_prefix_space") && !get_bool(j, "add_prefix_space", true, what)) {
      scheme_ = kNever;  // files older than prepend_scheme (the reference would prepend anyway)
    }
    split_ = get_bool(j, "split", true, what);
  }

  void apply(std::vector<std::string>& pieces, bool first_section) const override {
    std::vector<std::string> out;
    out.reserve(pieces.size());
    const bool prepend = scheme_ == kAlways || (scheme_ == kFirst && first_section);
    for (const std::string& piece : pieces) {
      std::string s;
      s.reserve(piece.size() + 8);
      for (char c : piece) {
        if (c == ' ') s += replacement_;
        else s += c;
      }
      if (prepend && s.compare(0, replacement_.size(), replacement_) != 0) s = replacement_ + s;
      if (!split_) {
        out.push_back(std::move(s));
        continue;
      }
      size_t start = 0;
      for (size_t at = s.find(replacement_, 1); at != std::string::npos; at = s.find(replacement_, at + 1)) {
        out.push_back(s.substr(start, at - start));
        start = at;
      }
      if (start < s.size()) out.push_back(s.substr(start));
    }
    pieces = std::move(out);
  }

 private:
  enum Scheme { kAlways, kFirst, kNever };
  std::string replacement_;
  Scheme scheme_ = kAlways;
  bool split_ = true;
};

class Sequence final : public PreTokenizer {
 public:
  Sequence(const json& j, const std::string& where) {
    if (!j.contains("pretokenizers") || !j["pretokenizers"].is_array()) {
      throw Error(where + ": Sequence pre-tokenizer has no \"pretokenizers\" array");
    }
    for (const json& item : j["pretokenizers"]) {
      if (auto p = make_pre_tokenizer(item, where)) steps_.push_back(std::move(p));
    }
  }

  void apply(std::vector<std::string>& pieces, bool first_section) const override {
    for (const auto& step : steps_) step->apply(pieces, first_section);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

}  // namespace

const std::array<std::string, 256>& byte_to_unicode() {
  // Printable Latin-1 bytes stand for themselves; the other 68 bytes (controls, space, DEL,
  // NBSP, soft hyphen) take U+0100, U+0101, ... in byte order.
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      utf8_append(t[b], printable ? static_cast<char32_t>(b) : next++);
    }
    return t;
  }();
  return table;
}

std::optional<uint8_t> unicode_to_byte(char32_t cp) {
  static const std::unordered_map<char32_t, uint8_t> inverse = [] {
    std::unordered_map<char32_t, uint8_t> m;
    const auto& t = byte_to_unicode();
    for (int b = 0; b < 256; ++b) m[utf8_to_u32(t[b])[0]] = static_cast<uint8_t>(b);
    return m;
  }();
  const auto it = inverse.find(cp);
  if (it == inverse.end()) return std::nullopt;
  return it->second;
}

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    throw Error(where + ": pre_tokenizer must be an object with a \"type\"");
  }
  const std::string type = j["type"].get<std::string>();
  if (type == "ByteLevel") return std::make_unique<ByteLevel>(j, where);
  if (type == "Split") return std::make_unique<Split>(j, where);
  if (type == "Metaspace") return std::make_unique<Metaspace>(j, where);
  if (type == "Sequence") return std::make_unique<Sequence>(j, where);
  throw Error(where + ": unsupported pre_tokenizer type \"" + type +
              "\" (supported: ByteLevel, Split, Metaspace, Sequence)");
}

}  // namespace hybridlm::tokenizer_detail
