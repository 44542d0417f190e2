#include "models/blocks/short_conv.h"

#include "kernels/kernels.h"

namespace hybridlm {

ShortConvWeights load_short_conv(const TensorSource& r, const std::string& p, const ShortConvSpec& s, int H) {
  ShortConvWeights w;
  w.in_proj = r.matrix(p + "in_proj.weight", {3 * int64_t{H}, H});
  w.out_proj = r.matrix(p + "out_proj.weight", {H, H});
  w.conv_w = r.vector(p + "conv.weight", {H, 1, s.d_conv});
  if (s.bias) {
    w.in_bias = r.vector(p + "in_proj.bias", {3 * int64_t{H}});
    w.out_bias = r.vector(p + "out_proj.bias", {H});
    w.conv_b = r.vector(p + "conv.bias", {H});
  }
  return w;
}

LayerStateSpec short_conv_state_spec(const ShortConvSpec& s, int H) { return {s.d_conv - 1, H, 0}; }

namespace {

class ShortConvMixer final : public MixerOf<ShortConvSpec, ShortConvWeights, load_short_conv> {
 public:
  using MixerOf::MixerOf;
  LayerCacheSpec cache_spec() const override { return {LayerCacheKind::Conv, short_conv_state_spec(s_, H_), {}}; }
  void kernel_limits(KernelLimits& lim) const override {
    lim.conv_channels = std::max(lim.conv_channels, H_);
    lim.conv_width = std::max(lim.conv_width, s_.d_conv);
  }
  size_t scratch_floats(int T) const override {
    FloatArena count;
    short_conv_buffers(H_, T, count);
    return count.used();
  }
  void forward(const KernelContext& ctx, const float* u, int T, std::span<const SeqRun> runs, FloatArena& arena,
               float* out) const override {
    short_conv_forward(ctx, s_, w_, u, T, H_, runs, short_conv_buffers(H_, T, arena), out);
  }
};

}  // namespace

std::unique_ptr<Mixer> make_short_conv_mixer(const ShortConvSpec& s, const std::string& prefix, int H) {
  return std::make_unique<ShortConvMixer>(s, prefix, H);
}

ShortConvBuffers short_conv_buffers(int H, int T, FloatArena& a) {
  const size_t n = static_cast<size_t>(T) * H;
  return {a.take(3 * n), a.take(n), a.take(n)};
}

void short_conv_forward(const KernelContext& ctx, const ShortConvSpec& s, const ShortConvWeights& w, const float* u,
                        int T, int H, std::span<const SeqRun> runs, const ShortConvBuffers& sc, float* out) {
  // bcx: (T, 3H) = u @ in_proj^T, split [B | C | x]
  ctx.ops->matmul(ctx, w.in_proj.view(), data_or_null(w.in_bias), u, T, sc.bcx);
  // bx: (T, H) = B * x
  for (int t = 0; t < T; ++t) {
    const float* r = sc.bcx + static_cast<size_t>(t) * 3 * H;
    float* o = sc.bx + static_cast<size_t>(t) * H;
    for (int c = 0; c < H; ++c) o[c] = r[c] * r[2 * H + c];
  }
  // y: (T, H) = causal_conv(bx) per sequence from its conv state (no activation)
  for (const SeqRun& r : runs)
    ctx.ops->conv1d_causal(ctx, sc.bx + static_cast<size_t>(r.start) * H, H, w.conv_w.data(),
                           data_or_null(w.conv_b), r.conv_state, r.len, H, s.d_conv, false,
                           sc.y + static_cast<size_t>(r.start) * H);
  // y *= C
  for (int t = 0; t < T; ++t) {
    const float* c = sc.bcx + static_cast<size_t>(t) * 3 * H + H;
    float* y = sc.y + static_cast<size_t>(t) * H;
    for (int i = 0; i < H; ++i) y[i] *= c[i];
  }
  // out: (T, H) = y @ out_proj^T
  ctx.ops->matmul(ctx, w.out_proj.view(), data_or_null(w.out_bias), sc.y, T, out);
}

}  // namespace hybridlm
