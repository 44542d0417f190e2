#include "models/blocks/gdn.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "base/arena.h"
#include "kernels/kernels.h"

namespace hybridlm {

namespace {

// The chunk of the CPU prefill: min(chunk_size, this); the chunked form is exact at any length.
constexpr int kCpuGdnChunk = 64;

// The forward's scratch, taken from the step's arena (one list, which also sizes it).
struct Buffers {
  float* qkvz;   // (T, 2 Kd + 2 Vd) as projected (interleaved per key head; unused when apart)
  float* ba;     // (T, 2 nv) as projected (unused when apart)
  float* mixed;  // (T, conv_dim) = [q (Kd) | k (Kd) | v (Vd)], de-interleaved
  float* xc;     // (T, conv_dim) after the conv and SiLU
  float* z;      // (T, Vd)
  float* g;      // (T, nv) log-decay
  float* beta;   // (T, nv)
  float* y;      // (T, Vd) the delta rule's output, then normalised in place
  float* gated;  // (T, Vd) = y * silu(z)
};

Buffers buffers(const GdnSpec& s, int T, FloatArena& a) {
  const size_t n = static_cast<size_t>(T);
  const size_t Vd = static_cast<size_t>(s.value_dim()), nv = static_cast<size_t>(s.n_v_heads);
  Buffers b;
  b.qkvz = s.interleaved ? a.take(n * (2 * s.key_dim() + 2 * Vd)) : nullptr;
  b.ba = s.interleaved ? a.take(n * 2 * nv) : nullptr;
  b.mixed = a.take(n * s.conv_dim());
  b.xc = a.take(n * s.conv_dim());
  b.z = a.take(n * Vd);
  b.g = a.take(n * nv);
  b.beta = a.take(n * nv);
  b.y = a.take(n * Vd);
  b.gated = a.take(n * Vd);
  return b;
}

class GdnMixer final : public MixerOf<GdnSpec, GdnWeights, load_gdn> {
 public:
  using MixerOf::MixerOf;
  LayerCacheSpec cache_spec() const override {
    const LayerStateSpec st{s_.d_conv - 1, s_.conv_dim(), static_cast<size_t>(s_.n_v_heads) * s_.k_dim * s_.v_dim};
    return {LayerCacheKind::Mamba, st, {}};
  }
  void kernel_limits(KernelLimits& lim) const override {
    lim.conv_channels = std::max(lim.conv_channels, s_.conv_dim());
    lim.conv_width = std::max(lim.conv_width, s_.d_conv);
    lim.gdn_k_dim = std::max(lim.gdn_k_dim, s_.k_dim);
    lim.gdn_v_dim = std::max(lim.gdn_v_dim, s_.v_dim);
    lim.gdn_chunk = std::max(lim.gdn_chunk, std::min(s_.chunk_size, kCpuGdnChunk));
  }
  size_t scratch_floats(int T) const override {
    FloatArena count;
    buffers(s_, T, count);
    return count.used();
  }
  void forward(const KernelContext& ctx, const float* u, int T, std::span<const SeqRun> runs, FloatArena& arena,
               float* out) const override;
};

void GdnMixer::forward(const KernelContext& ctx, const float* u, int T, std::span<const SeqRun> runs, FloatArena& arena,
                       float* out) const {
  const Buffers sc = buffers(s_, T, arena);
  const int nk = s_.n_k_heads, nv = s_.n_v_heads, dk = s_.k_dim, dv = s_.v_dim, r = nv / nk;
  const int Kd = s_.key_dim(), Vd = s_.value_dim(), C = s_.conv_dim();
  const int W = 2 * Kd + 2 * Vd, group = 2 * dk + 2 * r * dv;
  const size_t rows = static_cast<size_t>(T);
  if (s_.interleaved) {
    // qkvz: (T, W) = u @ in_proj_qkvz^T;  ba: (T, 2 nv) = u @ in_proj_ba^T
    ctx.ops->matmul(ctx, w_.in_proj_qkvz.view(), nullptr, u, T, sc.qkvz);
    ctx.ops->matmul(ctx, w_.in_proj_ba.view(), nullptr, u, T, sc.ba);
    // De-interleave key head j's group [q_j | k_j | v_j | z_j] into mixed = [q | k | v] and z, its
    // [b_j | a_j] into beta (b for now) and g (a for now).
    for (size_t t = 0; t < rows; ++t) {
      const float* src = sc.qkvz + t * W;
      float* m = sc.mixed + t * C;
      float* zt = sc.z + t * Vd;
      const float* bat = sc.ba + t * 2 * nv;
      for (int j = 0; j < nk; ++j) {
        const float* gj = src + static_cast<size_t>(j) * group;
        std::copy_n(gj, dk, m + j * dk);
        std::copy_n(gj + dk, dk, m + Kd + j * dk);
        std::copy_n(gj + 2 * dk, r * dv, m + 2 * Kd + j * r * dv);
        std::copy_n(gj + 2 * dk + r * dv, r * dv, zt + j * r * dv);
        std::copy_n(bat + 2 * j * r, r, sc.beta + t * nv + j * r);
        std::copy_n(bat + 2 * j * r + r, r, sc.g + t * nv + j * r);
      }
    }
  } else {
    // mixed: (T, C) = u @ in_proj_qkv^T;  z: (T, Vd);  beta (b for now), g (a for now): (T, nv)
    ctx.ops->matmul(ctx, w_.in_proj_qkv.view(), nullptr, u, T, sc.mixed);
    ctx.ops->matmul(ctx, w_.in_proj_z.view(), nullptr, u, T, sc.z);
    ctx.ops->matmul(ctx, w_.in_proj_b.view(), nullptr, u, T, sc.beta);
    ctx.ops->matmul(ctx, w_.in_proj_a.view(), nullptr, u, T, sc.g);
  }
  // xc: (T, C) = silu(causal_conv(mixed)), per sequence from its conv state
  for_each_run(ctx, runs, [&](const KernelContext& c, const SeqRun& run) {
    const size_t o = static_cast<size_t>(run.start) * C;
    c.ops->conv1d_causal(c, sc.mixed + o, C, w_.conv_w.data(), nullptr, run.conv_state, run.len, C, s_.d_conv, true,
                         sc.xc + o);
  });
  // beta = sigmoid(b);  g = -exp(A_log) softplus(a + dt_bias)
  for (size_t t = 0; t < rows; ++t)
    for (int h = 0; h < nv; ++h) {
      float& b = sc.beta[t * nv + h];
      b = 1.0f / (1.0f + std::exp(-b));
      sc.g[t * nv + h] += w_.dt_bias[h];
    }
  ctx.ops->softplus(ctx, sc.g, rows * nv);
  for (size_t t = 0; t < rows; ++t)
    for (int h = 0; h < nv; ++h) sc.g[t * nv + h] *= -std::exp(w_.A_log[h]);
  // y: (T, Vd) = the gated delta rule over q, k, v per sequence from its state
  const GdnDims dims = s_.dims();
  const int chunk = std::min(s_.chunk_size, kCpuGdnChunk);
  for_each_run(ctx, runs, [&](const KernelContext& c, const SeqRun& run) {
    const size_t o = static_cast<size_t>(run.start);
    const float* x = sc.xc + o * C;
    if (run.len == 1)  // decode: the plain recurrence
      c.ops->gated_delta_step(c, x, x + Kd, x + 2 * Kd, sc.g + o * nv, sc.beta + o * nv, dims, run.ssm_state,
                              sc.y + o * Vd);
    else
      c.ops->gated_delta_scan(c, x, x + Kd, C, x + 2 * Kd, C, sc.g + o * nv, sc.beta + o * nv, dims, chunk,
                              run.ssm_state, run.len, sc.y + o * Vd);
  });
  // gated: (T, Vd) = (norm_w * rmsnorm(y) per value head) * silu(z)
  ctx.ops->rmsnorm(ctx, sc.y, w_.norm_w.data(), T * nv, dv, s_.norm_eps, sc.y);
  ctx.ops->activation(ctx, Activation::Silu, sc.z, sc.y, Vd, T, Vd, sc.gated);
  // out: (T, H) = gated @ out_proj^T
  ctx.ops->matmul(ctx, w_.out_proj.view(), nullptr, sc.gated, T, out);
}

}  // namespace

GdnWeights load_gdn(const TensorSource& r, const std::string& p, const GdnSpec& s, int H) {
  const int64_t Kd = s.key_dim(), Vd = s.value_dim(), nv = s.n_v_heads;
  GdnWeights w;
  if (s.interleaved) {
    w.in_proj_qkvz = r.matrix(p + "in_proj_qkvz.weight", {2 * Kd + 2 * Vd, H});
    w.in_proj_ba = r.matrix(p + "in_proj_ba.weight", {2 * nv, H});
  } else {
    w.in_proj_qkv = r.matrix(p + "in_proj_qkv.weight", {2 * Kd + Vd, H});
    w.in_proj_z = r.matrix(p + "in_proj_z.weight", {Vd, H});
    w.in_proj_b = r.matrix(p + "in_proj_b.weight", {nv, H});
    w.in_proj_a = r.matrix(p + "in_proj_a.weight", {nv, H});
  }
  w.conv_w = r.vector(p + "conv1d.weight", {s.conv_dim(), 1, s.d_conv});
  w.dt_bias = r.vector(p + "dt_bias", {nv});
  w.A_log = r.vector(p + "A_log", {nv});
  w.norm_w = r.vector(p + "norm.weight", {s.v_dim});
  w.out_proj = r.matrix(p + "out_proj.weight", {H, Vd});
  return w;
}

std::unique_ptr<Mixer> make_gdn_mixer(const GdnSpec& s, const std::string& prefix, int H) {
  return std::make_unique<GdnMixer>(s, prefix, H);
}

}  // namespace hybridlm
