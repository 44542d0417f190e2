// y = x @ W^T for f32, bf16 or q8_0 weights. Each output element is one dot product whose
// summation order depends only on K and the SIMD path (16-lane partial sums, then a fixed
// reduction), never on T or on the tiling, so a token's result is bitwise identical alone or
// inside any batch. On AVX-512, gemm_cpu.cc computes the same sums as outer products: for weights
// in lane panels at any T, for row-major weights from kGemmMinTokens tokens on.
// Paths: AVX-512 register tiles (q8_0: AVX512_VNNI int8 dot products); the portable loops,
// compiled once for AVX2 + FMA (the compiler vectorises them with 8 lanes) and once for the
// baseline ISA.
#include "kernels/cpu/intrinsics.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/gemm_cpu.h"
#include "kernels/kernels.h"

namespace hybridlm::cpu {

namespace {

constexpr int kTileT = 4;  // tokens per register tile
constexpr int kTileR = 4;  // weight rows per register tile
constexpr int kTokenBlock = 64;  // tokens per cache block: 64 x 4 KiB rows (d = 1024) = 256 KiB
constexpr int kRowGroup = 8;     // row-major weights: rows per work unit (a whole decode tile)

// ---- portable path: 8 partial sums per dot product --------------------------------------------
template <bool kBf16>
inline float w_at(const void* W, size_t i) {
  if constexpr (kBf16) return bf16_to_f32(static_cast<const uint16_t*>(W)[i]);
  else return static_cast<const float*>(W)[i];
}

// Row-major weights.
template <bool kBf16>
HYBRIDLM_INLINE void rows_generic(const WeightView& W, const float* bias, const float* x, int T, float* y,
                                  int r_begin, int r_end) {
  const int K = W.cols;
  auto at = [&](int r, int k) { return static_cast<size_t>(r) * K + k; };
  for (int r = r_begin; r < r_end; ++r) {
    for (int t = 0; t < T; ++t) {
      const float* xt = x + static_cast<size_t>(t) * K;
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int k = 0;
      for (; k + 8 <= K; k += 8) {
        const size_t i = at(r, k);
        for (int l = 0; l < 8; ++l) acc[l] += w_at<kBf16>(W.data, i + l) * xt[k + l];
      }
      for (int l = 0; k < K; ++k, ++l) acc[l] += w_at<kBf16>(W.data, at(r, k)) * xt[k];
      float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
      y[static_cast<size_t>(t) * W.rows + r] = s + (bias ? bias[r] : 0.0f);
    }
  }
}
// Lane panels [p_begin, p_end), the same sums: partial sum l of output (t, r) adds the terms
// k = l, l + 8, l + 16, ... in order, which a panel holds as lane classes l and l + 8 (k = 16 j + l
// and 16 j + 8 + l); all 32 rows of a panel at once (vectorised over rows).
template <bool kBf16>
HYBRIDLM_INLINE void panels_generic(const WeightView& W, const float* bias, const float* x, int T, float* y,
                                    int p_begin, int p_end) {
  const int K = W.cols, KS = panel_chunks(K);
  for (int p = p_begin; p < p_end; ++p) {
    const size_t base = static_cast<size_t>(p) * kPanelLanes * KS * kPanelRows;
    const int r0 = p * kPanelRows, n_rows = std::min(kPanelRows, W.rows - r0);
    for (int t = 0; t < T; ++t) {
      const float* xt = x + static_cast<size_t>(t) * K;
      float acc[8][kPanelRows] = {};
      for (int j = 0; j < KS; ++j)
        for (int h = 0; h < 2; ++h)
          for (int l = 0; l < 8; ++l) {
            const int k = 16 * j + 8 * h + l;
            if (k >= K) break;
            const size_t i = base + panel_lane_offset(8 * h + l, j, KS);
            const float xv = xt[k];
            for (int r = 0; r < kPanelRows; ++r) acc[l][r] += w_at<kBf16>(W.data, i + r) * xv;
          }
      for (int r = 0; r < n_rows; ++r) {
        const float s =
            ((acc[0][r] + acc[4][r]) + (acc[1][r] + acc[5][r])) + ((acc[2][r] + acc[6][r]) + (acc[3][r] + acc[7][r]));
        y[static_cast<size_t>(t) * W.rows + r0 + r] = s + (bias ? bias[r0 + r] : 0.0f);
      }
    }
  }
}
HYBRIDLM_SIMD_VARIANTS(panels_f32, panels_generic<false>)
HYBRIDLM_SIMD_VARIANTS(panels_bf16, panels_generic<true>)

template <bool kBf16>
HYBRIDLM_AVX2 void rows_avx2(const WeightView& W, const float* bias, const float* x, int T, float* y, int rb,
                             int re) {
  rows_generic<kBf16>(W, bias, x, T, y, rb, re);
}
template <bool kBf16>
void rows_portable(const WeightView& W, const float* bias, const float* x, int T, float* y, int rb, int re) {
  rows_generic<kBf16>(W, bias, x, T, y, rb, re);
}

// ---- AVX-512 path: RT tokens x RR rows of 16-lane accumulators --------------------------------

template <bool kBf16>
HYBRIDLM_AVX512 inline __m512 load_w16(const void* W, size_t i, __mmask16 m) {
  if constexpr (kBf16) {
    __m256i raw = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(W) + i);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
  } else {
    return _mm512_maskz_loadu_ps(m, static_cast<const float*>(W) + i);
  }
}

// One k-step of the tile: RR weight vectors, RT activation vectors, RT x RR FMAs.
template <bool kBf16, int RT, int RR>
// (The dot tiles read row-major weights: element (r, k) at r * K + k; w0 = r0 * K.)
HYBRIDLM_AVX512 inline __attribute__((always_inline)) void tile_step(const WeightView& W, size_t w0,
                                                                    const float* x, int t0, int K, int k,
                                                                    __mmask16 m, __m512 (&acc)[RT][RR]) {
  __m512 wv[RR];
#pragma GCC unroll 8
  for (int r = 0; r < RR; ++r) wv[r] = load_w16<kBf16>(W.data, w0 + r * static_cast<size_t>(K) + k, m);
#pragma GCC unroll 4
  for (int t = 0; t < RT; ++t) {
    const __m512 xv = _mm512_maskz_loadu_ps(m, x + static_cast<size_t>(t0 + t) * K + k);
#pragma GCC unroll 8
    for (int r = 0; r < RR; ++r) acc[t][r] = _mm512_fmadd_ps(wv[r], xv, acc[t][r]);
  }
}

template <bool kBf16, int RT, int RR>
HYBRIDLM_AVX512 void tile_avx512(const WeightView& W, const float* bias, const float* x, int t0,
                                 int r0, float* y) {
  const int K = W.cols;
  const size_t w0 = static_cast<size_t>(r0) * K;
  __m512 acc[RT][RR];
#pragma GCC unroll 4
  for (int t = 0; t < RT; ++t)
#pragma GCC unroll 8
    for (int r = 0; r < RR; ++r) acc[t][r] = _mm512_setzero_ps();
  // Full 16-lane steps, then one masked step for the tail: the same per-lane order either way.
  int k = 0;
  for (; k + 16 <= K; k += 16) tile_step<kBf16, RT, RR>(W, w0, x, t0, K, k, static_cast<__mmask16>(0xffff), acc);
  if (k < K) tile_step<kBf16, RT, RR>(W, w0, x, t0, K, k, static_cast<__mmask16>((1u << (K - k)) - 1), acc);
  for (int t = 0; t < RT; ++t)
    for (int r = 0; r < RR; ++r)
      y[static_cast<size_t>(t0 + t) * W.rows + r0 + r] = reduce16(acc[t][r]) + (bias ? bias[r0 + r] : 0.0f);
}

// The two hot shapes written with named accumulators: GCC keeps a 2-D array of __m512 in memory
// and stores it back every iteration, which cost 3x in prefill.
// 4 tokens x 4 rows (prefill).
template <bool kBf16>
HYBRIDLM_AVX512 void tile_4x4(const WeightView& W, const float* bias, const float* x, int t0, int r0, float* y) {
  const int K = W.cols;
  const size_t w0 = static_cast<size_t>(r0) * K, w1 = w0 + K, w2 = w1 + K, w3 = w2 + K;
  const float* x0 = x + static_cast<size_t>(t0) * K;
  const float *x1 = x0 + K, *x2 = x1 + K, *x3 = x2 + K;
  __m512 a00 = _mm512_setzero_ps(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00, a13 = a00;
  __m512 a20 = a00, a21 = a00, a22 = a00, a23 = a00, a30 = a00, a31 = a00, a32 = a00, a33 = a00;
  for (size_t k = 0; k < static_cast<size_t>(K); k += 16) {
    const __mmask16 m = K - k >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << (K - k)) - 1);
    const __m512 v0 = load_w16<kBf16>(W.data, w0 + k, m), v1 = load_w16<kBf16>(W.data, w1 + k, m);
    const __m512 v2 = load_w16<kBf16>(W.data, w2 + k, m), v3 = load_w16<kBf16>(W.data, w3 + k, m);
    __m512 xv = _mm512_maskz_loadu_ps(m, x0 + k);
    a00 = _mm512_fmadd_ps(v0, xv, a00), a01 = _mm512_fmadd_ps(v1, xv, a01);
    a02 = _mm512_fmadd_ps(v2, xv, a02), a03 = _mm512_fmadd_ps(v3, xv, a03);
    xv = _mm512_maskz_loadu_ps(m, x1 + k);
    a10 = _mm512_fmadd_ps(v0, xv, a10), a11 = _mm512_fmadd_ps(v1, xv, a11);
    a12 = _mm512_fmadd_ps(v2, xv, a12), a13 = _mm512_fmadd_ps(v3, xv, a13);
    xv = _mm512_maskz_loadu_ps(m, x2 + k);
    a20 = _mm512_fmadd_ps(v0, xv, a20), a21 = _mm512_fmadd_ps(v1, xv, a21);
    a22 = _mm512_fmadd_ps(v2, xv, a22), a23 = _mm512_fmadd_ps(v3, xv, a23);
    xv = _mm512_maskz_loadu_ps(m, x3 + k);
    a30 = _mm512_fmadd_ps(v0, xv, a30), a31 = _mm512_fmadd_ps(v1, xv, a31);
    a32 = _mm512_fmadd_ps(v2, xv, a32), a33 = _mm512_fmadd_ps(v3, xv, a33);
  }
  const __m512 acc[4][4] = {{a00, a01, a02, a03}, {a10, a11, a12, a13}, {a20, a21, a22, a23}, {a30, a31, a32, a33}};
  for (int t = 0; t < 4; ++t)
    for (int r = 0; r < 4; ++r)
      y[static_cast<size_t>(t0 + t) * W.rows + r0 + r] = reduce16(acc[t][r]) + (bias ? bias[r0 + r] : 0.0f);
}

// 1 token x 8 rows (decode: memory-bound, many weight rows in flight).
template <bool kBf16>
HYBRIDLM_AVX512 void tile_1x8(const WeightView& W, const float* bias, const float* x, int t0, int r0, float* y) {
  const int K = W.cols;
  const size_t w0 = static_cast<size_t>(r0) * K, rs = static_cast<size_t>(K);
  const float* xt = x + static_cast<size_t>(t0) * K;
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  for (size_t k = 0, kw = w0; k < static_cast<size_t>(K); k += 16, kw += 16) {
    const __mmask16 m = K - k >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << (K - k)) - 1);
    const __m512 xv = _mm512_maskz_loadu_ps(m, xt + k);
    a0 = _mm512_fmadd_ps(load_w16<kBf16>(W.data, kw, m), xv, a0);
    a1 = _mm512_fmadd_ps(load_w16<kBf16>(W.data, kw + rs, m), xv, a1);
    a2 = _mm512_fmadd_ps(load_w16<kBf16>(W.data, kw + 2 * rs, m), xv, a2);
    a3 = _mm512_fmadd_ps(load_w16<kBf16>(W.data, kw + 3 * rs, m), xv, a3);
    a4 = _mm512_fmadd_ps(load_w16<kBf16>(W.data, kw + 4 * rs, m), xv, a4);
    a5 = _mm512_fmadd_ps(load_w16<kBf16>(W.data, kw + 5 * rs, m), xv, a5);
    a6 = _mm512_fmadd_ps(load_w16<kBf16>(W.data, kw + 6 * rs, m), xv, a6);
    a7 = _mm512_fmadd_ps(load_w16<kBf16>(W.data, kw + 7 * rs, m), xv, a7);
  }
  const __m512 acc[8] = {a0, a1, a2, a3, a4, a5, a6, a7};
  for (int r = 0; r < 8; ++r)
    y[static_cast<size_t>(t0) * W.rows + r0 + r] = reduce16(acc[r]) + (bias ? bias[r0 + r] : 0.0f);
}

template <bool kBf16, int RR>
HYBRIDLM_AVX512 void row_tile_avx512(const WeightView& W, const float* bias, const float* x, int T,
                                     int r0, float* y) {
  int t = 0;
  for (; t + kTileT <= T; t += kTileT) {
    if constexpr (RR == 4) tile_4x4<kBf16>(W, bias, x, t, r0, y);
    else tile_avx512<kBf16, kTileT, RR>(W, bias, x, t, r0, y);
  }
  switch (T - t) {
    case 3: tile_avx512<kBf16, 3, RR>(W, bias, x, t, r0, y); break;
    case 2: tile_avx512<kBf16, 2, RR>(W, bias, x, t, r0, y); break;
    case 1:
      if constexpr (RR == 8) tile_1x8<kBf16>(W, bias, x, t, r0, y);
      else tile_avx512<kBf16, 1, RR>(W, bias, x, t, r0, y);
      break;
    default: break;
  }
}

template <bool kBf16>
HYBRIDLM_AVX512 void rows_avx512(const WeightView& W, const float* bias, const float* x, int T,
                                 float* y, int r_begin, int r_end) {
  int r = r_begin;
  // Decode (T < kTileT): memory-bound, so keep 8 weight rows in flight instead of 4.
  if (T < kTileT)
    for (; r + 2 * kTileR <= r_end; r += 2 * kTileR) row_tile_avx512<kBf16, 2 * kTileR>(W, bias, x, T, r, y);
  for (; r + kTileR <= r_end; r += kTileR) row_tile_avx512<kBf16, kTileR>(W, bias, x, T, r, y);
  for (; r < r_end; ++r) row_tile_avx512<kBf16, 1>(W, bias, x, T, r, y);
}

// ---- q8_0 weights ----------------------------------------------------------------------------
// Every path sums each (token, row) the same way: per block of 32 columns an exact integer sum
// of code products, then acc = acc + float(isum) * (dw * dx) over the blocks in order, then the
// bias (the VNNI kernel fuses the last multiply-add, the portable loops may not: paths differ by
// rounding, each is batch-invariant). The VNNI kernel is written for the panel layout
// (tensor/quant.h): 16 rows per vector, a token's 4 codes of a group broadcast to every lane, the
// bias of the unsigned weight codes (q + 128) removed by starting each block's sum at -128 * (sum
// of the token's codes in the block). Its per-output operations do not depend on the tile, so
// results are batch-invariant.

// The activations of one call, quantized to q8_0 rows (codes with the weights' row stride), and
// per block -128 * (sum of its codes).
struct Q8Acts {
  const int8_t* codes = nullptr;
  const float* scales = nullptr;
  const int32_t* bias_fix = nullptr;
  int ld = 0, nb = 0;  // codes and scales per token
};

// Portable: one dot product at a time.
HYBRIDLM_INLINE void q8_rows_generic(const WeightView& W, const float* bias, const Q8Acts& xa, int T, float* y,
                                     int r_begin, int r_end) {
  const int nb = xa.nb, K = W.cols;
  const uint8_t* codes = static_cast<const uint8_t*>(W.data);
  for (int r = r_begin; r < r_end; ++r) {
    for (int t = 0; t < T; ++t) {
      const int8_t* xq = xa.codes + static_cast<size_t>(t) * xa.ld;
      const float* xs = xa.scales + static_cast<size_t>(t) * nb;
      float acc = 0.0f;
      for (int b = 0; b < nb; ++b) {
        int32_t isum = 0;
        for (int g = 0; g < kQ8Block; g += kQ8Group) {
          const uint8_t* wg = codes + q8_code_index(r, b * kQ8Block + g, K);  // a group's 4 codes
          for (int i = 0; i < kQ8Group; ++i) isum += q8_weight_code(wg, i) * xq[b * kQ8Block + g + i];
        }
        acc += static_cast<float>(isum) * (W.scales[q8_scale_index(r, b, K)] * xs[b]);
      }
      y[static_cast<size_t>(t) * W.rows + r] = acc + (bias ? bias[r] : 0.0f);
    }
  }
}
HYBRIDLM_AVX512 void q8_rows_avx512_novnni(const WeightView& W, const float* bias, const Q8Acts& xa, int T, float* y,
                                           int rb, int re) {
  q8_rows_generic(W, bias, xa, T, y, rb, re);
}
HYBRIDLM_AVX2 void q8_rows_avx2(const WeightView& W, const float* bias, const Q8Acts& xa, int T, float* y, int rb,
                                int re) {
  q8_rows_generic(W, bias, xa, T, y, rb, re);
}
void q8_rows_portable(const WeightView& W, const float* bias, const Q8Acts& xa, int T, float* y, int rb, int re) {
  q8_rows_generic(W, bias, xa, T, y, rb, re);
}

#define HYBRIDLM_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma")))

// MT tokens x NP panels (16 rows each) starting at panel p0; all blocks. Accumulators: MT x NP
// integer block sums and as many float sums (at most 8 x 1 or 2 x 2 ... within 32 registers).
template <int MT, int NP>
HYBRIDLM_VNNI void q8_tile_vnni(const WeightView& W, const float* bias, const Q8Acts& xa, int t0, int p0, float* y) {
  const int nb = xa.nb, ld = xa.ld;
  const size_t panel_codes = static_cast<size_t>(kQ8PanelRows) * ld, panel_scales = static_cast<size_t>(kQ8PanelRows) * nb;
  const uint8_t* wp = static_cast<const uint8_t*>(W.data) + static_cast<size_t>(p0) * panel_codes;
  const float* sp = W.scales + static_cast<size_t>(p0) * panel_scales;
  const int8_t* xq = xa.codes + static_cast<size_t>(t0) * ld;
  __m512 acc[MT][NP];
#pragma GCC unroll 8
  for (int t = 0; t < MT; ++t)
#pragma GCC unroll 2
    for (int p = 0; p < NP; ++p) acc[t][p] = _mm512_setzero_ps();
  for (int b = 0; b < nb; ++b) {
    __m512i isum[MT][NP];
#pragma GCC unroll 8
    for (int t = 0; t < MT; ++t) {
      const __m512i fix = _mm512_set1_epi32(xa.bias_fix[static_cast<size_t>(t0 + t) * nb + b]);
#pragma GCC unroll 2
      for (int p = 0; p < NP; ++p) isum[t][p] = fix;
    }
    const uint8_t* wb = wp + static_cast<size_t>(b) * kQ8Block * kQ8PanelRows;
#pragma GCC unroll 8
    for (int g = 0; g < kQ8Block / kQ8Group; ++g) {
      __m512i wv[NP];
#pragma GCC unroll 2
      for (int p = 0; p < NP; ++p) wv[p] = _mm512_loadu_si512(wb + p * panel_codes + g * 64);
#pragma GCC unroll 8
      for (int t = 0; t < MT; ++t) {
        int32_t x4;
        std::memcpy(&x4, xq + static_cast<size_t>(t) * ld + b * kQ8Block + g * kQ8Group, sizeof x4);
        const __m512i xv = _mm512_set1_epi32(x4);
#pragma GCC unroll 2
        for (int p = 0; p < NP; ++p) isum[t][p] = _mm512_dpbusd_epi32(isum[t][p], wv[p], xv);
      }
    }
#pragma GCC unroll 2
    for (int p = 0; p < NP; ++p) {
      const __m512 ws = _mm512_loadu_ps(sp + p * panel_scales + static_cast<size_t>(b) * kQ8PanelRows);
#pragma GCC unroll 8
      for (int t = 0; t < MT; ++t) {
        const __m512 scale = _mm512_mul_ps(ws, _mm512_set1_ps(xa.scales[static_cast<size_t>(t0 + t) * nb + b]));
        acc[t][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t][p]), scale, acc[t][p]);
      }
    }
  }
#pragma GCC unroll 2
  for (int p = 0; p < NP; ++p) {
    const int r0 = (p0 + p) * kQ8PanelRows, rows = std::min(kQ8PanelRows, W.rows - r0);  // >= 1: panels hold rows
    const __mmask16 m = static_cast<__mmask16>((1u << rows) - 1);
    const __m512 bv = bias ? _mm512_maskz_loadu_ps(m, bias + r0) : _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int t = 0; t < MT; ++t)
      _mm512_mask_storeu_ps(y + static_cast<size_t>(t0 + t) * W.rows + r0, m, _mm512_add_ps(acc[t][p], bv));
  }
}

// Panels [pb, pe): decode two panels at a time (two independent chains), prefill 8 tokens per
// tile, remainders by smaller tiles.
HYBRIDLM_VNNI void q8_panels_vnni(const WeightView& W, const float* bias, const Q8Acts& xa, int T, float* y, int pb,
                                  int pe) {
  int p = pb;
  if (T == 1) {
    for (; p + 2 <= pe; p += 2) q8_tile_vnni<1, 2>(W, bias, xa, 0, p, y);
    for (; p < pe; ++p) q8_tile_vnni<1, 1>(W, bias, xa, 0, p, y);
    return;
  }
  for (; p < pe; ++p) {
    int t = 0;
    for (; t + 8 <= T; t += 8) q8_tile_vnni<8, 1>(W, bias, xa, t, p, y);
    switch (T - t) {
      case 7: q8_tile_vnni<7, 1>(W, bias, xa, t, p, y); break;
      case 6: q8_tile_vnni<6, 1>(W, bias, xa, t, p, y); break;
      case 5: q8_tile_vnni<5, 1>(W, bias, xa, t, p, y); break;
      case 4: q8_tile_vnni<4, 1>(W, bias, xa, t, p, y); break;
      case 3: q8_tile_vnni<3, 1>(W, bias, xa, t, p, y); break;
      case 2: q8_tile_vnni<2, 1>(W, bias, xa, t, p, y); break;
      case 1: q8_tile_vnni<1, 1>(W, bias, xa, t, p, y); break;
      default: break;
    }
  }
}

// quantize_q8_0_row with 16 lanes: the same operations per element (NaN skipped by the block
// maximum, d = amax / 127, code = round-half-even(clamp(x / d)), zero codes for padding, NaN
// and blocks with d <= 0), so codes and scales are bitwise the scalar function's (tested).
HYBRIDLM_AVX512 HYBRIDLM_INLINE __m128i q8_codes16(__m512 v, __m512 d, __m512 lo, __m512 hi, __mmask16 keep) {
  __m512 q = _mm512_div_ps(v, d);
  const __mmask16 inf = _mm512_cmp_ps_mask(q, q, _CMP_UNORD_Q);  // inf / inf (NaN inputs are not kept)
  const __m512i sign = _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(INT32_MIN));
  q = _mm512_mask_blend_ps(inf, q, _mm512_castsi512_ps(_mm512_or_si512(sign, _mm512_castps_si512(hi))));
  const __m512 c = _mm512_min_ps(_mm512_max_ps(q, lo), hi);
  const __m512 r = _mm512_roundscale_ps(c, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return _mm512_maskz_cvtsepi32_epi8(keep, _mm512_cvtps_epi32(r));
}
HYBRIDLM_AVX512 void quantize_row_avx512(const float* x, int n, int8_t* codes, float* scales) {
  const int stride = q8_row_stride(n);
  const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
  for (int b0 = 0; b0 < stride; b0 += kQ8Block) {
    const int valid = std::clamp(n - b0, 0, kQ8Block);
    const __mmask16 m0 = static_cast<__mmask16>((1u << std::min(valid, 16)) - 1);
    const __mmask16 m1 = static_cast<__mmask16>((1u << std::max(valid - 16, 0)) - 1);
    const __m512 v0 = _mm512_maskz_loadu_ps(m0, x + b0), v1 = _mm512_maskz_loadu_ps(m1, x + b0 + 16);
    const __mmask16 ok0 = _mm512_cmp_ps_mask(v0, v0, _CMP_ORD_Q), ok1 = _mm512_cmp_ps_mask(v1, v1, _CMP_ORD_Q);
    const __m512 zero = _mm512_setzero_ps();
    const __m512 a = _mm512_max_ps(_mm512_mask_abs_ps(zero, ok0, v0), _mm512_mask_abs_ps(zero, ok1, v1));
    const float amax = _mm512_reduce_max_ps(a);
    const float d = amax / 127.0f;
    scales[b0 / kQ8Block] = (ok0 & ok1) != 0xffff ? std::nanf("") : d;
    __m128i q0 = _mm_setzero_si128(), q1 = q0;
    if (d > 0.0f) {
      const __m512 dv = _mm512_set1_ps(d);
      q0 = q8_codes16(v0, dv, lo, hi, static_cast<__mmask16>(ok0 & m0));
      q1 = q8_codes16(v1, dv, lo, hi, static_cast<__mmask16>(ok1 & m1));
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + b0), q0);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + b0 + 16), q1);
  }
}

// The quantized activations of the calling thread's current matmul (grown, never shrunk: no
// allocation per decode step once warm).
struct Q8Scratch {
  std::vector<int8_t> codes;
  std::vector<float> scales;
  std::vector<int32_t> bias_fix;
};
Q8Scratch& q8_scratch() {
  thread_local Q8Scratch s;
  return s;
}

void matmul_q8(const KernelContext& ctx, const WeightView& W, const float* bias, const float* x, int T, float* y) {
  const int K = W.cols, ld = q8_row_stride(K), nb = q8_row_blocks(K);
  Q8Scratch& s = q8_scratch();
  if (s.codes.size() < static_cast<size_t>(T) * ld) s.codes.resize(static_cast<size_t>(T) * ld);
  if (s.scales.size() < static_cast<size_t>(T) * nb) s.scales.resize(static_cast<size_t>(T) * nb);
  if (s.bias_fix.size() < static_cast<size_t>(T) * nb) s.bias_fix.resize(static_cast<size_t>(T) * nb);
  int8_t* codes = s.codes.data();
  float* scales = s.scales.data();
  int32_t* fix = s.bias_fix.data();
  quantize_q8_0_rows(ctx, x, T, K, codes, scales);
  const SimdPath path = simd_path();
  const bool vnni = has_avx512_vnni();
  if (path == SimdPath::Avx512 && vnni)  // only the VNNI kernel reads the biased weight codes raw
    parallel(ctx, static_cast<size_t>(T), 16, [&](size_t b, size_t e) {
      for (size_t t = b; t < e; ++t)
        for (int blk = 0; blk < nb; ++blk) {
          int32_t sum = 0;
          for (int i = 0; i < kQ8Block; ++i) sum += codes[t * ld + static_cast<size_t>(blk) * kQ8Block + i];
          fix[t * nb + blk] = -128 * sum;
        }
    });
  auto run = [&](size_t pb, size_t pe) {  // whole panels of 16 rows
    const int rb = static_cast<int>(pb) * kQ8PanelRows;
    const int re = std::min(W.rows, static_cast<int>(pe) * kQ8PanelRows);
    for (int t0 = 0; t0 < T; t0 += kTokenBlock) {
      const int nt = std::min(kTokenBlock, T - t0);
      const Q8Acts xb{codes + static_cast<size_t>(t0) * ld, scales + static_cast<size_t>(t0) * nb,
                      fix + static_cast<size_t>(t0) * nb, ld, nb};
      float* yb = y + static_cast<size_t>(t0) * W.rows;
      if (path == SimdPath::Avx512) vnni ? q8_panels_vnni(W, bias, xb, nt, yb, static_cast<int>(pb), static_cast<int>(pe))
                                         : q8_rows_avx512_novnni(W, bias, xb, nt, yb, rb, re);
      else if (path == SimdPath::Avx2) q8_rows_avx2(W, bias, xb, nt, yb, rb, re);
      else q8_rows_portable(W, bias, xb, nt, yb, rb, re);
    }
  };
  const size_t n_panels = static_cast<size_t>(q8_padded_rows(W.rows)) / kQ8PanelRows;
  if (ctx.pool) ctx.pool->parallel_for(n_panels, run, 1);
  else run(0, n_panels);
}

}  // namespace

void quantize_q8_0_rows(const KernelContext& ctx, const float* x, int T, int n, int8_t* codes, float* scales) {
  const int ld = q8_row_stride(n), nb = q8_row_blocks(n);
  const bool avx512 = simd_path() == SimdPath::Avx512;
  parallel(ctx, static_cast<size_t>(T), 16, [&](size_t b, size_t e) {
    for (size_t t = b; t < e; ++t) {
      if (avx512) quantize_row_avx512(x + t * n, n, codes + t * ld, scales + t * nb);
      else quantize_q8_0_row(x + t * n, n, codes + t * ld, scales + t * nb);
    }
  });
}

void matmul(const KernelContext& ctx, const WeightView& W, const float* bias, const float* x,
            int T, float* y) {
  if (W.dtype == DType::I8) return matmul_q8(ctx, W, bias, x, T, y);
  const bool bf16 = W.dtype == DType::BF16;
  const SimdPath path = simd_path();
  // Lane panels at any T, row-major weights from kGemmMinTokens on: the same sums as outer
  // products (bitwise equal to the dot tiles below).
  if (path == SimdPath::Avx512 && (W.panels || T >= kGemmMinTokens)) return gemm_lanes_avx512(ctx, W, bias, x, T, y);
  if (W.panels) {  // AVX2 / portable
    const size_t n_panels = (static_cast<size_t>(W.rows) + kPanelRows - 1) / kPanelRows;
    parallel(ctx, n_panels, 1, [&](size_t pb, size_t pe) {
      const int b = static_cast<int>(pb), e = static_cast<int>(pe);
      if (bf16) panels_bf16_dispatch(W, bias, x, T, y, b, e);
      else panels_f32_dispatch(W, bias, x, T, y, b, e);
    });
    return;
  }
  auto run = [&](size_t gb, size_t ge) {  // whole groups of kRowGroup rows (a decode tile never crosses one)
    const int rb = static_cast<int>(gb) * kRowGroup;
    const int re = std::min(W.rows, static_cast<int>(ge) * kRowGroup);
    // Token blocks keep the activations a thread re-reads for every row tile in L2 (a long
    // prompt's x is several MiB); the order of each dot product is unchanged.
    for (int t0 = 0; t0 < T; t0 += kTokenBlock) {
      const int nt = std::min(kTokenBlock, T - t0);
      const float* xb = x + static_cast<size_t>(t0) * W.cols;
      float* yb = y + static_cast<size_t>(t0) * W.rows;
      if (path == SimdPath::Avx512)
        bf16 ? rows_avx512<true>(W, bias, xb, nt, yb, rb, re) : rows_avx512<false>(W, bias, xb, nt, yb, rb, re);
      else if (path == SimdPath::Avx2)
        bf16 ? rows_avx2<true>(W, bias, xb, nt, yb, rb, re) : rows_avx2<false>(W, bias, xb, nt, yb, rb, re);
      else
        bf16 ? rows_portable<true>(W, bias, xb, nt, yb, rb, re) : rows_portable<false>(W, bias, xb, nt, yb, rb, re);
    }
  };
  const size_t n_groups = (static_cast<size_t>(W.rows) + kRowGroup - 1) / kRowGroup;
  if (ctx.pool) ctx.pool->parallel_for(n_groups, run, 2);
  else run(0, n_groups);
}

}  // namespace hybridlm::cpu
