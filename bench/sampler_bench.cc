// The sampler's cost per token (speed only, not a test): Sampler::sample against a baseline that
// sorts the whole vocabulary by scaled logit before the filters (the sampler's way before it
// selected instead), measured in the same run on the same logits, at the vocabulary sizes of
// GPT-NeoX (50280) and Qwen3 (151936).
//
//   build/bench_sampler [-r 50]
//
// Prints milliseconds per call (best of -r) for greedy, the CLI's defaults (T 0.8, top-k 40, top-p
// 0.95, min-p 0.05), top-p alone and temperature alone, and baseline / sampler.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "runtime/sampler.h"

namespace {

using hybridlm::SamplingParams;

// The baseline: every id as a (scaled logit, id) pair, sorted (or partially, for top-k), softmax
// over the survivors, min-p and top-p as heads of the sorted list, then the draw.
int32_t sort_all(const SamplingParams& p, std::vector<float>& logits, std::mt19937_64& rng) {
  const float mx = *std::max_element(logits.begin(), logits.end());
  if (p.temperature == 0) return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::vector<std::pair<float, int32_t>> c;
  c.reserve(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) c.emplace_back((logits[i] - mx) / p.temperature, static_cast<int32_t>(i));
  auto cmp = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  size_t n = c.size();
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < n) {
    std::partial_sort(c.begin(), c.begin() + p.top_k, c.end(), cmp);
    n = static_cast<size_t>(p.top_k);
  } else {
    std::sort(c.begin(), c.end(), cmp);
  }
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += c[i].first = std::exp(c[i].first);
  for (size_t i = 0; i < n; ++i) c[i].first = static_cast<float>(c[i].first / sum);
  size_t keep = n;
  if (p.min_p > 0)
    for (keep = 1; keep < n && c[keep].first >= p.min_p * c[0].first;) ++keep;
  if (p.top_p < 1) {
    double cum = 0;
    size_t head = 0;
    while (head < keep && cum < p.top_p) cum += c[head++].first;
    keep = head;
  }
  double total = 0;
  for (size_t i = 0; i < keep; ++i) total += c[i].first;
  double r = std::uniform_real_distribution<double>(0.0, total)(rng);
  for (size_t i = 0; i < keep; ++i)
    if ((r -= c[i].first) <= 0) return c[i].second;
  return c[keep - 1].second;
}

template <class F>
double best_ms(int reps, const std::vector<float>& base, F&& fn) {
  std::vector<float> l;
  double best = 1e30;
  for (int r = 0; r < reps + 1; ++r) {
    l = base;  // the sampler applies penalties in place: a fresh copy each call, outside the timing
    const auto t0 = std::chrono::steady_clock::now();
    fn(l);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) best = std::min(best, ms);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 50;
  for (int i = 1; i + 1 < argc; i += 2)
    if (std::strcmp(argv[i], "-r") == 0) reps = std::max(1, std::atoi(argv[i + 1]));
  struct Mode {
    const char* name;
    float temperature;
    int top_k;
    float top_p, min_p;
  };
  const Mode modes[] = {{"greedy", 0, 40, 0.95f, 0.05f},
                        {"defaults: T 0.8, top-k 40, top-p 0.95, min-p 0.05", 0.8f, 40, 0.95f, 0.05f},
                        {"T 1, top-p 0.95", 1, 0, 0.95f, 0},
                        {"T 1 alone", 1, 0, 1, 0}};
  std::printf("sampler: ms per call, best of %d (logits ~ N(0, 3), as a random-weight model's)\n\n", reps);
  std::printf("| vocabulary | sampling | sort all (baseline) | Sampler::sample | baseline / sampler |\n");
  std::printf("|---:|---|---:|---:|---:|\n");
  for (int V : {50280, 151936}) {
    std::mt19937 g(1);
    std::normal_distribution<float> normal(0, 3);
    std::vector<float> logits(static_cast<size_t>(V));
    for (float& x : logits) x = normal(g);
    for (const Mode& m : modes) {
      SamplingParams p;
      p.temperature = m.temperature, p.top_k = m.top_k, p.top_p = m.top_p, p.min_p = m.min_p;
      hybridlm::Sampler s(p);
      std::mt19937_64 rng(1);
      const double ms_base = best_ms(reps, logits, [&](std::vector<float>& l) { sort_all(p, l, rng); });
      const double ms_new = best_ms(reps, logits, [&](std::vector<float>& l) { s.sample(l, {}); });
      std::printf("| %d | %s | %.3f | %.3f | %.1fx |\n", V, m.name, ms_base, ms_new, ms_base / ms_new);
    }
  }
  return 0;
}
