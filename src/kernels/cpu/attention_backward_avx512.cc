// Causal attention's backward on AVX-512 (training; contiguous K and V of T rows). The portable
// kernel (attention_backward_cpu.cc) takes one (query, head) at a time and updates every key's dk
// and dv rows in memory for each query, so a step is bound by those stores. Here a work item is
// still one KV head with all its query heads (dk and dv have one writer), but queries go in
// blocks of kQb:
//   1. per query of the block, the scores and dP = dout . v over its keys, 16 keys at a time
//      (16 dot products in 16 registers, one cross-lane sum16x16), then the exact softmax P, the
//      row's D = sum P dP and dS = P (dP - D);
//   2. per piece of up to 64 columns of head_dim and per key, one load and one store of the key's
//      dk and dv piece for the whole block (dk += scale dS q_u, dv += P dout_u over the block's
//      queries in order), and dq's piece accumulated in registers over the keys.
// Every sum runs in a fixed order (dk and dv: query heads in order, then queries in order; dq: keys
// in order), so the result does not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/attention_avx512.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/intrinsics.h"
#include "kernels/cpu/vec_math.h"

namespace hybridlm::cpu {

namespace {

constexpr int kQb = 4;  // queries per block

alignas(64) constexpr float kZeros[1024] = {};

// s[j] = dot(a, rows[j]) for j < n (rows j >= n read as zeros), 16 keys per cross-lane sum; row
// j of `rows` at rows + j * ld. Lanes past n are written too (with the dot against zeros).
HYBRIDLM_AVX512 HYBRIDLM_INLINE void dots16(const float* a, const float* rows, size_t ld, int n, int hd, float* s) {
  for (int b = 0; b < (n + 15) / 16; ++b) {
    const float* r[16];
    for (int k = 0; k < 16; ++k) r[k] = 16 * b + k < n ? rows + static_cast<size_t>(16 * b + k) * ld : kZeros;
    __m512 d[16];
    for (int k = 0; k < 16; ++k) d[k] = _mm512_setzero_ps();
    for (int v = 0; v < hd; v += 16) {
      const __m512 av = _mm512_loadu_ps(a + v);
      for (int k = 0; k < 16; ++k) d[k] = _mm512_fmadd_ps(av, _mm512_loadu_ps(r[k] + v), d[k]);
    }
    _mm512_storeu_ps(s + 16 * b, sum16x16(d));
  }
}

// Step 2 for columns [c0, c0 + 16 NV) of one query head: keys j < n[nq - 1], query u of the block
// taking keys j < n[u].
template <int NV>
HYBRIDLM_AVX512 HYBRIDLM_INLINE void update_piece(const float* const* qu, const float* const* gu,
                                                  const float* const* pu, const float* const* dsu, const int* n, int nq,
                                                  const float* k, size_t kv_ld, float scale, float* dk, float* dv,
                                                  float* const* dqu) {
  __m512 acc[kQb][NV];
  for (int u = 0; u < kQb; ++u)
    for (int v = 0; v < NV; ++v) acc[u][v] = _mm512_setzero_ps();
  const __m512 sv = _mm512_set1_ps(scale);
  for (int j = 0; j < n[nq - 1]; ++j) {
    const float* kj = k + static_cast<size_t>(j) * kv_ld;
    float* dkj = dk + static_cast<size_t>(j) * kv_ld;
    float* dvj = dv + static_cast<size_t>(j) * kv_ld;
    __m512 kr[NV], dkr[NV], dvr[NV];
    for (int v = 0; v < NV; ++v) {
      kr[v] = _mm512_loadu_ps(kj + 16 * v);
      dkr[v] = _mm512_loadu_ps(dkj + 16 * v);
      dvr[v] = _mm512_loadu_ps(dvj + 16 * v);
    }
    for (int u = 0; u < nq; ++u) {
      if (j >= n[u]) continue;
      const __m512 ds = _mm512_set1_ps(dsu[u][j]);
      const __m512 sds = _mm512_mul_ps(sv, ds);
      const __m512 p = _mm512_set1_ps(pu[u][j]);
      for (int v = 0; v < NV; ++v) {
        acc[u][v] = _mm512_fmadd_ps(ds, kr[v], acc[u][v]);
        dkr[v] = _mm512_fmadd_ps(sds, _mm512_loadu_ps(qu[u] + 16 * v), dkr[v]);
        dvr[v] = _mm512_fmadd_ps(p, _mm512_loadu_ps(gu[u] + 16 * v), dvr[v]);
      }
    }
    for (int v = 0; v < NV; ++v) {
      _mm512_storeu_ps(dkj + 16 * v, dkr[v]);
      _mm512_storeu_ps(dvj + 16 * v, dvr[v]);
    }
  }
  for (int u = 0; u < nq; ++u)
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(dqu[u] + 16 * v, _mm512_mul_ps(sv, acc[u][v]));
}

HYBRIDLM_AVX512 void backward_kv_heads(const float* q, int ld_q, const float* k, const float* v, int T, int n_heads,
                                       int n_kv_heads, int hd, float scale, const float* dout, float* dq, float* dk,
                                       float* dv, float* rows, size_t gb, size_t ge) {
  const int rep = n_heads / n_kv_heads;
  const size_t kv_ld = static_cast<size_t>(n_kv_heads) * hd, o_ld = static_cast<size_t>(n_heads) * hd;
  const size_t row_len = (static_cast<size_t>(T) + 15) & ~size_t{15};
  float* p[kQb];
  float* ds[kQb];
  for (int u = 0; u < kQb; ++u) {
    p[u] = rows + (2 * u) * row_len;
    ds[u] = rows + (2 * u + 1) * row_len;
  }
  for (size_t g = gb; g < ge; ++g) {
    const size_t off = g * hd;
    for (int j = 0; j < T; ++j) {
      std::fill_n(dk + j * kv_ld + off, hd, 0.0f);
      std::fill_n(dv + j * kv_ld + off, hd, 0.0f);
    }
    for (int h = static_cast<int>(g) * rep; h < (static_cast<int>(g) + 1) * rep; ++h)
      for (int t0 = 0; t0 < T; t0 += kQb) {
        const int nq = std::min(kQb, T - t0);
        int n[kQb];
        const float* qu[kQb];
        const float* gu[kQb];
        float* dqu[kQb];
        for (int u = 0; u < nq; ++u) {
          const int t = t0 + u;
          n[u] = t + 1;
          qu[u] = q + static_cast<size_t>(t) * ld_q + static_cast<size_t>(h) * hd;
          gu[u] = dout + static_cast<size_t>(t) * o_ld + static_cast<size_t>(h) * hd;
          dqu[u] = dq + static_cast<size_t>(t) * ld_q + static_cast<size_t>(h) * hd;
          // Scores, then the exact softmax over the row's n keys.
          dots16(qu[u], k + off, kv_ld, n[u], hd, p[u]);
          float m = -INFINITY;
          for (int j = 0; j < n[u]; ++j) m = std::max(m, p[u][j] *= scale);
          float l = 0.0f;
          for (int j = 0; j < n[u]; ++j) l += (p[u][j] = vexp(p[u][j] - m));
          const float inv = 1.0f / l;
          // dP into ds, then D = sum P dP and dS = P (dP - D).
          dots16(gu[u], v + off, kv_ld, n[u], hd, ds[u]);
          float D = 0.0f;
          for (int j = 0; j < n[u]; ++j) D += (p[u][j] *= inv) * ds[u][j];
          for (int j = 0; j < n[u]; ++j) ds[u][j] = p[u][j] * (ds[u][j] - D);
        }
        const float* pc[kQb] = {p[0], p[1], p[2], p[3]};
        const float* dsc[kQb] = {ds[0], ds[1], ds[2], ds[3]};
        for (int c = 0; c < hd; c += 64) {
          const float* qc[kQb];
          const float* gc[kQb];
          float* dqc[kQb];
          for (int u = 0; u < nq; ++u) {
            qc[u] = qu[u] + c;
            gc[u] = gu[u] + c;
            dqc[u] = dqu[u] + c;
          }
          switch (std::min(4, (hd - c) / 16)) {
            case 1:
              update_piece<1>(qc, gc, pc, dsc, n, nq, k + off + c, kv_ld, scale, dk + off + c, dv + off + c, dqc);
              break;
            case 2:
              update_piece<2>(qc, gc, pc, dsc, n, nq, k + off + c, kv_ld, scale, dk + off + c, dv + off + c, dqc);
              break;
            case 3:
              update_piece<3>(qc, gc, pc, dsc, n, nq, k + off + c, kv_ld, scale, dk + off + c, dv + off + c, dqc);
              break;
            default:
              update_piece<4>(qc, gc, pc, dsc, n, nq, k + off + c, kv_ld, scale, dk + off + c, dv + off + c, dqc);
              break;
          }
        }
      }
  }
}

}  // namespace

bool attention_backward_avx512(const KernelContext& ctx, const float* q, int ld_q, const float* k, const float* v,
                               int T, int n_heads, int n_kv_heads, int head_dim, float scale, const float* dout,
                               float* dq, float* dk, float* dv) {
  if (head_dim % 16 != 0 || head_dim > 1024) return false;
  parallel(ctx, static_cast<size_t>(n_kv_heads), 1, [&](size_t gb, size_t ge) {
    std::vector<float> rows(2 * kQb * ((static_cast<size_t>(T) + 15) & ~size_t{15}));
    backward_kv_heads(q, ld_q, k, v, T, n_heads, n_kv_heads, head_dim, scale, dout, dq, dk, dv, rows.data(), gb, ge);
  });
  return true;
}

}  // namespace hybridlm::cpu
