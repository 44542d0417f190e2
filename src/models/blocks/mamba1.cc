#include "models/blocks/mamba1.h"

#include <algorithm>
#include <cmath>

#include "base/thread_pool.h"
#include "kernels/kernels.h"

namespace hybridlm {

namespace {

class Mamba1Mixer final : public MixerOf<Mamba1Spec, Mamba1Weights, load_mamba1> {
 public:
  using MixerOf::MixerOf;
  LayerCacheSpec cache_spec() const override { return {LayerCacheKind::Mamba, mamba1_state_spec(s_), {}}; }
  bool bf16_state_in_place() const override { return true; }
  void kernel_limits(KernelLimits& lim) const override {
    lim.conv_channels = std::max(lim.conv_channels, s_.d_inner);
    lim.conv_width = std::max(lim.conv_width, s_.d_conv);
    lim.d_state = std::max(lim.d_state, s_.d_state);
  }
  size_t scratch_floats(int T) const override {
    FloatArena count;
    mamba1_buffers(s_, T, count);
    return count.used();
  }
  void forward(const KernelContext& ctx, const float* u, int T, std::span<const SeqRun> runs, FloatArena& arena,
               float* out) const override {
    mamba1_forward(ctx, s_, w_, u, T, runs, mamba1_buffers(s_, T, arena), out);
  }
};

}  // namespace

std::unique_ptr<Mixer> make_mamba1_mixer(const Mamba1Spec& s, const std::string& prefix, int H) {
  return std::make_unique<Mamba1Mixer>(s, prefix, H);
}

Mamba1Buffers mamba1_buffers(const Mamba1Spec& s, int T, FloatArena& a) {
  const size_t n = static_cast<size_t>(T), I = s.d_inner, heads = s.head_tensors ? s.n_heads : 1;
  Mamba1Buffers b;
  b.xz = a.take(n * 2 * I);
  b.xc = a.take(n * I);
  b.xdbc = a.take(n * heads * (s.dt_rank + 2 * s.d_state));
  b.dt_in = a.take(n * s.dt_rank);
  b.dt = a.take(n * I);
  b.y = a.take(n * I);
  b.raw = s.in_proj_interleaved ? a.take(n * 2 * I) : nullptr;
  b.xh = s.head_tensors ? a.take(n * (I / heads)) : nullptr;
  b.yh = s.head_tensors ? a.take(n * I) : nullptr;
  return b;
}

Mamba1Weights load_mamba1(const TensorSource& r, const std::string& p, const Mamba1Spec& s, int H) {
  const int64_t I = s.d_inner, N = s.d_state, R = s.dt_rank, K = s.d_conv;
  Mamba1Weights w;
  w.in_proj = r.matrix(p + "in_proj.weight", {2 * I, H});
  if (s.proj_bias) w.in_proj_bias = r.vector(p + "in_proj.bias", {2 * I});
  w.conv_w = r.vector(p + "conv1d.weight", {I, 1, K});
  if (s.conv_bias) w.conv_b = r.vector(p + "conv1d.bias", {I});
  if (s.head_tensors) {  // Zamba: per-head x_proj / dt_proj; A_log (nh, P, N) and D (nh, P) are (I, N) and (I)
    const int64_t nh = s.n_heads, P = I / nh;
    w.x_proj_heads = r.stacked(p + "x_proj_weight", {nh, R + 2 * N, P});
    w.dt_proj_heads = r.stacked(p + "dt_proj_weight", {nh, P, R});
    w.dt_bias = r.vector(p + "dt_proj_bias", {nh, P});
    w.A = r.vector(p + "A_log", {nh, P, N});
    w.D = r.vector(p + "D", {nh, P});
  } else {
    w.x_proj = r.matrix(p + "x_proj.weight", {R + 2 * N, I});
    w.dt_proj = r.matrix(p + "dt_proj.weight", {I, R});
    w.dt_bias = r.vector(p + "dt_proj.bias", {I});
    w.A = r.vector(p + "A_log", {I, N});
    w.D = r.vector(p + "D", {I});
  }
  for (float& a : w.A) a = -std::exp(a);
  w.out_proj = r.matrix(p + "out_proj.weight", {H, I});
  if (s.proj_bias) w.out_proj_bias = r.vector(p + "out_proj.bias", {H});
  if (s.dt_bc_rms_weights) {  // Jamba
    w.dt_norm = r.vector(p + "dt_layernorm.weight", {R});
    w.b_norm = r.vector(p + "b_layernorm.weight", {N});
    w.c_norm = r.vector(p + "c_layernorm.weight", {N});
  }
  return w;
}

LayerStateSpec mamba1_state_spec(const Mamba1Spec& s) {
  return {s.d_conv - 1, s.d_inner, static_cast<size_t>(s.d_inner) * s.d_state};
}

namespace {

// Zamba's multi-head Mamba-1 from xc: (T, I) and z (row stride 2I): per head n of P channels,
// dbc_n = xc_n @ x_proj_n^T, dt_n = softplus(dt_in_n @ dt_proj_n^T + dt_bias_n), and the scan of
// the head's channels with its own B, C from the head's slice of each sequence's state; y: (T, I).
void mamba1_heads_forward(const KernelContext& ctx, const Mamba1Spec& s, const Mamba1Weights& w, int T,
                          std::span<const SeqRun> runs, const Mamba1Buffers& sc) {
  const int I = s.d_inner, N = s.d_state, R = s.dt_rank, nh = s.n_heads, P = I / nh;
  const int ld_dbc = R + 2 * N;
  const size_t TP = static_cast<size_t>(T) * P;
  for (int n = 0; n < nh; ++n) {
    // xh: (T, P) = xc[:, nP:(n+1)P]; dbc_n: (T, R + 2N) = xh @ x_proj_n^T
    for (int t = 0; t < T; ++t)
      std::copy_n(sc.xc + static_cast<size_t>(t) * I + static_cast<size_t>(n) * P, P,
                  sc.xh + static_cast<size_t>(t) * P);
    float* dbc = sc.xdbc + n * static_cast<size_t>(T) * ld_dbc;
    ctx.ops->matmul(ctx, w.x_proj_heads[n].view(), nullptr, sc.xh, T, dbc);
    // dt_n: (T, P) = softplus(dbc[:, :R] @ dt_proj_n^T + dt_bias_n)
    for (int t = 0; t < T; ++t)
      std::copy_n(dbc + static_cast<size_t>(t) * ld_dbc, R, sc.dt_in + static_cast<size_t>(t) * R);
    ctx.ops->matmul(ctx, w.dt_proj_heads[n].view(), w.dt_bias.data() + static_cast<size_t>(n) * P, sc.dt_in, T,
                    sc.dt + n * TP);
  }
  ctx.ops->softplus(ctx, sc.dt, static_cast<size_t>(T) * I);
  // yh_n: (T, P) = the head's selective scan, gated by silu(z_n)
  for_each_run(ctx, runs, [&](const KernelContext& c, const SeqRun& r) {
    const size_t o = static_cast<size_t>(r.start);
    for (int n = 0; n < nh; ++n) {
      const size_t ch = static_cast<size_t>(n) * P;  // the head's first channel
      const float* dbc = sc.xdbc + n * static_cast<size_t>(T) * ld_dbc + o * ld_dbc;
      auto scan = [&](auto kernel, auto* h) {
        kernel(c, sc.xc + o * I + ch, I, sc.dt + n * TP + o * P, w.A.data() + ch * N, dbc + R, dbc + R + N, ld_dbc,
               w.D.data() + ch, sc.xz + o * 2 * I + I + ch, 2 * I, h + ch * N, r.len, P, N, sc.yh + n * TP + o * P);
      };
      if (r.ssm_state_bf16) scan(c.ops->mamba1_scan_bf16, r.ssm_state_bf16);
      else scan(c.ops->mamba1_scan, r.ssm_state);
    }
  });
  // y: (T, I) = the heads side by side
  for (int n = 0; n < nh; ++n)
    for (int t = 0; t < T; ++t)
      std::copy_n(sc.yh + n * TP + static_cast<size_t>(t) * P, P,
                  sc.y + static_cast<size_t>(t) * I + static_cast<size_t>(n) * P);
}

}  // namespace

void mamba1_forward(const KernelContext& ctx, const Mamba1Spec& s, const Mamba1Weights& w, const float* u,
                    int T, std::span<const SeqRun> runs, const Mamba1Buffers& sc, float* out) {
  const int I = s.d_inner, N = s.d_state, R = s.dt_rank, K = s.d_conv;
  const int ld_dbc = R + 2 * N;

  // xz: (T, 2I) = u @ in_proj^T; x = xz[:, :I], z = xz[:, I:]
  if (s.in_proj_interleaved) {  // Zamba: raw rows alternate x_c, z_c
    ctx.ops->matmul(ctx, w.in_proj.view(), data_or_null(w.in_proj_bias), u, T, sc.raw);
    for (int t = 0; t < T; ++t) {
      const float* src = sc.raw + static_cast<size_t>(t) * 2 * I;
      float* dst = sc.xz + static_cast<size_t>(t) * 2 * I;
      for (int ch = 0; ch < I; ++ch) {
        dst[ch] = src[2 * ch];
        dst[I + ch] = src[2 * ch + 1];
      }
    }
  } else {
    ctx.ops->matmul(ctx, w.in_proj.view(), data_or_null(w.in_proj_bias), u, T, sc.xz);
  }
  // xc: (T, I) = silu(causal_conv(x)), per sequence from its conv state
  for_each_run(ctx, runs, [&](const KernelContext& c, const SeqRun& r) {
    c.ops->conv1d_causal(c, sc.xz + static_cast<size_t>(r.start) * 2 * I, 2 * I, w.conv_w.data(),
                          data_or_null(w.conv_b), r.conv_state, r.len, I, K, true,
                          sc.xc + static_cast<size_t>(r.start) * I);
  });
  if (s.head_tensors) {
    mamba1_heads_forward(ctx, s, w, T, runs, sc);
    ctx.ops->matmul(ctx, w.out_proj.view(), data_or_null(w.out_proj_bias), sc.y, T, out);
    return;
  }
  // xdbc: (T, R + 2N) = xc @ x_proj^T -> dt_in (R), B (N), C (N)
  ctx.ops->matmul(ctx, w.x_proj.view(), nullptr, sc.xc, T, sc.xdbc);
  for (int t = 0; t < T; ++t) {
    float* row = sc.xdbc + static_cast<size_t>(t) * ld_dbc;
    if (s.dt_bc_rms) {  // RMS norm of dt_in, B and C separately (FalconMamba: no weights; Jamba: weights)
      ctx.ops->rmsnorm(ctx, row, data_or_null(w.dt_norm), 1, R, s.dt_bc_rms_eps, row);
      ctx.ops->rmsnorm(ctx, row + R, data_or_null(w.b_norm), 1, N, s.dt_bc_rms_eps, row + R);
      ctx.ops->rmsnorm(ctx, row + R + N, data_or_null(w.c_norm), 1, N, s.dt_bc_rms_eps, row + R + N);
    }
    std::copy(row, row + R, sc.dt_in + static_cast<size_t>(t) * R);
  }
  // The scan of channels [c0, c0 + n) of run r, gated by silu(z) (y: (T, I)). The scan kernel
  // takes its channel count as the row stride of dt and y, so n < I is for one-token runs only.
  auto scan_channels = [&](const KernelContext& c, const SeqRun& r, int c0, int n) {
    const size_t o = static_cast<size_t>(r.start), ch = static_cast<size_t>(c0);
    const float* dbc = sc.xdbc + o * ld_dbc;
    auto scan = [&](auto kernel, auto* h) {  // the state as stored: f32, or bf16 updated in place
      kernel(c, sc.xc + o * I + ch, I, sc.dt + o * I + ch, w.A.data() + ch * N, dbc + R, dbc + R + N, ld_dbc,
             w.D.data() + ch, sc.xz + o * 2 * I + I + ch, 2 * I, h + ch * N, r.len, n, N, sc.y + o * I + ch);
    };
    if (r.ssm_state_bf16) scan(c.ops->mamba1_scan_bf16, r.ssm_state_bf16);
    else scan(c.ops->mamba1_scan, r.ssm_state);
  };
  // One token of one sequence (batch-1 decode): dt_proj, softplus and the scan in one parallel
  // region over blocks of kPanelRows channels instead of one region each, each op on its own
  // thread over the block's channels. A channel's dt row, softplus and state update depend on that
  // channel alone, and a matmul row on K only, so this is bitwise what the three calls give.
  WeightView dt_rows;  // (weight_rows also says whether dt_proj's dtype can be split)
  if (T == 1 && ctx.pool && ctx.pool->size() > 1 && I % kPanelRows == 0 &&
      weight_rows(w.dt_proj.view(), 0, 0, dt_rows)) {
    const KernelContext one{nullptr, ctx.ops, ctx.scratch};
    ctx.pool->parallel_for(static_cast<size_t>(I / kPanelRows), [&](size_t b, size_t e) {
      const int c0 = static_cast<int>(b) * kPanelRows, n = static_cast<int>(e - b) * kPanelRows;
      WeightView rows;
      weight_rows(w.dt_proj.view(), c0, n, rows);
      one.ops->matmul(one, rows, w.dt_bias.data() + c0, sc.dt_in, 1, sc.dt + c0);
      one.ops->softplus(one, sc.dt + c0, static_cast<size_t>(n));
      scan_channels(one, runs[0], c0, n);
    });
  } else {
    // dt: (T, I) = softplus(dt_in @ dt_proj^T + dt_bias)
    ctx.ops->matmul(ctx, w.dt_proj.view(), w.dt_bias.data(), sc.dt_in, T, sc.dt);
    ctx.ops->softplus(ctx, sc.dt, static_cast<size_t>(T) * I);
    // y: (T, I) = selective scan, gated by silu(z)
    for_each_run(ctx, runs, [&](const KernelContext& c, const SeqRun& r) { scan_channels(c, r, 0, I); });
  }
  // out: (T, H) = y @ out_proj^T
  ctx.ops->matmul(ctx, w.out_proj.view(), data_or_null(w.out_proj_bias), sc.y, T, out);
}

}  // namespace hybridlm
