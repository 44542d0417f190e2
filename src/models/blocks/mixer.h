// A layer's sequence mixer as the model sees every kind: one object per layer, made from the
// layer's BlockSpec by make_mixer (mixer.cc: the one table of kinds). Everything kind-specific
// lives behind it, in the kind's block file: its tensors (declared once, in load()), what it keeps
// per sequence (cache_spec()), its scratch (scratch_floats()) and its forward. The model, the
// cache, the planner and `inspect` call nothing kind-specific.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <utility>

#include "base/arena.h"
#include "cache/hybrid_cache.h"
#include "models/blocks/seq_run.h"
#include "models/config.h"
#include "models/weights.h"

namespace hybridlm {

class Mixer {
 public:
  virtual ~Mixer() = default;
  // Declares every tensor of the mixer (name, shape, the field it fills); from a checkpoint's
  // WeightReader this loads them, from a TensorCatalog it lists them.
  virtual void load(const TensorSource& r) = 0;
  // What the layer keeps per sequence: recurrent state, KV per token, or both.
  virtual LayerCacheSpec cache_spec() const = 0;
  // Its decode kernels update bf16-stored SSM states in place (HybridCache::load_state).
  virtual bool bf16_state_in_place() const { return false; }
  // Floats of scratch forward() takes from the arena for a step of T tokens.
  virtual size_t scratch_floats(int T) const = 0;
  // Widens `lim` to the shapes forward() hands the conv and scan kernels (the kernels' scratch is
  // sized from them; matmul widths come from the tensors). None for kinds that call neither.
  virtual void kernel_limits(KernelLimits& lim) const { (void)lim; }
  // out: (T, H) = mixer(u: (T, H)). `runs` partition the T rows and carry each sequence's cache;
  // scratch comes from `arena` (at least scratch_floats(T) free).
  virtual void forward(const KernelContext& ctx, const float* u, int T, std::span<const SeqRun> runs,
                       FloatArena& arena, float* out) const = 0;
};

// What every kind's Mixer class holds: its spec, the prefix of its tensors, d_model and its
// weights, which `load` fills through the kind's loader (load_mamba2, ...).
template <class Spec, class Weights, Weights (*Load)(const TensorSource&, const std::string&, const Spec&, int)>
class MixerOf : public Mixer {
 public:
  MixerOf(const Spec& s, std::string prefix, int d_model) : s_(s), prefix_(std::move(prefix)), H_(d_model) {}
  void load(const TensorSource& r) override { w_ = Load(r, prefix_, s_, H_); }

 protected:
  Spec s_;
  std::string prefix_;
  int H_;
  Weights w_;
};

// The mixer of layer b (d_model H), tensors not yet loaded; nullptr for MixerKind::None.
std::unique_ptr<Mixer> make_mixer(const BlockSpec& b, int d_model);

// Each kind's factory (its block file). `prefix` ends in '.', e.g. "backbone.layers.3.mixer.".
std::unique_ptr<Mixer> make_mamba1_mixer(const Mamba1Spec& s, const std::string& prefix, int d_model);
std::unique_ptr<Mixer> make_mamba2_mixer(const Mamba2Spec& s, const std::string& prefix, int d_model);
std::unique_ptr<Mixer> make_attention_mixer(const AttentionSpec& s, const std::string& prefix, int d_model);
std::unique_ptr<Mixer> make_short_conv_mixer(const ShortConvSpec& s, const std::string& prefix, int d_model);
std::unique_ptr<Mixer> make_mamba2_discrete_mixer(const Mamba2DiscreteSpec& s, const std::string& prefix,
                                                  int d_model);
std::unique_ptr<Mixer> make_gdn_mixer(const GdnSpec& s, const std::string& prefix, int d_model);

}  // namespace hybridlm
