// The table of mixer kinds, and Falcon-H1's parallel mixer (a Mamba-2 and an attention on the
// same input, summed), which is built from two of them.
#include "models/blocks/mixer.h"

#include <algorithm>

namespace hybridlm {

namespace {

// Falcon-H1: mix = mamba2(u) + attention(u), both from the layer's one input norm.
class ParallelMixer final : public Mixer {
 public:
  ParallelMixer(std::unique_ptr<Mixer> a, std::unique_ptr<Mixer> b, int d_model)
      : a_(std::move(a)), b_(std::move(b)), H_(d_model) {}
  void load(const TensorSource& r) override {
    a_->load(r);
    b_->load(r);
  }
  LayerCacheSpec cache_spec() const override {
    const LayerCacheSpec sa = a_->cache_spec(), sb = b_->cache_spec();
    LayerCacheSpec s{LayerCacheKind::MambaAndAttention, sa.has_state() ? sa.state : sb.state,
                     sa.has_kv() ? sa.kv : sb.kv};
    return s;
  }
  bool bf16_state_in_place() const override { return a_->bf16_state_in_place() || b_->bf16_state_in_place(); }
  void kernel_limits(KernelLimits& lim) const override {
    a_->kernel_limits(lim);
    b_->kernel_limits(lim);
  }
  size_t scratch_floats(int T) const override {
    FloatArena count;
    count.take(static_cast<size_t>(T) * H_);
    return count.used() + std::max(a_->scratch_floats(T), b_->scratch_floats(T));
  }
  void forward(const KernelContext& ctx, const float* u, int T, std::span<const SeqRun> runs, FloatArena& arena,
               float* out) const override {
    const size_t n = static_cast<size_t>(T) * H_;
    float* second = arena.take(n);
    const size_t mark = arena.used();
    a_->forward(ctx, u, T, runs, arena, out);
    arena.rewind(mark);
    b_->forward(ctx, u, T, runs, arena, second);
    arena.rewind(mark);
    for (size_t i = 0; i < n; ++i) out[i] += second[i];
  }

 private:
  std::unique_ptr<Mixer> a_, b_;
  int H_;
};

}  // namespace

std::unique_ptr<Mixer> make_mixer(const BlockSpec& b, int H) {
  const BlockNames& n = b.names;
  switch (b.mixer) {
    case MixerKind::None: return nullptr;
    case MixerKind::Mamba1: return make_mamba1_mixer(b.m1, n.mixer, H);
    case MixerKind::Mamba2: return make_mamba2_mixer(b.m2, n.mixer, H);
    case MixerKind::Attention: return make_attention_mixer(b.attn, n.mixer, H);
    case MixerKind::ShortConv: return make_short_conv_mixer(b.conv, n.mixer, H);
    case MixerKind::Mamba2Discrete: return make_mamba2_discrete_mixer(b.m2d, n.mixer, H);
    case MixerKind::GatedDeltaNet: return make_gdn_mixer(b.gdn, n.mixer, H);
    case MixerKind::Mamba2Attention:
      return std::make_unique<ParallelMixer>(make_mamba2_mixer(b.m2, n.mixer, H),
                                             make_attention_mixer(b.attn, n.mixer2, H), H);
  }
  throw_error("mixer kind ", static_cast<int>(b.mixer), " has no entry in make_mixer");
}

}  // namespace hybridlm
