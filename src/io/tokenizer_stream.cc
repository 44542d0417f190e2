// StreamDecoder: incremental detokenization that only ever returns whole UTF-8 characters.
//
// Each push decodes the window of recent ids as a whole and returns what its text adds to what was
// already returned, so every decoder behaves as in decode(): SentencePiece chains drop the space
// before the first word, byte-fallback tokens ("<0xE4>" "<0xB8>" "<0xAD>") join into a character.
// Ids that end inside a character are held back by Tokenizer::decode_prefix until it completes.
// To keep each push O(1), the window is cut back to a few ids of context once it is long and
// nothing is held: those ids are decoded again with the new ones, and their own text (decoded
// alone, as the start of a text) is subtracted, so a rule that only applies at the start of a
// text changes both alike.
#include "io/tokenizer.h"

#include <algorithm>

namespace hybridlm {

namespace {
constexpr size_t kWindow = 8;      // ids decoded together before the window is cut back
constexpr size_t kMaxContext = 4;  // ids kept as context at most
}  // namespace

StreamDecoder::StreamDecoder(const Tokenizer& tok, bool skip_special_tokens)
    : tok_(&tok), skip_special_tokens_(skip_special_tokens) {}

std::string StreamDecoder::push(int32_t id) {
  tok_->token_bytes(id);  // validates id
  if (skip_special_tokens_ && tok_->is_special(id)) return {};
  window_.push_back(id);
  bool held = false;
  const std::string text = tok_->decode_prefix(window_, &held);
  std::string out = text.size() > emitted_ ? text.substr(emitted_) : std::string();
  emitted_ = std::max(emitted_, text.size());
  if (!held && window_.size() >= kWindow) {
    // The fewest last ids whose text is complete and not empty (a text that is empty on its own,
    // like a lone "▁" after the first-word rule, would let that rule reach the next id).
    for (size_t n = 1; n <= kMaxContext && n < window_.size(); ++n) {
      const std::span<const int32_t> context(window_.data() + window_.size() - n, n);
      bool context_held = false;
      const std::string context_text = tok_->decode_prefix(context, &context_held);
      if (context_held || context_text.empty()) continue;
      window_.erase(window_.begin(), window_.end() - static_cast<std::ptrdiff_t>(n));
      emitted_ = context_text.size();
      break;
    }
  }
  return out;
}

std::string StreamDecoder::flush() {
  // The end of the text: an unfinished character becomes U+FFFD; the next push starts a new text.
  const std::string text = window_.empty() ? std::string() : tok_->decode(window_);
  std::string out = text.size() > emitted_ ? text.substr(emitted_) : std::string();
  window_.clear();
  emitted_ = 0;
  return out;
}

}  // namespace hybridlm
