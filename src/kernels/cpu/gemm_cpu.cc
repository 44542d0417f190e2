// Prefill GEMM with the summation order of the dot-product tiles.
//
// matmul's dot tiles give every output y[t, r] one fixed order: lane l (0..15) of a 16-lane
// accumulator sums x[t, k] W[r, k] over k = l, l + 16, l + 32, ... with one FMA each, then the
// 16 lanes are added by the tree of reduce16 and the bias is added. That order makes a token's
// result independent of the batch it is in, but a dot tile loads one weight vector per 4 FMAs
// and ends in a horizontal reduction per output, which holds prefill to ~35% of the FMA peak.
//
// Here the same sums run as outer products: for each lane class l, a register tile of kMR tokens
// x kNR rows accumulates x[t, 16 j + l] (broadcast) times W[r0 .. r0 + kNR, 16 j + l] (two
// vectors) over j, one FMA per (token, row, k) exactly as in the dot tile's lane l. The 16 lane
// sums of each output go to a small buffer and are added with reduce16's tree, then the bias:
// bitwise the dot tiles' result (tested), with 2 vector loads and 12 broadcasts per 24 FMAs and
// no horizontal work in the inner loop.
//
// Data movement: the activations of up to kBlockTokens tokens are packed once per call as
// [tile of kMR tokens][lane class][j][token] (zero past T and K); each thread packs the kNR rows
// it works on as [lane class][j][row] (bf16 widened, zero past the rows and K) and runs every
// token tile against them. Padding contributes fma(0, 0, acc) = acc, as the dot tile's masked
// tail does.
#include "kernels/cpu/gemm_cpu.h"

#include <algorithm>
#include <vector>

#include "kernels/cpu/intrinsics.h"

#include "kernels/cpu/cpu_common.h"

namespace hybridlm::cpu {

namespace {

constexpr int kLanes = 16;        // lane classes: the dot tiles' vector width
constexpr int kMR = 12;           // tokens per register tile
constexpr int kNR = 32;           // weight rows per register tile (two vectors)
constexpr int kBlockTokens = 516; // tokens packed at a time (43 tiles): <= 516 x K floats of scratch

struct GemmScratch {
  std::vector<float> a;     // packed activations (the calling thread's)
  std::vector<float> b;     // packed weight rows (each thread its own)
  std::vector<float> lane;  // [lane class][kMR][kNR] sums of one register tile
};
GemmScratch& scratch() {
  thread_local GemmScratch s;
  return s;
}

float* grow(std::vector<float>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

// In-register transpose of a 16 x 16 block: r[i] lane j <- r[j] lane i.
HYBRIDLM_AVX512 inline __attribute__((always_inline)) void transpose16(__m512 (&r)[16]) {
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

inline __mmask16 chunk_mask(int K, int c) {
  const int n = std::min(kLanes, K - c * kLanes);
  return static_cast<__mmask16>((1u << n) - 1);
}

// Activations of tokens t0 .. t0 + nt (tiles [i_begin, i_end)) into `a`: per tile and chunk of
// 16 columns, 12 token rows (zero past nt and K) transposed to 16 lane-class runs of 12.
HYBRIDLM_AVX512 void pack_tokens(const float* x, int K, int KS, int t0, int nt, int i_begin, int i_end, float* a) {
  for (int i = i_begin; i < i_end; ++i) {
    float* ai = a + static_cast<size_t>(i) * kLanes * KS * kMR;
    const int n_tok = std::min(kMR, nt - i * kMR);
    const float* xi = x + static_cast<size_t>(t0 + i * kMR) * K;
    for (int c = 0; c < KS; ++c) {
      const __mmask16 m = chunk_mask(K, c);
      __m512 r[16];
      for (int t = 0; t < 16; ++t)
        r[t] = t < n_tok ? _mm512_maskz_loadu_ps(m, xi + static_cast<size_t>(t) * K + c * kLanes) : _mm512_setzero_ps();
      transpose16(r);
      for (int l = 0; l < kLanes; ++l)
        _mm512_mask_storeu_ps(ai + (static_cast<size_t>(l) * KS + c) * kMR, static_cast<__mmask16>(0x0fff), r[l]);
    }
  }
}

// Weight rows r0 .. r0 + kNR into `b` as f32: b[(l * KS + c) * kNR + r] = W(r0 + r, 16 c + l),
// zero past the rows and K. Chunk c's 16 values of a row are contiguous in both layouts.
template <bool kBf16>
HYBRIDLM_AVX512 void pack_rows(const WeightView& W, int KS, int r0, float* b) {
  const int K = W.cols;
  for (int h = 0; h < kNR / 16; ++h) {
    size_t at[16];  // element index of (row, k = 0); panel rows step 16 within a chunk
    for (int r = 0; r < 16; ++r) {
      const int row = r0 + 16 * h + r;
      at[r] = row >= W.rows ? 0 : W.panels ? panel_index(row, 0, K) : static_cast<size_t>(row) * K;
    }
    const int n_rows = std::clamp(W.rows - (r0 + 16 * h), 0, 16);
    const size_t cs = W.panels ? static_cast<size_t>(kPanelCols) * kPanelRows : kLanes;  // chunk stride
    for (int c = 0; c < KS; ++c) {
      const __mmask16 m = chunk_mask(K, c);
      __m512 r[16];
      for (int j = 0; j < 16; ++j) {
        if (j >= n_rows) {
          r[j] = _mm512_setzero_ps();
        } else if constexpr (kBf16) {
          const __m256i raw = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(W.data) + at[j] + c * cs);
          r[j] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
        } else {
          r[j] = _mm512_maskz_loadu_ps(m, static_cast<const float*>(W.data) + at[j] + c * cs);
        }
      }
      transpose16(r);
      for (int l = 0; l < kLanes; ++l) _mm512_storeu_ps(b + (static_cast<size_t>(l) * KS + c) * kNR + 16 * h, r[l]);
    }
  }
}

// One lane class of one register tile: out[t][0 .. 32) = sum over j of a[j][t] * b[j][0 .. 32),
// one FMA per term in j order. Named accumulators (an array of __m512 is kept in memory by GCC).
HYBRIDLM_AVX512 void tile_12x32(const float* a, const float* b, int KS, float* out) {
  const __m512 z = _mm512_setzero_ps();
  __m512 c00 = z, c01 = z, c10 = z, c11 = z, c20 = z, c21 = z, c30 = z, c31 = z, c40 = z, c41 = z, c50 = z, c51 = z;
  __m512 c60 = z, c61 = z, c70 = z, c71 = z, c80 = z, c81 = z, c90 = z, c91 = z, ca0 = z, ca1 = z, cb0 = z, cb1 = z;
  for (int j = 0; j < KS; ++j, a += kMR, b += kNR) {
    const __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16);
#define HYBRIDLM_GEMM_STEP(t, c0, c1)                \
  {                                                  \
    const __m512 av = _mm512_set1_ps(a[t]);          \
    c0 = _mm512_fmadd_ps(b0, av, c0);                \
    c1 = _mm512_fmadd_ps(b1, av, c1);                \
  }
    HYBRIDLM_GEMM_STEP(0, c00, c01)
    HYBRIDLM_GEMM_STEP(1, c10, c11)
    HYBRIDLM_GEMM_STEP(2, c20, c21)
    HYBRIDLM_GEMM_STEP(3, c30, c31)
    HYBRIDLM_GEMM_STEP(4, c40, c41)
    HYBRIDLM_GEMM_STEP(5, c50, c51)
    HYBRIDLM_GEMM_STEP(6, c60, c61)
    HYBRIDLM_GEMM_STEP(7, c70, c71)
    HYBRIDLM_GEMM_STEP(8, c80, c81)
    HYBRIDLM_GEMM_STEP(9, c90, c91)
    HYBRIDLM_GEMM_STEP(10, ca0, ca1)
    HYBRIDLM_GEMM_STEP(11, cb0, cb1)
#undef HYBRIDLM_GEMM_STEP
  }
  const __m512 acc[kMR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51},
                              {c60, c61}, {c70, c71}, {c80, c81}, {c90, c91}, {ca0, ca1}, {cb0, cb1}};
  for (int t = 0; t < kMR; ++t) {
    _mm512_storeu_ps(out + t * kNR, acc[t][0]);
    _mm512_storeu_ps(out + t * kNR + 16, acc[t][1]);
  }
}

// reduce16's tree over the lane classes, then the bias, into y (valid tokens and rows only).
HYBRIDLM_AVX512 void finish_tile(const float* lane, const float* bias, int r0, int n_rows, int tok0, int n_tok,
                                 int ld_y, float* y) {
  constexpr size_t kStride = static_cast<size_t>(kMR) * kNR;  // one lane class
  for (int h = 0; h < kNR / 16; ++h) {
    const int rows = std::clamp(n_rows - 16 * h, 0, 16);
    if (rows == 0) break;
    const __mmask16 m = static_cast<__mmask16>((1u << rows) - 1);
    const __m512 bv = bias ? _mm512_maskz_loadu_ps(m, bias + r0 + 16 * h) : _mm512_setzero_ps();
    for (int t = 0; t < n_tok; ++t) {
      const float* p = lane + static_cast<size_t>(t) * kNR + 16 * h;
      __m512 s[8];
      for (int l = 0; l < 8; ++l) s[l] = _mm512_add_ps(_mm512_loadu_ps(p + l * kStride), _mm512_loadu_ps(p + (l + 8) * kStride));
      for (int l = 0; l < 4; ++l) s[l] = _mm512_add_ps(s[l], s[l + 4]);
      for (int l = 0; l < 2; ++l) s[l] = _mm512_add_ps(s[l], s[l + 2]);
      const __m512 v = _mm512_add_ps(_mm512_add_ps(s[0], s[1]), bv);
      _mm512_mask_storeu_ps(y + static_cast<size_t>(tok0 + t) * ld_y + r0 + 16 * h, m, v);
    }
  }
}

}  // namespace

void gemm_lanes_avx512(const KernelContext& ctx, const WeightView& W, const float* bias, const float* x, int T,
                       float* y) {
  const int K = W.cols, N = W.rows, KS = (K + kLanes - 1) / kLanes;
  if (N <= 0 || T <= 0) return;
  const bool bf16 = W.dtype == DType::BF16;
  const size_t tile_a = static_cast<size_t>(kLanes) * KS * kMR;
  float* a = grow(scratch().a, tile_a * ((kBlockTokens + kMR - 1) / kMR));
  const size_t n_panels = (static_cast<size_t>(N) + kNR - 1) / kNR;
  for (int t0 = 0; t0 < T; t0 += kBlockTokens) {
    const int nt = std::min(kBlockTokens, T - t0), n_tiles = (nt + kMR - 1) / kMR;
    parallel(ctx, static_cast<size_t>(n_tiles), 1, [&](size_t ib, size_t ie) {
      pack_tokens(x, K, KS, t0, nt, static_cast<int>(ib), static_cast<int>(ie), a);
    });
    // Work items: (panel, run of token tiles). Few panels (x_proj: 80 rows) are split over
    // tokens too so every thread has work; each item packs its panel's rows itself.
    const int threads = ctx.pool ? ctx.pool->size() : 1;
    const int runs = std::clamp(static_cast<int>((4 * threads + n_panels - 1) / n_panels), 1, n_tiles);
    const int tiles_per_run = (n_tiles + runs - 1) / runs;
    parallel(ctx, n_panels * runs, 1, [&](size_t wb, size_t we) {
      GemmScratch& s = scratch();
      float* b = grow(s.b, static_cast<size_t>(kLanes) * KS * kNR);
      float* lane = grow(s.lane, static_cast<size_t>(kLanes) * kMR * kNR);
      int packed = -1;  // the panel in b (a thread's items are consecutive: runs of one panel)
      for (size_t w = wb; w < we; ++w) {
        const int r0 = static_cast<int>(w / runs) * kNR;
        const int i_begin = static_cast<int>(w % runs) * tiles_per_run;
        const int i_end = std::min(n_tiles, i_begin + tiles_per_run);
        if (i_begin >= i_end) continue;
        if (packed != r0) bf16 ? pack_rows<true>(W, KS, r0, b) : pack_rows<false>(W, KS, r0, b);
        packed = r0;
        for (int i = i_begin; i < i_end; ++i) {
          const float* ai = a + static_cast<size_t>(i) * tile_a;
          for (int l = 0; l < kLanes; ++l)
            tile_12x32(ai + static_cast<size_t>(l) * KS * kMR, b + static_cast<size_t>(l) * KS * kNR, KS,
                       lane + static_cast<size_t>(l) * kMR * kNR);
          finish_tile(lane, bias, r0, std::min(kNR, N - r0), t0 + i * kMR, std::min(kMR, nt - i * kMR), N, y);
        }
      }
    });
  }
}

}  // namespace hybridlm::cpu
