#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
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

namespace {

// The largest logit and whether any is NaN, in one pass the compiler vectorises: 16 running maxima
// (`x > m ? x : m` keeps m when x is NaN, as a vector max does) and 16 NaN flags.
float max_and_nan(std::span<const float> x, bool& nan) {
  constexpr size_t kW = 16;
  float m[kW];
  int bad[kW] = {};
  std::fill(m, m + kW, -std::numeric_limits<float>::infinity());
  size_t i = 0;
  for (; i + kW <= x.size(); i += kW)
    for (size_t j = 0; j < kW; ++j) {
      const float v = x[i + j];
      m[j] = v > m[j] ? v : m[j];
      bad[j] |= v != v;
    }
  for (size_t j = 0; i < x.size(); ++i, ++j) {
    m[j] = x[i] > m[j] ? x[i] : m[j];
    bad[j] |= x[i] != x[i];
  }
  float mx = m[0];
  int any = bad[0];
  for (size_t j = 1; j < kW; ++j) {
    mx = m[j] > mx ? m[j] : mx;
    any |= bad[j];
  }
  nan = any != 0;
  return mx;
}

// A logit scaled and shifted: (l - max) / T is <= 0 for any T > 0, so exp() of it never overflows,
// however small the temperature (NaN, from inf - inf, is taken as -inf).
float scaled_logit(float l, float mx, float temperature) {
  const float z = (l - mx) / temperature;
  return std::isnan(z) ? -std::numeric_limits<float>::infinity() : z;
}

}  // namespace

int32_t argmax_first(std::span<const float> logits) {
  bool nan = false;
  const float mx = max_and_nan(logits, nan);
  const auto at = std::find(logits.begin(), logits.end(), mx);
  return at == logits.end() ? 0 : static_cast<int32_t>(at - logits.begin());
}

int32_t Sampler::sample(std::span<float> logits, std::span<const int32_t> history) {
  const int V = static_cast<int>(logits.size());
  apply_penalties(logits, history);
  bool nan = false;
  const float mx_logit = max_and_nan(logits, nan);
  check(!nan, "the model produced NaN logits (corrupt weights or an invalid config value?)");
  check(mx_logit > -std::numeric_limits<float>::infinity(), "every logit is -inf: nothing can be sampled");
  if (p_.temperature == 0.0f)  // greedy: first maximum
    return static_cast<int32_t>(std::find(logits.begin(), logits.end(), mx_logit) - logits.begin());

  if (p_.top_k <= 0 || p_.top_k >= V) return sample_whole(logits, mx_logit);

  // The k-th largest logit, from a min-heap of k that most logits fail to enter at the first
  // comparison; then only the ids at or above it (ties included) are sorted.
  heap_.assign(logits.begin(), logits.begin() + p_.top_k);
  std::make_heap(heap_.begin(), heap_.end(), std::greater<float>());
  for (int i = p_.top_k; i < V; ++i)
    if (logits[i] > heap_.front()) {
      std::pop_heap(heap_.begin(), heap_.end(), std::greater<float>());
      heap_.back() = logits[i];
      std::push_heap(heap_.begin(), heap_.end(), std::greater<float>());
    }
  const float kth = heap_.front();
  cand_.clear();
  for (int i = 0; i < V; ++i)
    if (logits[i] >= kth) cand_.emplace_back(scaled_logit(logits[i], mx_logit, p_.temperature), i);
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  std::partial_sort(cand_.begin(), cand_.begin() + p_.top_k, cand_.end(), by_logit);
  const size_t n = static_cast<size_t>(p_.top_k);
  // softmax over the survivors (sorted, highest first)
  const float mx = cand_[0].first;
  double sum = 0;
  for (size_t i = 0; i < n; ++i) {
    cand_[i].first = std::exp(cand_[i].first - mx);
    sum += cand_[i].first;
  }
  for (size_t i = 0; i < n; ++i) cand_[i].first = static_cast<float>(cand_[i].first / sum);
  size_t keep = n;
  if (p_.min_p > 0) {  // p >= min_p * p_max: a head of the sorted survivors
    const float floor = p_.min_p * cand_[0].first;
    keep = 1;
    while (keep < n && cand_[keep].first >= floor) ++keep;
  }
  if (p_.top_p < 1) {  // the shortest head whose mass reaches top_p
    double cum = 0;
    size_t head = 0;
    while (head < keep) {
      cum += cand_[head].first;
      ++head;
      if (cum >= p_.top_p) break;
    }
    keep = head;
  }
  return draw(keep);
}

// Without top-k the whole vocabulary survives it, and sorting all of it (3.8 ms at 50K ids, 13 ms
// at 152K: longer than a small model's decode step) is what the filters below never need: min-p
// is a threshold on each probability, top-p needs only the head whose mass reaches p (its last
// bucket of probabilities sorted, the rest of it in any order), and the draw takes any order.
int32_t Sampler::sample_whole(std::span<const float> logits, float mx_logit) {
  const int V = static_cast<int>(logits.size());
  prob_.resize(static_cast<size_t>(V));
  double sum = 0;
  for (int i = 0; i < V; ++i) {
    prob_[i] = std::exp(scaled_logit(logits[i], mx_logit, p_.temperature));  // the maximum's: exp(0) = 1
    sum += prob_[i];
  }
  const float top = static_cast<float>(1.0 / sum);  // the most likely id's probability
  const float floor = p_.min_p > 0 ? p_.min_p * top : 0.0f;
  idx_.clear();
  for (int i = 0; i < V; ++i) {
    prob_[i] = static_cast<float>(prob_[i] / sum);
    if (prob_[i] > 0 && prob_[i] >= floor) idx_.push_back(i);
  }
  size_t n = idx_.size();
  if (p_.top_p < 1) {
    // The shortest head, most likely first, whose mass reaches top_p. A positive float's bits
    // order as its value, so its bits above the 20th (the exponent and 3 mantissa bits: 8 buckets
    // an octave) bucket the probabilities in order: the mass by bucket from the top finds the
    // bucket where top_p is reached. The ids above it are all in the head and need no order; only
    // that bucket is sorted.
    auto bucket = [&](int32_t id) {
      uint32_t bits;
      std::memcpy(&bits, &prob_[id], sizeof bits);
      return bits >> 20;
    };
    mass_.assign(kBuckets, 0.0);
    for (int32_t id : idx_) mass_[bucket(id)] += prob_[id];
    double cum = 0;
    int edge = kBuckets - 1;
    for (; edge >= 0 && cum + mass_[edge] < p_.top_p; --edge) cum += mass_[edge];
    if (edge >= 0) {  // else the mass never reached top_p (rounding): all of idx_ stays
      n = 0;
      size_t at_edge = idx_.size();  // the edge bucket's ids, gathered at the end of idx_
      for (size_t i = 0; i < idx_.size() && i < at_edge;) {
        const int b = static_cast<int>(bucket(idx_[i]));
        if (b > edge) std::swap(idx_[n++], idx_[i++]);
        else if (b == edge) std::swap(idx_[i], idx_[--at_edge]);
        else ++i;
      }
      auto by_prob = [&](int32_t a, int32_t b) { return prob_[a] > prob_[b] || (prob_[a] == prob_[b] && a < b); };
      std::sort(idx_.begin() + at_edge, idx_.end(), by_prob);
      for (size_t i = at_edge; i < idx_.size() && cum < p_.top_p; ++i) {
        cum += prob_[idx_[i]];
        idx_[n++] = idx_[i];
      }
    }
  }
  cand_.clear();
  for (size_t i = 0; i < n; ++i) cand_.emplace_back(prob_[idx_[i]], idx_[i]);
  return draw(n);
}

// A draw from the n (probability, id) pairs in cand_, in proportion to their probabilities.
int32_t Sampler::draw(size_t n) {
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
