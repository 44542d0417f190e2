// The optimizer side of training: AdamW, the learning-rate schedules and gradient clipping by
// global norm. Parameters and gradients are f32 arrays owned by the trainer; the optimizer keeps
// the two moments of each (f32) and updates the parameters in place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace hybridlm {

class ThreadPool;

struct AdamWOptions {
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float weight_decay = 0.1f;  // applied to parameters added with decay = true
};

// AdamW (Loshchilov & Hutter, "Decoupled Weight Decay Regularization", Alg. 2), in the form
// torch.optim.AdamW computes it. At step t (from 1), for each element with gradient g:
//   m = b1 m + (1 - b1) g;   v = b2 v + (1 - b2) g^2
//   p = p - lr wd p            (decoupled decay, only for decay parameters)
//   p = p - lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
// The moments are f32; the bias corrections are computed in double once per step.
class AdamW {
 public:
  explicit AdamW(const AdamWOptions& o) : o_(o) {}
  // A parameter of param.size() floats and its gradient (same size), read at each step. Its
  // moments start at zero. Returns its index.
  size_t add(std::span<float> param, std::span<const float> grad, bool decay);
  // One update of every parameter from its current gradient, at learning rate lr.
  void step(float lr, ThreadPool* pool = nullptr);
  int64_t steps() const { return t_; }
  size_t size() const { return params_.size(); }
  // The moments of parameter i (to save and restore with a checkpoint) and the step count.
  std::span<float> m(size_t i) { return params_[i].m; }
  std::span<float> v(size_t i) { return params_[i].v; }
  void set_steps(int64_t t) { t_ = t; }

 private:
  struct Param {
    std::span<float> p;
    std::span<const float> g;
    std::vector<float> m, v;
    bool decay;
  };
  AdamWOptions o_;
  std::vector<Param> params_;
  int64_t t_ = 0;
};

// Learning rate at step s (from 0) of `total`: a linear warmup, lr (s + 1) / warmup, that reaches
// lr at the last warmup step (no step is spent at 0), then
// - cosine: lr_min + (lr - lr_min) (1 + cos(pi q)) / 2, q from 0 at the first step after warmup to
//   1 at the last step (which runs at lr_min);
// - wsd (warmup, stable, decay): lr until the last `decay_fraction` of the steps, then linearly
//   down to lr_min at the last step.
struct Schedule {
  std::string kind = "cosine";  // "cosine" or "wsd"
  float lr = 3e-4f, min_lr = 3e-5f;
  int64_t warmup = 0, total = 1;
  float decay_fraction = 0.2f;  // wsd only
};
// Throws Error naming the field for an unknown kind or an impossible value.
void validate(const Schedule& s);
float lr_at(const Schedule& s, int64_t step);

// The global L2 norm of all gradients (accumulated in double). If it is above max_norm (> 0),
// every gradient is scaled by max_norm / norm, as torch.nn.utils.clip_grad_norm_. Returns the norm
// before clipping.
double clip_grad_norm(std::span<const std::span<float>> grads, double max_norm);

}  // namespace hybridlm
