#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "base/error.h"

namespace hybridlm {

void validate(const SamplingParams& p) {
  // Written so that NaN fails every check (a comparison with NaN is false).
  check(p.temperature >= 0 && std::isfinite(p.temperature), "--temperature must be a finite number >= 0, got ",
        p.temperature);
  check(p.top_k >= 0, "--top-k must be >= 0, got ", p.top_k);
  check(p.top_p > 0 && p.top_p <= 1, "--top-p must be in (0, 1], got ", p.top_p);
  check(p.min_p >= 0 && p.min_p <= 1, "--min-p must be in [0, 1], got ", p.min_p);
  check(p.repetition_penalty > 0 && std::isfinite(p.repetition_penalty),
        "--repeat-penalty must be a finite number > 0, got ", p.repetition_penalty);
  check(p.repeat_last_n >= -1, "--repeat-last-n must be >= 0, or -1 for the whole history, got ", p.repeat_last_n);
  check(p.presence_penalty >= -2 && p.presence_penalty <= 2, "--presence-penalty must be in [-2, 2], got ",
        p.presence_penalty);
  check(p.frequency_penalty >= -2 && p.frequency_penalty <= 2, "--frequency-penalty must be in [-2, 2], got ",
        p.frequency_penalty);
}

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) { validate(p); }

void Sampler::apply_penalties(std::span<float> logits, std::span<const int32_t> history) {
  const bool any = p_.repetition_penalty != 1.0f || p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f;
  if (!any || p_.repeat_last_n == 0) return;
  const int V = static_cast<int>(logits.size());
  if (p_.repeat_last_n > 0 && history.size() > static_cast<size_t>(p_.repeat_last_n))
    history = history.last(static_cast<size_t>(p_.repeat_last_n));
  if (count_.size() != static_cast<size_t>(V)) count_.assign(V, 0);
  seen_.clear();
  for (int32_t t : history)
    if (t >= 0 && t < V && count_[t]++ == 0) seen_.push_back(t);
  for (int32_t t : seen_) {
    float& l = logits[t];
    l = l > 0 ? l / p_.repetition_penalty : l * p_.repetition_penalty;
    l -= p_.presence_penalty + p_.frequency_penalty * static_cast<float>(count_[t]);
    count_[t] = 0;
  }
}

int32_t Sampler::sample(std::span<float> logits, std::span<const int32_t> history) {
  const int V = static_cast<int>(logits.size());
  apply_penalties(logits, history);
  for (float l : logits)
    check(!std::isnan(l), "the model produced NaN logits (corrupt weights or an invalid config value?)");
  const float mx_logit = *std::max_element(logits.begin(), logits.end());
  check(mx_logit > -std::numeric_limits<float>::infinity(), "every logit is -inf: nothing can be sampled");
  if (p_.temperature == 0.0f)  // greedy: first maximum
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());

  // Scaled, shifted logits (l - max) / T are <= 0 for any T > 0, so exp() below never overflows,
  // however small the temperature.
  cand_.clear();
  for (int i = 0; i < V; ++i) {
    const float z = (logits[i] - mx_logit) / p_.temperature;
    cand_.emplace_back(std::isnan(z) ? -std::numeric_limits<float>::infinity() : z, i);
  }
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  size_t n = cand_.size();
  if (p_.top_k > 0 && static_cast<size_t>(p_.top_k) < n) {
    std::partial_sort(cand_.begin(), cand_.begin() + p_.top_k, cand_.end(), by_logit);
    n = static_cast<size_t>(p_.top_k);
  } else {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }
  // softmax over the survivors (sorted, highest first)
  const float mx = cand_[0].first;
  double sum = 0;
  for (size_t i = 0; i < n; ++i) {
    cand_[i].first = std::exp(cand_[i].first - mx);
    sum += cand_[i].first;
  }
  for (size_t i = 0; i < n; ++i) cand_[i].first = static_cast<float>(cand_[i].first / sum);
  if (p_.min_p > 0) {
    const float floor = p_.min_p * cand_[0].first;
    size_t keep = 1;
    while (keep < n && cand_[keep].first >= floor) ++keep;
    n = keep;
  }
  if (p_.top_p < 1) {
    double cum = 0;
    size_t keep = 0;
    while (keep < n) {
      cum += cand_[keep].first;
      ++keep;
      if (cum >= p_.top_p) break;
    }
    n = keep;
  }
  double total = 0;
  for (size_t i = 0; i < n; ++i) total += cand_[i].first;
  std::uniform_real_distribution<double> u(0.0, total);
  double r = u(rng_);
  for (size_t i = 0; i < n; ++i) {
    r -= cand_[i].first;
    if (r <= 0) return cand_[i].second;
  }
  return cand_[n - 1].second;
}

}  // namespace hybridlm
