// StreamDecoder: incremental detokenization that only ever returns whole UTF-8 characters.
#include "io/tokenizer.h"
#include "io/tokenizer_internal.h"

namespace hybridlm {

using tokenizer_detail::Utf8Char;

StreamDecoder::StreamDecoder(const Tokenizer& tok, bool skip_special_tokens)
    : tok_(&tok), skip_special_tokens_(skip_special_tokens) {}

std::string StreamDecoder::push(int32_t id) {
  std::string bytes = tok_->token_bytes(id);  // validates id
  if (skip_special_tokens_ && tok_->is_special(id)) return {};
  pending_ += bytes;
  // Emit every complete character; a byte run that can no longer become a character is one
  // U+FFFD now (the same rule decode() applies), and a valid but unfinished tail waits.
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    const Utf8Char c = tokenizer_detail::utf8_read(pending_, i);
    if (c.status == Utf8Char::kIncomplete) break;
    if (c.status == Utf8Char::kOk) {
      out.append(pending_, i, c.len);
    } else {
      tokenizer_detail::utf8_append(out, 0xFFFD);
    }
    i += c.len;
  }
  pending_.erase(0, i);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = tokenizer_detail::utf8_sanitize(pending_);
  pending_.clear();
  return out;
}

}  // namespace hybridlm
