// The recurrent decode steps on AVX-512, and Mamba-1's prefill scan. A step reads and writes
// every element of a sequence's state once, so at batch 32 these passes are the memory traffic of
// decode (mamba2-130m: 18.5 MiB of f32 state per sequence); with bf16 storage they read and write
// it as bf16 directly.
#include "kernels/cpu/intrinsics.h"

#include <algorithm>
#include <vector>

#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/ssm_step_avx512.h"
#include "kernels/cpu/vec_math.h"

namespace hybridlm::cpu {

namespace {

// 16 elements of a recurrent state as f32, and back (bf16: widened; rounded to nearest even with
// NaN kept quiet, lane for lane what f32_to_bf16 does; vcvtneps2bf16 would flush subnormals,
// which a decaying state reaches).
HYBRIDLM_AVX512 HYBRIDLM_INLINE __m512 load_state16(const float* p) { return _mm512_loadu_ps(p); }
HYBRIDLM_AVX512 HYBRIDLM_INLINE __m512 load_state16(const uint16_t* p) {
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
HYBRIDLM_AVX512 HYBRIDLM_INLINE void store_state16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
HYBRIDLM_AVX512 HYBRIDLM_INLINE void store_state16(uint16_t* p, __m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), odd), 16);
  const __mmask16 nan =
      _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet)));
}

// Heads [hb, he), four state rows (p .. p + 3) at a time: each 16-element piece of a row is read
// once, decayed and updated (decay S + dt x B), multiplied into the row's C accumulator and written
// back; B and C pieces are loaded once for the four rows. y = reduce16(accumulator) + D x.
template <class St>
HYBRIDLM_AVX512 void step_heads(const float* x, const float* dt, const float* A, const float* B, const float* C,
                                const float* D, const SsdDims& dm, St* S, float* y, size_t hb, size_t he) {
  const int P = dm.head_dim, N = dm.d_state, hpg = dm.n_heads / dm.n_groups;
  for (size_t h = hb; h < he; ++h) {
    const float* Bg = B + (h / hpg) * N;
    const float* Cg = C + (h / hpg) * N;
    const __m512 decay = _mm512_set1_ps(vexp(dt[h] * A[h]));
    for (int p = 0; p < P; p += 4) {
      const float* xp = x + h * P + p;
      const __m512 dx0 = _mm512_set1_ps(dt[h] * xp[0]), dx1 = _mm512_set1_ps(dt[h] * xp[1]);
      const __m512 dx2 = _mm512_set1_ps(dt[h] * xp[2]), dx3 = _mm512_set1_ps(dt[h] * xp[3]);
      St* s0 = S + (h * P + p) * N;
      St *s1 = s0 + N, *s2 = s1 + N, *s3 = s2 + N;
      __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      for (int n = 0; n < N; n += 16) {
        const __m512 b = _mm512_loadu_ps(Bg + n), c = _mm512_loadu_ps(Cg + n);
        const __m512 n0 = _mm512_fmadd_ps(decay, load_state16(s0 + n), _mm512_mul_ps(dx0, b));
        const __m512 n1 = _mm512_fmadd_ps(decay, load_state16(s1 + n), _mm512_mul_ps(dx1, b));
        const __m512 n2 = _mm512_fmadd_ps(decay, load_state16(s2 + n), _mm512_mul_ps(dx2, b));
        const __m512 n3 = _mm512_fmadd_ps(decay, load_state16(s3 + n), _mm512_mul_ps(dx3, b));
        a0 = _mm512_fmadd_ps(n0, c, a0), a1 = _mm512_fmadd_ps(n1, c, a1);
        a2 = _mm512_fmadd_ps(n2, c, a2), a3 = _mm512_fmadd_ps(n3, c, a3);
        store_state16(s0 + n, n0), store_state16(s1 + n, n1), store_state16(s2 + n, n2), store_state16(s3 + n, n3);
      }
      float* yp = y + h * P + p;
      yp[0] = reduce16(a0) + D[h] * xp[0];
      yp[1] = reduce16(a1) + D[h] * xp[1];
      yp[2] = reduce16(a2) + D[h] * xp[2];
      yp[3] = reduce16(a3) + D[h] * xp[3];
    }
  }
}

template <class St>
bool step(const KernelContext& ctx, const float* x, const float* dt, const float* A, const float* B, const float* C,
          const float* D, const SsdDims& dm, St* S, float* y) {
  if (dm.d_state % 16 != 0 || dm.head_dim % 4 != 0) return false;
  parallel(ctx, dm.n_heads, 4, [&](size_t b, size_t e) { step_heads(x, dt, A, B, C, D, dm, S, y, b, e); });
  return true;
}

// Mamba-1, channels [ib, ie): a channel's state row (N) is updated in vectors of 16,
//   h = exp(dt A_i) h + dt x_i B,  y_i = (h . C + D_i x_i) silu(z_i).
// The decays of 16 channels are computed first in one loop (the vectorised vexp), then each
// channel's row is read, updated, dotted with C and written back in one pass.
template <class St>
HYBRIDLM_AVX512 void m1_step_channels(const float* x, const float* dt, const float* A, const float* B, const float* C,
                                      const float* D, const float* z, St* h, int N, float* y, size_t ib, size_t ie,
                                      float* dA) {
  // dA: the decays of 16 channels, (16, N).
  for (size_t i0 = ib; i0 < ie; i0 += 16) {
    const size_t nc = std::min<size_t>(16, ie - i0);
    for (size_t c = 0; c < nc; ++c) {
      const float d = dt[i0 + c];
      const float* Ai = A + (i0 + c) * N;
      for (int n = 0; n < N; ++n) dA[c * N + n] = vexp(d * Ai[n]);
    }
    for (size_t c = 0; c < nc; ++c) {
      const size_t i = i0 + c;
      const __m512 dx = _mm512_set1_ps(dt[i] * x[i]);
      St* hi = h + i * N;
      __m512 acc = _mm512_setzero_ps();
      for (int n = 0; n < N; n += 16) {
        const __m512 v = _mm512_fmadd_ps(_mm512_loadu_ps(dA + c * N + n), load_state16(hi + n),
                                         _mm512_mul_ps(dx, _mm512_loadu_ps(B + n)));
        acc = _mm512_fmadd_ps(v, _mm512_loadu_ps(C + n), acc);
        store_state16(hi + n, v);
      }
      y[i] = (reduce16(acc) + D[i] * x[i]) * vsilu(z[i]);
    }
  }
}

// The causal conv of one token (decode) with K = 4 taps, channels [cb, ce). The prefill kernel
// (conv_channels) copies its channels' taps to (K, channels) on every call, which at decode costs
// as much as the conv itself, once per sequence and layer in a batched step. Here the taps of 16
// channels, 64 contiguous floats of the (C, 4) weight, are transposed in registers. Per channel
// the same operations in the same order as conv_channels: from the bias or 0, one FMA per tap,
// then vsilu. That is bitwise its result where the compiler contracts its `o += w * x` into an
// FMA (GCC from -O2 in C++, clang within an expression: the release builds), and within rounding
// where it does not (GCC at -O1, the sanitizer build); the test allows that rounding.
HYBRIDLM_AVX512 void conv4_step_channels(const float* x, const float* w, const float* bias, float* state, int C,
                                         bool act, float* out, size_t cb, size_t ce) {
  // Tap k of the block's channel j is float 4 (j % 8) + k of the pair of quarters (wq0, wq1) for
  // j < 8 and of (wq2, wq3) for j >= 8.
  const __m512i j8 = _mm512_set_epi32(7, 6, 5, 4, 3, 2, 1, 0, 7, 6, 5, 4, 3, 2, 1, 0);
  __m512i idx[4];
  for (int k = 0; k < 4; ++k) idx[k] = _mm512_add_epi32(_mm512_slli_epi32(j8, 2), _mm512_set1_epi32(k));
  const size_t ld = static_cast<size_t>(C);
  for (size_t c0 = cb; c0 < ce; c0 += 16) {
    const int nc = static_cast<int>(std::min<size_t>(16, ce - c0));
    const __mmask16 m = static_cast<__mmask16>((1u << nc) - 1);
    __m512 wq[4];
    for (int q = 0; q < 4; ++q) {
      const int valid = std::clamp(4 * nc - 16 * q, 0, 16);  // floats of this quarter in range
      wq[q] = valid == 0 ? _mm512_setzero_ps()
                         : _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << valid) - 1), w + 4 * c0 + 16 * q);
    }
    const __m512 s0 = _mm512_maskz_loadu_ps(m, state + c0), s1 = _mm512_maskz_loadu_ps(m, state + ld + c0);
    const __m512 s2 = _mm512_maskz_loadu_ps(m, state + 2 * ld + c0), xv = _mm512_maskz_loadu_ps(m, x + c0);
    const __m512 in[4] = {s0, s1, s2, xv};
    __m512 o = bias ? _mm512_maskz_loadu_ps(m, bias + c0) : _mm512_setzero_ps();
    for (int k = 0; k < 4; ++k) {
      const __m512 tap = _mm512_mask_blend_ps(0xFF00, _mm512_permutex2var_ps(wq[0], idx[k], wq[1]),
                                              _mm512_permutex2var_ps(wq[2], idx[k], wq[3]));
      o = _mm512_fmadd_ps(tap, in[k], o);
    }
    _mm512_mask_storeu_ps(out + c0, m, o);
    _mm512_mask_storeu_ps(state + c0, m, s1);
    _mm512_mask_storeu_ps(state + ld + c0, m, s2);
    _mm512_mask_storeu_ps(state + 2 * ld + c0, m, xv);
  }
  if (act)
    for (size_t c = cb; c < ce; ++c) out[c] = vsilu(out[c]);
}

// Mamba-1 over T tokens, channels [ib, ie), 16 channels per vector (one per lane), d_state N <= 16:
// per channel block the N state vectors (state element n of 16 channels) stay in registers for
// all T tokens, and per token and n one exp16, a multiply and an FMA for h = exp(dt A) h + dt x B
// and an FMA for h . C. The portable loop did the same per lane with scalar set-up around it, and GCC kept its
// vexp half scalar: 25% of mamba-130m's prefill.
template <class St>
HYBRIDLM_AVX512 void m1_scan_channels(const float* x, int ld_x, const float* dt, const float* A, const float* B,
                                      const float* C, int ld_bc, const float* D, const float* z, int ld_z, St* h, int T,
                                      int I, int N, float* y, size_t ib, size_t ie) {
  constexpr int kMaxN = 16;
  constexpr int kAhead = 8;  // tokens
  for (size_t i0 = ib; i0 < ie; i0 += 16) {
    const int nc = static_cast<int>(std::min<size_t>(16, ie - i0));
    const __mmask16 m = static_cast<__mmask16>((1u << nc) - 1);
    __m512 hs[kMaxN], as[kMaxN];
    alignas(64) float tmp[16];
    for (int n = 0; n < kMaxN; ++n) {
      if (n >= N) {
        hs[n] = as[n] = _mm512_setzero_ps();
        continue;
      }
      for (int l = 0; l < 16; ++l) tmp[l] = l < nc ? widen(h[(i0 + l) * N + n]) : 0.0f;
      hs[n] = _mm512_load_ps(tmp);
      for (int l = 0; l < 16; ++l) tmp[l] = l < nc ? A[(i0 + l) * N + n] : 0.0f;
      as[n] = _mm512_load_ps(tmp);
    }
    const __m512 Dv = _mm512_maskz_loadu_ps(m, D + i0);
    for (int t = 0; t < T; ++t) {
      if (t + kAhead < T) {  // rows I floats apart: a new page per token, which no prefetcher follows
        const size_t ta = static_cast<size_t>(t + kAhead);
        const float* yt = y + ta * I + i0;
        for (const float* p : {dt + ta * I + i0, x + ta * ld_x + i0, z + ta * ld_z + i0, yt}) {
          _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0);  // the 16 floats' first line
          _mm_prefetch(reinterpret_cast<const char*>(p + 15), _MM_HINT_T0);  // and last, if another
        }
      }
      const __m512 d = _mm512_maskz_loadu_ps(m, dt + static_cast<size_t>(t) * I + i0);
      const __m512 xv = _mm512_maskz_loadu_ps(m, x + static_cast<size_t>(t) * ld_x + i0);
      const __m512 dx = _mm512_mul_ps(d, xv);
      const float* Bt = B + static_cast<size_t>(t) * ld_bc;
      const float* Ct = C + static_cast<size_t>(t) * ld_bc;
      __m512 acc = _mm512_setzero_ps();
#pragma GCC unroll 16
      for (int n = 0; n < kMaxN; ++n) {
        if (n >= N) break;
        const __m512 e = exp16(_mm512_mul_ps(d, as[n]));
        hs[n] = _mm512_fmadd_ps(e, hs[n], _mm512_mul_ps(dx, _mm512_set1_ps(Bt[n])));
        acc = _mm512_fmadd_ps(hs[n], _mm512_set1_ps(Ct[n]), acc);
      }
      const __m512 zv = _mm512_maskz_loadu_ps(m, z + static_cast<size_t>(t) * ld_z + i0);
      const __m512 neg_z = _mm512_sub_ps(_mm512_setzero_ps(), zv);
      const __m512 silu = _mm512_div_ps(zv, _mm512_add_ps(_mm512_set1_ps(1.0f), exp16(neg_z)));
      _mm512_mask_storeu_ps(y + static_cast<size_t>(t) * I + i0, m, _mm512_mul_ps(_mm512_fmadd_ps(Dv, xv, acc), silu));
    }
    for (int n = 0; n < N; ++n) {
      _mm512_store_ps(tmp, hs[n]);
      for (int l = 0; l < nc; ++l) narrow(tmp[l], h[(i0 + l) * N + n]);
    }
  }
}

template <class St>
bool m1_scan_any(const KernelContext& ctx, const float* x, int ld_x, const float* dt, const float* A, const float* B,
                 const float* C, int ld_bc, const float* D, const float* z, int ld_z, St* h, int T, int I, int N,
                 float* y) {
  if (N > 16) return false;
  parallel(ctx, I, 16, [&](size_t b, size_t e) {
    m1_scan_channels(x, ld_x, dt, A, B, C, ld_bc, D, z, ld_z, h, T, I, N, y, b, e);
  });
  return true;
}

template <class St>
bool m1_step(const KernelContext& ctx, const float* x, const float* dt, const float* A, const float* B, const float* C,
             const float* D, const float* z, St* h, int I, int N, float* y) {
  if (N % 16 != 0) return false;
  parallel(ctx, I, 16, [&](size_t b, size_t e) {
    ScratchFrame frame(ctx);
    m1_step_channels(x, dt, A, B, C, D, z, h, N, y, b, e, frame.take(static_cast<size_t>(16) * N));
  });
  return true;
}

}  // namespace

bool ssd_step_avx512(const KernelContext& ctx, const float* x, const float* dt, const float* A, const float* B,
                     const float* C, const float* D, const SsdDims& dims, float* S, float* y) {
  return step(ctx, x, dt, A, B, C, D, dims, S, y);
}
bool ssd_step_avx512(const KernelContext& ctx, const float* x, const float* dt, const float* A, const float* B,
                     const float* C, const float* D, const SsdDims& dims, uint16_t* S, float* y) {
  return step(ctx, x, dt, A, B, C, D, dims, S, y);
}
bool mamba1_step_avx512(const KernelContext& ctx, const float* x, const float* dt, const float* A, const float* B,
                        const float* C, const float* D, const float* z, float* h, int I, int N, float* y) {
  return m1_step(ctx, x, dt, A, B, C, D, z, h, I, N, y);
}
bool mamba1_step_avx512(const KernelContext& ctx, const float* x, const float* dt, const float* A, const float* B,
                        const float* C, const float* D, const float* z, uint16_t* h, int I, int N, float* y) {
  return m1_step(ctx, x, dt, A, B, C, D, z, h, I, N, y);
}

void ssd_step_avx512_heads(const float* x, const float* dt, const float* A, const float* B, const float* C,
                           const float* D, const SsdDims& dims, float* S, float* y, size_t hb, size_t he) {
  step_heads(x, dt, A, B, C, D, dims, S, y, hb, he);
}
void ssd_step_avx512_heads(const float* x, const float* dt, const float* A, const float* B, const float* C,
                           const float* D, const SsdDims& dims, uint16_t* S, float* y, size_t hb, size_t he) {
  step_heads(x, dt, A, B, C, D, dims, S, y, hb, he);
}
void conv4_step_avx512_channels(const float* x, const float* w, const float* bias, float* state, int C, bool apply_silu,
                                float* out, size_t cb, size_t ce) {
  conv4_step_channels(x, w, bias, state, C, apply_silu, out, cb, ce);
}

bool conv_step_avx512(const KernelContext& ctx, const float* x, const float* w, const float* bias, float* state,
                      int C, int K, bool apply_silu, float* out) {
  if (K != 4) return false;
  parallel(ctx, C, 64, [&](size_t b, size_t e) { conv4_step_channels(x, w, bias, state, C, apply_silu, out, b, e); });
  return true;
}

HYBRIDLM_AVX512 void exp_avx512(const float* x, size_t n, float* y) {
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 m = static_cast<__mmask16>(n - i >= 16 ? 0xffff : (1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(y + i, m, exp16(_mm512_maskz_loadu_ps(m, x + i)));
  }
}

bool mamba1_scan_avx512(const KernelContext& ctx, const float* x, int ld_x, const float* dt, const float* A,
                        const float* B, const float* C, int ld_bc, const float* D, const float* z, int ld_z, float* h,
                        int T, int I, int N, float* y) {
  return m1_scan_any(ctx, x, ld_x, dt, A, B, C, ld_bc, D, z, ld_z, h, T, I, N, y);
}
bool mamba1_scan_avx512(const KernelContext& ctx, const float* x, int ld_x, const float* dt, const float* A,
                        const float* B, const float* C, int ld_bc, const float* D, const float* z, int ld_z,
                        uint16_t* h, int T, int I, int N, float* y) {
  return m1_scan_any(ctx, x, ld_x, dt, A, B, C, ld_bc, D, z, ld_z, h, T, I, N, y);
}

ScratchNeed ssm_step_avx512_scratch(const KernelLimits& lim) {
  const size_t each = FloatArena::rounded(static_cast<size_t>(16) * lim.d_state);  // m1_step_channels
  return {each, each};
}

}  // namespace hybridlm::cpu
