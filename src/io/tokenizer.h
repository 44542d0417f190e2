// Hugging Face `tokenizer.json` tokenizers (BPE family), token-for-token identical to the pure
// JavaScript `@huggingface/tokenizers` package (the oracle in tests/tokenizer/compare.mjs); and
// SentencePiece `tokenizer.model` files, which Debian's libsentencepiece encodes and decodes
// (checked against Debian's python3-sentencepiece in tests/tokenizer/spm_oracle_test.py).
//
// Pipeline of encode(), in the order the reference runs it:
//   1. invalid UTF-8 bytes in the input become U+FFFD (see utf8_sanitize in tokenizer_internal.h);
//   2. added tokens ("<|endoftext|>", ...) are cut out first: leftmost, then longest match;
//   3. the text between them is normalized (NFC), cut again on added tokens whose content is
//      "normalized", then pre-tokenized (ByteLevel / Split regex / Sequence);
//   4. each pre-token goes through the BPE model (merges by rank, leftmost first on ties);
//   5. the post-processor (TemplateProcessing) adds special tokens such as BOS.
//
// Supported components: model BPE (with byte_fallback, fuse_unk, ignore_merges); normalizers NFC,
// Prepend, Replace, Sequence; pre-tokenizers ByteLevel, Split (Regex or String pattern; behaviour
// Isolated), Metaspace, Sequence; post-processors TemplateProcessing, ByteLevel (a no-op on ids),
// Sequence; decoders ByteLevel, or a chain of Replace, ByteFallback, Fuse, Strip, Metaspace
// (Sequence). Anything else is refused at load time with an Error naming the file and the
// component.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace hybridlm {

class Tokenizer {
 public:
  // path: a directory holding tokenizer.json (and optionally tokenizer_config.json), or the
  // tokenizer.json file itself (tokenizer_config.json is then looked for next to it). A directory
  // with tokenizer.model and no tokenizer.json, or a *.model file, loads the SentencePiece model
  // (BOS from the model, prepended by encode as Llama and Mistral do); a build without
  // libsentencepiece refuses it with an Error saying so.
  static Tokenizer load(const std::filesystem::path& path);

  // Text to ids. add_special_tokens lets the post-processor add BOS/EOS; special tokens written
  // in the text itself ("<|endoftext|>") are always recognised.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // Ids to text. Bytes that do not form valid UTF-8 become U+FFFD. Throws Error for an id
  // outside the vocabulary. No "clean up tokenization spaces" pass: decode(encode(s)) == s.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;
  // Raw bytes this token decodes to in the middle of a text (ByteLevel decoded; "▁the" as " the";
  // a byte-fallback token as its byte); may be a partial UTF-8 sequence. decode() of several ids
  // may differ from their concatenation: SentencePiece decoders drop the space of the first word.
  std::string token_bytes(int32_t id) const;
  int32_t vocab_size() const;  // max id + 1 over vocab and added tokens
  // From tokenizer_config.json (bos_token / eos_token); nullopt when there is no such file or key.
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  bool is_special(int32_t id) const;  // an added token marked "special"
  // A token as spelled in the vocabulary ("Ġthe") or an added token's content.
  std::optional<int32_t> token_to_id(std::string_view token) const;

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

 private:
  friend class StreamDecoder;
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  // decode(ids) without the characters that later ids could still change (bytes of a character
  // that is not complete yet); *held says whether anything was left out. ids are valid.
  std::string decode_prefix(std::span<const int32_t> ids, bool* held) const;
  std::unique_ptr<Impl> impl_;
};

// Streaming detokenizer: push ids one at a time, get back only complete UTF-8 characters (never
// half a character). Bytes that can never become a valid character are emitted as U+FFFD as soon
// as that is certain. The pieces add up to decode(ids, skip_special_tokens): each push returns
// the difference between the decoded text of the ids so far and what was already returned. Keeps
// a reference to the tokenizer, which must outlive it.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool skip_special_tokens = true);
  std::string push(int32_t id);  // newly completed text
  std::string flush();           // whatever is left (invalid trailing bytes become U+FFFD)

 private:
  const Tokenizer* tok_;
  bool skip_special_tokens_;
  // The ids decoded together: since the start, or since a few ids of context (whose own text is
  // already out) when the window was last cut short; and how many bytes of their text are out.
  std::vector<int32_t> window_;
  size_t emitted_ = 0;
};

}  // namespace hybridlm
