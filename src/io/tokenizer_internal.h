// Internal parts of the tokenizer (src/io/tokenizer.h): UTF-8 helpers, NFC, the PCRE2 regex
// wrapper, normalizers, pre-tokenizers, the BPE model, decoders and the SentencePiece backend.
// Not a public header; only src/io/tokenizer*.cc and src/io/unicode_nfc.cc include it.
//
// Reference for behaviour: the `@huggingface/tokenizers` npm package (pinned in
// tests/tokenizer/package.json), which the cross-check test compares against id for id.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace hybridlm::tokenizer_detail {

// Token ids index dense tables, so a huge id in a stranger's file would allocate gigabytes.
// The largest real vocabularies are ~262k; 2^22 leaves room and bounds the tables.
constexpr int64_t kMaxTokenId = (1 << 22) - 1;


// ---------------------------------------------------------------------------------------------
// UTF-8 (tokenizer_utf8.cc)

// Result of reading one character at s[i]. kIncomplete: the bytes up to the end of s are a valid
// start of a longer character (only possible at the end of s).
struct Utf8Char {
  enum Status { kOk, kInvalid, kIncomplete } status;
  char32_t cp;  // valid when kOk
  size_t len;   // kOk: bytes of the character; kInvalid: bytes replaced by one U+FFFD (>= 1);
                // kIncomplete: bytes left
};
// Reads one character with the WHATWG "maximal subpart" rule that JavaScript's TextDecoder uses,
// so one U+FFFD replaces each maximal invalid prefix.
Utf8Char utf8_read(std::string_view s, size_t i);
// Invalid bytes become U+FFFD (same rule). This is how encode() treats malformed input: it never
// throws on bad UTF-8, it tokenizes what a JavaScript TextDecoder would have produced.
std::string utf8_sanitize(std::string_view s);
void utf8_append(std::string& out, char32_t cp);
// Decodes valid UTF-8 (as produced by utf8_sanitize) to code points.
std::u32string utf8_to_u32(std::string_view s);
// JavaScript's \s (and String.prototype.trim): Zs, TAB, VT, FF, LF, CR, U+2028/9, U+FEFF.
bool is_js_whitespace(char32_t cp);
std::string_view js_trim_start(std::string_view s);
std::string_view js_trim_end(std::string_view s);

// ---------------------------------------------------------------------------------------------
// Unicode normalization (unicode_nfc.cc)

// Canonical composition (NFC) of valid UTF-8, table-driven (src/io/unicode_nfc_table.inc).
std::string nfc(std::string_view s);
const char* nfc_unicode_version();

// ---------------------------------------------------------------------------------------------
// Regex (tokenizer_regex.cc)

// A compiled PCRE2 pattern (UTF + UCP, JIT when available). Matching uses JavaScript `matchAll`
// semantics: leftmost matches, scanning resumes at the end of each match, and an empty match
// moves the scan on by one character.
class Regex {
 public:
  // pcre2_pattern is PCRE2 syntax; `where` names the file and component for error messages.
  Regex(const std::string& pcre2_pattern, const std::string& where);
  Regex(Regex&& other) noexcept;
  Regex& operator=(Regex&& other) noexcept;
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  ~Regex();
  // [begin, end) byte ranges of every match in s (valid UTF-8).
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view s) const;

 private:
  void* code_ = nullptr;  // pcre2_code_8*
  std::string where_;
};

// Rewrites a pattern written for Oniguruma (the engine of the Rust `tokenizers` crate, which is
// what tokenizer.json patterns are authored for) into PCRE2 syntax with the same meaning as the
// JavaScript reference gives it: \s is Unicode White_Space, (?i:...) folds ASCII letters only,
// `.` excludes only \n, ^ and $ are line anchors, \h is a hex digit. Throws Error (naming
// `where`) on constructs it cannot carry over: character-class intersection (&&), nested
// classes, \G, inline flags other than (?i:...), and {n,m} directly followed by + or *.
std::string oniguruma_to_pcre2(std::string_view pattern, const std::string& where);

// Escapes a literal string for use inside a PCRE2 pattern.
std::string pcre2_escape_literal(std::string_view literal);

// ---------------------------------------------------------------------------------------------
// Normalizers (tokenizer_normalize.cc)

// The tokenizer.json "normalizer": NFC, Prepend, Replace, and Sequences of them, flattened into
// one list of steps run in order. Applied to the text between added tokens, and to the content of
// added tokens marked "normalized".
class Normalizer {
 public:
  Normalizer();
  // A JSON null gives the identity normalizer. `where` names the file for error messages.
  Normalizer(const nlohmann::json& config, const std::string& where);
  Normalizer(Normalizer&&) noexcept;
  Normalizer& operator=(Normalizer&&) noexcept;
  ~Normalizer();
  bool active() const;  // false for the identity
  std::string apply(const std::string& text) const;

 private:
  struct Step;
  std::vector<Step> steps_;
};

// ---------------------------------------------------------------------------------------------
// Pre-tokenizers (tokenizer_pretok.cc)

// GPT-2's reversible map from bytes to printable characters (byte 0x20 ' ' -> U+0120 'Ġ'), as
// UTF-8 strings, and its inverse.
const std::array<std::string, 256>& byte_to_unicode();
std::optional<uint8_t> unicode_to_byte(char32_t cp);

// Splits each piece of text into smaller pieces; pieces are UTF-8 strings. ByteLevel rewrites
// pieces into the byte-to-unicode alphabet that BPE vocabularies are spelled in.
class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // first_section: the pieces come from the first section of the input (the text before the
  // first added token, or all of it); Metaspace's prepend_scheme "first" needs to know.
  virtual void apply(std::vector<std::string>& pieces, bool first_section) const = 0;
};
// `where` names the file for error messages. Returns nullptr for a JSON null.
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& config, const std::string& where);

// ---------------------------------------------------------------------------------------------
// BPE model (tokenizer_bpe.cc)

// Byte-pair encoding: a word (one pre-token) starts as its characters and the pair with the
// lowest merge rank is merged until no pair has a rank; equal ranks merge leftmost first.
class BpeModel {
 public:
  static BpeModel from_json(const nlohmann::json& model, const std::string& where);

  // The reference looks tokens up in the vocabulary extended by the added tokens' contents, and
  // maps a token string to an id through the added tokens first. `added` holds every added-token
  // lookup key (content, and normalized content) -> id; `raw_added` holds contents only.
  void set_added_tokens(const std::unordered_map<std::string, int32_t>& added,
                        const std::unordered_map<std::string, int32_t>& raw_added);

  // Appends the ids of one pre-token. `cache` memoizes words within one encode() call.
  using Cache = std::unordered_map<std::string, std::vector<int32_t>>;
  void encode_word(const std::string& word, std::vector<int32_t>& out, Cache& cache) const;

  // Token string -> id: added tokens first (see set_added_tokens), then the vocabulary.
  std::optional<int32_t> token_to_id(std::string_view token) const { return final_id(token); }
  const std::vector<std::string>& id_to_token() const { return id_to_token_; }  // "" = hole
  std::optional<int32_t> unk_id() const { return unk_id_; }
  bool fuse_unk() const { return fuse_unk_; }

 private:
  void merge_word(const std::string& word, std::vector<int32_t>& out) const;
  void emit_unknown(std::string_view symbol, std::vector<int32_t>& out) const;
  std::optional<int32_t> final_id(std::string_view token) const;

  std::unordered_map<std::string, int32_t> vocab_;  // as in tokenizer.json
  std::vector<std::string> id_to_token_;
  // (left id << 32 | right id) -> (rank, merged id)
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;
  std::vector<int32_t> final_of_vocab_;             // vocab id -> id the reference reports for that string
  std::unordered_map<std::string, int32_t> added_;  // see set_added_tokens
  std::unordered_map<std::string, int32_t> raw_added_;  // see set_added_tokens
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::string where_;
};

// ---------------------------------------------------------------------------------------------
// Decoders other than ByteLevel (tokenizer_decode.cc)

// The SentencePiece-style "decoder" chain: Replace, ByteFallback, Fuse, Strip, Metaspace, and
// Sequences of them. It works on token strings as the reference does: each step maps the list of
// strings to a new list, and the text is the concatenation of the last list.
class DecoderChain {
 public:
  DecoderChain();
  DecoderChain(const nlohmann::json& config, const std::string& where);
  DecoderChain(DecoderChain&&) noexcept;
  DecoderChain& operator=(DecoderChain&&) noexcept;
  ~DecoderChain();

  std::string decode(std::vector<std::string> tokens) const;
  // The text one token stands for in the middle of a text: a byte token ("<0x0A>", when the chain
  // has ByteFallback) is its byte; other tokens go through the per-token steps, without the rules
  // that only apply at the start or end of the whole text.
  std::string token_text(const std::string& token) const;
  bool byte_fallback() const { return byte_fallback_; }

 private:
  struct Step;
  std::vector<std::string> run(std::vector<std::string> tokens, bool whole_text) const;
  std::vector<Step> steps_;
  bool byte_fallback_ = false;
};

// "<0xAB>" -> 0xAB: the spelling of byte-fallback tokens (two upper- or lower-case hex digits).
std::optional<uint8_t> byte_token_value(std::string_view token);

// ---------------------------------------------------------------------------------------------
// SentencePiece models (tokenizer_spm.cc): tokenizer.model files through Debian's libsentencepiece

// A SentencePiece model (tokenizer.model), as the library encodes and decodes it. In a build
// without libsentencepiece, load() throws an Error saying so.
class SentencePieceModel {
 public:
  static std::unique_ptr<SentencePieceModel> load(const std::filesystem::path& file);
  static bool available();  // this build links libsentencepiece
  virtual ~SentencePieceModel() = default;

  virtual std::vector<int32_t> encode(const std::string& text) const = 0;  // valid UTF-8, no BOS
  virtual std::string decode(std::span<const int32_t> ids) const = 0;     // ids in range
  virtual int32_t size() const = 0;                                        // pieces
  virtual std::string piece(int32_t id) const = 0;
  virtual std::optional<int32_t> piece_to_id(std::string_view piece) const = 0;
  virtual bool is_control(int32_t id) const = 0;  // <s>, </s>: decode drops them
  virtual bool is_byte(int32_t id) const = 0;     // <0xAB> byte pieces
  virtual std::optional<int32_t> bos_id() const = 0;
  virtual std::optional<int32_t> eos_id() const = 0;
};

}  // namespace hybridlm::tokenizer_detail
