// AdamW, the schedules and gradient clipping against plain double loops written from the formulas
// (src/train/optimizer.h gives them), and the values the formulas fix at known steps.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <random>
#include <vector>

#include "base/error.h"
#include "base/thread_pool.h"
#include "numerics.h"
#include "train/optimizer.h"

namespace hybridlm {
namespace {

// AdamW in double, one element at a time (Loshchilov & Hutter Alg. 2 with torch's bias correction).
struct NaiveAdamW {
  double b1, b2, eps, wd;
  std::vector<double> p, m, v;
  bool decay;
  int t = 0;
  void step(double lr, const std::vector<float>& g) {
    ++t;
    for (size_t i = 0; i < p.size(); ++i) {
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * static_cast<double>(g[i]) * g[i];
      if (decay) p[i] -= lr * wd * p[i];
      const double mh = m[i] / (1 - std::pow(b1, t)), vh = v[i] / (1 - std::pow(b2, t));
      p[i] -= lr * mh / (std::sqrt(vh) + eps);
    }
  }
};

TEST(AdamW, MatchesTheFormulaInDoubleOverManySteps) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  ThreadPool pool(2);
  const AdamWOptions o{0.9f, 0.95f, 1e-8f, 0.1f};
  AdamW opt(o);
  const size_t sizes[] = {10000, 37};  // one split over threads, one small
  std::vector<std::vector<float>> params, grads;
  std::vector<NaiveAdamW> naive;
  for (size_t k = 0; k < 2; ++k) {
    params.emplace_back(sizes[k]);
    grads.emplace_back(sizes[k]);
    for (float& x : params[k]) x = 0.01f * nd(rng);  // small: f32 rounding of p stays far below the steps
  }
  const std::vector<std::vector<float>> start = params;
  for (size_t k = 0; k < 2; ++k) {
    const bool decay = k == 0;
    opt.add(params[k], grads[k], decay);
    naive.push_back({o.beta1, o.beta2, o.eps, o.weight_decay,
                     std::vector<double>(params[k].begin(), params[k].end()), std::vector<double>(sizes[k]),
                     std::vector<double>(sizes[k]), decay});
  }
  for (int step = 0; step < 30; ++step) {
    const float lr = 1e-2f * (1.0f + 0.1f * static_cast<float>(step % 5));
    for (auto& g : grads)
      for (float& x : g) x = nd(rng) * (step % 3 == 0 ? 1e-3f : 1.0f);  // small and large gradients
    opt.step(lr, &pool);
    for (size_t k = 0; k < 2; ++k) naive[k].step(lr, grads[k]);
  }
  EXPECT_EQ(opt.steps(), 30);
  for (size_t k = 0; k < 2; ++k) {
    // Relative to how far the parameters moved (about 30 steps of lr).
    double err = 0, moved = 0;
    for (size_t i = 0; i < sizes[k]; ++i) {
      err = std::max(err, std::abs(params[k][i] - naive[k].p[i]));
      moved = std::max(moved, std::abs(naive[k].p[i] - start[k][i]));
    }
    EXPECT_LT(err / moved, tol::kAdamWVsF64) << "parameter " << k;
  }
}

TEST(AdamW, FirstStepMovesEachValueByLrTimesTheSignOfItsGradient) {
  // With zero moments, m / (1 - b1) = g and sqrt(v / (1 - b2)) = |g|: the step is lr * g / (|g| + eps).
  std::vector<float> p = {1.0f, -2.0f, 0.5f}, g = {3.0f, -0.25f, 1e-3f};
  std::vector<float> q = p;
  AdamW opt({0.9f, 0.999f, 1e-8f, 0.5f});
  opt.add(p, g, true);
  opt.add(q, g, false);
  opt.step(0.01f);
  for (size_t i = 0; i < p.size(); ++i) {
    const double sign = g[i] > 0 ? 1.0 : -1.0;
    const double moved = 0.01 * std::abs(g[i]) / (std::abs(g[i]) + 1e-8);
    EXPECT_NEAR(p[i], (i == 0 ? 1.0 : i == 1 ? -2.0 : 0.5) * (1 - 0.01 * 0.5) - sign * moved, 1e-6);
    EXPECT_NEAR(q[i], (i == 0 ? 1.0 : i == 1 ? -2.0 : 0.5) - sign * moved, 1e-6);
  }
}

TEST(AdamW, RefusesAGradientOfAnotherSize) {
  std::vector<float> p(4), g(3);
  AdamW opt({});
  EXPECT_THROW(opt.add(p, g, true), Error);
}

TEST(Schedule, CosineWarmsUpThenFallsToMinAtTheLastStep) {
  Schedule s;
  s.lr = 1e-3f;
  s.min_lr = 1e-4f;
  s.warmup = 10;
  s.total = 110;
  validate(s);
  EXPECT_FLOAT_EQ(lr_at(s, 0), 1e-4f);  // 1/10 of lr
  EXPECT_FLOAT_EQ(lr_at(s, 9), 1e-3f);
  EXPECT_FLOAT_EQ(lr_at(s, 10), 1e-3f);  // the first step after warmup: q = 0
  EXPECT_FLOAT_EQ(lr_at(s, 109), 1e-4f);
  // q = 1/2 halfway: (lr + min) / 2; and at q = 1/3 the cosine's value.
  Schedule h = s;
  h.total = 111;  // 101 steps after warmup: q = (s - 10) / 100
  EXPECT_NEAR(lr_at(h, 60), 0.5 * (1e-3 + 1e-4), 1e-9);
  EXPECT_NEAR(lr_at(h, 10 + 100.0 / 4), 1e-4 + 0.9e-3 * 0.5 * (1 + std::cos(std::numbers::pi / 4)), 1e-9);
  for (int64_t i = 11; i < s.total; ++i) EXPECT_LE(lr_at(s, i), lr_at(s, i - 1)) << i;
}

TEST(Schedule, WsdHoldsThenDecaysLinearly) {
  Schedule s;
  s.kind = "wsd";
  s.lr = 2e-3f;
  s.min_lr = 0.0f;
  s.warmup = 5;
  s.total = 105;
  s.decay_fraction = 0.2f;  // the last 21 steps: 84 .. 104
  validate(s);
  EXPECT_FLOAT_EQ(lr_at(s, 4), 2e-3f);
  EXPECT_FLOAT_EQ(lr_at(s, 50), 2e-3f);
  EXPECT_FLOAT_EQ(lr_at(s, 83), 2e-3f);
  EXPECT_FLOAT_EQ(lr_at(s, 84), 2e-3f);
  EXPECT_NEAR(lr_at(s, 94), 1e-3, 1e-9);
  EXPECT_FLOAT_EQ(lr_at(s, 104), 0.0f);
}

TEST(Schedule, RefusesImpossibleValues) {
  Schedule s;
  s.kind = "linear";
  EXPECT_THROW(validate(s), Error);
  s = {};
  s.warmup = 5;
  s.total = 4;
  EXPECT_THROW(validate(s), Error);
  s = {};
  s.min_lr = 1.0f;  // above lr
  EXPECT_THROW(validate(s), Error);
  s = {};
  s.lr = std::nanf("");
  EXPECT_THROW(validate(s), Error);
}

TEST(ClipGradNorm, ScalesToTheLimitOnlyAbove) {
  std::vector<float> a = {3.0f, 0.0f}, b = {4.0f};
  std::vector<std::span<float>> g = {a, b};
  EXPECT_DOUBLE_EQ(clip_grad_norm(g, 10.0), 5.0);  // below: unchanged
  EXPECT_EQ(a[0], 3.0f);
  EXPECT_DOUBLE_EQ(clip_grad_norm(g, 1.0), 5.0);
  double n2 = 0;
  for (float x : a) n2 += static_cast<double>(x) * x;
  for (float x : b) n2 += static_cast<double>(x) * x;
  EXPECT_NEAR(std::sqrt(n2), 1.0, 1e-6);
  EXPECT_NEAR(a[0] / b[0], 0.75, 1e-7);  // direction kept
}

}  // namespace
}  // namespace hybridlm
