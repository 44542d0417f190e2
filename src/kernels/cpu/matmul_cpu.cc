// y = x @ W^T for f32 or bf16 weights. Each output element is one dot product whose summation
// order depends only on K (16-lane partial sums, then a fixed reduction), never on T or on the
// tiling, so a token's result is bitwise identical alone or inside any batch.
// GCC 12 reports its own intrinsics' _mm512_undefined_* placeholders as uninitialized (a known
// false positive of avx512fintrin.h); silence exactly those two warnings in this file.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>

#include "base/thread_pool.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/kernels.h"

namespace hybridlm::cpu {

namespace {

constexpr int kTileT = 4;  // tokens per register tile
constexpr int kTileR = 4;  // weight rows per register tile

// ---- portable path: 8 partial sums per dot product --------------------------------------------
template <bool kBf16>
inline float w_at(const void* W, size_t i) {
  if constexpr (kBf16) return bf16_to_f32(static_cast<const uint16_t*>(W)[i]);
  else return static_cast<const float*>(W)[i];
}

template <bool kBf16>
void rows_portable(const WeightView& W, const float* bias, const float* x, int T, float* y,
                   int r_begin, int r_end) {
  const int K = W.cols;
  for (int r = r_begin; r < r_end; ++r) {
    const size_t wr = static_cast<size_t>(r) * K;
    for (int t = 0; t < T; ++t) {
      const float* xt = x + static_cast<size_t>(t) * K;
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int k = 0;
      for (; k + 8 <= K; k += 8)
        for (int l = 0; l < 8; ++l) acc[l] += w_at<kBf16>(W.data, wr + k + l) * xt[k + l];
      for (int l = 0; k < K; ++k, ++l) acc[l] += w_at<kBf16>(W.data, wr + k) * xt[k];
      float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
      y[static_cast<size_t>(t) * W.rows + r] = s + (bias ? bias[r] : 0.0f);
    }
  }
}

// ---- AVX-512 path: RT tokens x RR rows of 16-lane accumulators --------------------------------
#define HYBRIDLM_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,fma")))

template <bool kBf16>
HYBRIDLM_AVX512 inline __m512 load_w16(const void* W, size_t i, __mmask16 m) {
  if constexpr (kBf16) {
    __m256i raw = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(W) + i);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
  } else {
    return _mm512_maskz_loadu_ps(m, static_cast<const float*>(W) + i);
  }
}

template <bool kBf16, int RT, int RR>
HYBRIDLM_AVX512 void tile_avx512(const WeightView& W, const float* bias, const float* x, int t0,
                                 int r0, float* y) {
  const int K = W.cols;
  __m512 acc[RT][RR];
  for (int t = 0; t < RT; ++t)
    for (int r = 0; r < RR; ++r) acc[t][r] = _mm512_setzero_ps();
  for (int k = 0; k < K; k += 16) {
    const __mmask16 m = K - k >= 16 ? static_cast<__mmask16>(0xffff)
                                    : static_cast<__mmask16>((1u << (K - k)) - 1);
    __m512 wv[RR];
    for (int r = 0; r < RR; ++r) wv[r] = load_w16<kBf16>(W.data, static_cast<size_t>(r0 + r) * K + k, m);
    for (int t = 0; t < RT; ++t) {
      __m512 xv = _mm512_maskz_loadu_ps(m, x + static_cast<size_t>(t0 + t) * K + k);
      for (int r = 0; r < RR; ++r) acc[t][r] = _mm512_fmadd_ps(wv[r], xv, acc[t][r]);
    }
  }
  for (int t = 0; t < RT; ++t)
    for (int r = 0; r < RR; ++r)
      y[static_cast<size_t>(t0 + t) * W.rows + r0 + r] =
          _mm512_reduce_add_ps(acc[t][r]) + (bias ? bias[r0 + r] : 0.0f);
}

template <bool kBf16, int RR>
HYBRIDLM_AVX512 void row_tile_avx512(const WeightView& W, const float* bias, const float* x, int T,
                                     int r0, float* y) {
  int t = 0;
  for (; t + kTileT <= T; t += kTileT) tile_avx512<kBf16, kTileT, RR>(W, bias, x, t, r0, y);
  switch (T - t) {
    case 3: tile_avx512<kBf16, 3, RR>(W, bias, x, t, r0, y); break;
    case 2: tile_avx512<kBf16, 2, RR>(W, bias, x, t, r0, y); break;
    case 1: tile_avx512<kBf16, 1, RR>(W, bias, x, t, r0, y); break;
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

}  // namespace

void matmul(const KernelContext& ctx, const WeightView& W, const float* bias, const float* x,
            int T, float* y) {
  const bool bf16 = W.dtype == DType::BF16;
  const bool avx = simd_path() == SimdPath::Avx512;
  auto run = [&](size_t tb, size_t te) {
    const int rb = static_cast<int>(tb) * kTileR;
    const int re = std::min(W.rows, static_cast<int>(te) * kTileR);
    if (avx) bf16 ? rows_avx512<true>(W, bias, x, T, y, rb, re) : rows_avx512<false>(W, bias, x, T, y, rb, re);
    else bf16 ? rows_portable<true>(W, bias, x, T, y, rb, re) : rows_portable<false>(W, bias, x, T, y, rb, re);
  };
  const size_t n_tiles = (static_cast<size_t>(W.rows) + kTileR - 1) / kTileR;
  if (ctx.pool) ctx.pool->parallel_for(n_tiles, run, 4);
  else run(0, n_tiles);
}

}  // namespace hybridlm::cpu
