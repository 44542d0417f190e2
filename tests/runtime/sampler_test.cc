// Sampling filters against hand-computed distributions, the penalties against a plain loop written
// from their formulas, and the stop-string holdback.
#include <gtest/gtest.h>

#include "numerics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>

#include "base/error.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"

namespace hybridlm {
namespace {

std::map<int, int> histogram(SamplingParams p, const std::vector<float>& logits, int draws,
                             const std::vector<int32_t>& history = {}) {
  Sampler s(p);
  std::map<int, int> h;
  for (int i = 0; i < draws; ++i) {
    std::vector<float> l = logits;
    ++h[s.sample(l, history)];
  }
  return h;
}

// Sampling parameters with the four filters set; the rest at their defaults.
SamplingParams filters(float temperature, int top_k, float top_p, float min_p) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  return p;
}

TEST(Sampler, GreedyTakesTheFirstMaximum) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p);
  std::vector<float> l = {0.1f, 3.0f, -1.0f, 3.0f};
  EXPECT_EQ(s.sample(l, {}), 1);
}

TEST(Sampler, TopKKeepsOnlyKTokensWithSoftmaxWeights) {
  const SamplingParams p = filters(1, 2, 1, 0);
  // p(0) : p(1) = e^2 : e^1 among the top 2; token 2 never drawn.
  auto h = histogram(p, {2.0f, 1.0f, 0.5f, -3.0f}, 20000);
  EXPECT_EQ(h.count(2) + h.count(3), 0u);
  const double expected = std::exp(2.0) / (std::exp(2.0) + std::exp(1.0));
  EXPECT_NEAR(h[0] / 20000.0, expected, tol::kSampleFrequency);
}

TEST(Sampler, TemperatureDividesTheLogits) {
  const SamplingParams p = filters(0.5f, 0, 1, 0);
  // At T = 0.5, p(0) : p(1) = e^(2/0.5) : e^(1/0.5) = e^4 : e^2.
  auto h = histogram(p, {2.0f, 1.0f}, 20000);
  EXPECT_NEAR(h[0] / 20000.0, std::exp(4.0) / (std::exp(4.0) + std::exp(2.0)), tol::kSampleFrequency);
}

TEST(Sampler, TinyTemperatureActsGreedyAndNaNIsAnError) {
  SamplingParams p;
  p.temperature = 1e-38f;  // (l - max) / T overflows to -inf for all but the maximum: no NaN
  p.top_k = 0;
  p.min_p = 0;
  auto h = histogram(p, {0.5f, 3.0f, 2.9f}, 50);
  EXPECT_EQ(h[1], 50);
  Sampler s(p);
  std::vector<float> l = {1.0f, std::nanf(""), 0.0f};
  EXPECT_THROW(s.sample(l, {}), Error);
  std::vector<float> none(3, -std::numeric_limits<float>::infinity());
  EXPECT_THROW(s.sample(none, {}), Error);
}

TEST(Sampler, TopPAndMinPCutTheTail) {
  SamplingParams p;
  p.temperature = 1;
  p.top_k = 0;
  p.min_p = 0;
  p.top_p = 0.5f;  // probabilities ~ (0.665, 0.245, 0.09): top-p 0.5 keeps only token 0
  auto h = histogram(p, {2.0f, 1.0f, 0.0f}, 500);
  EXPECT_EQ(h[0], 500);
  p.top_p = 1;
  p.min_p = 0.3f;  // keep p >= 0.3 * 0.665 = 0.2: tokens 0 and 1
  h = histogram(p, {2.0f, 1.0f, 0.0f}, 5000);
  EXPECT_EQ(h.count(2), 0u);
  EXPECT_GT(h[1], 0);
}

// Top-k finds the k-th largest logit and sorts only the ids at or above it: ties at that value
// still go to the lower ids, as a sort of the whole vocabulary by (logit, id) would give them.
TEST(Sampler, TopKBreaksTiesAtTheKthLogitByLowerId) {
  const SamplingParams p = filters(1, 3, 1, 0);
  std::vector<float> logits(100, 0.0f);
  logits[50] = 1.0f;
  logits[7] = -1.0f;
  auto h = histogram(p, logits, 6000);
  std::map<int, int> only;
  for (auto [id, n] : h) only[id] = id == 50 || id == 0 || id == 1 ? 0 : n;
  for (auto [id, n] : only) EXPECT_EQ(n, 0) << "id " << id << " drawn outside the top 3";
  // p(50) = e / (e + 2)
  EXPECT_NEAR(h[50] / 6000.0, std::exp(1.0) / (std::exp(1.0) + 2), tol::kSampleFrequency);
}

// Without top-k, top-p keeps the shortest head of the whole vocabulary (most likely first) whose
// mass reaches p, found by selection rather than a sort of all ids; here the head (231 of 2000
// ids, shuffled) spans more than one selection block. The expected head is taken from a plain
// sort of the probabilities in double.
TEST(Sampler, TopPWithoutTopKKeepsTheHeadOfTheWholeVocabulary) {
  const int V = 2000;
  std::vector<int> perm(V);
  for (int i = 0; i < V; ++i) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), std::mt19937(3));
  std::vector<float> logits(V);
  for (int r = 0; r < V; ++r) logits[perm[r]] = -0.01f * static_cast<float>(r);  // rank r: p ~ e^(-0.01 r)
  std::vector<double> prob(V);
  double sum = 0;
  for (int i = 0; i < V; ++i) sum += prob[i] = std::exp(static_cast<double>(logits[i]));
  std::vector<int> order(V);
  for (int i = 0; i < V; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](int a, int b) { return prob[a] > prob[b]; });
  const double top_p = 0.9;
  int head = 0;
  double cum = 0, before = 0;
  while (cum < top_p) before = cum, cum += prob[order[head++]] / sum;
  ASSERT_GT(head, 64);                                 // more than the first selection block
  ASSERT_TRUE(before < top_p - 1e-4 && cum > top_p + 1e-4);  // the boundary is not a rounding call
  SamplingParams p = filters(1, 0, static_cast<float>(top_p), 0);
  const int draws = 20000;
  auto h = histogram(p, logits, draws);
  std::vector<bool> kept(V, false);
  double first_half = 0;
  for (int r = 0; r < head; ++r) {
    kept[order[r]] = true;
    if (r < head / 2) first_half += prob[order[r]] / sum / cum;
  }
  int outside = 0, in_first_half = 0;
  for (auto [id, n] : h) {
    outside += kept[id] ? 0 : n;
    for (int r = 0; r < head / 2; ++r) in_first_half += order[r] == id ? n : 0;
  }
  EXPECT_EQ(outside, 0);
  EXPECT_NEAR(in_first_half / static_cast<double>(draws), first_half, tol::kSampleFrequency);
  // With min-p as well: ids below min_p times the top probability go first (e^(-0.01 r) >= 0.5:
  // ranks 0 .. 69), then top-p over what is left.
  p.min_p = 0.5f;
  h = histogram(p, logits, 2000);
  for (auto [id, n] : h) {
    const int rank = static_cast<int>(std::find(perm.begin(), perm.end(), id) - perm.begin());
    EXPECT_LE(rank, 69) << "id " << id << " of rank " << rank << " is below min-p";
  }
}

TEST(Sampler, SameSeedSameDrawsAndRepetitionPenalty) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 42;
  const std::vector<float> logits = {1.0f, 1.1f, 0.9f, 1.05f, 0.3f};
  std::vector<int> a, b;
  for (auto* out : {&a, &b}) {
    Sampler s(p);
    for (int i = 0; i < 50; ++i) {
      std::vector<float> l = logits;
      out->push_back(s.sample(l, {}));
    }
  }
  EXPECT_EQ(a, b);
  // HF semantics: positive logits divided, negative multiplied, once per distinct token.
  SamplingParams g;
  g.temperature = 0;
  g.repetition_penalty = 2.0f;
  Sampler s(g);
  std::vector<float> l = {3.0f, 2.0f, -1.0f};
  EXPECT_EQ(s.sample(l, std::vector<int32_t>{0, 0, 2}), 1);
  EXPECT_FLOAT_EQ(l[0], 1.5f);
  EXPECT_FLOAT_EQ(l[2], -2.0f);
}

// The penalized logits, from the formulas (sampler.h) in double, one token at a time: count the
// token in the window (the last `last_n` ids of history; -1 = all of it, 0 = none).
std::vector<double> penalized_naive(const std::vector<float>& logits, const std::vector<int32_t>& history,
                                    const SamplingParams& p) {
  std::vector<double> out(logits.begin(), logits.end());
  const size_t n = history.size();
  const size_t from = p.repeat_last_n < 0 ? 0 : n - std::min(n, static_cast<size_t>(p.repeat_last_n));
  for (size_t v = 0; v < out.size(); ++v) {
    int c = 0;
    for (size_t i = from; i < n; ++i) c += history[i] == static_cast<int32_t>(v);
    if (c == 0) continue;
    out[v] = out[v] > 0 ? out[v] / p.repetition_penalty : out[v] * p.repetition_penalty;
    out[v] -= p.presence_penalty + p.frequency_penalty * c;
  }
  return out;
}

TEST(Sampler, PenaltiesMatchTheFormulasOverTheWindow) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> logit(-5.0f, 5.0f);
  std::uniform_int_distribution<int32_t> id(0, 19);  // V = 24: ids 20..23 never seen
  const int V = 24;
  struct Case {
    float rep, presence, frequency;
    int last_n;
  };
  const Case cases[] = {{1.3f, 0.0f, 0.0f, 64},  {1.0f, 0.7f, 0.0f, 64},   {1.0f, 0.0f, 0.45f, 64},
                        {1.7f, -1.2f, 2.0f, 16}, {0.8f, 2.0f, -2.0f, -1},  {1.5f, 1.0f, 1.0f, 0},
                        {1.1f, 0.3f, 0.2f, 1},   {1.2f, 0.5f, 0.25f, 1000}};
  for (const Case& c : cases)
    for (int trial = 0; trial < 20; ++trial) {
      SamplingParams p;
      p.temperature = 0;  // greedy: sample() leaves the penalized logits in place
      p.repetition_penalty = c.rep;
      p.presence_penalty = c.presence;
      p.frequency_penalty = c.frequency;
      p.repeat_last_n = c.last_n;
      std::vector<float> l(V);
      for (float& x : l) x = logit(rng);
      std::vector<int32_t> history(5 + trial * 7);
      for (int32_t& t : history) t = id(rng);
      const std::vector<double> want = penalized_naive(l, history, p);
      Sampler s(p);
      std::vector<float> got = l;
      const int32_t pick = s.sample(got, history);
      // The sampler's state (its counts) is reset between calls: a second call agrees too.
      std::vector<float> again = l;
      s.sample(again, history);
      for (int v = 0; v < V; ++v) {
        EXPECT_NEAR(got[v], want[v], tol::kPenaltyVsF64 * std::max(1.0, std::abs(want[v])))
            << "rep " << c.rep << " presence " << c.presence << " frequency " << c.frequency << " last_n "
            << c.last_n << " token " << v;
        EXPECT_EQ(again[v], got[v]);
      }
      EXPECT_EQ(pick, std::max_element(got.begin(), got.end()) - got.begin());
    }
}

TEST(Sampler, PresencePenaltySteersGreedyAwayFromASeenToken) {
  SamplingParams p;
  p.temperature = 0;
  p.presence_penalty = 1.0f;
  p.repeat_last_n = 2;
  Sampler s(p);
  std::vector<float> l = {2.0f, 1.5f, 0.0f};
  EXPECT_EQ(s.sample(l, std::vector<int32_t>{2, 0}), 1);  // 0 is in the window: 2 - 1 < 1.5
  l = {2.0f, 1.5f, 0.0f};
  EXPECT_EQ(s.sample(l, std::vector<int32_t>{0, 2, 2}), 0);  // 0 fell out of the last 2
}

TEST(Sampler, RejectsBadParameters) {
  SamplingParams p;
  p.top_p = 0;
  EXPECT_THROW(validate(p), Error);
  p = {};
  p.temperature = -1;
  EXPECT_THROW(validate(p), Error);
  for (float t : {std::numeric_limits<float>::infinity(), std::nanf("")}) {
    p = {};
    p.temperature = t;
    EXPECT_THROW(validate(p), Error);
  }
  p = {};
  p.repeat_last_n = -2;
  EXPECT_THROW(validate(p), Error);
  for (float v : {2.5f, -2.01f, std::nanf("")}) {
    p = {};
    p.presence_penalty = v;
    EXPECT_THROW(validate(p), Error);
    p = {};
    p.frequency_penalty = v;
    EXPECT_THROW(validate(p), Error);
  }
  p = {};
  p.presence_penalty = -2;
  p.frequency_penalty = 2;
  p.repeat_last_n = -1;
  EXPECT_NO_THROW(validate(p));
}

TEST(StopMatcher, HoldsBackPossiblePrefixesAndCutsAtTheStop) {
  StopMatcher m({"\n\nUser:", "END"});
  std::string out;
  out += m.push("Hello");
  out += m.push(" wor");
  out += m.push("ld\n");
  EXPECT_EQ(out, "Hello world");  // "\n" might start a stop string: held back
  out += m.push("\nUs");
  EXPECT_EQ(out, "Hello world");
  out += m.push("er: hi");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(out, "Hello world");
  StopMatcher n({"END"});
  std::string o = n.push("the EN");
  o += n.push("D? no, ENDING");
  EXPECT_TRUE(n.stopped());
  EXPECT_EQ(o, "the ");
  // The earliest match over all stop strings wins, whatever their order in the list.
  StopMatcher e({"b", "a"});
  EXPECT_EQ(e.push("xab"), "x");
  EXPECT_TRUE(e.stopped());
  StopMatcher q({"xyz"});
  std::string r = q.push("ab");
  r += q.push("cx");
  r += q.flush();
  EXPECT_FALSE(q.stopped());
  EXPECT_EQ(r, "abcx");
}

}  // namespace
}  // namespace hybridlm
