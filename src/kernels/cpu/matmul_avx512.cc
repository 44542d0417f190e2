// The AVX-512 kernels of cpu::matmul (see matmul_cpu.cc for the summation order every path
// keeps): register tiles of dot products on row-major f32 and bf16 weights, the AVX512_VNNI int8
// tiles for q8_0 and q4_0 weights, and the 16-lane q8_0 quantizer of the activations. x86-64 only.
#include "kernels/cpu/intrinsics.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/matmul_avx512.h"
#include "kernels/kernels.h"

namespace hybridlm::cpu {

namespace {

constexpr int kTileT = 4;  // tokens per register tile
constexpr int kTileR = 4;  // weight rows per register tile

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

#define HYBRIDLM_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma")))

// One group of 4 columns (activation codes from column c of each token's row): the NP panels'
// weight code vectors against each token's 4 codes broadcast.
template <int MT, int NP>
HYBRIDLM_VNNI inline __attribute__((always_inline)) void q8_group(const int8_t* xq, int ld, int c,
                                                                  const __m512i (&wv)[NP], __m512i (&isum)[MT][NP]) {
#pragma GCC unroll 8
  for (int t = 0; t < MT; ++t) {
    int32_t x4;
    std::memcpy(&x4, xq + static_cast<size_t>(t) * ld + c, sizeof x4);
    const __m512i xv = _mm512_set1_epi32(x4);
#pragma GCC unroll 4
    for (int p = 0; p < NP; ++p) isum[t][p] = _mm512_dpbusd_epi32(isum[t][p], wv[p], xv);
  }
}

// MT tokens x NP panels (16 rows each) starting at panel p0; all blocks. Accumulators: MT x NP
// integer block sums and as many float sums (at most 8 x 1 or 2 x 2 ... within 32 registers).
// kQ4: q4_0 weights, each 64-byte load two groups' codes (low and high nibbles, tensor/quant.h).
template <bool kQ4, int MT, int NP>
HYBRIDLM_VNNI void q8_tile_vnni(const WeightView& W, const float* bias, const Q8Acts& xa, int t0, int p0, float* y) {
  const int nb = xa.nb, ld = xa.ld;
  constexpr int kBlockBytes = kQ8Block * kQ8PanelRows / (kQ4 ? 2 : 1);
  const size_t panel_codes = static_cast<size_t>(kQ8PanelRows) * ld / (kQ4 ? 2 : 1);
  const size_t panel_scales = static_cast<size_t>(kQ8PanelRows) * nb;
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
    const uint8_t* wb = wp + static_cast<size_t>(b) * kBlockBytes;
    if constexpr (kQ4) {
      const __m512i low = _mm512_set1_epi8(15);
#pragma GCC unroll 4
      for (int j = 0; j < kQ8Block / kQ8Group / 2; ++j) {
        __m512i lo[NP], hi[NP];
#pragma GCC unroll 4
        for (int p = 0; p < NP; ++p) {
          const __m512i raw = _mm512_loadu_si512(wb + p * panel_codes + j * 64);
          lo[p] = _mm512_and_si512(raw, low);
          hi[p] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low);
        }
        q8_group<MT, NP>(xq, ld, b * kQ8Block + j * kQ8Group, lo, isum);
        q8_group<MT, NP>(xq, ld, b * kQ8Block + (j + 4) * kQ8Group, hi, isum);
      }
    } else {
#pragma GCC unroll 8
      for (int g = 0; g < kQ8Block / kQ8Group; ++g) {
        __m512i wv[NP];
#pragma GCC unroll 4
        for (int p = 0; p < NP; ++p) wv[p] = _mm512_loadu_si512(wb + p * panel_codes + g * 64);
        q8_group<MT, NP>(xq, ld, b * kQ8Block + g * kQ8Group, wv, isum);
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
// tile, remainders by smaller tiles. q4_0 decode takes four panels at a time on rows of 2048+
// columns: its panels are half q8_0's bytes, and on mamba2-1.3b (d_model 2048, d_inner 4096) four
// kept more loads in flight (tg16 at 1 thread, alternating pairs: 21.9 / 15.8 / 12.6 -> 23.4 /
// 18.9 / 16.4 t/s), while on mamba2-130m's rows of 768 and 1536 two were faster (four pairs:
// 180 / 148 / 175 / 194 against 168 / 142 / 153 / 150 t/s with four).
template <bool kQ4>
HYBRIDLM_VNNI void q8_panels_vnni(const WeightView& W, const float* bias, const Q8Acts& xa, int T, float* y, int pb,
                                  int pe) {
  int p = pb;
  if (T == 1) {
    if constexpr (kQ4) {
      if (W.cols >= 2048)
        for (; p + 4 <= pe; p += 4) q8_tile_vnni<kQ4, 1, 4>(W, bias, xa, 0, p, y);
    }
    for (; p + 2 <= pe; p += 2) q8_tile_vnni<kQ4, 1, 2>(W, bias, xa, 0, p, y);
    for (; p < pe; ++p) q8_tile_vnni<kQ4, 1, 1>(W, bias, xa, 0, p, y);
    return;
  }
  for (; p < pe; ++p) {
    int t = 0;
    for (; t + 8 <= T; t += 8) q8_tile_vnni<kQ4, 8, 1>(W, bias, xa, t, p, y);
    switch (T - t) {
      case 7: q8_tile_vnni<kQ4, 7, 1>(W, bias, xa, t, p, y); break;
      case 6: q8_tile_vnni<kQ4, 6, 1>(W, bias, xa, t, p, y); break;
      case 5: q8_tile_vnni<kQ4, 5, 1>(W, bias, xa, t, p, y); break;
      case 4: q8_tile_vnni<kQ4, 4, 1>(W, bias, xa, t, p, y); break;
      case 3: q8_tile_vnni<kQ4, 3, 1>(W, bias, xa, t, p, y); break;
      case 2: q8_tile_vnni<kQ4, 2, 1>(W, bias, xa, t, p, y); break;
      case 1: q8_tile_vnni<kQ4, 1, 1>(W, bias, xa, t, p, y); break;
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

}  // namespace

void matmul_rows_avx512(const WeightView& W, const float* bias, const float* x, int T, float* y, int r_begin,
                        int r_end) {
  if (W.dtype == DType::BF16) rows_avx512<true>(W, bias, x, T, y, r_begin, r_end);
  else rows_avx512<false>(W, bias, x, T, y, r_begin, r_end);
}

void matmul_q8_vnni(const WeightView& W, const float* bias, const Q8Acts& xa, int T, float* y, int pb, int pe) {
  if (W.dtype == DType::U8) q8_panels_vnni<true>(W, bias, xa, T, y, pb, pe);
  else q8_panels_vnni<false>(W, bias, xa, T, y, pb, pe);
}

void quantize_q8_0_row_avx512(const float* x, int n, int8_t* codes, float* scales) {
  quantize_row_avx512(x, n, codes, scales);
}

}  // namespace hybridlm::cpu
