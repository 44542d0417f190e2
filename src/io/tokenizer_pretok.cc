// Pre-tokenizers: ByteLevel, Split, Sequence. Component reference:
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

  void apply(std::vector<std::string>& pieces) const override {
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

  void apply(std::vector<std::string>& pieces) const override {
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

  void apply(std::vector<std::string>& pieces) const override {
    for (const auto& step : steps_) step->apply(pieces);
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
  if (type == "Sequence") return std::make_unique<Sequence>(j, where);
  throw Error(where + ": unsupported pre_tokenizer type \"" + type +
              "\" (supported: ByteLevel, Split, Sequence)");
}

}  // namespace hybridlm::tokenizer_detail
