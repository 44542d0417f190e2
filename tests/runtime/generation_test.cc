// Generation over several sequences: a left-padded transformers-style batch gives the tokens of
// unpadded runs, batched generation gives each prompt's solo tokens, and beam search (built on
// HybridCache::reorder) reports log-probabilities that an independent scoring pass reproduces.
#include <gtest/gtest.h>

#include "numerics.h"

#include <cmath>
#include <cstdlib>
#include <random>

#include "base/error.h"
#include "runtime/batch.h"

namespace hybridlm {
namespace {

std::filesystem::path fixture(const char* name) {
  const char* d = std::getenv("HYBRIDLM_TEST_MODELS");
  if (!d) throw std::runtime_error("HYBRIDLM_TEST_MODELS is not set (run through ctest)");
  return std::filesystem::path(d) / name;
}

std::vector<int32_t> random_ids(int n, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> ids(n);
  for (auto& v : ids) v = static_cast<int32_t>(rng() % vocab);
  return ids;
}

EngineOptions opts(int seqs) {
  EngineOptions o;
  o.threads = 2;
  o.max_sequences = seqs;
  return o;
}

SamplingParams greedy() {
  SamplingParams p;
  p.temperature = 0;
  return p;
}

const char* kModels[] = {"mamba1", "mamba2_g2", "hybridlm", "hybridlm_var", "jamba", "bamba", "lfm2", "nemotron_h", "granite", "falcon_h1", "zamba2",
                          "lfm2_moe", "zamba"};

class Generation : public ::testing::TestWithParam<const char*> {};

TEST_P(Generation, LeftPaddedBatchEqualsEachPromptAlone) {
  Engine e(fixture(GetParam()), opts(4));
  const int V = e.vocab_size();
  const std::vector<std::vector<int32_t>> prompts = {random_ids(9, V, 1), random_ids(2, V, 2), random_ids(17, V, 3)};
  // transformers-style: pad every row on the left to the longest + 32 pads, mask 0 on pads.
  const size_t L = 17 + 32;
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::vector<int>> mask;
  for (const auto& p : prompts) {
    std::vector<int32_t> row(L - p.size(), 7);  // pad id 7: any id must do
    row.insert(row.end(), p.begin(), p.end());
    std::vector<int> m(L - p.size(), 0);
    m.resize(L, 1);
    ids.push_back(row);
    mask.push_back(m);
  }
  BatchGenerateOptions go;
  go.max_new_tokens = 12;
  go.sampling = greedy();
  const auto batched = generate_batch(e, strip_left_padding(ids, mask), go);
  for (size_t b = 0; b < prompts.size(); ++b) {
    const auto alone = generate_batch(e, {prompts[b]}, go);
    EXPECT_EQ(batched[b], alone[0]) << "prompt " << b;
  }
  EXPECT_EQ(e.cache().live_sequences(), 0);
  // Sampling too: sequence b of a batch draws with seed + b.
  go.sampling = SamplingParams{};
  go.sampling.seed = 11;
  const auto sampled = generate_batch(e, prompts, go);
  go.sampling.seed = 12;
  EXPECT_EQ(generate_batch(e, {prompts[1]}, go)[0], sampled[1]);
}

// Sum of log-softmax of `gen` after `prompt`, from one fresh prefill of everything.
double logprob_of(Engine& e, const std::vector<int32_t>& prompt, const std::vector<int32_t>& gen) {
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), gen.begin(), gen.end());
  const int s = e.new_sequence();
  const std::vector<float> l = e.prefill(s, all, true);
  e.free_sequence(s);
  const int V = e.vocab_size();
  double total = 0;
  for (size_t i = 0; i < gen.size(); ++i) {
    const float* row = l.data() + (prompt.size() - 1 + i) * V;
    double mx = row[0], sum = 0;
    for (int v = 0; v < V; ++v) mx = std::max<double>(mx, row[v]);
    for (int v = 0; v < V; ++v) sum += std::exp(row[v] - mx);
    total += row[gen[i]] - mx - std::log(sum);
  }
  return total;
}

TEST_P(Generation, BeamSearchScoresMatchAnIndependentPassAndOneBeamIsGreedy) {
  Engine e(fixture(GetParam()), opts(4));
  const int V = e.vocab_size();
  const auto prompt = random_ids(11, V, 5);
  BeamOptions bo;
  bo.num_beams = 1;
  bo.max_new_tokens = 10;
  const auto one = beam_search(e, prompt, bo);
  BatchGenerateOptions go;
  go.max_new_tokens = 10;
  go.sampling = greedy();
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].tokens, generate_batch(e, {prompt}, go)[0]);

  bo.num_beams = 4;
  const auto beams = beam_search(e, prompt, bo);
  ASSERT_EQ(beams.size(), 4u);
  EXPECT_EQ(e.cache().live_sequences(), 0);
  for (size_t i = 0; i < beams.size(); ++i) {
    SCOPED_TRACE("beam " + std::to_string(i));
    ASSERT_EQ(beams[i].tokens.size(), 10u);
    EXPECT_NEAR(beams[i].logprob, logprob_of(e, prompt, beams[i].tokens), tol::kBeamLogprob);
    if (i) {
      EXPECT_GE(beams[i - 1].score, beams[i].score);
    }
    for (size_t j = 0; j < i; ++j) EXPECT_NE(beams[i].tokens, beams[j].tokens) << "beams must differ";
  }
  // Ids past the tokenizer are never chosen.
  BeamOptions limited = bo;
  limited.decodable = V / 3;
  for (const BeamHypothesis& h : beam_search(e, prompt, limited))
    for (int32_t t : h.tokens) EXPECT_LT(t, V / 3);
  // With an end-of-sequence id, finished hypotheses end with it. The streamed (settled) tokens
  // are the best hypothesis without its eos, whether or not it finished.
  for (int num_beams : {4, 3}) {
    BeamOptions b = bo;
    b.num_beams = num_beams;
    b.eos_id = beams[0].tokens[2];
    std::vector<int32_t> streamed;
    const auto hyps = beam_search(e, prompt, b, [&](int32_t t) { streamed.push_back(t); });
    for (const BeamHypothesis& h : hyps) {
      for (size_t t = 0; t + 1 < h.tokens.size(); ++t) EXPECT_NE(h.tokens[t], *b.eos_id);
      EXPECT_NEAR(h.logprob, logprob_of(e, prompt, h.tokens), tol::kBeamLogprob);
    }
    std::vector<int32_t> best = hyps.front().tokens;
    if (!best.empty() && best.back() == *b.eos_id) best.pop_back();
    EXPECT_EQ(streamed, best);
  }
  std::vector<int32_t> streamed;
  EXPECT_EQ(beam_search(e, prompt, bo, [&](int32_t t) { streamed.push_back(t); }).front().tokens, beams[0].tokens);
  EXPECT_EQ(streamed, beams[0].tokens);
  // -n 0: one empty hypothesis, nothing streamed.
  bo.max_new_tokens = 0;
  const auto none = beam_search(e, prompt, bo, [&](int32_t) { ADD_FAILURE() << "a token streamed at -n 0"; });
  ASSERT_EQ(none.size(), 1u);
  EXPECT_TRUE(none[0].tokens.empty());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Generation, ::testing::ValuesIn(kModels));

TEST(PaddedBatch, OnlyLeftPaddingIsAccepted) {
  EXPECT_EQ(strip_left_padding({{0, 0, 5, 6}, {1, 2, 3, 4}}, {{0, 0, 1, 1}, {1, 1, 1, 1}}),
            (std::vector<std::vector<int32_t>>{{5, 6}, {1, 2, 3, 4}}));
  auto error_of = [](const std::vector<std::vector<int32_t>>& ids, const std::vector<std::vector<int>>& mask) {
    try {
      strip_left_padding(ids, mask);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(error_of({{5, 6, 0}}, {{1, 1, 0}}).find("row 0: attention mask must be 0...0 1...1 (left padding), found 0 at position 2"),
            std::string::npos);
  EXPECT_NE(error_of({{5, 0, 6}}, {{1, 0, 1}}).find("found 0 at position 1"), std::string::npos);
  EXPECT_NE(error_of({{0, 0}}, {{0, 0}}).find("has no token"), std::string::npos);
  EXPECT_NE(error_of({{1, 2}}, {{1}}).find("differ in length"), std::string::npos);
  EXPECT_NE(error_of({{1, 2}}, {}).find("1 rows of ids but 0 rows"), std::string::npos);
}

}  // namespace
}  // namespace hybridlm
