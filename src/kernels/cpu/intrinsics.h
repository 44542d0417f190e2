// The x86 intrinsics for the hand-written kernel files. GCC 12 reports its own intrinsics'
// _mm512_undefined_* placeholders as uninitialized (a known false positive of avx512fintrin.h);
// exactly those two warnings are silenced, for the rest of each file that includes this header.
#pragma once

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

namespace hybridlm::cpu {

// Fixed reduction tree over the 16 lanes (the same in every kernel, so results agree bitwise):
// lane l += lane l + 8, then l += l + 4, l += l + 2, l += l + 1, each stage one vector add of the
// upper half onto the lower (the same additions as the scalar tree, in 8 instructions instead of
// a store and 15 dependent scalar adds).
inline __attribute__((always_inline, target("avx512f"))) float reduce16(__m512 v) {
  const __m256 v8 = _mm256_add_ps(_mm512_castps512_ps256(v),
                                  _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  const __m128 v4 = _mm_add_ps(_mm256_castps256_ps128(v8), _mm256_extractf128_ps(v8, 1));
  const __m128 v2 = _mm_add_ps(v4, _mm_movehl_ps(v4, v4));
  return _mm_cvtss_f32(_mm_add_ss(v2, _mm_shuffle_ps(v2, v2, 1)));
}

// In-register transpose of a 16 x 16 block: r[i] lane j <- r[j] lane i.
inline __attribute__((always_inline, target("avx512f"))) void transpose16(__m512 (&r)[16]) {
  __m512 t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    u[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    u[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    u[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    u[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j) {
      t[8 * i + j] = _mm512_shuffle_f32x4(u[8 * i + j], u[8 * i + 4 + j], 0x88);
      t[8 * i + 4 + j] = _mm512_shuffle_f32x4(u[8 * i + j], u[8 * i + 4 + j], 0xDD);
    }
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88);
    r[8 + j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0xDD);
  }
}

// exp of 16 lanes by vexp's method (vec_math.h: clamp to [-87.3, 88], 2^n p(r) with a two-part
// ln 2 and a degree-6 polynomial), the polynomial and the reduction in FMAs; NaN stays NaN.
inline __attribute__((always_inline, target("avx512f"))) __m512 exp16(__m512 x_in) {
  // max/min return their second operand for a NaN first: NaN becomes -87.3 here, restored below.
  const __m512 x = _mm512_min_ps(_mm512_max_ps(x_in, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860682030941723212e-6f),
                                    _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x));
  __m512 p = _mm512_set1_ps(1.0f / 720.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  const __m512 e = _mm512_scalef_ps(p, n);  // p 2^n in one instruction (n is whole and >= -126)
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x_in, x_in, _CMP_UNORD_Q), e, x_in);
}

// Lane j of the result is the sum of v[j]'s 16 lanes: 16 horizontal sums in 15 adds and 30
// shuffles (pairs, then quads within 128-bit lanes, then across them; not reduce16's tree).
inline __attribute__((always_inline, target("avx512f"))) __m512 sum16x16(const __m512 (&v)[16]) {
  __m512 a[8], b[4], c[2];
  for (int i = 0; i < 8; ++i)  // per 128-bit lane: [v0 0+2, v1 0+2, v0 1+3, v1 1+3]
    a[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i)  // per 128-bit lane: the lane's 4-sums of v[4i .. 4i + 3]
    b[i] = _mm512_add_ps(_mm512_shuffle_ps(a[2 * i], a[2 * i + 1], 0x44), _mm512_shuffle_ps(a[2 * i], a[2 * i + 1], 0xEE));
  for (int i = 0; i < 2; ++i)  // 128-bit lanes: [b 0+1, b 2+3] of b[2i], then of b[2i + 1]
    c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88), _mm512_shuffle_f32x4(c[0], c[1], 0xDD));
}

}  // namespace hybridlm::cpu
