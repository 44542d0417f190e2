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

void short_conv_forward(const KernelContext& ctx, const ShortConvSpec& s, const ShortConvWeights& w, const float* u,
                        int T, int H, std::span<const SeqRun> runs, ShortConvScratch& sc, float* out) {
  sc.bcx.resize(static_cast<size_t>(T) * 3 * H);
  sc.bx.resize(static_cast<size_t>(T) * H);
  sc.y.resize(static_cast<size_t>(T) * H);
  // bcx: (T, 3H) = u @ in_proj^T, split [B | C | x]
  ctx.ops->matmul(ctx, w.in_proj.view(), data_or_null(w.in_bias), u, T, sc.bcx.data());
  // bx: (T, H) = B * x
  for (int t = 0; t < T; ++t) {
    const float* r = sc.bcx.data() + static_cast<size_t>(t) * 3 * H;
    float* o = sc.bx.data() + static_cast<size_t>(t) * H;
    for (int c = 0; c < H; ++c) o[c] = r[c] * r[2 * H + c];
  }
  // y: (T, H) = causal_conv(bx) per sequence from its conv state (no activation)
  for (const SeqRun& r : runs)
    ctx.ops->conv1d_causal(ctx, sc.bx.data() + static_cast<size_t>(r.start) * H, H, w.conv_w.data(),
                           data_or_null(w.conv_b), r.conv_state, r.len, H, s.d_conv, false,
                           sc.y.data() + static_cast<size_t>(r.start) * H);
  // y *= C
  for (int t = 0; t < T; ++t) {
    const float* c = sc.bcx.data() + static_cast<size_t>(t) * 3 * H + H;
    float* y = sc.y.data() + static_cast<size_t>(t) * H;
    for (int i = 0; i < H; ++i) y[i] *= c[i];
  }
  // out: (T, H) = y @ out_proj^T
  ctx.ops->matmul(ctx, w.out_proj.view(), data_or_null(w.out_bias), sc.y.data(), T, out);
}

}  // namespace hybridlm
