// CPU kernels for norms, the causal conv and the two scans. Each loop body is written once
// (always_inline) and instantiated per SIMD path by HYBRIDLM_SIMD_VARIANTS (the compiler
// vectorises it with 16 lanes for AVX-512, 8 for AVX2). Threads split channels or heads, which
// never interact inside one kernel, so results do not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/ssd_avx512.h"
#include "kernels/cpu/ssm_step_avx512.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/kernels.h"

namespace hybridlm::cpu {

namespace {

// ---- RMSNorm ------------------------------------------------------------------------------------
HYBRIDLM_INLINE void rmsnorm_rows(const float* x, const float* w, int d, float eps, float* y,
                                  size_t tb, size_t te) {
  for (size_t t = tb; t < te; ++t) {
    const float* xr = x + t * d;
    float* yr = y + t * d;
    const float ss = vdot(xr, xr, d);
    const float inv = 1.0f / std::sqrt(ss / d + eps);
    if (w) for (int i = 0; i < d; ++i) yr[i] = xr[i] * inv * w[i];
    else for (int i = 0; i < d; ++i) yr[i] = xr[i] * inv;
  }
}
HYBRIDLM_SIMD_VARIANTS(rmsnorm, rmsnorm_rows)

// ---- gated RMSNorm (gate, then norm per group) -------------------------------------------------
// The two halves of a row, also run apart by the fused Mamba-2 step (the gate per head in its
// region, the norm after it): o[i] = y[i] silu(z[i]) over [b, e); then o[i] *= w[i] / rms(group).
HYBRIDLM_INLINE void gate_range(const float* y, const float* z, float* o, size_t b, size_t e) {
  for (size_t i = b; i < e; ++i) o[i] = y[i] * vsilu(z[i]);
}
HYBRIDLM_INLINE void group_norm_row(float* o, const float* w, int d, int gs, float eps) {
  for (int g0 = 0; g0 < d; g0 += gs) {
    const float ss = vdot(o + g0, o + g0, gs);
    const float inv = 1.0f / std::sqrt(ss / gs + eps);
    for (int i = g0; i < g0 + gs; ++i) o[i] = o[i] * inv * w[i];
  }
}
HYBRIDLM_INLINE void gated_rows(const float* y, const float* z, int ld_z, const float* w, int d,
                                int gs, float eps, float* out, size_t tb, size_t te) {
  for (size_t t = tb; t < te; ++t) {
    float* o = out + t * d;
    gate_range(y + t * d, z + t * ld_z, o, 0, static_cast<size_t>(d));
    group_norm_row(o, w, d, gs, eps);
  }
}
HYBRIDLM_SIMD_VARIANTS(gated, gated_rows)
HYBRIDLM_SIMD_VARIANTS(gate, gate_range)
HYBRIDLM_SIMD_VARIANTS(group_norm, group_norm_row)

// ---- causal depthwise conv ---------------------------------------------------------------------
// For channels [cb, ce): out[t, c] = sum_k w[c, k] * in(t - (K-1) + k, c), where in(j < 0) comes
// from the state. Channels are independent, so threads split them.
inline size_t conv_taps_floats(int K, size_t channels) { return static_cast<size_t>(K) * channels; }
HYBRIDLM_INLINE void conv_channels(const float* x, int ld_x, const float* w, const float* bias,
                                   float* state, int T, int C, int K, bool act, float* out,
                                   size_t cb, size_t ce, float* wt) {
  // wt: the taps as (K, channels) (w is (C, K), and a stride-K read per channel does not
  // vectorise): conv_taps_floats of scratch.
  const size_t nc = ce - cb;
  for (size_t c = cb; c < ce; ++c)
    for (int k = 0; k < K; ++k) wt[static_cast<size_t>(k) * nc + (c - cb)] = w[c * K + k];
  for (int t = 0; t < T; ++t) {
    float* o = out + static_cast<size_t>(t) * C;
    for (size_t c = cb; c < ce; ++c) o[c] = bias ? bias[c] : 0.0f;
    for (int k = 0; k < K; ++k) {
      const int j = t - (K - 1) + k;
      const float* src = j < 0 ? state + static_cast<size_t>(K - 1 + j) * C
                               : x + static_cast<size_t>(j) * ld_x;
      const float* wk = wt + static_cast<size_t>(k) * nc;
      for (size_t c = cb; c < ce; ++c) o[c] += wk[c - cb] * src[c];
    }
    if (act) for (size_t c = cb; c < ce; ++c) o[c] = vsilu(o[c]);
  }
  // New state: the last K-1 inputs of (state ++ x).
  for (int k = 0; k < K - 1; ++k) {
    const int j = T - (K - 1) + k;  // index into x, or into the old state when negative
    float* dst = state + static_cast<size_t>(k) * C;
    if (j >= 0) {
      for (size_t c = cb; c < ce; ++c) dst[c] = x[static_cast<size_t>(j) * ld_x + c];
    } else {
      const float* src = state + static_cast<size_t>(K - 1 + j) * C;  // K-1+j > k: reads ahead
      for (size_t c = cb; c < ce; ++c) dst[c] = src[c];
    }
  }
}
HYBRIDLM_SIMD_VARIANTS(conv, conv_channels)

// ---- Mamba-1 selective scan over channels [ib, ie) ---------------------------------------------
// Channels are processed 16 at a time, one per vector lane: the state block is transposed to
// (N, 16) so that every step is a lane-wise update with no reduction across lanes, and each
// channel's arithmetic is the same whichever lane or thread it lands on.
constexpr int kLanes = 16;
inline size_t m1_block_floats(int N) { return static_cast<size_t>(N) * kLanes; }
template <class St>
HYBRIDLM_INLINE void m1_channels(const float* x, int ld_x, const float* dt, const float* A,
                                 const float* B, const float* C, int ld_bc, const float* D,
                                 const float* z, int ld_z, St* h, int T, int I, int N, float* y,
                                 size_t ib, size_t ie, float* hT, float* AT) {
  // hT, AT: a block's state and A transposed, (N, 16) each.
  for (size_t i0 = ib; i0 < ie; i0 += kLanes) {
    const int nl = static_cast<int>(std::min<size_t>(kLanes, ie - i0));
    for (int n = 0; n < N; ++n)
      for (int l = 0; l < kLanes; ++l) {
        hT[n * kLanes + l] = l < nl ? widen(h[(i0 + l) * N + n]) : 0.0f;
        AT[n * kLanes + l] = l < nl ? A[(i0 + l) * N + n] : 0.0f;
      }
    for (int t = 0; t < T; ++t) {
      float d[kLanes], dx[kLanes], acc[kLanes];
      const float* dtt = dt + static_cast<size_t>(t) * I + i0;
      const float* xt = x + static_cast<size_t>(t) * ld_x + i0;
      for (int l = 0; l < kLanes; ++l) {
        d[l] = l < nl ? dtt[l] : 0.0f;
        dx[l] = l < nl ? d[l] * xt[l] : 0.0f;
        acc[l] = 0.0f;
      }
      const float* Bt = B + static_cast<size_t>(t) * ld_bc;
      const float* Ct = C + static_cast<size_t>(t) * ld_bc;
      for (int n = 0; n < N; ++n) {
        float* hn = hT + n * kLanes;
        const float* an = AT + n * kLanes;
        const float b = Bt[n], c = Ct[n];
        for (int l = 0; l < kLanes; ++l) {
          hn[l] = vexp(d[l] * an[l]) * hn[l] + dx[l] * b;
          acc[l] += hn[l] * c;
        }
      }
      float* yt = y + static_cast<size_t>(t) * I + i0;
      const float* zt = z + static_cast<size_t>(t) * ld_z + i0;
      for (int l = 0; l < nl; ++l) yt[l] = (acc[l] + D[i0 + l] * xt[l]) * vsilu(zt[l]);
    }
    for (int n = 0; n < N; ++n)
      for (int l = 0; l < nl; ++l) narrow(hT[n * kLanes + l], h[(i0 + l) * N + n]);
  }
}
HYBRIDLM_SIMD_VARIANTS(m1, m1_channels)

// How a step's state decays and how its input is weighed: Mamba-2 (log-decay dt A_h, input
// weight dt) or the discrete Mamba-2 (log-decay given per token, input weight 1). Both scans are
// the same loops over one of these.
struct Mamba2Decay {
  const float* dt;  // (T, nh)
  const float* A;   // (nh)
  HYBRIDLM_INLINE float log_decay(size_t i, size_t h) const { return dt[i] * A[h]; }
  HYBRIDLM_INLINE float weight(size_t i) const { return dt[i]; }
};
struct DiscreteDecay {
  const float* log_a;  // (T, nh)
  HYBRIDLM_INLINE float log_decay(size_t i, size_t) const { return log_a[i]; }
  HYBRIDLM_INLINE float weight(size_t) const { return 1.0f; }
};

// ---- Mamba-2 SSD over heads [hb, he) -----------------------------------------------------------
// Per chunk of Q steps with cumulative log-decay s_i (see ref/ops_ref.cc for the formulas):
//   y_i = sum_{j<=i} exp(s_i - s_j) (C_i.B_j) w_j x_j + exp(s_i) S_in C_i + D x_i
//   S_out = exp(s_last) S_in + sum_j exp(s_last - s_j) w_j x_j B_j^T
// A run of one token (decode) is the plain recurrence, which is the same formula with Q = 1.
// (w_j = dt_j for Mamba-2, 1 for the discrete Mamba-2.)
template <class Decay>
HYBRIDLM_INLINE void ssd_heads(const float* x, int ld_x, Decay dec, const float* B, const float* C, int ld_bc,
                               const float* D, const SsdDims& dm, int chunk, float* S, int T, float* y,
                               size_t hb, size_t he, float* s, float* L, float* wj) {
  // s, wj: (chunk); L: (chunk, chunk). dec's arrays are (T, nh), read at t * nh + h.
  const int nh = dm.n_heads, P = dm.head_dim, N = dm.d_state, hpg = nh / dm.n_groups;
  for (size_t h = hb; h < he; ++h) {
    const size_t g = h / hpg;
    float* Sh = S + h * P * N;
    for (int c0 = 0; c0 < T; c0 += chunk) {
      const int Q = std::min(chunk, T - c0);
      float acc_s = 0;
      for (int i = 0; i < Q; ++i) {
        acc_s += dec.log_decay(static_cast<size_t>(c0 + i) * nh + h, h);
        s[i] = acc_s;
      }
      // L[i, j] = exp(s_i - s_j) * (C_i . B_j) * dt_j for j <= i.
      for (int i = 0; i < Q; ++i) {
        const float* Ci = C + static_cast<size_t>(c0 + i) * ld_bc + g * N;
        for (int j = 0; j <= i; ++j) {
          const float* Bj = B + static_cast<size_t>(c0 + j) * ld_bc + g * N;
          const float cb = vdot(Ci, Bj, N);
          L[static_cast<size_t>(i) * chunk + j] =
              vexp(s[i] - s[j]) * cb * dec.weight(static_cast<size_t>(c0 + j) * nh + h);
        }
      }
      for (int i = 0; i < Q; ++i) {
        const size_t ti = static_cast<size_t>(c0 + i);
        const float* Ci = C + ti * ld_bc + g * N;
        float* yi = y + ti * nh * P + h * P;
        const float ei = vexp(s[i]);
        for (int p = 0; p < P; ++p) {  // contribution of the incoming state
          const float* Sp = Sh + static_cast<size_t>(p) * N;
          const float off = vdot(Sp, Ci, N);
          yi[p] = ei * off + D[h] * x[ti * ld_x + h * P + p];
        }
        for (int j = 0; j <= i; ++j) {  // intra-chunk
          const float l = L[static_cast<size_t>(i) * chunk + j];
          const float* xj = x + static_cast<size_t>(c0 + j) * ld_x + h * P;
          for (int p = 0; p < P; ++p) yi[p] += l * xj[p];
        }
      }
      const float e_last = vexp(s[Q - 1]);
      for (int j = 0; j < Q; ++j) wj[j] = vexp(s[Q - 1] - s[j]) * dec.weight(static_cast<size_t>(c0 + j) * nh + h);
      for (int p = 0; p < P; ++p) {
        float* Sp = Sh + static_cast<size_t>(p) * N;
        for (int n = 0; n < N; ++n) Sp[n] *= e_last;
        for (int j = 0; j < Q; ++j) {
          const float a = wj[j] * x[static_cast<size_t>(c0 + j) * ld_x + h * P + p];
          const float* Bj = B + static_cast<size_t>(c0 + j) * ld_bc + g * N;
          for (int n = 0; n < N; ++n) Sp[n] += a * Bj[n];
        }
      }
    }
  }
}
HYBRIDLM_SIMD_VARIANTS(ssd, ssd_heads)

// ---- softplus in place over [b, e) -------------------------------------------------------------
HYBRIDLM_INLINE void softplus_range(float* x, size_t b, size_t e) {
  for (size_t i = b; i < e; ++i) x[i] = vsoftplus(x[i]);
}
HYBRIDLM_SIMD_VARIANTS(softplus, softplus_range)

// ---- Mamba-2 decode dt over heads [b, e): clamp(softplus(raw + bias)) --------------------------
// raw + bias rounded first, as mamba2's separate ops do.
HYBRIDLM_INLINE void m2_dt_range(const float* raw, const float* bias, float lo, float hi, float* dt, size_t b,
                                 size_t e) {
  for (size_t h = b; h < e; ++h) {
    const float v = raw[h] + bias[h];
    dt[h] = std::clamp(vsoftplus(v), lo, hi);
  }
}
HYBRIDLM_SIMD_VARIANTS(m2_dt, m2_dt_range)

// ---- Mamba-2 single step over heads [hb, he) ---------------------------------------------------
// One pass over the state: each row (h, p) is read, decayed and updated, dotted with C, and written
// back. With bf16 storage the updated row is kept in f32 for the dot and rounded once on the way out.
template <class Decay, class St>
HYBRIDLM_INLINE void ssd_step_heads(const float* x, Decay dec, const float* B, const float* C, const float* D,
                                    const SsdDims& dm, St* S, float* y, size_t hb, size_t he, float* wide) {
  // wide (N): with bf16 storage, one row of the state, updated, in f32.
  const int P = dm.head_dim, N = dm.d_state, hpg = dm.n_heads / dm.n_groups;
  for (size_t h = hb; h < he; ++h) {
    const float* Bg = B + (h / hpg) * N;
    const float* Cg = C + (h / hpg) * N;
    const float decay = vexp(dec.log_decay(h, h));
    for (int p = 0; p < P; ++p) {
      St* Sp = S + (h * P + p) * N;
      const float xv = x[h * P + p], dx = dec.weight(h) * xv;
      float* row;
      if constexpr (std::is_same_v<St, float>) row = Sp;
      else row = wide;
      for (int n = 0; n < N; ++n) row[n] = decay * widen(Sp[n]) + dx * Bg[n];
      y[h * P + p] = vdot(row, Cg, N) + D[h] * xv;
      if constexpr (!std::is_same_v<St, float>)
        for (int n = 0; n < N; ++n) narrow(row[n], Sp[n]);
    }
  }
}
HYBRIDLM_SIMD_VARIANTS(ssd_step_loops, ssd_step_heads)  // not ssd_step_avx512: that is the intrinsics kernel


}  // namespace

void rmsnorm(const KernelContext& ctx, const float* x, const float* w, int T, int d, float eps,
             float* y) {
  parallel(ctx, T, 8, [&](size_t b, size_t e) {
    rmsnorm_dispatch(x, w, d, eps, y, b, e);
  });
}

void gated_rmsnorm(const KernelContext& ctx, const float* y, const float* z, int ld_z,
                   const float* w, int T, int d, int group_size, float eps, float* out) {
  parallel(ctx, T, 8, [&](size_t b, size_t e) {
    gated_dispatch(y, z, ld_z, w, d, group_size, eps, out, b, e);
  });
}

void conv1d_causal(const KernelContext& ctx, const float* x, int ld_x, const float* w,
                   const float* bias, float* state, int T, int C, int K, bool apply_silu,
                   float* out) {
  if (T == 1 && simd_path() == SimdPath::Avx512 && conv_step_avx512(ctx, x, w, bias, state, C, K, apply_silu, out))
    return;
  parallel(ctx, C, 64, [&](size_t b, size_t e) {
    ScratchFrame frame(ctx);
    conv_dispatch(x, ld_x, w, bias, state, T, C, K, apply_silu, out, b, e, frame.take(conv_taps_floats(K, e - b)));
  });
}

namespace {
// Both state types (f32, bf16 stored and updated in place) through the same kernels.
template <class St>
void m1_scan(const KernelContext& ctx, const float* x, int ld_x, const float* dt, const float* A, const float* B,
             const float* C, int ld_bc, const float* D, const float* z, int ld_z, St* h, int T, int I, int N,
             float* y) {
  if (T == 1 && simd_path() == SimdPath::Avx512 && mamba1_step_avx512(ctx, x, dt, A, B, C, D, z, h, I, N, y)) return;
  if (simd_path() == SimdPath::Avx512 &&
      mamba1_scan_avx512(ctx, x, ld_x, dt, A, B, C, ld_bc, D, z, ld_z, h, T, I, N, y))
    return;
  parallel(ctx, I, 16, [&](size_t b, size_t e) {
    ScratchFrame frame(ctx);
    float* hT = frame.take(m1_block_floats(N));
    float* AT = frame.take(m1_block_floats(N));
    m1_dispatch(x, ld_x, dt, A, B, C, ld_bc, D, z, ld_z, h, T, I, N, y, b, e, hT, AT);
  });
}
}  // namespace

void mamba1_scan(const KernelContext& ctx, const float* x, int ld_x, const float* dt,
                 const float* A, const float* B, const float* C, int ld_bc, const float* D,
                 const float* z, int ld_z, float* h, int T, int I, int N, float* y) {
  m1_scan(ctx, x, ld_x, dt, A, B, C, ld_bc, D, z, ld_z, h, T, I, N, y);
}
void mamba1_scan(const KernelContext& ctx, const float* x, int ld_x, const float* dt,
                 const float* A, const float* B, const float* C, int ld_bc, const float* D,
                 const float* z, int ld_z, uint16_t* h, int T, int I, int N, float* y) {
  m1_scan(ctx, x, ld_x, dt, A, B, C, ld_bc, D, z, ld_z, h, T, I, N, y);
}

void ssd_scan(const KernelContext& ctx, const float* x, int ld_x, const float* dt,
              const float* A, const float* B, const float* C, int ld_bc, const float* D,
              const SsdDims& dims, int chunk, float* S, int T, float* y) {
  if (simd_path() == SimdPath::Avx512 &&
      ssd_scan_avx512(ctx, x, ld_x, dt, A, B, C, ld_bc, D, dims, chunk, S, T, y))
    return;
  parallel(ctx, dims.n_heads, 1, [&](size_t b, size_t e) {
    ScratchFrame frame(ctx);
    float* s = frame.take(static_cast<size_t>(chunk));
    float* L = frame.take(static_cast<size_t>(chunk) * chunk);
    float* wj = frame.take(static_cast<size_t>(chunk));
    ssd_dispatch(x, ld_x, Mamba2Decay{dt, A}, B, C, ld_bc, D, dims, chunk, S, T, y, b, e, s, L, wj);
  });
}

// The discrete Mamba-2 runs the portable-source loops on every path (compiled per SIMD path like
// the rest): the AVX-512 intrinsics kernels take dt and A.
void ssd_scan_discrete(const KernelContext& ctx, const float* x, int ld_x, const float* log_a, const float* B,
                       const float* C, int ld_bc, const float* D, const SsdDims& dims, int chunk, float* S, int T,
                       float* y) {
  parallel(ctx, dims.n_heads, 1, [&](size_t b, size_t e) {
    ScratchFrame frame(ctx);
    float* s = frame.take(static_cast<size_t>(chunk));
    float* L = frame.take(static_cast<size_t>(chunk) * chunk);
    float* wj = frame.take(static_cast<size_t>(chunk));
    ssd_dispatch(x, ld_x, DiscreteDecay{log_a}, B, C, ld_bc, D, dims, chunk, S, T, y, b, e, s, L, wj);
  });
}

void ssd_step_discrete(const KernelContext& ctx, const float* x, const float* log_a, const float* B, const float* C,
                       const float* D, const SsdDims& dims, float* S, float* y) {
  parallel(ctx, dims.n_heads, 4, [&](size_t b, size_t e) {
    ssd_step_loops_dispatch(x, DiscreteDecay{log_a}, B, C, D, dims, S, y, b, e, static_cast<float*>(nullptr));
  });
}

namespace {
template <class St>
void step_any(const KernelContext& ctx, const float* x, const float* dt, const float* A, const float* B, const float* C,
          const float* D, const SsdDims& dims, St* S, float* y) {
  if (simd_path() == SimdPath::Avx512 && ssd_step_avx512(ctx, x, dt, A, B, C, D, dims, S, y)) return;
  parallel(ctx, dims.n_heads, 4, [&](size_t b, size_t e) {
    ScratchFrame frame(ctx);
    ssd_step_loops_dispatch(x, Mamba2Decay{dt, A}, B, C, D, dims, S, y, b, e,
                            frame.take(static_cast<size_t>(dims.d_state)));
  });
}
}  // namespace

void ssd_step(const KernelContext& ctx, const float* x, const float* dt, const float* A, const float* B,
              const float* C, const float* D, const SsdDims& dims, float* S, float* y) {
  step_any(ctx, x, dt, A, B, C, D, dims, S, y);
}
void ssd_step(const KernelContext& ctx, const float* x, const float* dt, const float* A, const float* B,
              const float* C, const float* D, const SsdDims& dims, uint16_t* S, float* y) {
  step_any(ctx, x, dt, A, B, C, D, dims, S, y);
}

namespace {
// The fused Mamba-2 step: the conv of B and C (read by every head of a group) on the calling
// thread, then one region over heads, each range doing its heads' x conv, dt, state step and gate
// with the per-element code of the separate ops (so bitwise their result), then the norm's
// per-group sums on the calling thread: one parallel region where the ops take two (conv, step).
template <class St>
void m2_step(const KernelContext& ctx, const Mamba2StepParams& p, const float* zxbcdt, float* conv_state, St* S,
             float* xbc, float* dt, float* y, float* out) {
  const SsdDims& dm = p.dims;
  const int nh = dm.n_heads, P = dm.head_dim, N = dm.d_state, K = p.d_conv;
  const size_t I = static_cast<size_t>(nh) * P, GN = static_cast<size_t>(dm.n_groups) * N, C = I + 2 * GN;
  const float* z = zxbcdt;           // z: (I)
  const float* x_in = zxbcdt + I;    // xBC: (C), before the conv
  const float* dt_raw = x_in + C;    // dt: (nh), before softplus
  const bool avx512 = simd_path() == SimdPath::Avx512;
  const bool conv4 = avx512 && K == 4, step512 = avx512 && N % 16 == 0 && P % 4 == 0;
  auto conv = [&](size_t cb, size_t ce) {  // conv1d_causal's T = 1 paths, channels [cb, ce)
    if (conv4) {
      conv4_step_avx512_channels(x_in, p.conv_w, p.conv_b, conv_state, static_cast<int>(C), true, xbc, cb, ce);
      return;
    }
    ScratchFrame frame(ctx);
    conv_dispatch(x_in, static_cast<int>(C), p.conv_w, p.conv_b, conv_state, 1, static_cast<int>(C), K, true, xbc, cb,
                  ce, frame.take(conv_taps_floats(K, ce - cb)));
  };
  conv(I, C);  // B, C: (G N) each
  const float* B = xbc + I;
  const float* Cm = B + GN;
  parallel(ctx, nh, 4, [&](size_t hb, size_t he) {
    conv(hb * P, he * P);
    m2_dt_dispatch(dt_raw, p.dt_bias, p.dt_min, p.dt_max, dt, hb, he);
    if (step512) {
      ssd_step_avx512_heads(xbc, dt, p.A, B, Cm, p.D, dm, S, y, hb, he);
    } else {
      ScratchFrame frame(ctx);
      ssd_step_loops_dispatch(xbc, Mamba2Decay{dt, p.A}, B, Cm, p.D, dm, S, y, hb, he,
                              frame.take(static_cast<size_t>(N)));
    }
    gate_dispatch(y, z, out, hb * P, he * P);
  });
  group_norm_dispatch(out, p.norm_w, static_cast<int>(I), p.norm_group, p.norm_eps);
}
}  // namespace

void mamba2_step(const KernelContext& ctx, const Mamba2StepParams& p, const float* zxbcdt, float* conv_state, float* S,
                 float* xbc, float* dt, float* y, float* out) {
  m2_step(ctx, p, zxbcdt, conv_state, S, xbc, dt, y, out);
}
void mamba2_step(const KernelContext& ctx, const Mamba2StepParams& p, const float* zxbcdt, float* conv_state,
                 uint16_t* S, float* xbc, float* dt, float* y, float* out) {
  m2_step(ctx, p, zxbcdt, conv_state, S, xbc, dt, y, out);
}

void softplus(const KernelContext& ctx, float* x, size_t n) {
  parallel(ctx, n, 4096, [&](size_t b, size_t e) { softplus_dispatch(x, b, e); });
}

void embedding(const WeightView& E, const int32_t* ids, int T, float* out) {
  for (int t = 0; t < T; ++t) {
    const size_t row = static_cast<size_t>(ids[t]) * E.cols;
    float* o = out + static_cast<size_t>(t) * E.cols;
    if (E.dtype == DType::I8) {
      dequantize_q8_0_matrix_row(static_cast<const uint8_t*>(E.data), E.scales, ids[t], E.cols, o);
    } else if (E.dtype == DType::U8) {
      dequantize_q4_0_matrix_row(static_cast<const uint8_t*>(E.data), E.scales, ids[t], E.cols, o);
    } else if (E.panels && E.dtype == DType::BF16) {
      const uint16_t* e = static_cast<const uint16_t*>(E.data);
      for_panel_row(ids[t], E.cols, [&](int c, size_t i) { o[c] = bf16_to_f32(e[i]); });
    } else if (E.panels) {
      const float* e = static_cast<const float*>(E.data);
      for_panel_row(ids[t], E.cols, [&](int c, size_t i) { o[c] = e[i]; });
    } else if (E.dtype == DType::BF16) {
      const uint16_t* e = static_cast<const uint16_t*>(E.data) + row;
      for (int c = 0; c < E.cols; ++c) o[c] = bf16_to_f32(e[c]);
    } else {
      std::memcpy(o, static_cast<const float*>(E.data) + row, sizeof(float) * E.cols);
    }
  }
}

ScratchNeed ssm_scratch(const KernelLimits& lim) {
  const size_t chunk = static_cast<size_t>(lim.ssd_chunk);
  const size_t each = std::max({FloatArena::rounded(conv_taps_floats(lim.conv_width, lim.conv_channels)),
                                2 * FloatArena::rounded(m1_block_floats(lim.d_state)),
                                2 * FloatArena::rounded(chunk) + FloatArena::rounded(chunk * chunk),
                                FloatArena::rounded(static_cast<size_t>(lim.d_state))});
  return most(most({each, each}, ssd_scan_avx512_scratch(lim)), ssm_step_avx512_scratch(lim));
}

}  // namespace hybridlm::cpu
