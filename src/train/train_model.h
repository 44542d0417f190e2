// A block-pattern model (docs/model-format.md) held for training: every parameter as f32 in one
// flat buffer under the checkpoint's own tensor names and shapes, its gradient in a second one, and
// the forward pass with the activations the backward pass reads. Forward and backward call only
// kernel-table ops (ref or cpu), each block's backward written beside its forward below.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/scratch.h"
#include "models/config.h"

namespace hybridlm {

class Checkpoint;
class ThreadPool;

// Buffers by slot, kept between steps: a backward pass's temporaries, each as long as the largest
// call asked; get() returns n floats of slot i whose contents are whatever was left there.
class TrainWorkspace {
 public:
  float* get(size_t slot, size_t n) {
    if (bufs_.size() <= slot) bufs_.resize(slot + 1);
    if (bufs_[slot].size() < n) bufs_[slot].resize(n);
    return bufs_[slot].data();
  }

 private:
  std::vector<std::vector<float>> bufs_;
};

struct TrainTensor {
  std::string name;
  std::vector<int64_t> shape;  // as stored in the checkpoint
  size_t offset = 0, numel = 0;  // in the flat parameter (and gradient) buffer
  bool decay = true;  // AdamW weight decay: matrices yes; norms, biases, A_log, D, dt_bias no
};

class TrainModel {
 public:
  // Throws Error naming the first feature of `cfg` the trainer cannot compute (another family's
  // multipliers, mixture of experts, ...). Parameters start at zero: call init() or load().
  TrainModel(HybridConfig cfg, const KernelTable& ops, ThreadPool* pool);
  ~TrainModel();
  TrainModel(const TrainModel&) = delete;
  TrainModel& operator=(const TrainModel&) = delete;

  const HybridConfig& config() const { return cfg_; }
  const std::vector<TrainTensor>& tensors() const { return tensors_; }
  std::span<float> params() { return params_; }
  std::span<float> grads() { return grads_; }
  std::span<const float> grads() const { return grads_; }
  // One tensor's parameters or gradient; throws Error for a name the model does not have.
  std::span<float> param(const std::string& name);
  std::span<float> grad(const std::string& name);
  size_t n_params() const { return params_.size(); }

  // Every tensor from a checkpoint of this config, converted to f32.
  void load(const Checkpoint& ckpt);
  // mamba_ssm's initialisation (docs/training.md), from `seed` alone.
  void init(uint64_t seed);
  void zero_grads();

  // Rows of `len` ids (B rows, row stride len): each row predicts ids[1..len-1] from the ids before
  // (a new sequence: zero states, positions from 0). Returns the mean cross-entropy over the
  // B (len - 1) predictions; with backward, grads += grad_scale * d(that mean)/d(parameters).
  double forward_backward(const int32_t* ids, int B, int len, bool backward, float grad_scale = 1.0f);
  // The logits of the last forward_backward: (B * (len - 1), vocab) before they became gradients
  // (only valid after a call with backward = false).
  std::span<const float> logits() const { return logits_; }

  struct Layer;  // per-layer parameter pointers and saved activations (train_model.cc)

 private:
  void check_supported() const;
  void build_tensors();
  TrainTensor& find(const std::string& name);

  void reserve_kernels(int tokens);

  HybridConfig cfg_;
  KernelScratch scratch_;  // the kernels' per-thread working memory, sized for the largest batch yet
  int scratch_tokens_ = 0;
  KernelContext ctx_;
  TrainWorkspace workspace_;
  std::vector<TrainTensor> tensors_;
  std::vector<float> params_, grads_;
  std::vector<Layer*> layers_;
  // Whole-model activations and gradients, (rows, H) unless noted.
  std::vector<float> h_final_, hn_, logits_, dh_, dtmp_, du_;
  std::vector<int32_t> inputs_, targets_;
};

}  // namespace hybridlm
