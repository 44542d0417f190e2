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

  SamplingParams p_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;
  std::vector<int32_t> count_;  // (vocab) occurrences in the penalty window; all 0 between calls
  std::vector<int32_t> seen_;   // the distinct ids with count_ > 0, to apply and reset
};

}  // namespace hybridlm
