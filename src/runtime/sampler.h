// Turning logits into the next token: the penalties for tokens already seen (repetition, presence,
// frequency), temperature, top-k, top-p, min-p, then a seeded draw (or argmax when temperature is 0).
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace hybridlm {

struct SamplingParams {
  float temperature = 0.8f;  // 0 = greedy
  int top_k = 40;            // 0 = off
  float top_p = 0.95f;       // 1 = off
  float min_p = 0.05f;       // 0 = off; keep tokens with p >= min_p * p_max
  // The penalties look at the last repeat_last_n tokens of the history (llama.cpp's
  // penalty_last_n: 64 by default, 0 = no penalty at all, -1 = the whole history). For a token
  // seen c > 0 times in that window, in this order:
  //   repetition (HF): logit > 0 ? logit / r : logit * r      (1 = off)
  //   presence and frequency (OpenAI, llama.cpp): logit -= presence + frequency * c   (0 = off)
  float repetition_penalty = 1.0f;
  int repeat_last_n = 64;
  float presence_penalty = 0.0f;   // in [-2, 2], as OpenAI's presence_penalty
  float frequency_penalty = 0.0f;  // in [-2, 2], as OpenAI's frequency_penalty
  uint64_t seed = 0;
};

// The first id of the largest logit (NaN never counts as the largest; 0 when all are NaN): greedy
// decoding's pick, in one vectorised pass and a search.
int32_t argmax_first(std::span<const float> logits);

// Throws Error naming the flag (and the value) for out-of-range values.
void validate(const SamplingParams& p);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  // logits: (vocab); history: tokens seen so far, prompt included (for the penalties). Modifies
  // logits: the penalties are applied in place (greedy returns the argmax of the penalized logits).
  int32_t sample(std::span<float> logits, std::span<const int32_t> history);

 private:
  void apply_penalties(std::span<float> logits, std::span<const int32_t> history);
  // Temperature > 0 without top-k: min-p and top-p over the whole vocabulary, without sorting it.
  int32_t sample_whole(std::span<const float> logits, float mx_logit);
  int32_t draw(size_t n);

  SamplingParams p_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;  // (probability, id) of the ids a draw picks from
  std::vector<float> prob_;     // (vocab) sample_whole's probabilities
  static constexpr int kBuckets = 2048;  // sample_whole's buckets of probabilities (a float's bits >> 20)
  std::vector<double> mass_;    // (kBuckets) the probability mass in each
  std::vector<float> heap_;     // the top-k largest logits seen (a min-heap)
  std::vector<int32_t> idx_;    // the ids that pass min-p there, then top-p's head
  std::vector<int32_t> count_;  // (vocab) occurrences in the penalty window; all 0 between calls
  std::vector<int32_t> seen_;   // the distinct ids with count_ > 0, to apply and reset
};

}  // namespace hybridlm
