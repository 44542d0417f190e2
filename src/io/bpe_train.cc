// Byte-level BPE training (src/io/bpe_train.h). Reference for the algorithm and the file format:
// Hugging Face tokenizers' BpeTrainer (tokenizers/src/models/bpe/trainer.rs) and
// https://huggingface.co/docs/tokenizers/api/trainers#tokenizers.trainers.BpeTrainer
#include "io/bpe_train.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <queue>

#include "base/error.h"
#include "io/tokenizer_internal.h"

namespace hybridlm {

using tokenizer_detail::byte_to_unicode;

struct BpeWordCounter::Impl {
  std::unique_ptr<tokenizer_detail::PreTokenizer> pre;
};

BpeWordCounter::BpeWordCounter(std::vector<std::string> special_tokens)
    : impl_(std::make_unique<Impl>()), specials_(std::move(special_tokens)) {
  const nlohmann::json cfg = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  impl_->pre = tokenizer_detail::make_pre_tokenizer(cfg, "bpe trainer");
  std::erase_if(specials_, [](const std::string& s) { return s.empty(); });
}

BpeWordCounter::~BpeWordCounter() = default;

void BpeWordCounter::add_text(std::string_view raw) {
  const std::string text = tokenizer_detail::utf8_sanitize(raw);
  // The text between special tokens (leftmost, then longest match), as encode() cuts it.
  std::vector<std::string> pieces;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t best = std::string::npos, best_len = 0;
    for (const std::string& s : specials_) {
      const size_t at = text.find(s, pos);
      if (at != std::string::npos && (at < best || (at == best && s.size() > best_len))) {
        best = at;
        best_len = s.size();
      }
    }
    const size_t end = best == std::string::npos ? text.size() : best;
    if (end > pos) pieces.push_back(text.substr(pos, end - pos));
    if (best == std::string::npos) break;
    pos = best + best_len;
  }
  impl_->pre->apply(pieces, /*first_section=*/true);  // ByteLevel: no sections
  for (std::string& w : pieces) {
    ++counts_[std::move(w)];
    ++total_;
  }
}

std::vector<std::string> bpe_initial_alphabet() {
  std::vector<std::pair<char32_t, std::string>> syms;
  for (const std::string& s : byte_to_unicode()) syms.emplace_back(tokenizer_detail::utf8_to_u32(s).at(0), s);
  std::sort(syms.begin(), syms.end());
  std::vector<std::string> out;
  for (auto& [cp, s] : syms) out.push_back(std::move(s));
  return out;
}

namespace {

uint64_t pair_key(int32_t a, int32_t b) { return static_cast<uint64_t>(a) << 32 | static_cast<uint32_t>(b); }
int32_t left_of(uint64_t k) { return static_cast<int32_t>(k >> 32); }
int32_t right_of(uint64_t k) { return static_cast<int32_t>(k & 0xffffffffu); }

struct Word {
  std::vector<int32_t> sym;
  int64_t count;
};

// A heap entry: valid while `count` is still the pair's count. The top is the highest count and,
// among equal counts, the smallest key, i.e. the smallest (left id, right id).
struct Candidate {
  int64_t count;
  uint64_t key;
  bool operator<(const Candidate& o) const { return count != o.count ? count < o.count : key > o.key; }
};

}  // namespace

BpeModelData train_bpe(const BpeWordCounts& words_in, const BpeTrainOptions& opt) {
  BpeModelData m;
  const int need = 256 + static_cast<int>(opt.special_tokens.size());
  check(opt.vocab_size >= need, "vocab size ", opt.vocab_size, " is below the ", need,
        " tokens it must hold (256 byte symbols + ", opt.special_tokens.size(), " special tokens)");
  std::unordered_map<std::string, int32_t> ids;
  const auto add_token = [&](const std::string& t) {
    const auto [it, fresh] = ids.emplace(t, static_cast<int32_t>(m.vocab.size()));
    if (fresh) m.vocab.push_back(t);
    return it->second;
  };
  for (const std::string& s : opt.special_tokens) add_token(s);
  m.num_special = static_cast<int>(m.vocab.size());
  for (const std::string& s : bpe_initial_alphabet()) add_token(s);

  // Words in a fixed order (sorted), so that nothing depends on hash-map iteration.
  std::vector<const std::pair<const std::string, int64_t>*> sorted;
  sorted.reserve(words_in.size());
  for (const auto& kv : words_in) sorted.push_back(&kv);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->first < b->first; });
  std::vector<Word> words;
  words.reserve(sorted.size());
  for (const auto* kv : sorted) {
    Word w{{}, kv->second};
    const std::string& s = kv->first;
    for (size_t i = 0; i < s.size();) {
      const size_t len = tokenizer_detail::utf8_read(s, i).len;
      w.sym.push_back(ids.at(s.substr(i, len)));  // every character is a byte symbol
      i += len;
    }
    words.push_back(std::move(w));
  }

  // pair -> count over all words; pair -> words that may contain it (may hold stale entries and
  // repeats; checked when used).
  std::unordered_map<uint64_t, int64_t> count;
  std::unordered_map<uint64_t, std::vector<uint32_t>> where;
  for (uint32_t wi = 0; wi < words.size(); ++wi) {
    const Word& w = words[wi];
    for (size_t i = 0; i + 1 < w.sym.size(); ++i) {
      const uint64_t k = pair_key(w.sym[i], w.sym[i + 1]);
      count[k] += w.count;
      std::vector<uint32_t>& in = where[k];
      if (in.empty() || in.back() != wi) in.push_back(wi);
    }
  }
  std::priority_queue<Candidate> heap;
  for (const auto& [k, c] : count) heap.push({c, k});

  std::unordered_map<uint64_t, int64_t> delta;
  while (static_cast<int>(m.vocab.size()) < opt.vocab_size) {
    while (!heap.empty()) {
      const Candidate top = heap.top();
      const auto it = count.find(top.key);
      if (it != count.end() && it->second == top.count && top.count > 0) break;
      heap.pop();  // stale: the count changed since this entry was pushed
    }
    if (heap.empty() || heap.top().count < std::max<int64_t>(opt.min_frequency, 1)) break;
    const uint64_t best = heap.top().key;
    heap.pop();
    const int32_t a = left_of(best), b = right_of(best);
    const int32_t merged = add_token(m.vocab[a] + m.vocab[b]);
    m.merges.emplace_back(m.vocab[a], m.vocab[b]);

    std::vector<uint32_t> touched = std::move(where[best]);
    where.erase(best);
    std::sort(touched.begin(), touched.end());
    touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
    delta.clear();
    for (uint32_t wi : touched) {
      Word& w = words[wi];
      std::vector<int32_t>& s = w.sym;
      // Remove the word's pairs, merge left to right without overlaps, add its pairs back.
      for (size_t i = 0; i + 1 < s.size(); ++i) delta[pair_key(s[i], s[i + 1])] -= w.count;
      size_t out = 0;
      for (size_t i = 0; i < s.size(); ++i) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
          s[out++] = merged;
          ++i;
        } else {
          s[out++] = s[i];
        }
      }
      s.resize(out);
      for (size_t i = 0; i + 1 < s.size(); ++i) {
        const uint64_t k = pair_key(s[i], s[i + 1]);
        delta[k] += w.count;
        std::vector<uint32_t>& in = where[k];
        if (in.empty() || in.back() != wi) in.push_back(wi);
      }
    }
    for (const auto& [k, d] : delta) {
      if (d == 0) continue;
      int64_t& c = count[k];
      c += d;
      if (c > 0) heap.push({c, k});
      else count.erase(k);
    }
  }
  return m;
}

std::string bpe_tokenizer_json(const BpeModelData& m) {
  using ojson = nlohmann::ordered_json;
  ojson added = ojson::array();
  for (int i = 0; i < m.num_special; ++i) {
    added.push_back({{"id", i},
                     {"content", m.vocab[i]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  const auto byte_level = [](bool prefix, bool trim) {
    return ojson{{"type", "ByteLevel"}, {"add_prefix_space", prefix}, {"trim_offsets", trim}, {"use_regex", true}};
  };
  ojson vocab = ojson::object();
  for (size_t i = 0; i < m.vocab.size(); ++i) vocab[m.vocab[i]] = i;
  ojson merges = ojson::array();
  for (const auto& [l, r] : m.merges) merges.push_back({l, r});
  const ojson model = {{"type", "BPE"},
                       {"dropout", nullptr},
                       {"unk_token", nullptr},
                       {"continuing_subword_prefix", nullptr},
                       {"end_of_word_suffix", nullptr},
                       {"fuse_unk", false},
                       {"byte_fallback", false},
                       {"ignore_merges", false},
                       {"vocab", vocab},
                       {"merges", merges}};
  const ojson j = {{"version", "1.0"},
                   {"truncation", nullptr},
                   {"padding", nullptr},
                   {"added_tokens", added},
                   {"normalizer", nullptr},
                   {"pre_tokenizer", byte_level(false, true)},
                   {"post_processor", byte_level(true, false)},
                   {"decoder", byte_level(true, true)},
                   {"model", model}};
  return j.dump(2) + "\n";
}

std::string bpe_tokenizer_config_json(const BpeModelData& m) {
  nlohmann::ordered_json j = {{"tokenizer_class", "PreTrainedTokenizerFast"}};
  if (m.num_special > 0) j["eos_token"] = m.vocab[0];
  return j.dump(2) + "\n";
}

}  // namespace hybridlm
