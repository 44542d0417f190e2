// Turning logits into the next token: repetition penalty, temperature, top-k, top-p, min-p, then a
// seeded draw (or argmax when temperature is 0).
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
  float repetition_penalty = 1.0f;  // 1 = off; HF semantics: logit > 0 ? logit / r : logit * r
  uint64_t seed = 0;
};

// Throws Error naming the flag for out-of-range values.
void validate(const SamplingParams& p);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  // logits: (vocab); history: tokens seen so far (for the repetition penalty). Modifies logits.
  int32_t sample(std::span<float> logits, std::span<const int32_t> history);

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;
};

}  // namespace hybridlm
