// Training a byte-level BPE tokenizer, as Hugging Face `tokenizers`' BpeTrainer does with the
// ByteLevel pre-tokenizer, and writing it as a `tokenizer.json` that Tokenizer::load (and the
// JavaScript reference @huggingface/tokenizers) reads.
//
// The algorithm:
//   1. text is cut on the special tokens (they are never part of a word), invalid UTF-8 becomes
//      U+FFFD, and each piece is split with GPT-2's regex and mapped byte by byte to GPT-2's
//      printable alphabet (the ByteLevel pre-tokenizer of tokenizer_pretok.cc, the one encode()
//      uses); each distinct pre-token is a "word" with a count;
//   2. the vocabulary starts as the special tokens (ids 0..), then the 256 byte symbols in code
//      point order;
//   3. every word is a sequence of symbols; the adjacent pair with the highest count (summed over
//      words, weighted by word count) is merged into a new symbol, ties going to the smallest
//      (left id, right id) as in the reference trainer; repeat until the vocabulary has
//      vocab_size entries, no pair is left, or the best count is below min_frequency.
// Pair counts are kept up to date per merge from the words that contain the merged pair (an index
// pair -> words), with a max-heap whose stale entries are skipped, so a merge costs the words it
// touches, not a recount of the corpus.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace hybridlm {

// Distinct pre-tokens (in the byte-level alphabet, "Ġthe") -> how often each occurs.
using BpeWordCounts = std::unordered_map<std::string, int64_t>;

// Step 1: cuts text into pre-tokens and counts them.
class BpeWordCounter {
 public:
  explicit BpeWordCounter(std::vector<std::string> special_tokens);
  ~BpeWordCounter();
  void add_text(std::string_view text);
  const BpeWordCounts& counts() const { return counts_; }
  int64_t total_words() const { return total_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::vector<std::string> specials_;
  BpeWordCounts counts_;
  int64_t total_ = 0;
};

struct BpeTrainOptions {
  int vocab_size = 8192;      // including the special tokens
  int64_t min_frequency = 2;  // a pair seen fewer times is never merged
  std::vector<std::string> special_tokens;
};

struct BpeModelData {
  std::vector<std::string> vocab;                             // id -> token (byte-level alphabet)
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order
  int num_special = 0;                                        // ids [0, num_special) are the specials
};

// The 256 byte symbols in the order training gives them ids: code point order.
std::vector<std::string> bpe_initial_alphabet();

// Steps 2 and 3. Throws Error when vocab_size is below 256 + the special tokens.
BpeModelData train_bpe(const BpeWordCounts& words, const BpeTrainOptions& options);

// tokenizer.json text: model BPE, pre-tokenizer / decoder / post-processor ByteLevel, the special
// tokens as added tokens with "special": true.
std::string bpe_tokenizer_json(const BpeModelData& model);
// tokenizer_config.json text: the first special token as eos_token (none without special tokens).
std::string bpe_tokenizer_config_json(const BpeModelData& model);

}  // namespace hybridlm
