#include "models/blocks/mamba2.h"

#include <algorithm>
#include <cmath>
#include <iterator>

#include "base/error.h"
#include "kernels/kernels.h"

namespace hybridlm {

namespace {


class Mamba2Mixer final : public MixerOf<Mamba2Spec, Mamba2Weights, load_mamba2> {
 public:
  using MixerOf::MixerOf;
  LayerCacheSpec cache_spec() const override {
    return {LayerCacheKind::Mamba, mamba2_state_spec(s_), {}};
  }
  bool bf16_state_in_place() const override { return true; }
  void kernel_limits(KernelLimits& lim) const override { widen_ssd_limits(s_, lim); }
  size_t scratch_floats(int T) const override {
    FloatArena count;
    mamba2_buffers(s_, H_, T, count);
    return count.used();
  }
  void forward(const KernelContext& ctx, const float* u, int T, std::span<const SeqRun> runs, FloatArena& arena,
               float* out) const override {
    mamba2_forward(ctx, s_, w_, u, T, runs, mamba2_buffers(s_, H_, T, arena), out);
  }
};

}  // namespace

std::unique_ptr<Mixer> make_mamba2_mixer(const Mamba2Spec& s, const std::string& prefix, int H) {
  return std::make_unique<Mamba2Mixer>(s, prefix, H);
}

Mamba2Buffers mamba2_buffers(const Mamba2Spec& s, int H, int T, FloatArena& a) {
  const size_t n = static_cast<size_t>(T);
  Mamba2Buffers b;
  if (s.in_scale != 1.0f) b.u = a.take(n * H);
  b.zxbcdt = a.take(n * s.in_proj_dim());
  b.xbc = a.take(n * s.conv_dim());
  b.dt = a.take(n * s.n_heads);
  b.y = a.take(n * s.d_inner);
  b.g = a.take(n * s.d_inner);
  return b;
}

Mamba2Weights load_mamba2(const TensorSource& r, const std::string& p, const Mamba2Spec& s, int H) {
  const int64_t I = s.d_inner, nh = s.n_heads, K = s.d_conv, conv_dim = s.conv_dim();
  Mamba2Weights w;
  // mamba_ssm's Mamba2 with d_ssm < d_inner adds a gated-MLP branch whose rows sit in front of
  // in_proj ([d_mlp, d_mlp, z, xBC, dt]); transformers cannot load such checkpoints and neither do
  // we: refuse by name rather than computing without the branch.
  const int64_t rows = s.in_proj_dim();
  if (const TensorInfo* t = r.find(p + "in_proj.weight");
      t && t->shape.size() == 2 && t->shape[0] > rows && (t->shape[0] - rows) % 2 == 0)
    throw Error(t->file + ": tensor '" + p + "in_proj.weight' has " + std::to_string(t->shape[0]) +
                " rows, " + std::to_string(t->shape[0] - rows) +
                " more than z + xBC + dt: a mamba_ssm checkpoint with an MLP branch (d_ssm < d_inner), not supported");
  w.in_proj = r.matrix(p + "in_proj.weight", {rows, H});
  if (s.proj_bias) w.in_proj_bias = r.vector(p + "in_proj.bias", {rows});
  w.conv_w = r.vector(p + "conv1d.weight", {conv_dim, 1, K});
  if (s.conv_bias) w.conv_b = r.vector(p + "conv1d.bias", {conv_dim});
  w.dt_bias = r.vector(p + "dt_bias", {nh});
  w.A = r.vector(p + "A_log", {nh});
  for (float& a : w.A) a = -std::exp(a);
  w.D = r.vector(p + "D", {nh});
  if (s.gate_norm) w.norm_w = r.vector(p + "norm.weight", {I});
  w.out_proj = r.matrix(p + "out_proj.weight", {H, I});
  if (s.has_out_bias()) w.out_proj_bias = r.vector(p + "out_proj.bias", {H});
  return w;
}

LayerStateSpec mamba2_state_spec(const Mamba2Spec& s) {
  return {s.d_conv - 1, s.conv_dim(), static_cast<size_t>(s.n_heads) * s.head_dim * s.d_state};
}

namespace {

// Between the projections, op by op, for any batch: g: (T, I) from zxbcdt: (T, W).
void mamba2_mix(const KernelContext& ctx, const Mamba2Spec& s, const Mamba2Weights& w, int T,
                std::span<const SeqRun> runs, const Mamba2Buffers& sc) {
  const int I = s.d_inner, nh = s.n_heads, K = s.d_conv, conv_dim = s.conv_dim();
  const int G = s.n_groups, N = s.d_state;
  const int W = w.in_proj.rows;
  const int z_off = 0, xbc_off = z_off + I, dt_off = xbc_off + conv_dim;
  const size_t n_dt = static_cast<size_t>(T) * nh;
  // xbc: (T, conv_dim) = silu(causal_conv(xBC)), per sequence from its conv state
  for_each_run(ctx, runs, [&](const KernelContext& c, const SeqRun& r) {
    c.ops->conv1d_causal(c, sc.zxbcdt + static_cast<size_t>(r.start) * W + xbc_off, W, w.conv_w.data(),
                          data_or_null(w.conv_b), r.conv_state, r.len, conv_dim, K, true,
                          sc.xbc + static_cast<size_t>(r.start) * conv_dim);
  });
  // dt: (T, nh) = clamp(softplus(dt_raw + dt_bias), time_step_limit)
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < nh; ++h)
      sc.dt[static_cast<size_t>(t) * nh + h] = sc.zxbcdt[static_cast<size_t>(t) * W + dt_off + h] + w.dt_bias[h];
  ctx.ops->softplus(ctx, sc.dt, n_dt);
  for (size_t i = 0; i < n_dt; ++i) sc.dt[i] = std::clamp(sc.dt[i], s.dt_min, s.dt_max);
  // y: (T, I) = SSD scan over x (I), B (G*N), C (G*N), per sequence from its SSM state
  const SsdDims dims{nh, s.head_dim, G, N};
  // The chunked form is exact for any chunk length; chunk_size (256 in released configs) is tuned
  // for GPU tensor cores. On CPU the intra-chunk work grows with the chunk while the state pass
  // does not, and 32-64 measured fastest (docs/benchmarks.md), so cap it.
  const int chunk = std::min(s.chunk_size, kCpuSsdChunk);
  for_each_run(ctx, runs, [&](const KernelContext& c, const SeqRun& r) {
    const size_t o = static_cast<size_t>(r.start);
    const float* xr = sc.xbc + o * conv_dim;
    if (r.len == 1) {  // decode: the plain recurrence
      auto step = [&](auto kernel, auto* S) {  // the state as stored: f32, or bf16 updated in place
        kernel(c, xr, sc.dt + o * nh, w.A.data(), xr + I, xr + I + G * N, w.D.data(), dims, S,
               sc.y + o * I);
      };
      if (r.ssm_state_bf16) step(c.ops->ssd_step_bf16, r.ssm_state_bf16);
      else step(c.ops->ssd_step, r.ssm_state);
      return;
    }
    c.ops->ssd_scan(c, xr, conv_dim, sc.dt + o * nh, w.A.data(), xr + I, xr + I + G * N, conv_dim,
                     w.D.data(), dims, chunk, r.ssm_state, r.len, sc.y + o * I);
  });
  const int group = s.norm_grouping == NormGrouping::Grouped ? I / G : I;
  if (s.gate_norm && !s.norm_before_gate) {
    // g: (T, I) = norm_w * rmsnorm_groups(y * silu(z))
    ctx.ops->gated_rmsnorm(ctx, sc.y, sc.zxbcdt + z_off, W, w.norm_w.data(), T, I, group, s.norm_eps,
                            sc.g);
  } else {
    // Falcon-H1: g = (norm_w * rmsnorm_groups(y) or y) * silu(z). The groups of y: (T, I) are
    // contiguous rows of `group` channels, so one weightless rmsnorm over T * I / group rows.
    if (s.gate_norm) ctx.ops->rmsnorm(ctx, sc.y, nullptr, T * (I / group), group, s.norm_eps, sc.y);
    ctx.ops->activation(ctx, Activation::Silu, sc.zxbcdt + z_off, nullptr, W, T, I, sc.g);
    for (size_t t = 0; t < static_cast<size_t>(T); ++t)
      for (int i = 0; i < I; ++i)
        sc.g[t * I + i] *= sc.y[t * I + i] * (s.gate_norm ? w.norm_w[i] : 1.0f);
  }
}

}  // namespace

void mamba2_forward(const KernelContext& ctx, const Mamba2Spec& s, const Mamba2Weights& w, const float* u,
                    int T, std::span<const SeqRun> runs, const Mamba2Buffers& sc, float* out) {
  const int I = s.d_inner, nh = s.n_heads, K = s.d_conv, conv_dim = s.conv_dim();
  const int G = s.n_groups, N = s.d_state;
  const int W = w.in_proj.rows;
  if (s.in_scale != 1.0f) {  // Falcon-H1: in_proj(u x ssm_in_multiplier)
    for (size_t i = 0; i < static_cast<size_t>(T) * w.in_proj.cols; ++i) sc.u[i] = u[i] * s.in_scale;
    u = sc.u;
  }
  // zxbcdt: (T, W) = u @ in_proj^T
  ctx.ops->matmul(ctx, w.in_proj.view(), data_or_null(w.in_proj_bias), u, T, sc.zxbcdt);
  if (std::any_of(std::begin(s.mup), std::end(s.mup), [](float m) { return m != 1.0f; })) {
    // Falcon-H1's mup_vector: one multiplier per segment [z (I) | x (I) | B (GN) | C (GN) | dt (nh)].
    const int ends[5] = {I, 2 * I, 2 * I + G * N, 2 * I + 2 * G * N, W};
    for (int t = 0; t < T; ++t) {
      float* row = sc.zxbcdt + static_cast<size_t>(t) * W;
      for (int seg = 0, c = 0; seg < 5; ++seg)
        for (; c < ends[seg]; ++c) row[c] *= s.mup[seg];
    }
  }
  // A batch of decode steps (every run one token) with the usual gate-then-norm: conv, dt, state
  // step and gate in one kernel per sequence (one parallel region where the ops take two; the
  // same numbers, bitwise).
  if (s.gate_norm && !s.norm_before_gate &&
      std::all_of(runs.begin(), runs.end(), [](const SeqRun& r) { return r.len == 1; })) {
    Mamba2StepParams p;
    p.dims = {nh, s.head_dim, G, N};
    p.conv_w = w.conv_w.data(), p.conv_b = data_or_null(w.conv_b), p.d_conv = K;
    p.dt_bias = w.dt_bias.data(), p.dt_min = s.dt_min, p.dt_max = s.dt_max;
    p.A = w.A.data(), p.D = w.D.data();
    p.norm_w = w.norm_w.data(), p.norm_eps = s.norm_eps;
    p.norm_group = s.norm_grouping == NormGrouping::Grouped ? I / G : I;
    for_each_run(ctx, runs, [&](const KernelContext& c, const SeqRun& r) {
      const size_t o = static_cast<size_t>(r.start);
      auto step = [&](auto kernel, auto* S) {  // the state as stored: f32, or bf16 updated in place
        // zxbcdt: (W) -> xbc: (conv_dim), dt: (nh), y: (I), g: (I)
        kernel(c, p, sc.zxbcdt + o * W, r.conv_state, S, sc.xbc + o * conv_dim, sc.dt + o * nh, sc.y + o * I,
               sc.g + o * I);
      };
      if (r.ssm_state_bf16) step(c.ops->mamba2_step_bf16, r.ssm_state_bf16);
      else step(c.ops->mamba2_step, r.ssm_state);
    });
  } else {
    mamba2_mix(ctx, s, w, T, runs, sc);
  }
  // out: (T, H) = g @ out_proj^T
  ctx.ops->matmul(ctx, w.out_proj.view(), data_or_null(w.out_proj_bias), sc.g, T, out);
  if (s.out_scale != 1.0f)
    for (size_t i = 0; i < static_cast<size_t>(T) * w.out_proj.rows; ++i) out[i] *= s.out_scale;
}

}  // namespace hybridlm
