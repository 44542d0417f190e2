#include "train/optimizer.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "base/error.h"
#include "base/thread_pool.h"

namespace hybridlm {

size_t AdamW::add(std::span<float> param, std::span<const float> grad, bool decay) {
  check(param.size() == grad.size(), "AdamW: a parameter of ", param.size(), " values with a gradient of ",
        grad.size());
  params_.push_back({param, grad, std::vector<float>(param.size(), 0.0f), std::vector<float>(param.size(), 0.0f),
                     decay});
  return params_.size() - 1;
}

void AdamW::step(float lr, ThreadPool* pool) {
  ++t_;
  const double c1 = 1.0 - std::pow(static_cast<double>(o_.beta1), static_cast<double>(t_));
  const double c2 = 1.0 - std::pow(static_cast<double>(o_.beta2), static_cast<double>(t_));
  // p -= lr * (m / c1) / (sqrt(v / c2) + eps) = p - step_size * m / (sqrt(v) / sqrt(c2) + eps)
  const float step_size = static_cast<float>(lr / c1);
  const float inv_sqrt_c2 = static_cast<float>(1.0 / std::sqrt(c2));
  const float b1 = o_.beta1, b2 = o_.beta2, eps = o_.eps;
  for (Param& q : params_) {
    const float keep = q.decay ? 1.0f - lr * o_.weight_decay : 1.0f;
    auto body = [&](size_t b, size_t e) {
      float* p = q.p.data();
      const float* g = q.g.data();
      float* m = q.m.data();
      float* v = q.v.data();
      for (size_t i = b; i < e; ++i) {
        m[i] = b1 * m[i] + (1.0f - b1) * g[i];
        v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
        p[i] = p[i] * keep - step_size * m[i] / (std::sqrt(v[i]) * inv_sqrt_c2 + eps);
      }
    };
    if (pool) pool->parallel_for(q.p.size(), body, 4096);
    else body(0, q.p.size());
  }
}

void validate(const Schedule& s) {
  check(s.kind == "cosine" || s.kind == "wsd", "schedule '", s.kind, "': use cosine or wsd");
  check(std::isfinite(s.lr) && s.lr > 0, "lr ", s.lr, ": must be a finite number > 0");
  check(std::isfinite(s.min_lr) && s.min_lr >= 0 && s.min_lr <= s.lr, "min_lr ", s.min_lr, ": must be in [0, lr ",
        s.lr, "]");
  check(s.total >= 1, "steps ", s.total, ": must be >= 1");
  check(s.warmup >= 0 && s.warmup <= s.total, "warmup ", s.warmup, ": must be in [0, steps ", s.total, "]");
  check(s.decay_fraction >= 0 && s.decay_fraction <= 1, "decay_fraction ", s.decay_fraction, ": must be in [0, 1]");
}

float lr_at(const Schedule& s, int64_t step) {
  if (step < s.warmup) return s.lr * static_cast<float>(step + 1) / static_cast<float>(s.warmup);
  const double lr = s.lr, lo = s.min_lr;
  if (s.kind == "wsd") {
    const int64_t decay_steps = static_cast<int64_t>(std::llround(s.decay_fraction * static_cast<double>(s.total)));
    const int64_t decay_start = std::max(s.warmup, s.total - decay_steps);
    if (step < decay_start || decay_steps == 0) return s.lr;
    // From lr at decay_start to lr_min at the last step (total - 1).
    const int64_t span = std::max<int64_t>(1, s.total - 1 - decay_start);
    const double q = std::min(1.0, static_cast<double>(step - decay_start) / static_cast<double>(span));
    return static_cast<float>(lr + (lo - lr) * q);
  }
  const int64_t after = s.total - s.warmup;
  const double q = after <= 1 ? 1.0 : std::min(1.0, static_cast<double>(step - s.warmup) / static_cast<double>(after - 1));
  return static_cast<float>(lo + (lr - lo) * 0.5 * (1.0 + std::cos(std::numbers::pi * q)));
}

double clip_grad_norm(std::span<const std::span<float>> grads, double max_norm) {
  double sum = 0;
  for (std::span<float> g : grads)
    for (float x : g) sum += static_cast<double>(x) * x;
  const double norm = std::sqrt(sum);
  if (max_norm > 0 && norm > max_norm) {
    // torch adds 1e-6 to the norm in the coefficient.
    const float scale = static_cast<float>(max_norm / (norm + 1e-6));
    for (std::span<float> g : grads)
      for (float& x : g) x *= scale;
  }
  return norm;
}

}  // namespace hybridlm
