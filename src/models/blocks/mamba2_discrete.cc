#include "models/blocks/mamba2_discrete.h"

#include <algorithm>
#include <memory>

#include "base/arena.h"
#include "kernels/kernels.h"
#include "models/blocks/mamba2.h"

namespace hybridlm {

namespace {


// The forward's scratch, taken from the step's arena (one list, which also sizes it).
struct Buffers {
  float* proj;   // (T, in_proj rows): [xBC | z | A~]
  float* xbc;    // (T, conv_dim) after the conv
  float* log_a;  // (T, nh) = -softplus(A~)
  float* y;      // (T, I)
  float* gate;   // (T, I) = z + z_bias
  float* g;      // (T, I) = y * silu(gate)
};

Buffers buffers(const Mamba2DiscreteSpec& s, int T, FloatArena& a) {
  const size_t n = static_cast<size_t>(T);
  Buffers b;
  b.proj = a.take(n * s.in_proj_dim());
  b.xbc = a.take(n * s.conv_dim());
  b.log_a = a.take(n * s.n_heads);
  b.y = a.take(n * s.d_inner);
  b.gate = a.take(n * s.d_inner);
  b.g = a.take(n * s.d_inner);
  return b;
}

class Mamba2DiscreteMixer final : public MixerOf<Mamba2DiscreteSpec, Mamba2DiscreteWeights, load_mamba2_discrete> {
 public:
  using MixerOf::MixerOf;
  LayerCacheSpec cache_spec() const override {
    const LayerStateSpec st{s_.d_conv - 1, s_.conv_dim(), static_cast<size_t>(s_.n_heads) * s_.head_dim * s_.d_state};
    return {LayerCacheKind::Mamba, st, {}};
  }
  void kernel_limits(KernelLimits& lim) const override { widen_ssd_limits(s_, lim); }
  size_t scratch_floats(int T) const override {
    FloatArena count;
    buffers(s_, T, count);
    return count.used();
  }
  void forward(const KernelContext& ctx, const float* u, int T, std::span<const SeqRun> runs, FloatArena& arena,
               float* out) const override;
};

void Mamba2DiscreteMixer::forward(const KernelContext& ctx, const float* u, int T, std::span<const SeqRun> runs,
                                  FloatArena& arena, float* out) const {
  const Buffers sc = buffers(s_, T, arena);
  const int I = s_.d_inner, nh = s_.n_heads, G = s_.n_groups, N = s_.d_state, K = s_.d_conv;
  const int conv_dim = s_.conv_dim(), W = s_.in_proj_dim();
  const int z_off = conv_dim, a_off = conv_dim + I;
  const size_t rows = static_cast<size_t>(T);
  // proj: (T, W) = u @ in_proj^T
  ctx.ops->matmul(ctx, w_.in_proj.view(), data_or_null(w_.in_proj_bias), u, T, sc.proj);
  // xbc: (T, conv_dim) = [silu](causal_conv(xBC)), per sequence from its conv state
  for_each_run(ctx, runs, [&](const KernelContext& c, const SeqRun& r) {
    c.ops->conv1d_causal(c, sc.proj + static_cast<size_t>(r.start) * W, W, w_.conv_w.data(), data_or_null(w_.conv_b),
                         r.conv_state, r.len, conv_dim, K, s_.conv_silu,
                         sc.xbc + static_cast<size_t>(r.start) * conv_dim);
  });
  // log_a: (T, nh) = -softplus(A~), the log of the decay. The reference code reaches the same
  // recurrence through the Mamba-2 kernel as x / softplus(A~) with dt = softplus(A~) and A = -1; the
  // divide and multiply lose precision when softplus(A~) is tiny, so the scan takes log_a as is.
  for (size_t t = 0; t < rows; ++t) std::copy_n(sc.proj + t * W + a_off, nh, sc.log_a + t * nh);
  ctx.ops->softplus(ctx, sc.log_a, rows * nh);
  for (size_t i = 0; i < rows * nh; ++i) sc.log_a[i] = -sc.log_a[i];
  // y: (T, I) = the scan over x (I), B (G*N), C (G*N), per sequence from its SSM state
  const SsdDims dims{nh, s_.head_dim, G, N};
  const int chunk = std::min(s_.chunk_size, kCpuSsdChunk);
  for_each_run(ctx, runs, [&](const KernelContext& c, const SeqRun& r) {
    const size_t o = static_cast<size_t>(r.start);
    const float* xr = sc.xbc + o * conv_dim;
    if (r.len == 1)  // decode: the plain recurrence
      c.ops->ssd_step_discrete(c, xr, sc.log_a + o * nh, xr + I, xr + I + G * N, w_.D.data(), dims, r.ssm_state,
                               sc.y + o * I);
    else
      c.ops->ssd_scan_discrete(c, xr, conv_dim, sc.log_a + o * nh, xr + I, xr + I + G * N, conv_dim, w_.D.data(), dims,
                               chunk, r.ssm_state, r.len, sc.y + o * I);
  });
  // g: (T, I) = y * silu(z + z_bias)
  for (size_t t = 0; t < rows; ++t) {
    const float* z = sc.proj + t * W + z_off;
    float* gt = sc.gate + t * I;
    if (w_.z_bias.empty())
      std::copy_n(z, I, gt);
    else
      for (int i = 0; i < I; ++i) gt[i] = z[i] + w_.z_bias[i];
  }
  ctx.ops->activation(ctx, Activation::Silu, sc.gate, sc.y, I, T, I, sc.g);
  // out: (T, H) = g @ out_proj^T
  ctx.ops->matmul(ctx, w_.out_proj.view(), data_or_null(w_.out_proj_bias), sc.g, T, out);
}

}  // namespace

Mamba2DiscreteWeights load_mamba2_discrete(const TensorSource& r, const std::string& p, const Mamba2DiscreteSpec& s,
                                           int H) {
  const int64_t I = s.d_inner, nh = s.n_heads, K = s.d_conv, rows = s.in_proj_dim();
  Mamba2DiscreteWeights w;
  w.in_proj = r.matrix(p + "in_proj.weight", {rows, H});
  if (s.proj_bias) w.in_proj_bias = r.vector(p + "in_proj.bias", {rows});
  w.conv_w = r.vector(p + "conv1d.weight", {s.conv_dim(), 1, K});
  if (s.conv_bias) w.conv_b = r.vector(p + "conv1d.bias", {s.conv_dim()});
  w.D = r.vector(p + "D", {nh});
  if (!s.proj_bias) w.z_bias = r.vector(p + "z_bias", {I});
  w.out_proj = r.matrix(p + "out_proj.weight", {H, I});
  if (s.proj_bias) w.out_proj_bias = r.vector(p + "out_proj.bias", {H});
  return w;
}

std::unique_ptr<Mixer> make_mamba2_discrete_mixer(const Mamba2DiscreteSpec& s, const std::string& prefix, int H) {
  return std::make_unique<Mamba2DiscreteMixer>(s, prefix, H);
}

}  // namespace hybridlm
