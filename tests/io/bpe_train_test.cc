// BPE training (src/io/bpe_train.h) against a slow, obviously correct trainer written here: it
// recounts every pair over every word before each merge. Both start from the same word counts,
// so the merges must be identical, rank for rank.
#include "io/bpe_train.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "io/tokenizer.h"

namespace hybridlm {
namespace {

using Merges = std::vector<std::pair<std::string, std::string>>;

// The oracle: a full recount per merge; the highest count wins, ties to the smallest
// (left id, right id); ids as train_bpe gives them (specials, then the byte symbols in code point
// order, then merged tokens in order, a string seen before keeping its id).
Merges naive_train(const BpeWordCounts& counts, const BpeTrainOptions& opt) {
  std::vector<std::string> vocab = opt.special_tokens;
  for (const std::string& s : bpe_initial_alphabet()) vocab.push_back(s);
  std::map<std::string, int> id;
  for (size_t i = 0; i < vocab.size(); ++i) id.emplace(vocab[i], static_cast<int>(i));
  std::vector<std::pair<std::vector<int>, int64_t>> words;
  for (const auto& [w, c] : counts) {
    std::vector<int> syms;
    for (size_t i = 0; i < w.size();) {
      const unsigned char b = static_cast<unsigned char>(w[i]);
      const size_t len = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
      syms.push_back(id.at(w.substr(i, len)));
      i += len;
    }
    words.emplace_back(syms, c);
  }
  Merges merges;
  while (static_cast<int>(vocab.size()) < opt.vocab_size) {
    std::map<std::pair<int, int>, int64_t> pairs;  // ordered: the first of equal counts is the smallest
    for (const auto& [syms, c] : words)
      for (size_t i = 0; i + 1 < syms.size(); ++i) pairs[{syms[i], syms[i + 1]}] += c;
    std::pair<int, int> best{-1, -1};
    int64_t best_count = 0;
    for (const auto& [p, c] : pairs)
      if (c > best_count) {
        best = p;
        best_count = c;
      }
    if (best_count < opt.min_frequency || best_count == 0) break;
    const std::string merged = vocab[best.first] + vocab[best.second];
    if (!id.count(merged)) {
      id.emplace(merged, static_cast<int>(vocab.size()));
      vocab.push_back(merged);
    }
    merges.emplace_back(vocab[best.first], vocab[best.second]);
    for (auto& [syms, c] : words) {
      std::vector<int> out;
      for (size_t i = 0; i < syms.size(); ++i) {
        if (i + 1 < syms.size() && syms[i] == best.first && syms[i + 1] == best.second) {
          out.push_back(id.at(merged));
          ++i;
        } else {
          out.push_back(syms[i]);
        }
      }
      syms = out;
    }
  }
  return merges;
}

BpeWordCounts count(const std::string& text, const std::vector<std::string>& specials) {
  BpeWordCounter counter(specials);
  counter.add_text(text);
  return counter.counts();
}

TEST(BpeTrain, FirstMergesByHand) {
  // Pairs (l,o) and (o,w) both occur 7 times; the tie goes to the smaller ids: 'l' < 'o'.
  const BpeWordCounts words = count("low low low lower lowest newer wider new new low low", {});
  EXPECT_EQ(words.at("low"), 1);
  EXPECT_EQ(words.at("\xC4\xA0low"), 4);  // "Ġlow": the space joins the word after it
  const BpeModelData m = train_bpe(words, {256 + 2, 1, {}});
  ASSERT_EQ(m.merges.size(), 2u);
  EXPECT_EQ(m.merges[0], std::make_pair(std::string("l"), std::string("o")));
  EXPECT_EQ(m.merges[1], std::make_pair(std::string("lo"), std::string("w")));
  EXPECT_EQ(m.vocab.back(), "low");
}

TEST(BpeTrain, MatchesNaiveTrainer) {
  const std::string text =
      "The quick brown fox jumps over the lazy dog. The dog sleeps; the fox doesn't.\n\n"
      "aaaa aaa aa a abab ababab  \t spaces   and\nnewlines\n\n ünïcödé naïve café 日本語日本 🎉🎉 "
      "<|endoftext|>It's 2024, isn't it? We'll see: 12345 1234 123.\n";
  for (int64_t min_freq : {1, 2}) {
    const BpeTrainOptions opt{256 + 1 + 80, min_freq, {"<|endoftext|>"}};
    const BpeWordCounts words = count(text, opt.special_tokens);
    EXPECT_EQ(words.count("<|endoftext|>"), 0u) << "a special token is never part of a word";
    const BpeModelData m = train_bpe(words, opt);
    const Merges expected = naive_train(words, opt);
    ASSERT_GE(expected.size(), min_freq == 1 ? 80u : 10u);
    EXPECT_EQ(m.merges, expected) << "min_frequency " << min_freq;
    EXPECT_EQ(m.num_special, 1);
    EXPECT_EQ(m.vocab[0], "<|endoftext|>");
  }
}

TEST(BpeTrain, RefusesTooSmallVocab) {
  EXPECT_THROW(train_bpe(count("abc", {}), {256, 1, {"<|endoftext|>"}}), Error);
  EXPECT_NO_THROW(train_bpe(count("abc", {}), {256, 1, {}}));
}

// What train_bpe writes, Tokenizer::load reads, and encode/decode round-trip through it.
TEST(BpeTrain, WrittenTokenizerLoadsAndRoundTrips) {
  const std::string text = "to be or not to be, that is the question: whether 'tis nobler in the mind";
  const BpeTrainOptions opt{300, 1, {"<|endoftext|>"}};
  const BpeModelData m = train_bpe(count(text, opt.special_tokens), opt);
  const std::string dir = ::testing::TempDir() + "/bpe_train_test_tok";
  std::filesystem::create_directories(dir);
  {
    std::ofstream(dir + "/tokenizer.json") << bpe_tokenizer_json(m);
    std::ofstream(dir + "/tokenizer_config.json") << bpe_tokenizer_config_json(m);
  }
  const Tokenizer tok = Tokenizer::load(dir);
  EXPECT_EQ(tok.vocab_size(), static_cast<int32_t>(m.vocab.size()));
  EXPECT_EQ(tok.eos_id(), 0);
  for (const std::string s : {"to be or not", "the question<|endoftext|>x", "ünï 🎉  \n\t"}) {
    const std::vector<int32_t> ids = tok.encode(s);
    EXPECT_EQ(tok.decode(ids), s);
  }
  EXPECT_EQ(tok.encode("<|endoftext|>"), std::vector<int32_t>{0});
  EXPECT_EQ(tok.encode(" the").size(), 1u);  // learned: " the" occurs twice
}

}  // namespace
}  // namespace hybridlm
