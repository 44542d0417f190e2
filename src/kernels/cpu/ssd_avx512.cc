// Mamba-2 chunked SSD on the AVX-512 path, for head_dim 16, 32, 64 or 128 and
// chunks of at most 64 tokens (the decode step is in ssm_step_avx512.cc). The same formulas as
// the portable kernel in ssm_cpu.cc (see ref/ops_ref.cc), as small matrix products with register
// tiles:
//   CB[i, j] = C_i . B_j                 once per group and chunk (shared by the group's heads)
//   L[i, j]  = exp(s_i - s_j) CB[i, j] dt_j   (j <= i, else 0)
//   y_i      = exp(s_i) C_i S_in^T + sum_j L[i, j] x_j + D x_i
//   S_out    = exp(s_last) S_in + sum_j (exp(s_last - s_j) dt_j x_j) B_j^T
// The state of a head is held transposed, (N, P), while its chunks run, so every product
// vectorises over P (or over j for CB) with broadcasts of the other operand and no reduction
// across lanes; y rows and state rows are computed four at a time (two for head_dim 128).
// Results differ from the portable kernel by rounding only (tested against the float64
// sequential recurrence).
#include "kernels/cpu/intrinsics.h"

#include <algorithm>
#include <vector>

#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/ssd_avx512.h"
#include "kernels/cpu/vec_math.h"

namespace hybridlm::cpu {

namespace {

constexpr int kQ = 64;  // largest chunk; CB and L rows are kQ wide (zero past the chunk)

// CB of one group and chunk: cb[i * kQ + j] = C_i . B_j for i < Q, every j < kQ (zero past Q).
HYBRIDLM_AVX512 void chunk_cb(const float* B, const float* C, int ld_bc, int N, int Q, float* bt, float* cb) {
  for (int n = 0; n < N; ++n)
    for (int j = 0; j < kQ; ++j) bt[n * kQ + j] = j < Q ? B[static_cast<size_t>(j) * ld_bc + n] : 0.0f;
  for (int i = 0; i < Q; ++i) {
    const float* Ci = C + static_cast<size_t>(i) * ld_bc;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int n = 0; n < N; ++n) {
      const __m512 c = _mm512_set1_ps(Ci[n]);
      const float* b = bt + n * kQ;
      a0 = _mm512_fmadd_ps(c, _mm512_loadu_ps(b), a0);
      a1 = _mm512_fmadd_ps(c, _mm512_loadu_ps(b + 16), a1);
      a2 = _mm512_fmadd_ps(c, _mm512_loadu_ps(b + 32), a2);
      a3 = _mm512_fmadd_ps(c, _mm512_loadu_ps(b + 48), a3);
    }
    float* o = cb + i * kQ;
    _mm512_storeu_ps(o, a0);
    _mm512_storeu_ps(o + 16, a1);
    _mm512_storeu_ps(o + 32, a2);
    _mm512_storeu_ps(o + 48, a3);
  }
}

// R rows of accumulators, each PV vectors wide: a[r] += sum_k p[r][k * sp] R_k over k in [0, n),
// R_k = rows + k * ld (one head_dim row). The shape of every product of a chunk: each R_k vector
// is loaded once for all R rows (R x PV accumulators in registers: 4 x PV for head_dim <= 64,
// 2 x 8 for 128).
template <int R, int PV>
HYBRIDLM_AVX512 HYBRIDLM_INLINE void rows_accumulate(const float* const (&p)[R], size_t sp, const float* rows,
                                                     size_t ld, int n, __m512 (&a)[R][PV]) {
  for (int k = 0; k < n; ++k) {
    __m512 w[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) w[r] = _mm512_set1_ps(p[r][k * sp]);
    const float* row = rows + k * ld;
#pragma GCC unroll 8
    for (int v = 0; v < PV; ++v) {
      const __m512 rv = _mm512_loadu_ps(row + 16 * v);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) a[r][v] = _mm512_fmadd_ps(w[r], rv, a[r][v]);
    }
  }
}

// One head's working rows (a thread's scratch): the state transposed (N, P), L (kQ, kQ), the
// chunk's weighted x (kQ, P), and s, e, w, d (kQ each).
struct HeadScratch {
  float *st, *L, *xw, *s, *e, *w, *d;
  HeadScratch(ScratchFrame& f, int N, int P)
      : st(f.take(static_cast<size_t>(N) * P)), L(f.take(kQ * kQ)), xw(f.take(static_cast<size_t>(kQ) * P)),
        s(f.take(kQ)), e(f.take(kQ)), w(f.take(kQ)), d(f.take(kQ)) {}
  static size_t floats(int N, int P) {
    return FloatArena::rounded(static_cast<size_t>(N) * P) + FloatArena::rounded(kQ * kQ) +
           FloatArena::rounded(static_cast<size_t>(kQ) * P) + 4 * FloatArena::rounded(kQ);
  }
};

// One head over all chunks. PV = head_dim / 16 vectors per row; rows of y and of the state are
// computed R at a time (R x PV accumulators).
template <int PV, int R = (PV <= 4 ? 4 : 2)>
HYBRIDLM_AVX512 void ssd_head(const float* x, int ld_x, const float* dt, float A, const float* B, const float* C,
                              int ld_bc, float Dh, int nh, int h, int g, int N, int chunk, const float* cb_all,
                              float* Sh, int T, float* y, HeadScratch& hs) {
  constexpr int P = PV * 16;
  float *st = hs.st, *L = hs.L, *xw = hs.xw, *s = hs.s, *e = hs.e, *w = hs.w, *d = hs.d;
  for (int p = 0; p < P; ++p)
    for (int n = 0; n < N; ++n) st[n * P + p] = Sh[p * N + n];
  const float* Bg = B + static_cast<size_t>(g) * N;
  const float* Cg = C + static_cast<size_t>(g) * N;
  for (int c0 = 0, ci = 0; c0 < T; c0 += chunk, ++ci) {
    const int Q = std::min(chunk, T - c0);
    const float* cb = cb_all + static_cast<size_t>(ci) * chunk * kQ;
    float acc_s = 0;
    for (int i = 0; i < Q; ++i) {
      acc_s += dt[static_cast<size_t>(c0 + i) * nh + h] * A;
      s[i] = acc_s;
    }
    for (int i = 0; i < Q; ++i) e[i] = vexp(s[i]);
    const float e_last = e[Q - 1];
    for (int j = 0; j < Q; ++j) w[j] = vexp(s[Q - 1] - s[j]) * dt[static_cast<size_t>(c0 + j) * nh + h];
    // s and dt padded past the chunk (s: its last value, dt: 0) so that every row of L is one
    // branch-free loop over kQ columns, which the compiler vectorises (vexp included).
    for (int j = Q; j < kQ; ++j) s[j] = s[Q - 1];
    for (int j = 0; j < kQ; ++j) d[j] = j < Q ? dt[static_cast<size_t>(c0 + j) * nh + h] : 0.0f;
    for (int i = 0; i < Q; ++i) {
      float* Li = L + i * kQ;
      const float* cbi = cb + i * kQ;
      const float si = s[i];
      for (int j = 0; j < kQ; ++j) {
        // j > i: s_i - s_j >= 0 may be large, but vexp clamps (finite), and the select drops it.
        const float v = vexp(si - s[j]) * cbi[j] * d[j];
        Li[j] = j <= i ? v : 0.0f;
      }
    }
    const float* xc = x + static_cast<size_t>(c0) * ld_x + static_cast<size_t>(h) * P;
    for (int j = 0; j < Q; ++j) {
      const __m512 wj = _mm512_set1_ps(w[j]);
      for (int v = 0; v < PV; ++v)
        _mm512_storeu_ps(xw + j * P + 16 * v, _mm512_mul_ps(wj, _mm512_loadu_ps(xc + static_cast<size_t>(j) * ld_x + 16 * v)));
    }
    // y rows i .. i + R - 1 (the ones past the chunk clamped to its last row and not stored).
    for (int i = 0; i < Q; i += R) {
      int ir[R];
      const float *Cr[R], *Lr[R];
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        ir[r] = std::min(i + r, Q - 1);
        Cr[r] = Cg + static_cast<size_t>(c0 + ir[r]) * ld_bc;
        Lr[r] = L + ir[r] * kQ;
      }
      __m512 a[R][PV];
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
        for (int v = 0; v < PV; ++v) a[r][v] = _mm512_setzero_ps();
      rows_accumulate<R, PV>(Cr, 1, st, P, N, a);  // C_i S^T
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m512 er = _mm512_set1_ps(e[ir[r]]);
#pragma GCC unroll 8
        for (int v = 0; v < PV; ++v) a[r][v] = _mm512_mul_ps(a[r][v], er);
      }
      rows_accumulate<R, PV>(Lr, 1, xc, ld_x, i + 1, a);  // sum_{j <= i} L[i + r, j] x_j
      // Each later row's own tokens j in (i, i + r], kept out of the rows before it (0 * inf
      // would be NaN there).
#pragma GCC unroll 4
      for (int r = 1; r < R; ++r)
        for (int j = i + 1; j <= ir[r]; ++j) {
          const __m512 l = _mm512_set1_ps(Lr[r][j]);
          const float* xj = xc + static_cast<size_t>(j) * ld_x;
#pragma GCC unroll 8
          for (int v = 0; v < PV; ++v) a[r][v] = _mm512_fmadd_ps(l, _mm512_loadu_ps(xj + 16 * v), a[r][v]);
        }
      const __m512 dv = _mm512_set1_ps(Dh);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        if (i + r >= Q) break;
        const float* xr = xc + static_cast<size_t>(i + r) * ld_x;
        float* yr = y + (static_cast<size_t>(c0 + i + r) * nh + h) * P;
#pragma GCC unroll 8
        for (int v = 0; v < PV; ++v) _mm512_storeu_ps(yr + 16 * v, _mm512_fmadd_ps(dv, _mm512_loadu_ps(xr + 16 * v), a[r][v]));
      }
    }
    // State rows n .. n + R - 1 of the transposed state.
    const __m512 el = _mm512_set1_ps(e_last);
    const float* Bc = Bg + static_cast<size_t>(c0) * ld_bc;
    for (int n = 0; n < N; n += R) {
      float* sr[R];
      const float* Br[R];
      __m512 a[R][PV];
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const int nr = std::min(n + r, N - 1);
        sr[r] = st + nr * P;
        Br[r] = Bc + nr;
#pragma GCC unroll 8
        for (int v = 0; v < PV; ++v) a[r][v] = _mm512_mul_ps(el, _mm512_loadu_ps(sr[r] + 16 * v));
      }
      rows_accumulate<R, PV>(Br, ld_bc, xw, P, Q, a);  // sum_j B_j[n] w_j x_j
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        if (n + r >= N) break;  // a clamped copy of row N - 1
#pragma GCC unroll 8
        for (int v = 0; v < PV; ++v) _mm512_storeu_ps(sr[r] + 16 * v, a[r][v]);
      }
    }
  }
  for (int p = 0; p < P; ++p)
    for (int n = 0; n < N; ++n) Sh[p * N + n] = st[n * P + p];
}

// CB of every group and chunk: G x ceil(T / chunk) blocks of chunk x kQ.
size_t cb_floats(int G, int T, int chunk) {
  return static_cast<size_t>(G) * ((T + chunk - 1) / chunk) * chunk * kQ;
}

}  // namespace

bool ssd_scan_avx512(const KernelContext& ctx, const float* x, int ld_x, const float* dt, const float* A,
                     const float* B, const float* C, int ld_bc, const float* D, const SsdDims& dm, int chunk,
                     float* S, int T, float* y) {
  const int P = dm.head_dim, N = dm.d_state, nh = dm.n_heads, G = dm.n_groups;
  if ((P != 16 && P != 32 && P != 64 && P != 128) || chunk > kQ || chunk < 1 || T < 1) return false;
  const int n_chunks = (T + chunk - 1) / chunk, hpg = nh / G;
  const size_t cb_size = static_cast<size_t>(chunk) * kQ;
  ScratchFrame frame(ctx);
  float* cbp = frame.take(cb_floats(G, T, chunk));  // the calling thread's: [group][chunk][chunk rows][kQ]
  parallel(ctx, static_cast<size_t>(G) * n_chunks, 1, [&](size_t b, size_t e) {
    ScratchFrame thread_frame(ctx);
    float* bt = thread_frame.take(static_cast<size_t>(N) * kQ);
    for (size_t it = b; it < e; ++it) {
      const int g = static_cast<int>(it) / n_chunks, ci = static_cast<int>(it) % n_chunks;
      const int c0 = ci * chunk, Q = std::min(chunk, T - c0);
      const size_t row0 = static_cast<size_t>(c0) * ld_bc + static_cast<size_t>(g) * N;
      chunk_cb(B + row0, C + row0, ld_bc, N, Q, bt, cbp + it * cb_size);
    }
  });
  parallel(ctx, static_cast<size_t>(nh), 1, [&](size_t hb, size_t he) {
    ScratchFrame thread_frame(ctx);
    HeadScratch hs(thread_frame, N, P);
    for (size_t hh = hb; hh < he; ++hh) {
      const int h = static_cast<int>(hh), g = h / hpg;
      const float* cbg = cbp + static_cast<size_t>(g) * n_chunks * cb_size;
      float* Sh = S + static_cast<size_t>(h) * P * N;
      switch (P / 16) {
        case 1: ssd_head<1>(x, ld_x, dt, A[h], B, C, ld_bc, D[h], nh, h, g, N, chunk, cbg, Sh, T, y, hs); break;
        case 2: ssd_head<2>(x, ld_x, dt, A[h], B, C, ld_bc, D[h], nh, h, g, N, chunk, cbg, Sh, T, y, hs); break;
        case 4: ssd_head<4>(x, ld_x, dt, A[h], B, C, ld_bc, D[h], nh, h, g, N, chunk, cbg, Sh, T, y, hs); break;
        default: ssd_head<8>(x, ld_x, dt, A[h], B, C, ld_bc, D[h], nh, h, g, N, chunk, cbg, Sh, T, y, hs); break;
      }
    }
  });
  return true;
}

ScratchNeed ssd_scan_avx512_scratch(const KernelLimits& lim) {
  if (lim.head_dim == 0) return {};
  const int chunk = std::clamp(lim.ssd_chunk, 1, kQ);  // larger chunks run the portable kernel
  const size_t each =
      std::max(FloatArena::rounded(static_cast<size_t>(lim.d_state) * kQ), HeadScratch::floats(lim.d_state, lim.head_dim));
  // A call's chunk is at most `chunk`, so its ceil(T / chunk) chunks span at most T + chunk - 1 rows.
  const size_t cb = static_cast<size_t>(std::max(lim.n_groups, 1)) * (lim.tokens + chunk - 1) * kQ;
  return {FloatArena::rounded(cb) + each, each};
}

}  // namespace hybridlm::cpu
