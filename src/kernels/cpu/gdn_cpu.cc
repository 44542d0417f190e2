// The gated delta rule (gated DeltaNet) on the CPU: the chunked WY / UT-transform prefill and the
// recurrent decode step, threads over value heads, the loops written once and compiled per SIMD
// path (cpu_common.h).
//
// The chunked form, per value head and chunk of Q steps from the state S0 (dk, dv), with
// c_i = g_1 + ... + g_i (the chunk's cumulative log-decay), k and q already normalised:
//   the new values u_i = beta_i (v_i - S_{i-}^T k_i), where S_{i-} = exp(c_i) S0 + sum_{j<i}
//   exp(c_i - c_j) k_j u_j^T is the decayed state the step reads, solve the unit lower-triangular
//   system (I + A) U = R with A_ij = beta_i exp(c_i - c_j) (k_i . k_j) (j < i) and
//   R_i = beta_i (v_i - exp(c_i) S0^T k_i), by forward substitution (the UT transform);
//   y_i = exp(c_i) S0^T q_i + sum_{j<=i} exp(c_i - c_j) (q_i . k_j) u_j;
//   S_out = exp(c_Q) S0 + sum_j exp(c_Q - c_j) k_j u_j^T.
// Every exp(.) above has an argument <= 0, so nothing overflows at any chunk length. The decay
// between two steps of a chunk, c_i - c_j, is summed from the g between them (not subtracted from
// two long cumulative sums, which would lose the small differences of fast-decaying heads to the
// rounding of the large sums). A run of one step is the recurrence itself (gated_delta_step).
#include <algorithm>
#include <cmath>

#include "base/arena.h"
#include "kernels/cpu/cpu_common.h"

namespace hybridlm::cpu {

namespace {

// 1 / sqrt(sum x^2 + 1e-6) over n values.
HYBRIDLM_INLINE float inv_l2(const float* x, int n) {
  float ss = 0;
  for (int i = 0; i < n; ++i) ss += x[i] * x[i];
  return 1.0f / std::sqrt(ss + 1e-6f);
}

// The working memory of one thread for one head's chunk: qn, kn (chunk, dk), u (chunk, dv),
// c and tail (chunk), decay (chunk, chunk) and acc (dv).
struct ChunkScratch {
  float *qn, *kn, *u, *c, *tail, *decay, *acc;
};

size_t chunk_scratch_floats(int chunk, int dk, int dv) {
  const size_t Q = static_cast<size_t>(chunk);
  return 2 * FloatArena::rounded(Q * dk) + FloatArena::rounded(Q * dv) + 2 * FloatArena::rounded(Q) +
         FloatArena::rounded(Q * Q) + FloatArena::rounded(static_cast<size_t>(dv));
}

ChunkScratch take_chunk_scratch(ScratchFrame& f, int chunk, int dk, int dv) {
  const size_t Q = static_cast<size_t>(chunk);
  ChunkScratch s;
  s.qn = f.take(Q * dk);
  s.kn = f.take(Q * dk);
  s.u = f.take(Q * dv);
  s.c = f.take(Q);
  s.tail = f.take(Q);
  s.decay = f.take(Q * Q);
  s.acc = f.take(static_cast<size_t>(dv));
  return s;
}

// Value heads [hb, he) over all T steps, chunk by chunk.
HYBRIDLM_INLINE void gdn_heads(const float* q, const float* k, int ld_qk, const float* v, int ld_v, const float* g,
                               const float* beta, const GdnDims& dm, int chunk, float* S, int T, float* y, size_t hb,
                               size_t he, ChunkScratch w) {
  const int nv = dm.n_v_heads, dk = dm.k_dim, dv = dm.v_dim, rep = nv / dm.n_k_heads;
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(dk));
  for (size_t h = hb; h < he; ++h) {
    float* Sh = S + h * dk * dv;
    const size_t koff = (h / rep) * dk, voff = h * dv;
    for (int c0 = 0; c0 < T; c0 += chunk) {
      const int Q = std::min(chunk, T - c0);
      // Normalised q and k of the chunk, the cumulative log-decay.
      float acc_c = 0;
      for (int i = 0; i < Q; ++i) {
        const size_t t = static_cast<size_t>(c0 + i);
        const float* ki = k + t * ld_qk + koff;
        const float* qi = q + t * ld_qk + koff;
        const float rk = inv_l2(ki, dk), rq = inv_l2(qi, dk) * q_scale;
        float* kn = w.kn + static_cast<size_t>(i) * dk;
        float* qn = w.qn + static_cast<size_t>(i) * dk;
        for (int d = 0; d < dk; ++d) {
          kn[d] = ki[d] * rk;
          qn[d] = qi[d] * rq;
        }
        acc_c += g[t * nv + h];
        w.c[i] = acc_c;
      }
      // decay[i][j] = exp(g_{j+1} + ... + g_i) for j <= i; tail[j] = exp(g_{j+1} + ... + g_{Q-1}).
      for (int i = 0; i < Q; ++i) {
        float* di = w.decay + static_cast<size_t>(i) * chunk;
        float sum = 0;
        di[i] = 1.0f;
        for (int j = i - 1; j >= 0; --j) {
          sum += g[static_cast<size_t>(c0 + j + 1) * nv + h];
          di[j] = std::exp(sum);
        }
      }
      std::copy_n(w.decay + static_cast<size_t>(Q - 1) * chunk, Q, w.tail);
      // R_i = beta_i (v_i - exp(c_i) S0^T k_i), then the forward substitution into u.
      for (int i = 0; i < Q; ++i) {
        const size_t t = static_cast<size_t>(c0 + i);
        const float* kn = w.kn + static_cast<size_t>(i) * dk;
        float* ui = w.u + static_cast<size_t>(i) * dv;
        std::fill_n(w.acc, dv, 0.0f);
        for (int d = 0; d < dk; ++d) {
          const float kd = kn[d];
          const float* Sr = Sh + static_cast<size_t>(d) * dv;
          for (int e = 0; e < dv; ++e) w.acc[e] += kd * Sr[e];
        }
        const float b = beta[t * nv + h], ec = std::exp(w.c[i]);
        const float* vi = v + t * ld_v + voff;
        for (int e = 0; e < dv; ++e) ui[e] = b * (vi[e] - ec * w.acc[e]);
        for (int j = 0; j < i; ++j) {
          const float* kj = w.kn + static_cast<size_t>(j) * dk;
          float kk = 0;
          for (int d = 0; d < dk; ++d) kk += kn[d] * kj[d];
          const float a = b * w.decay[static_cast<size_t>(i) * chunk + j] * kk;
          const float* uj = w.u + static_cast<size_t>(j) * dv;
          for (int e = 0; e < dv; ++e) ui[e] -= a * uj[e];
        }
      }
      // y_i = exp(c_i) S0^T q_i + sum_{j<=i} exp(c_i - c_j) (q_i . k_j) u_j (S still S0 here).
      for (int i = 0; i < Q; ++i) {
        const float* qn = w.qn + static_cast<size_t>(i) * dk;
        float* gi = w.decay + static_cast<size_t>(i) * chunk;  // row i becomes decay * (q_i . k_j)
        for (int j = 0; j <= i; ++j) {
          const float* kj = w.kn + static_cast<size_t>(j) * dk;
          float qk = 0;
          for (int d = 0; d < dk; ++d) qk += qn[d] * kj[d];
          gi[j] *= qk;
        }
        float* yi = y + static_cast<size_t>(c0 + i) * nv * dv + voff;
        std::fill_n(w.acc, dv, 0.0f);
        for (int d = 0; d < dk; ++d) {
          const float qd = qn[d];
          const float* Sr = Sh + static_cast<size_t>(d) * dv;
          for (int e = 0; e < dv; ++e) w.acc[e] += qd * Sr[e];
        }
        const float ec = std::exp(w.c[i]);
        for (int e = 0; e < dv; ++e) yi[e] = ec * w.acc[e];
        for (int j = 0; j <= i; ++j) {
          const float a = gi[j];
          const float* uj = w.u + static_cast<size_t>(j) * dv;
          for (int e = 0; e < dv; ++e) yi[e] += a * uj[e];
        }
      }
      // S = exp(c_Q) S0 + sum_j exp(c_Q - c_j) k_j u_j^T.
      const float e_last = std::exp(w.c[Q - 1]);
      for (int d = 0; d < dk; ++d) {
        float* Sr = Sh + static_cast<size_t>(d) * dv;
        for (int e = 0; e < dv; ++e) Sr[e] *= e_last;
        for (int j = 0; j < Q; ++j) {
          const float a = w.tail[j] * w.kn[static_cast<size_t>(j) * dk + d];
          const float* uj = w.u + static_cast<size_t>(j) * dv;
          for (int e = 0; e < dv; ++e) Sr[e] += a * uj[e];
        }
      }
    }
  }
}
HYBRIDLM_SIMD_VARIANTS(gdn_scan, gdn_heads)

// One step for value heads [hb, he): S <- exp(g) S; delta = beta (v - S^T k); S += k delta^T;
// y = S^T q. acc: (dv) working memory.
HYBRIDLM_INLINE void gdn_step_heads(const float* q, const float* k, const float* v, const float* g, const float* beta,
                                    const GdnDims& dm, float* S, float* y, size_t hb, size_t he, float* acc) {
  const int nv = dm.n_v_heads, dk = dm.k_dim, dv = dm.v_dim, rep = nv / dm.n_k_heads;
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(dk));
  for (size_t h = hb; h < he; ++h) {
    const float* kh = k + (h / rep) * dk;
    const float* qh = q + (h / rep) * dk;
    const float rk = inv_l2(kh, dk), rq = inv_l2(qh, dk) * q_scale;
    const float decay = std::exp(g[h]), b = beta[h];
    float* Sh = S + h * dk * dv;
    const float* vh = v + h * dv;
    float* yh = y + h * dv;
    std::fill_n(acc, dv, 0.0f);
    for (int d = 0; d < dk; ++d) {
      float* Sr = Sh + static_cast<size_t>(d) * dv;
      const float kd = kh[d] * rk;
      for (int e = 0; e < dv; ++e) {
        Sr[e] *= decay;
        acc[e] += kd * Sr[e];
      }
    }
    for (int e = 0; e < dv; ++e) acc[e] = b * (vh[e] - acc[e]);
    std::fill_n(yh, dv, 0.0f);
    for (int d = 0; d < dk; ++d) {
      float* Sr = Sh + static_cast<size_t>(d) * dv;
      const float kd = kh[d] * rk, qd = qh[d] * rq;
      for (int e = 0; e < dv; ++e) {
        Sr[e] += kd * acc[e];
        yh[e] += qd * Sr[e];
      }
    }
  }
}
HYBRIDLM_SIMD_VARIANTS(gdn_step, gdn_step_heads)

}  // namespace

void gated_delta_scan(const KernelContext& ctx, const float* q, const float* k, int ld_qk, const float* v, int ld_v,
                      const float* g, const float* beta, const GdnDims& dims, int chunk, float* S, int T, float* y) {
  parallel(ctx, static_cast<size_t>(dims.n_v_heads), 1, [&](size_t b, size_t e) {
    ScratchFrame frame(ctx);
    const ChunkScratch w = take_chunk_scratch(frame, chunk, dims.k_dim, dims.v_dim);
    gdn_scan_dispatch(q, k, ld_qk, v, ld_v, g, beta, dims, chunk, S, T, y, b, e, w);
  });
}

void gated_delta_step(const KernelContext& ctx, const float* q, const float* k, const float* v, const float* g,
                      const float* beta, const GdnDims& dims, float* S, float* y) {
  parallel(ctx, static_cast<size_t>(dims.n_v_heads), 1, [&](size_t b, size_t e) {
    ScratchFrame frame(ctx);
    gdn_step_dispatch(q, k, v, g, beta, dims, S, y, b, e, frame.take(static_cast<size_t>(dims.v_dim)));
  });
}

ScratchNeed gdn_scratch(const KernelLimits& lim) {
  if (lim.gdn_k_dim == 0) return {};
  const size_t each = chunk_scratch_floats(std::max(lim.gdn_chunk, 1), lim.gdn_k_dim, lim.gdn_v_dim);
  return {each, each};
}

}  // namespace hybridlm::cpu
