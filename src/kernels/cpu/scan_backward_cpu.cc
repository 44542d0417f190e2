// CPU backward of the two scans (docs/derivations/mamba1-scan.md, mamba2-ssd.md), in f32.
//
// Memory: the state is saved only at checkpoints (every kM1Interval steps for Mamba-1, at each
// chunk boundary for the SSD), O(T / interval) states. The backward walks the segments last to
// first, carrying the adjoint of the state, which each segment hands on to the one before.
// Mamba-1: each thread reruns the forward over its segment from the checkpoint, keeping that
// segment's states (interval + 1 of them, per thread), then walks them back in time. The SSD: a
// chunk's gradients are matrix products of its inputs with the entry state and the adjoint
// leaving it (no per-step states; see "---- SSD" below).
//
// Threads split Mamba-1's channels (in blocks of 16, one per vector lane, the state transposed to
// (N, 16) as in the forward) and the SSD's heads. dB and dC are sums over all channels (over the
// heads of a group), so each block or head writes its own partial rows for the segment and a
// second pass adds them in block (head) order. Every split depends on the shapes only, so the
// results do not depend on the thread count. Mamba-1's segments are synchronised (one
// parallel_for each), which keeps those partials to one segment's rows; an SSD thread takes
// whole heads through all their chunks, with partial rows for all T steps.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "base/error.h"
#include "base/thread_pool.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/scratch.h"

namespace hybridlm::cpu {

namespace {

constexpr int kLanes = 16;
// Mamba-1's checkpoint interval: 64 steps keep a segment's states (65 (N, 16) blocks) in L2 and
// the checkpoints at 1/64 of the states.
constexpr int kM1Interval = 64;

// The sum of 16 lanes by a fixed tree.
HYBRIDLM_INLINE float hsum16(const float* v) {
  float a[8];
  for (int l = 0; l < 8; ++l) a[l] = v[l] + v[l + 8];
  for (int l = 0; l < 4; ++l) a[l] += a[l + 4];
  return (a[0] + a[2]) + (a[1] + a[3]);
}

// n zeros from the frame.
float* zeroed(ScratchFrame& frame, size_t n) {
  float* p = frame.take(n);
  std::fill(p, p + n, 0.0f);
  return p;
}

// ---- Mamba-1 --------------------------------------------------------------------------------------
// A block is channels [16 blk, 16 blk + 16) (the last one may be partial: its extra lanes carry
// dt = x = dy = 0 and A = 0, so their states and adjoints stay 0 and add nothing to the sums).
// States and adjoints of a block are (N, 16): [n * 16 + l].

struct M1Lanes {  // one step's per-channel inputs of a block
  float d[kLanes], xv[kLanes], dx[kLanes];
};
HYBRIDLM_INLINE void m1_load(const float* x, int ld_x, const float* dt, int I, int t, size_t i0, int nl, M1Lanes& s) {
  const float* dtt = dt + static_cast<size_t>(t) * I + i0;
  const float* xt = x + static_cast<size_t>(t) * ld_x + i0;
  for (int l = 0; l < kLanes; ++l) {
    s.d[l] = l < nl ? dtt[l] : 0.0f;
    s.xv[l] = l < nl ? xt[l] : 0.0f;
    s.dx[l] = s.d[l] * s.xv[l];
  }
}
HYBRIDLM_INLINE void m1_load_A(const float* A, int N, size_t i0, int nl, float* AT) {
  for (int n = 0; n < N; ++n)
    for (int l = 0; l < kLanes; ++l) AT[n * kLanes + l] = l < nl ? A[(i0 + l) * N + n] : 0.0f;
}
// h_t = exp(dt A) h_{t-1} + dt B_t x_t, from hp into hn (distinct).
HYBRIDLM_INLINE void m1_advance(const M1Lanes& s, const float* __restrict__ AT, const float* __restrict__ Bt, int N,
                                const float* __restrict__ hp, float* __restrict__ hn) {
  for (int n = 0; n < N; ++n) {
    const float b = Bt[n];
    for (int l = 0; l < kLanes; ++l)
      hn[n * kLanes + l] = vexp(s.d[l] * AT[n * kLanes + l]) * hp[n * kLanes + l] + s.dx[l] * b;
  }
}

// The states entering every segment, for blocks [bb, be): ckpt[(seg * nblk + blk) * N * 16].
HYBRIDLM_INLINE void m1b_checkpoints(const float* x, int ld_x, const float* dt, const float* A, const float* B,
                                     int ld_bc, const float* h0, int T, int I, int N, float* ckpt, size_t bb,
                                     size_t be, float* h, float* h2, float* AT) {
  // h, h2: (N, 16) each, the state stepping from one to the other.
  const size_t nblk = (static_cast<size_t>(I) + kLanes - 1) / kLanes, blk_floats = static_cast<size_t>(N) * kLanes;
  for (size_t blk = bb; blk < be; ++blk) {
    const size_t i0 = blk * kLanes;
    const int nl = static_cast<int>(std::min<size_t>(kLanes, I - i0));
    m1_load_A(A, N, i0, nl, AT);
    for (int n = 0; n < N; ++n)
      for (int l = 0; l < kLanes; ++l) h[n * kLanes + l] = h0 && l < nl ? h0[(i0 + l) * N + n] : 0.0f;
    for (int t = 0; t < T; ++t) {
      if (t % kM1Interval == 0)
        std::memcpy(ckpt + (static_cast<size_t>(t / kM1Interval) * nblk + blk) * blk_floats, h,
                    blk_floats * sizeof(float));
      M1Lanes s;
      m1_load(x, ld_x, dt, I, t, i0, nl, s);
      m1_advance(s, AT, B + static_cast<size_t>(t) * ld_bc, N, h, h2);
      std::swap(h, h2);
    }
  }
}

// State n of one step's backward, for the 16 lanes of a block: g (dL/dh_t before y_t's term, in
// gn) gets y_t's term; then gb, dd (dx, ddt) and gAn (dA) accumulate, tb, tc get this step's dB and
// dC terms, and gn becomes dL/dh_{t-1}.
HYBRIDLM_INLINE void m1_state_backward(float* __restrict__ gn, float* __restrict__ gAn, const float* __restrict__ an,
                                       const float* __restrict__ hn, const float* __restrict__ hp, const M1Lanes& s,
                                       const float* __restrict__ dys, float b, float c, float* __restrict__ gb,
                                       float* __restrict__ dd, float* __restrict__ tb, float* __restrict__ tc) {
  for (int l = 0; l < kLanes; ++l) {
    const float gv = gn[l] + dys[l] * c;  // dL/dh_t: y_t reads h_t
    const float decay = vexp(s.d[l] * an[l]);
    const float hd = decay * hp[l];  // the decayed previous state
    tc[l] = dys[l] * hn[l];
    tb[l] = gv * s.dx[l];
    gb[l] += gv * b;
    dd[l] += gv * (b * s.xv[l] + an[l] * hd);
    gAn[l] += gv * s.d[l] * hd;
    gn[l] = gv * decay;  // dL/dh_{t-1}
  }
}

// One segment [t0, t0 + Q) of blocks [bb, be), walked back. g, gA: the blocks' adjoint of the
// state and dA so far, (nblk, N, 16); gD: dD so far, (nblk, 16). dBp, dCp: the blocks' partial dB
// and dC rows of the segment, (nblk, kM1Interval, N). hs: (kM1Interval + 1) (N, 16) blocks.
HYBRIDLM_INLINE void m1b_segment(const float* x, int ld_x, const float* dt, const float* A, const float* B,
                                 const float* C, int ld_bc, const float* D, const float* z, int ld_z, int I, int N,
                                 const float* dy, float* dxo, int ld_dx, float* ddt, float* dz, int ld_dz,
                                 const float* ckpt_seg, float* g_all, float* gA_all, float* gD_all, float* dBp,
                                 float* dCp, int t0, int Q, size_t bb, size_t be, float* hs, float* AT) {
  const size_t blk_floats = static_cast<size_t>(N) * kLanes;
  for (size_t blk = bb; blk < be; ++blk) {
    const size_t i0 = blk * kLanes;
    const int nl = static_cast<int>(std::min<size_t>(kLanes, I - i0));
    m1_load_A(A, N, i0, nl, AT);
    std::memcpy(hs, ckpt_seg + blk * blk_floats, blk_floats * sizeof(float));
    for (int j = 0; j < Q; ++j) {  // hs[j + 1] = h_{t0 + j}
      M1Lanes s;
      m1_load(x, ld_x, dt, I, t0 + j, i0, nl, s);
      m1_advance(s, AT, B + static_cast<size_t>(t0 + j) * ld_bc, N, hs + j * blk_floats, hs + (j + 1) * blk_floats);
    }
    float* g = g_all + blk * blk_floats;
    float* gA = gA_all + blk * blk_floats;
    float* gD = gD_all + blk * kLanes;
    for (int j = Q - 1; j >= 0; --j) {
      const int t = t0 + j;
      M1Lanes s;
      m1_load(x, ld_x, dt, I, t, i0, nl, s);
      const float* Bt = B + static_cast<size_t>(t) * ld_bc;
      const float* Ct = C + static_cast<size_t>(t) * ld_bc;
      const float* hn = hs + (j + 1) * blk_floats;
      const float* hp = hs + j * blk_floats;
      const float* dyt = dy + static_cast<size_t>(t) * I + i0;
      const float* zt = z + static_cast<size_t>(t) * ld_z + i0;
      float y[kLanes], dys[kLanes], dzv[kLanes], gb[kLanes], dd[kLanes], tb[kLanes], tc[kLanes];
      for (int l = 0; l < kLanes; ++l) y[l] = l < nl ? D[i0 + l] * s.xv[l] : 0.0f;
      for (int n = 0; n < N; ++n)
        for (int l = 0; l < kLanes; ++l) y[l] += hn[n * kLanes + l] * Ct[n];
      // The gate: out = y silu(z), so dz = dout y silu'(z) and the scan sees dys = dout silu(z).
      for (int l = 0; l < kLanes; ++l) {
        const float zv = l < nl ? zt[l] : 0.0f, dout = l < nl ? dyt[l] : 0.0f;
        const float sg = 1.0f / (1.0f + vexp(-zv));
        dys[l] = dout * zv * sg;
        dzv[l] = dout * y[l] * sg * (1.0f + zv * (1.0f - sg));
        gb[l] = 0.0f;
        dd[l] = 0.0f;
      }
      for (int n = 0; n < N; ++n) {
        m1_state_backward(g + n * kLanes, gA + n * kLanes, AT + n * kLanes, hn + n * kLanes, hp + n * kLanes, s, dys,
                          Bt[n], Ct[n], gb, dd, tb, tc);
        dBp[(blk * kM1Interval + j) * N + n] = hsum16(tb);
        dCp[(blk * kM1Interval + j) * N + n] = hsum16(tc);
      }
      float* dxt = dxo + static_cast<size_t>(t) * ld_dx + i0;
      float* ddtt = ddt + static_cast<size_t>(t) * I + i0;
      float* dzt = dz + static_cast<size_t>(t) * ld_dz + i0;
      for (int l = 0; l < nl; ++l) {
        dxt[l] = D[i0 + l] * dys[l] + s.d[l] * gb[l];
        ddtt[l] = dd[l];
        dzt[l] = dzv[l];
        gD[l] += dys[l] * s.xv[l];
      }
    }
  }
}
HYBRIDLM_SIMD_VARIANTS(m1b_ckpt, m1b_checkpoints)
HYBRIDLM_SIMD_VARIANTS(m1b_seg, m1b_segment)

// ---- SSD ------------------------------------------------------------------------------------------
// Chunked, as matrix products inside each chunk (docs/derivations/mamba2-ssd.md, "Chunked
// backward"). A head's state and its adjoint are (P, N), row p the state of x's channel p. For a
// chunk of Q steps j (t = c0 + j), with l_j the step's log-decay and d_j its input scale:
//   L[i, j]  = exp(l_{j+1} + ... + l_i) for j <= i (else 0), e_i = exp(l_0 + ... + l_i),
//   eo_j     = exp(l_{j+1} + ... + l_{Q-1}), e_last = e_{Q-1};
//   S_in, G_out: the state entering the chunk and the adjoint of the state leaving it;
//   CB = C B^T, XY = dY X^T (Q x Q), M = L o CB, W = L o XY diag(d).
// Then, with G_j = dL/dS_j:
//   G_j B_j = eo_j G_out B_j + sum_{i >= j} M[i, j] dy_i            (dx_j = D dy_j + d_j G_j B_j)
//   dB_j    = d_j eo_j G_out^T x_j + sum_{i >= j} W[i, j] C_i
//   dC_i    = e_i S_in^T dy_i + sum_{j <= i} W[i, j] B_j
//   G_in    = e_last G_out + sum_i e_i dy_i C_i^T                    (passed to the chunk before)
//   S_out   = e_last S_in + sum_j eo_j d_j x_j B_j^T                 (the checkpoints, forward)
// and the gradient of the log-decay, da_t = <G_t, exp(l_t) S_{t-1}>, as the sum of its four
// parts, each a sum of terms of that product (no difference of cumulative sums, which would
// cancel where the decay is strong):
//   da_t = e_last <G_out, S_in> + sum_{i >= t} u_i + sum_{s < t} v_s + sum_{i >= t > s} K[i, s]
//   u_i = e_i dy_i . S_in C_i,  v_s = eo_s d_s x_s . G_out B_s,  K[i, s] = CB[i, s] W[i, s].
// Every decay factor is a sum of log-decays over the steps it spans (never a difference of two
// cumulative sums), so strong decay loses no precision. The chunk of the backward is its own
// (at most kSsdBwdChunk): the result does not depend on it beyond rounding.
constexpr int kSsdBwdChunk = 32;
constexpr int kMmCols = 32;  // columns of a product's register tile
constexpr int kMmRows = 4;   // its rows

// 16 floats as one value (GCC/Clang vector extension, not an intrinsic): one AVX-512 register,
// two AVX2 ones, four SSE or NEON ones. The register tile below is written with it because an
// array of float sums is kept on the stack by GCC, not in registers. Loads and stores are
// memcpy (unaligned); no function takes or returns one (that would change the ABI per ISA).
typedef float F16 __attribute__((vector_size(64)));

// The rows [i0, i0 + R) of out = [out +] diag(rs) A Bm, A read as A[i * ar + k * ac], Bm's rows
// k (ldb apart) contiguous over the output columns, k in [k0, k1): a tile of R x kMmCols sums in
// registers, each summed over k in order.
template <int R>
HYBRIDLM_INLINE void mm_tile(const float* A, size_t ar, size_t ac, const float* Bm, size_t ldb, int k0, int k1,
                             const float* rs, float* out, size_t ldo, bool acc) {
  constexpr int V = kMmCols / 16;
  F16 s[R][V];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) s[r][v] = F16{};
  for (int k = k0; k < k1; ++k) {
    const float* b = Bm + static_cast<size_t>(k) * ldb;
    F16 bv[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) std::memcpy(&bv[v], b + 16 * v, sizeof(F16));
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const float w = A[r * ar + k * ac];
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) s[r][v] += w * bv[v];
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const float sc = rs ? rs[r] : 1.0f;
    float* o = out + r * ldo;
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      F16 prev{};
      if (acc) std::memcpy(&prev, o + 16 * v, sizeof(F16));
      const F16 res = prev + sc * s[r][v];
      std::memcpy(o + 16 * v, &res, sizeof(F16));
    }
  }
}
// The same for a partial tile: one row, the first nc < kMmCols columns.
HYBRIDLM_INLINE void mm_row_part(const float* A, size_t ac, const float* Bm, size_t ldb, int k0, int k1, int nc,
                                 const float* rs, float* out, bool acc) {
  float s[kMmCols] = {};
  for (int k = k0; k < k1; ++k) {
    const float w = A[k * ac];
    const float* b = Bm + static_cast<size_t>(k) * ldb;
    for (int l = 0; l < nc; ++l) s[l] += w * b[l];
  }
  const float sc = rs ? rs[0] : 1.0f;
  for (int l = 0; l < nc; ++l) out[l] = (acc ? out[l] : 0.0f) + sc * s[l];
}

// Which k a row tile [i0, i0 + R) needs when A is triangular: all, k >= i0 (A[i, k] = 0 for
// k < i, read as A^T of a lower triangle), or k < i0 + R (A[i, k] = 0 for k > i).
enum class Tri { kAll, kFromRow, kToRow };

// out (M x nc, rows ldo apart) = [out +] diag(rs) A Bm with A (M x K) and Bm (K x nc) as in
// mm_tile.
HYBRIDLM_INLINE void mm(int M, int nc, int K, const float* A, size_t ar, size_t ac, const float* Bm, size_t ldb,
                        const float* rs, float* out, size_t ldo, bool acc, Tri tri = Tri::kAll) {
  for (int j0 = 0; j0 < nc; j0 += kMmCols) {
    const int n = std::min(kMmCols, nc - j0);
    int i = 0;
    for (; i < M; i += kMmRows) {
      const int R = std::min(kMmRows, M - i);
      const int k0 = tri == Tri::kFromRow ? i : 0, k1 = tri == Tri::kToRow ? std::min(K, i + R) : K;
      const float* Ai = A + i * ar;
      const float* ri = rs ? rs + i : nullptr;
      float* o = out + i * ldo + j0;
      if (n < kMmCols) {
        for (int r = 0; r < R; ++r)
          mm_row_part(Ai + r * ar, ac, Bm + j0, ldb, k0, k1, n, ri ? ri + r : nullptr, o + r * ldo, acc);
      } else if (R == kMmRows) {
        mm_tile<kMmRows>(Ai, ar, ac, Bm + j0, ldb, k0, k1, ri, o, ldo, acc);
      } else {
        for (int r = 0; r < R; ++r)
          mm_tile<1>(Ai + r * ar, ar, ac, Bm + j0, ldb, k0, k1, ri ? ri + r : nullptr, o + r * ldo, ldo, acc);
      }
    }
  }
}

// sum_k a[k] b[k] over 16 partial sums (hsum16): vectorises without reassociating.
HYBRIDLM_INLINE float dot16(const float* a, const float* b, size_t n) {
  float acc[kLanes] = {};
  size_t k = 0;
  for (; k + kLanes <= n; k += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += a[k + l] * b[k + l];
  for (int l = 0; k < n; ++k, ++l) acc[l] += a[k] * b[k];
  return hsum16(acc);
}

// Step j's log-decay and input scale of head h (Mamba-2: A given, a = dt A, d = dt; the discrete
// form: A null, a = dt (the log-decay itself), d = 1), and the chunk's decay factors: e, eo
// (e_last = e[Q - 1]).
HYBRIDLM_INLINE void ssd_decays(const float* dt, const float* A, int c0, int Q, int nh, size_t h, float* la, float* d,
                                float* e, float* eo) {
  for (int j = 0; j < Q; ++j) {
    const float v = dt[static_cast<size_t>(c0 + j) * nh + h];
    d[j] = A ? v : 1.0f;
    la[j] = A ? v * A[h] : v;
  }
  float s = 0;
  for (int j = 0; j < Q; ++j) e[j] = (s += la[j]);
  s = 0;
  for (int j = Q - 1; j >= 0; --j) {
    eo[j] = s;
    s += la[j];
  }
  for (int j = 0; j < Q; ++j) e[j] = vexp(e[j]), eo[j] = vexp(eo[j]);
}

// The state entering every chunk of head h: ckpt[c * P * N]. bw: (chunk, N) scratch
// (eo_j d_j B_j), v: 4 x chunk.
HYBRIDLM_INLINE void ssdb_checkpoints(const float* x, int ld_x, const float* dt, const float* A, const float* B,
                                      int ld_bc, const SsdDims& dm, int chunk, const float* S0, int T, size_t h,
                                      float* ckpt, float* bw, float* v) {
  const int nh = dm.n_heads, P = dm.head_dim, N = dm.d_state, hpg = nh / dm.n_groups;
  const size_t PN = static_cast<size_t>(P) * N, g = h / hpg;
  const int n_chunks = (T + chunk - 1) / chunk;
  float *la = v, *d = v + chunk, *e = v + 2 * chunk, *eo = v + 3 * chunk;
  if (S0) std::memcpy(ckpt, S0 + h * PN, PN * sizeof(float));
  else std::fill(ckpt, ckpt + PN, 0.0f);
  for (int c = 0; c + 1 < n_chunks; ++c) {
    const int c0 = c * chunk;  // a full chunk: only the last may be shorter
    ssd_decays(dt, A, c0, chunk, nh, h, la, d, e, eo);
    for (int j = 0; j < chunk; ++j) {
      const float w = eo[j] * d[j];
      const float* Bj = B + static_cast<size_t>(c0 + j) * ld_bc + g * N;
      for (int n = 0; n < N; ++n) bw[j * N + n] = w * Bj[n];
    }
    const float* S = ckpt + static_cast<size_t>(c) * PN;
    float* Sn = ckpt + static_cast<size_t>(c + 1) * PN;
    const float el = e[chunk - 1];
    for (size_t i = 0; i < PN; ++i) Sn[i] = el * S[i];
    // S_out[p, n] += sum_j x_j[p] (eo_j d_j B_j[n])
    mm(P, N, chunk, x + static_cast<size_t>(c0) * ld_x + h * P, 1, ld_x, bw, N, nullptr, Sn, N, true);
  }
}

// CB of the chunks [cb, ce) of every group: cb_all[(g * n_chunks + c) * chunk * chunk], (Q, Q)
// rows chunk apart; bt: (N, chunk) scratch, B transposed.
HYBRIDLM_INLINE void ssdb_cb(const float* B, const float* C, int ld_bc, const SsdDims& dm, int chunk, int T,
                             float* cb_all, size_t ib, size_t ie, float* bt) {
  const int N = dm.d_state, n_chunks = (T + chunk - 1) / chunk;
  for (size_t it = ib; it < ie; ++it) {
    const int g = static_cast<int>(it) / n_chunks, c = static_cast<int>(it) % n_chunks;
    const int c0 = c * chunk, Q = std::min(chunk, T - c0);
    const size_t off = static_cast<size_t>(c0) * ld_bc + static_cast<size_t>(g) * N;
    for (int j = 0; j < Q; ++j)
      for (int n = 0; n < N; ++n) bt[n * Q + j] = B[off + static_cast<size_t>(j) * ld_bc + n];
    mm(Q, Q, N, C + off, ld_bc, 1, bt, Q, nullptr, cb_all + it * chunk * chunk, chunk, false, Tri::kAll);
  }
}

// A worker's buffers for one head and chunk.
struct SsdbScratch {
  float *L, *M, *W, *xt, *bt, *ce, *gbt;
  float *la, *d, *e, *eo, *u, *v, *run, *cr;
  static size_t floats(size_t Q, size_t P, size_t N) {
    using R = FloatArena;
    return 3 * R::rounded(Q * Q) + 2 * R::rounded(P * Q) + 2 * R::rounded(N * Q) + 8 * R::rounded(Q);
  }
  SsdbScratch(ScratchFrame& f, size_t Q, size_t P, size_t N)
      : L(f.take(Q * Q)), M(f.take(Q * Q)), W(f.take(Q * Q)), xt(f.take(P * Q)), bt(f.take(N * Q)), ce(f.take(N * Q)),
        gbt(f.take(P * Q)), la(f.take(Q)), d(f.take(Q)), e(f.take(Q)), eo(f.take(Q)), u(f.take(Q)), v(f.take(Q)),
        run(f.take(Q)), cr(f.take(Q)) {}
};

// One chunk [c0, c0 + Q) of head h, walked back. gS: the head's adjoint of the state, G_out on
// entry and G_in on return; Sin: the state entering the chunk; gA, gD: its dA and dD so far.
// bp, cp: its dB and dC rows of the chunk (N apart). cb: the chunk's CB of group 0, the next
// group's chunk-by-chunk block cb_stride further.
HYBRIDLM_INLINE void ssdb_chunk(const float* x, int ld_x, const float* dt, const float* A, const float* B,
                                const float* C, int ld_bc, const float* D, const SsdDims& dm, int chunk,
                                const float* dy, float* dxo, int ld_dx, float* ddt, const float* Sin, float* gS,
                                float& gA, float& gD, float* bp, float* cp, const float* cb, size_t cb_stride, int c0,
                                int Q, size_t h, const SsdbScratch& s) {
  const int nh = dm.n_heads, P = dm.head_dim, N = dm.d_state, hpg = nh / dm.n_groups;
  const size_t PN = static_cast<size_t>(P) * N, ldy = static_cast<size_t>(nh) * P;
  const size_t q = static_cast<size_t>(Q);
  {
    const size_t g = h / hpg;
    const float* cbg = cb + g * cb_stride;  // CB[i, j] at cbg[i * chunk + j]
    const float* xc = x + static_cast<size_t>(c0) * ld_x + h * P;
    const float* dyc = dy + static_cast<size_t>(c0) * ldy + h * P;
    const float* Bc = B + static_cast<size_t>(c0) * ld_bc + g * N;
    const float* Cc = C + static_cast<size_t>(c0) * ld_bc + g * N;
    ssd_decays(dt, A, c0, Q, nh, h, s.la, s.d, s.e, s.eo);
    const float e_last = s.e[Q - 1];
    // L row by row: run[j] = l_{j+1} + ... + l_i for j < i.
    for (int i = 0; i < Q; ++i) {
      for (int j = 0; j < Q; ++j) s.run[j] = j < i ? s.run[j] + s.la[i] : 0.0f;
      float* Li = s.L + i * q;
      for (int j = 0; j < Q; ++j) {
        const float v = vexp(s.run[j]);
        Li[j] = j <= i ? v : 0.0f;
      }
    }
    // Transposed copies: x (P, Q) and eo_j B_j (N, Q); e_i C_i (Q, N).
    for (int j = 0; j < Q; ++j) {
      const float* xj = xc + static_cast<size_t>(j) * ld_x;
      for (int p = 0; p < P; ++p) s.xt[p * q + j] = xj[p];
      const float* Bj = Bc + static_cast<size_t>(j) * ld_bc;
      const float* Cj = Cc + static_cast<size_t>(j) * ld_bc;
      for (int n = 0; n < N; ++n) {
        s.bt[n * q + j] = s.eo[j] * Bj[n];
        s.ce[j * N + n] = s.e[j] * Cj[n];
      }
    }
    // XY = dY X^T into W, then W = L o XY diag(d) and M = L o CB (lower triangles).
    mm(Q, Q, P, dyc, ldy, 1, s.xt, q, nullptr, s.W, q, false);
    for (int i = 0; i < Q; ++i) {
      const float* Li = s.L + i * q;
      const float* cbi = cbg + static_cast<size_t>(i) * chunk;
      float* Wi = s.W + i * q;
      float* Mi = s.M + i * q;
      for (int j = 0; j < Q; ++j) {
        Wi[j] = Li[j] * Wi[j] * s.d[j];
        Mi[j] = Li[j] * cbi[j];
      }
    }
    // (G B)^T (P, Q) = G_out (eo B)^T + dY^T M.
    mm(P, Q, N, gS, N, 1, s.bt, q, nullptr, s.gbt, q, false);
    mm(P, Q, Q, dyc, 1, ldy, s.M, q, nullptr, s.gbt, q, true);
    // dB (Q, N) = diag(d eo) X G_out + W^T C; v_s from the first part.
    for (int j = 0; j < Q; ++j) s.v[j] = s.d[j] * s.eo[j];
    mm(Q, N, P, xc, ld_x, 1, gS, N, s.v, bp, N, false);
    for (int j = 0; j < Q; ++j) s.v[j] = dot16(bp + j * N, Bc + static_cast<size_t>(j) * ld_bc, N);
    mm(Q, N, Q, s.W, 1, q, Cc, ld_bc, nullptr, bp, N, true, Tri::kFromRow);
    // dC (Q, N) = diag(e) dY S_in + W B; u_i from the first part.
    mm(Q, N, P, dyc, ldy, 1, Sin, N, s.e, cp, N, false);
    for (int i = 0; i < Q; ++i) s.u[i] = dot16(cp + i * N, Cc + static_cast<size_t>(i) * ld_bc, N);
    mm(Q, N, Q, s.W, q, 1, Bc, ld_bc, nullptr, cp, N, true, Tri::kToRow);
    // da_t: e_last <G_out, S_in> + sum_{i >= t} u_i + sum_{s < t} v_s + sum_{i >= t > s} K[i, s],
    // the last through cr[s] = sum_{i >= t} K[i, s].
    const float t1 = e_last * dot16(gS, Sin, PN);
    // x_t . (G B)_t for ddt, over t in the lanes (run: L is built).
    float* xgb = s.run;
    for (int t = 0; t < Q; ++t) xgb[t] = 0.0f;
    for (int p = 0; p < P; ++p)
      for (int t = 0; t < Q; ++t) xgb[t] += s.xt[p * q + t] * s.gbt[p * q + t];
    float fwd = 0;  // sum_{s < t} v_s
    for (int t = 0; t < Q; ++t) {
      const float vt = s.v[t];
      s.v[t] = fwd;
      fwd += vt;
    }
    for (int j = 0; j < Q; ++j) s.cr[j] = 0.0f;
    float rev = 0, sum_a = 0;  // sum_{i >= t} u_i
    for (int t = Q - 1; t >= 0; --t) {
      const float* Wt = s.W + t * q;
      const float* cbt = cbg + static_cast<size_t>(t) * chunk;
      for (int j = 0; j < Q; ++j) s.cr[j] += j < t ? cbt[j] * Wt[j] : 0.0f;
      float k4v[kLanes] = {};
      for (int j0 = 0; j0 < t; j0 += kLanes)
        for (int l = 0; l < kLanes; ++l) k4v[l] += j0 + l < t ? s.cr[j0 + l] : 0.0f;
      const float k4 = hsum16(k4v);
      rev += s.u[t];
      const float da = ((t1 + rev) + s.v[t]) + k4;
      // dx, and x . G B for ddt
      const size_t tt = static_cast<size_t>(c0 + t);
      const float* dyt = dyc + static_cast<size_t>(t) * ldy;
      float* dxt = dxo + tt * ld_dx + h * P;
      for (int p = 0; p < P; ++p) dxt[p] = D[h] * dyt[p] + s.d[t] * s.gbt[p * q + t];
      ddt[tt * nh + h] = A ? xgb[t] + A[h] * da : da;
      sum_a += s.d[t] * da;
    }
    float sum_d = 0;
    for (int j = 0; j < Q; ++j)
      sum_d += dot16(dyc + static_cast<size_t>(j) * ldy, xc + static_cast<size_t>(j) * ld_x, P);
    gA += sum_a;
    gD += sum_d;
    // G_in = e_last G_out + dY^T diag(e) C.
    for (size_t k = 0; k < PN; ++k) gS[k] *= e_last;
    mm(P, N, Q, dyc, 1, ldy, s.ce, N, nullptr, gS, N, true);
  }
}

// Heads [hb, he), each from its checkpoints through its chunks last to first: dx, ddt, and the
// heads' dB and dC rows, dBp and dCp (nh, T, N); dA, dD (dA null: the discrete form) and dS0 (if
// wanted) of each head. ckpt: (n_chunks, P, N), gS: (P, N) of the thread.
HYBRIDLM_INLINE void ssdb_heads(const float* x, int ld_x, const float* dt, const float* A, const float* B,
                                const float* C, int ld_bc, const float* D, const SsdDims& dm, int chunk,
                                const float* S0, int T, const float* dy, float* dxo, int ld_dx, float* ddt, float* dA,
                                float* dD, float* dS0, float* dBp, float* dCp, const float* cb, size_t hb, size_t he,
                                float* ckpt, float* gS, float* bw, const SsdbScratch& s) {
  const size_t PN = static_cast<size_t>(dm.head_dim) * dm.d_state, N = static_cast<size_t>(dm.d_state);
  const size_t q = static_cast<size_t>(chunk);
  const int n_chunks = (T + chunk - 1) / chunk;
  const size_t cb_stride = static_cast<size_t>(n_chunks) * q * q;
  for (size_t h = hb; h < he; ++h) {
    ssdb_checkpoints(x, ld_x, dt, A, B, ld_bc, dm, chunk, S0, T, h, ckpt, bw, bw + q * N);
    std::fill(gS, gS + PN, 0.0f);
    float gA = 0, gD = 0;
    for (int c = n_chunks - 1; c >= 0; --c) {
      const int c0 = c * chunk, Q = std::min(chunk, T - c0);
      const size_t row = (h * T + c0) * N;
      ssdb_chunk(x, ld_x, dt, A, B, C, ld_bc, D, dm, chunk, dy, dxo, ld_dx, ddt, ckpt + c * PN, gS, gA, gD,
                 dBp + row, dCp + row, cb + c * q * q, cb_stride, c0, Q, h, s);
    }
    if (dA) dA[h] += gA;
    dD[h] += gD;
    if (dS0) std::copy(gS, gS + PN, dS0 + h * PN);
  }
}
HYBRIDLM_SIMD_VARIANTS(ssdb_cb_loops, ssdb_cb)
HYBRIDLM_SIMD_VARIANTS(ssdb_heads_loops, ssdb_heads)

}  // namespace

void mamba1_scan_backward(const KernelContext& ctx, const float* x, int ld_x, const float* dt, const float* A,
                          const float* B, const float* C, int ld_bc, const float* D, const float* z, int ld_z,
                          const float* h0, int T, int I, int N, const float* dy, float* dx, int ld_dx, float* ddt,
                          float* dA, float* dB, float* dC, int ld_dbc, float* dD, float* dz, int ld_dz,
                          float* dh0) {
  const size_t nblk = (static_cast<size_t>(I) + kLanes - 1) / kLanes, blk_floats = static_cast<size_t>(N) * kLanes;
  const int n_seg = (T + kM1Interval - 1) / kM1Interval;
  ScratchFrame frame(ctx);
  float* ckpt = frame.take(static_cast<size_t>(n_seg) * nblk * blk_floats);
  parallel(ctx, nblk, 1, [&](size_t b, size_t e) {
    ScratchFrame body(ctx);
    float* h = body.take(3 * blk_floats);
    m1b_ckpt_dispatch(x, ld_x, dt, A, B, ld_bc, h0, T, I, N, ckpt, b, e, h, h + blk_floats, h + 2 * blk_floats);
  });
  float* g = zeroed(frame, nblk * blk_floats);
  float* gA = zeroed(frame, nblk * blk_floats);
  float* gD = zeroed(frame, nblk * kLanes);
  float* dBp = frame.take(nblk * kM1Interval * N);
  float* dCp = frame.take(nblk * kM1Interval * N);
  for (int seg = n_seg - 1; seg >= 0; --seg) {
    const int t0 = seg * kM1Interval, Q = std::min(kM1Interval, T - t0);
    parallel(ctx, nblk, 1, [&](size_t b, size_t e) {
      ScratchFrame body(ctx);  // the segment's states, then A transposed
      float* hs = body.take((kM1Interval + 2) * blk_floats);
      m1b_seg_dispatch(x, ld_x, dt, A, B, C, ld_bc, D, z, ld_z, I, N, dy, dx, ld_dx, ddt, dz, ld_dz,
                       ckpt + static_cast<size_t>(seg) * nblk * blk_floats, g, gA, gD, dBp, dCp, t0, Q, b, e, hs,
                       hs + (kM1Interval + 1) * blk_floats);
    });
    // The segment's dB, dC rows: the blocks' partials added in block order.
    parallel(ctx, static_cast<size_t>(Q), 8, [&](size_t jb, size_t je) {
      for (size_t j = jb; j < je; ++j) {
        float* bo = dB + (t0 + j) * ld_dbc;
        float* co = dC + (t0 + j) * ld_dbc;
        for (int n = 0; n < N; ++n) bo[n] = co[n] = 0.0f;
        for (size_t blk = 0; blk < nblk; ++blk)
          for (int n = 0; n < N; ++n) {
            bo[n] += dBp[(blk * kM1Interval + j) * N + n];
            co[n] += dCp[(blk * kM1Interval + j) * N + n];
          }
      }
    });
  }
  for (size_t blk = 0; blk < nblk; ++blk) {
    const size_t i0 = blk * kLanes;
    const int nl = static_cast<int>(std::min<size_t>(kLanes, I - i0));
    for (int l = 0; l < nl; ++l) {
      dD[i0 + l] += gD[blk * kLanes + l];
      for (int n = 0; n < N; ++n) {
        dA[(i0 + l) * N + n] += gA[blk * blk_floats + n * kLanes + l];
        if (dh0) dh0[(i0 + l) * N + n] = g[blk * blk_floats + n * kLanes + l];
      }
    }
  }
}

namespace {

// Both SSD scans' backward (ssd_decays): Mamba-2 with A, the discrete form with A and dA null.
// Three passes: CB per group and chunk; the heads, each through all its chunks (a head's chunks
// depend on each other, the heads do not); the dB, dC rows, each group's heads' rows added in head
// order.
void ssd_backward(const KernelContext& ctx, const float* x, int ld_x, const float* dt, const float* A, const float* B,
                  const float* C, int ld_bc, const float* D, const SsdDims& dims, int chunk_in, const float* S0, int T,
                  const float* dy, float* dx, int ld_dx, float* ddt, float* dA, float* dB, float* dC, int ld_dbc,
                  float* dD, float* dS0) {
  check(chunk_in > 0, "ssd_scan_backward: chunk must be positive, got ", chunk_in);
  if (T <= 0) {  // no step: dS0 = 0, nothing else to write
    if (dS0) std::fill(dS0, dS0 + static_cast<size_t>(dims.n_heads) * dims.head_dim * dims.d_state, 0.0f);
    return;
  }
  const int chunk = std::min(chunk_in, kSsdBwdChunk);
  const int nh = dims.n_heads, P = dims.head_dim, N = dims.d_state, G = dims.n_groups, hpg = nh / G;
  const size_t PN = static_cast<size_t>(P) * N, q = static_cast<size_t>(chunk);
  const int n_chunks = (T + chunk - 1) / chunk;
  ScratchFrame frame(ctx);
  float* cb = frame.take(static_cast<size_t>(G) * n_chunks * q * q);
  float* dBp = frame.take(static_cast<size_t>(nh) * T * N);
  float* dCp = frame.take(static_cast<size_t>(nh) * T * N);
  parallel(ctx, static_cast<size_t>(G) * n_chunks, 1, [&](size_t b, size_t e) {
    ScratchFrame body(ctx);
    ssdb_cb_loops_dispatch(B, C, ld_bc, dims, chunk, T, cb, b, e, body.take(q * N));
  });
  parallel(ctx, static_cast<size_t>(nh), 1, [&](size_t b, size_t e) {
    ScratchFrame body(ctx);
    float* ckpt = body.take(static_cast<size_t>(n_chunks) * PN);
    float* gS = body.take(PN);
    float* bw = body.take(q * N + 4 * q);
    const SsdbScratch s(body, q, P, N);
    ssdb_heads_loops_dispatch(x, ld_x, dt, A, B, C, ld_bc, D, dims, chunk, S0, T, dy, dx, ld_dx, ddt, dA, dD, dS0,
                              dBp, dCp, cb, b, e, ckpt, gS, bw, s);
  });
  parallel(ctx, static_cast<size_t>(T), 16, [&](size_t tb, size_t te) {
    for (size_t t = tb; t < te; ++t) {
      float* bo = dB + t * ld_dbc;
      float* co = dC + t * ld_dbc;
      for (int k = 0; k < G * N; ++k) bo[k] = co[k] = 0.0f;
      for (int h = 0; h < nh; ++h) {
        const size_t off = static_cast<size_t>(h / hpg) * N, src = (static_cast<size_t>(h) * T + t) * N;
        for (int n = 0; n < N; ++n) {
          bo[off + n] += dBp[src + n];
          co[off + n] += dCp[src + n];
        }
      }
    }
  });
}

}  // namespace

void ssd_scan_backward(const KernelContext& ctx, const float* x, int ld_x, const float* dt, const float* A,
                       const float* B, const float* C, int ld_bc, const float* D, const SsdDims& dims, int chunk,
                       const float* S0, int T, const float* dy, float* dx, int ld_dx, float* ddt, float* dA,
                       float* dB, float* dC, int ld_dbc, float* dD, float* dS0) {
  ssd_backward(ctx, x, ld_x, dt, A, B, C, ld_bc, D, dims, chunk, S0, T, dy, dx, ld_dx, ddt, dA, dB, dC, ld_dbc, dD,
               dS0);
}

void ssd_scan_discrete_backward(const KernelContext& ctx, const float* x, int ld_x, const float* log_a,
                                const float* B, const float* C, int ld_bc, const float* D, const SsdDims& dims,
                                int chunk, const float* S0, int T, const float* dy, float* dx, int ld_dx,
                                float* dlog_a, float* dB, float* dC, int ld_dbc, float* dD, float* dS0) {
  ssd_backward(ctx, x, ld_x, log_a, nullptr, B, C, ld_bc, D, dims, chunk, S0, T, dy, dx, ld_dx, dlog_a, nullptr, dB,
               dC, ld_dbc, dD, dS0);
}

ScratchNeed scan_backward_scratch(const KernelLimits& lim) {
  if (!lim.backward || lim.d_state == 0 || lim.tokens == 0) return {};
  using R = FloatArena;
  const size_t T = static_cast<size_t>(lim.tokens), N = static_cast<size_t>(lim.d_state);
  const size_t I = static_cast<size_t>(lim.conv_channels);  // bounds d_inner (Mamba-1) and nh * P (SSD)
  // Mamba-1: blocks of 16 channels; the checkpoint pass and the segments run one after the other.
  const size_t nblk = (I + kLanes - 1) / kLanes, blk = N * kLanes;
  const size_t m1_worker = R::rounded((kM1Interval + 2) * blk);
  const size_t m1_caller = R::rounded(((T + kM1Interval - 1) / kM1Interval) * nblk * blk) +
                           2 * R::rounded(nblk * blk) + R::rounded(nblk * kLanes) +
                           2 * R::rounded(nblk * kM1Interval * N);
  ScratchNeed need{m1_caller + m1_worker, m1_worker};
  if (lim.head_dim > 0 && lim.ssd_chunk > 0) {
    // The SSD: a thread's head's checkpoints are fewer with longer chunks, its per-chunk buffers
    // larger (and a call's ceil(T / chunk) CB blocks of chunk^2 span at most (T + chunk - 1) chunk
    // floats). Its chunk is the call's, capped at kSsdBwdChunk.
    const size_t P = static_cast<size_t>(lim.head_dim), nh = (I + P - 1) / P;
    const size_t G = static_cast<size_t>(std::max(lim.n_groups, 1));
    const size_t hi = static_cast<size_t>(std::min(lim.ssd_chunk, kSsdBwdChunk));
    const int lo_chunk = lim.ssd_chunk_min > 0 ? lim.ssd_chunk_min : lim.ssd_chunk;
    const size_t lo = std::min(hi, static_cast<size_t>(std::max(1, lo_chunk)));
    const size_t worker = R::rounded(((T + lo - 1) / lo) * P * N) + R::rounded(P * N) + R::rounded(hi * N + 4 * hi) +
                          SsdbScratch::floats(hi, P, N);
    const size_t caller = R::rounded(G * (T + hi - 1) * hi) + 2 * R::rounded(nh * T * N);
    need = most(need, {caller + worker, worker});
  }
  return need;
}

}  // namespace hybridlm::cpu
