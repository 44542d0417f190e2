// The outer-product GEMM (prefill, batched decode, and decode on lane panels) with the summation
// order of the dot-product tiles.
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
// [tile of kMR tokens][lane class][j][token] (zero past T and K; one token with K a multiple of 16
// is read from x in place). Weights in lane panels (WeightView::panels, the layout of weights
// copied at load) are read in place: a panel of kNR rows is [lane group][j][lane in group][row],
// a register tile loads a (j, lane class) run of 32 rows as two vectors (bf16 widened in the loop,
// or once per work item when it runs 4 or more token tiles on the panel).
// Row-major weights (mapped from the checkpoint) are packed into that order per call, each thread
// the panel it works on. Padding contributes fma(0, 0, acc) = acc, as the dot tile's masked tail
// does. With no packing of weights, the tiles pay off from one token on (decode, batched decode);
// for row-major weights matmul uses them from kGemmMinTokens on.
#include "kernels/cpu/gemm_cpu.h"

#include <algorithm>
#include <atomic>
#include <type_traits>
#include <vector>

#include "kernels/cpu/intrinsics.h"

#include "kernels/cpu/cpu_common.h"

namespace hybridlm::cpu {

namespace {

constexpr int kLanes = 16;        // lane classes: the dot tiles' vector width
constexpr int kMR = 12;           // tokens per register tile (at most)
constexpr int kNR = 32;           // weight rows per register tile (two vectors)
constexpr int kGroup = kPanelGroup;  // lane classes stored side by side per chunk
constexpr int kWidenMinTiles = 4;    // token tiles on a bf16 panel from which it is widened once
static_assert(kNR == kPanelRows && kLanes == kPanelLanes, "a register tile reads one lane panel");
constexpr int kBlockTokens = 516; // tokens packed at a time (43 tiles): <= 516 x K floats of scratch
constexpr int kBlockChunks = 32;     // chunks of 16 columns a block of a wide panel (512 columns: 64 KB of f32)
constexpr int kBlockMinChunks = 192; // panels of 3072+ columns go by blocks, ...
constexpr int kBlockedTiles = 4;     // ... when 2 to 4 token tiles share the panel

// Scratch (floats) of one call: packed activations of a block of tokens (the calling thread's),
// and on every thread a weight panel (packed from row-major rows, or widened from bf16) and the
// [lane class][kMR][kNR] sums of one register tile.
size_t packed_tokens_floats(int T, int K) {
  return static_cast<size_t>(kLanes) * panel_chunks(K) * kMR * ((std::min(T, kBlockTokens) + kMR - 1) / kMR);
}
size_t panel_floats(int K) { return static_cast<size_t>(kLanes) * panel_chunks(K) * kNR; }
constexpr size_t kLaneSums = static_cast<size_t>(kLanes) * kMR * kNR;

inline __mmask16 chunk_mask(int K, int c) {
  const int n = std::min(kLanes, K - c * kLanes);
  return static_cast<__mmask16>((1u << n) - 1);
}

// Activations of tokens t0 .. t0 + nt (tiles [i_begin, i_end)) into `a`: per tile and chunk of
// 16 columns, the tile's mr <= 12 token rows (zero past them and K) transposed to 16 lane-class
// runs of 12.
HYBRIDLM_AVX512 void pack_tokens(const float* x, int K, int KS, int t0, int nt, int mr, int i_begin, int i_end,
                                 float* a) {
  for (int i = i_begin; i < i_end; ++i) {
    float* ai = a + static_cast<size_t>(i) * kLanes * KS * kMR;
    const int n_tok = std::min(mr, nt - i * mr);
    const float* xi = x + static_cast<size_t>(t0 + i * mr) * K;
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

// Row-major weight rows r0 .. r0 + kNR into `b` as an f32 lane panel: b[panel_lane_offset(l, c) +
// r] = W(r0 + r, 16 c + l), zero past the rows and K.
template <bool kBf16>
HYBRIDLM_AVX512 void pack_rows(const WeightView& W, int KS, int r0, float* b) {
  const int K = W.cols;
  for (int h = 0; h < kNR / 16; ++h) {
    const int n_rows = std::clamp(W.rows - (r0 + 16 * h), 0, 16);
    const size_t row0 = static_cast<size_t>(r0 + 16 * h) * K;
    for (int c = 0; c < KS; ++c) {
      const __mmask16 m = chunk_mask(K, c);
      __m512 r[16];
      for (int j = 0; j < 16; ++j) {
        const size_t at = row0 + static_cast<size_t>(j) * K + c * kLanes;
        if (j >= n_rows) {
          r[j] = _mm512_setzero_ps();
        } else if constexpr (kBf16) {
          const __m256i raw = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(W.data) + at);
          r[j] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
        } else {
          r[j] = _mm512_maskz_loadu_ps(m, static_cast<const float*>(W.data) + at);
        }
      }
      transpose16(r);
      for (int l = 0; l < kLanes; ++l) _mm512_storeu_ps(b + panel_lane_offset(l, c, KS) + 16 * h, r[l]);
    }
  }
}

// 16 weights of a panel row run as f32 (bf16: widened, exact).
template <bool kBf16>
HYBRIDLM_AVX512 inline __attribute__((always_inline)) __m512 load_b(const void* b) {
  if constexpr (kBf16)
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(static_cast<const __m256i*>(b))), 16));
  else return _mm512_loadu_ps(static_cast<const float*>(b));
}

// A bf16 panel as f32 (exact).
HYBRIDLM_AVX512 void widen_panel(const uint16_t* b, size_t n, float* out) {
  for (size_t i = 0; i < n; i += 16) _mm512_storeu_ps(out + i, load_b<true>(b + i));
}

// One lane class of one register tile of MR <= kMR tokens: out[t][0 .. 32) = sum over j of
// a[j][t] * b[j][0 .. 32), one FMA per term in j order, over KS chunks; with `accumulate` the sums
// continue from what out holds (a block of chunks after the ones before it: the same FMAs in the
// same order as one pass). Named accumulators (an array of __m512 is kept in memory by GCC); those
// of tokens past MR are never used and compile away. kPrefetch: also prefetch into L2 what this
// lane class reads of the panel `next` elements on.
template <int MR, bool kBf16, bool kPrefetch = false>
HYBRIDLM_AVX512 void tile_lanes(const float* a, const void* bv, int KS, float* out, bool accumulate, size_t next = 0) {
  using B = std::conditional_t<kBf16, uint16_t, float>;
  const B* b = static_cast<const B*>(bv);
  const __m512 z = _mm512_setzero_ps();
#define HYBRIDLM_INIT(t, h) (accumulate && (t) < MR ? _mm512_loadu_ps(out + (t) * kNR + 16 * (h)) : z)
  __m512 c00 = HYBRIDLM_INIT(0, 0), c01 = HYBRIDLM_INIT(0, 1), c10 = HYBRIDLM_INIT(1, 0), c11 = HYBRIDLM_INIT(1, 1);
  __m512 c20 = HYBRIDLM_INIT(2, 0), c21 = HYBRIDLM_INIT(2, 1), c30 = HYBRIDLM_INIT(3, 0), c31 = HYBRIDLM_INIT(3, 1);
  __m512 c40 = HYBRIDLM_INIT(4, 0), c41 = HYBRIDLM_INIT(4, 1), c50 = HYBRIDLM_INIT(5, 0), c51 = HYBRIDLM_INIT(5, 1);
  __m512 c60 = HYBRIDLM_INIT(6, 0), c61 = HYBRIDLM_INIT(6, 1), c70 = HYBRIDLM_INIT(7, 0), c71 = HYBRIDLM_INIT(7, 1);
  __m512 c80 = HYBRIDLM_INIT(8, 0), c81 = HYBRIDLM_INIT(8, 1), c90 = HYBRIDLM_INIT(9, 0), c91 = HYBRIDLM_INIT(9, 1);
  __m512 ca0 = HYBRIDLM_INIT(10, 0), ca1 = HYBRIDLM_INIT(10, 1), cb0 = HYBRIDLM_INIT(11, 0), cb1 = HYBRIDLM_INIT(11, 1);
#undef HYBRIDLM_INIT
  for (int j = 0; j < KS; ++j, a += kMR, b += kGroup * kNR) {
    if constexpr (kPrefetch) {
      const char* ahead = reinterpret_cast<const char*>(b + next);
      for (size_t q = 0; q < kNR * sizeof(B); q += 64) _mm_prefetch(ahead + q, _MM_HINT_T1);
    }
    const __m512 b0 = load_b<kBf16>(b), b1 = load_b<kBf16>(b + 16);
#define HYBRIDLM_GEMM_STEP(t, c0, c1)                \
  if constexpr (MR > t) {                            \
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
  for (int t = 0; t < MR; ++t) {
    _mm512_storeu_ps(out + t * kNR, acc[t][0]);
    _mm512_storeu_ps(out + t * kNR + 16, acc[t][1]);
  }
}

// All 16 lane classes of a tile of MR tokens against one panel (f32 or bf16 elements). With
// `next` > 0 the tile also prefetches the panel `next` elements on into L2: the first tile on a
// panel streams it from memory, and a third of its samples sat on the weight loads; the second
// tile, which finds its panel in L2, fetches the next one meanwhile.
// Chunks [j0, j0 + jn) of KS (the whole panel: 0, KS), continuing the lane sums when accumulate.
template <int MR, bool kBf16>
HYBRIDLM_AVX512 void tile_panel(const float* a, const void* b, int KS, int j0, int jn, bool accumulate, float* lane,
                                size_t next) {
  using B = std::conditional_t<kBf16, uint16_t, float>;
  for (int l = 0; l < kLanes; ++l) {
    const float* al = a + (static_cast<size_t>(l) * KS + j0) * kMR;
    const B* bl = static_cast<const B*>(b) + panel_lane_offset(l, j0, KS);
    float* out = lane + static_cast<size_t>(l) * kMR * kNR;
    if (next) tile_lanes<MR, kBf16, true>(al, bl, jn, out, accumulate, next);
    else tile_lanes<MR, kBf16>(al, bl, jn, out, accumulate);
  }
}

// A few tokens (decode of 1 to 6 sequences) against one panel, memory-bound: LG lane classes of a
// group per pass (4 for up to 3 tokens, 2 for up to 6), so a pass reads LG / 4 of the group's run
// of the panel front to back (one lane class per pass read 128 of every 512 bytes: decode of 2
// sequences 17% slower than the dot tiles) and 2 LG MR accumulator chains hide the FMA latency.
// Per output the same FMAs in the same order as tile_lanes<MR>; chunks [j0, j0 + jn) with the sums
// continued when accumulate, and `next` as in tile_lanes. Token t's value for (lane class
// l, chunk j) is at a[l * ls + j * js + t]: packed (ls = KS * kMR, js = kMR) or, for one token,
// x itself (ls = 1, js = 16).
template <int MR, int LG, bool kBf16>
HYBRIDLM_AVX512 void tile_group(const float* a, size_t ls, size_t js, const void* bv, int KS, float* lane, int j0 = 0,
                                int jn = -1, bool accumulate = false, size_t next = 0) {
  using B = std::conditional_t<kBf16, uint16_t, float>;
  static_assert(kGroup % LG == 0 && 2 * LG * MR <= 24, "accumulators in registers");
  if (jn < 0) jn = KS;
  for (int l = 0; l < kLanes; l += LG) {
    const B* b = static_cast<const B*>(bv) + panel_lane_offset(l, j0, KS);
    const float* x = a + l * ls + j0 * js;
    __m512 acc[LG][MR][2];
#pragma GCC unroll 4
    for (int g = 0; g < LG; ++g)
#pragma GCC unroll 6
      for (int t = 0; t < MR; ++t) {
        const float* o = lane + (static_cast<size_t>(l + g) * kMR + t) * kNR;
        acc[g][t][0] = accumulate ? _mm512_loadu_ps(o) : _mm512_setzero_ps();
        acc[g][t][1] = accumulate ? _mm512_loadu_ps(o + 16) : _mm512_setzero_ps();
      }
    for (int j = 0; j < jn; ++j, b += kGroup * kNR, x += js) {
      if (next) {
        const char* ahead = reinterpret_cast<const char*>(b + next);
        for (size_t q = 0; q < LG * kNR * sizeof(B); q += 64) _mm_prefetch(ahead + q, _MM_HINT_T1);
      }
#pragma GCC unroll 4
      for (int g = 0; g < LG; ++g) {
        const __m512 b0 = load_b<kBf16>(b + g * kNR), b1 = load_b<kBf16>(b + g * kNR + 16);
#pragma GCC unroll 6
        for (int t = 0; t < MR; ++t) {
          const __m512 av = _mm512_set1_ps(x[g * ls + t]);
          acc[g][t][0] = _mm512_fmadd_ps(b0, av, acc[g][t][0]);
          acc[g][t][1] = _mm512_fmadd_ps(b1, av, acc[g][t][1]);
        }
      }
    }
#pragma GCC unroll 4
    for (int g = 0; g < LG; ++g)
#pragma GCC unroll 6
      for (int t = 0; t < MR; ++t) {
        float* o = lane + (static_cast<size_t>(l + g) * kMR + t) * kNR;
        _mm512_storeu_ps(o, acc[g][t][0]);
        _mm512_storeu_ps(o + 16, acc[g][t][1]);
      }
  }
}

// A tile of n_tok tokens over chunks [j0, j0 + jn) of KS (see tile_panel).
template <bool kBf16>
HYBRIDLM_AVX512 void tile_panel_n(int n_tok, const float* a, const void* b, int KS, int j0, int jn, bool accumulate,
                                  float* lane, size_t next) {
  const size_t ls = static_cast<size_t>(KS) * kMR;
  switch (n_tok) {
    case 1: return tile_group<1, 4, kBf16>(a, ls, kMR, b, KS, lane, j0, jn, accumulate, next);
    case 2: return tile_group<2, 4, kBf16>(a, ls, kMR, b, KS, lane, j0, jn, accumulate, next);
    case 3: return tile_group<3, 4, kBf16>(a, ls, kMR, b, KS, lane, j0, jn, accumulate, next);
    case 4: return tile_group<4, 2, kBf16>(a, ls, kMR, b, KS, lane, j0, jn, accumulate, next);
    case 5: return tile_group<5, 2, kBf16>(a, ls, kMR, b, KS, lane, j0, jn, accumulate, next);
    case 6: return tile_group<6, 2, kBf16>(a, ls, kMR, b, KS, lane, j0, jn, accumulate, next);
    case 7: return tile_panel<7, kBf16>(a, b, KS, j0, jn, accumulate, lane, next);
    case 8: return tile_panel<8, kBf16>(a, b, KS, j0, jn, accumulate, lane, next);
    case 9: return tile_panel<9, kBf16>(a, b, KS, j0, jn, accumulate, lane, next);
    case 10: return tile_panel<10, kBf16>(a, b, KS, j0, jn, accumulate, lane, next);
    case 11: return tile_panel<11, kBf16>(a, b, KS, j0, jn, accumulate, lane, next);
    default: return tile_panel<12, kBf16>(a, b, KS, j0, jn, accumulate, lane, next);
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
  const int K = W.cols, N = W.rows, KS = panel_chunks(K);
  if (N <= 0 || T <= 0) return;
  const bool bf16 = W.dtype == DType::BF16;
  const size_t tile_a = static_cast<size_t>(kLanes) * KS * kMR;
  const size_t panel = panel_floats(K);  // elements of one panel
  ScratchFrame frame(ctx);
  float* a = frame.take(packed_tokens_floats(T, K));
  const size_t n_panels = (static_cast<size_t>(N) + kNR - 1) / kNR;
  for (int t0 = 0; t0 < T; t0 += kBlockTokens) {
    const int nt = std::min(kBlockTokens, T - t0), n_tiles = (nt + kMR - 1) / kMR;
    // Tiles of even size (16 tokens as 8 + 8, not 12 + 4): a second tile of 7 or more tokens
    // prefetches the next panel, a tile of up to 6 would run tile_group (1.13-1.41x at 16 tokens).
    const int mr = (nt + n_tiles - 1) / n_tiles;
    const bool direct = T == 1 && K % kLanes == 0;  // one token: its values read from x in place
    if (!direct)
      parallel(ctx, static_cast<size_t>(n_tiles), 1, [&](size_t ib, size_t ie) {
        pack_tokens(x, K, KS, t0, nt, mr, static_cast<int>(ib), static_cast<int>(ie), a);
      });
    // Work items: (panel, run of token tiles). Few panels (x_proj: 3) are split over tokens too
    // so every thread has work.
    const int threads = ctx.pool ? ctx.pool->size() : 1;
    const int runs = std::clamp(static_cast<int>((4 * threads + n_panels - 1) / n_panels), 1, n_tiles);
    const int tiles_per_run = (n_tiles + runs - 1) / runs;
    // Threads take blocks of consecutive items from a shared counter rather than fixed halves: on
    // a shared host one thread often runs slower for a while, and a fixed split makes the other
    // wait for it at the end of every call. Each output is one item's work, so the result does
    // not depend on who computes it.
    // Blocks of at least 4 items where there are enough (the next-panel prefetch stays inside a
    // block; out_proj's 24 panels would otherwise go one at a time).
    const size_t n_items = n_panels * runs, n_threads = static_cast<size_t>(threads);
    const size_t block = std::max<size_t>({1, std::min<size_t>(4, n_items / n_threads), n_items / (8 * n_threads)});
    std::atomic<size_t> next_item{0};
    parallel(ctx, std::min(n_threads, n_items), 1, [&](size_t, size_t) {
      ScratchFrame thread_frame(ctx);
      float* lane = thread_frame.take(kBlockedTiles * kLaneSums);
      float* pb = nullptr;  // this thread's panel, taken at its first use
      int packed = -1;  // the panel in pb, packed or widened (a block's items are consecutive)
      for (size_t w = 0, we = 0;; ++w) {
        if (w == we) {  // the next block
          w = next_item.fetch_add(block, std::memory_order_relaxed);
          if (w >= n_items) break;
          we = std::min(n_items, w + block);
        }
        const size_t p = w / runs;
        const int r0 = static_cast<int>(p) * kNR;
        const int i_begin = static_cast<int>(w % runs) * tiles_per_run;
        const int i_end = std::min(n_tiles, i_begin + tiles_per_run);
        if (i_begin >= i_end) continue;
        // The panel's weights: in place (lane panels), or f32 in pb, packed from row-major
        // rows or, for many tiles on one bf16 panel (prefill), widened once instead of in every
        // tile. Tiles reading in place prefetch the block's next panel from the second tile on,
        // or the only one (with runs split over tokens only the last run of a panel can).
        const void* b = nullptr;
        bool b16 = false, in_place = false, prefetch = false;
        if (W.panels && !(bf16 && i_end - i_begin >= kWidenMinTiles)) {
          in_place = true;
          b = bf16 ? static_cast<const void*>(static_cast<const uint16_t*>(W.data) + p * panel)
                   : static_cast<const void*>(static_cast<const float*>(W.data) + p * panel);
          b16 = bf16;
          prefetch = w + 1 < we && (w + 1) / runs != p;
        } else {
          if (!pb) pb = thread_frame.take(panel);
          if (packed != r0) {
            if (W.panels) widen_panel(static_cast<const uint16_t*>(W.data) + p * panel, panel, pb);
            else bf16 ? pack_rows<true>(W, KS, r0, pb) : pack_rows<false>(W, KS, r0, pb);
          }
          packed = r0;
          b = pb;
        }
        // A few token tiles on a wide panel (batched decode; 3072+ columns: 384 KB and more of
        // f32 a panel, which with the tiles' activations and the next panel's prefetch outgrows
        // L2) go through the panel in blocks of kBlockChunks chunks, each tile's sums carried from
        // block to block: each block's weights come from memory once and from L2 for the other
        // tiles, and the second tile prefetches the next block (or, at the last, the next panel):
        // 1.06-1.10x at 24-48 tokens on 4096 columns; within 5% either way on 1536-2048, so not
        // there. A lone tile on its panel (2 to 12 sequences decoding together) prefetches the
        // next panel itself: 1.16-1.42x; one token (decode of one sequence) leaves it to the
        // hardware, as fast.
        const int n_run = i_end - i_begin;
        const bool blocked = KS >= kBlockMinChunks && n_run >= 2 && n_run <= kBlockedTiles;
        for (int j0 = 0; j0 < KS; j0 += blocked ? kBlockChunks : KS) {
          const int jn = blocked ? std::min(kBlockChunks, KS - j0) : KS;
          const bool last = j0 + jn == KS;
          // What the second tile prefetches, in elements past what it reads: the next block of this
          // panel, or from the last block the next panel's start.
          size_t ahead = 0;
          if (in_place && !last) ahead = static_cast<size_t>(jn) * kGroup * kNR;
          else if (prefetch && last) ahead = panel - static_cast<size_t>(j0) * kGroup * kNR;
          for (int i = i_begin; i < i_end; ++i) {
            const int n_tok = std::min(mr, nt - i * mr);
            const float* ai = a + static_cast<size_t>(i) * tile_a;
            float* li = lane + (blocked ? static_cast<size_t>(i - i_begin) * kLaneSums : 0);
            const size_t next = i == i_begin + 1 || n_run == 1 ? ahead : 0;
            if (direct && b16) tile_group<1, 4, true>(x, 1, kLanes, b, KS, li);
            else if (direct) tile_group<1, 4, false>(x, 1, kLanes, b, KS, li);
            else if (b16) tile_panel_n<true>(n_tok, ai, b, KS, j0, jn, j0 > 0, li, next);
            else tile_panel_n<false>(n_tok, ai, b, KS, j0, jn, j0 > 0, li, next);
            if (last) finish_tile(li, bias, r0, std::min(kNR, N - r0), t0 + i * mr, n_tok, N, y);
          }
        }
      }
    });
  }
}

namespace {
HYBRIDLM_AVX512 void transpose_blocks(const float* in, size_t rows, size_t cols, float* out, size_t rb, size_t re) {
  __m512 r[16];
  for (size_t r0 = rb * 16; r0 < re * 16; r0 += 16)
    for (size_t c0 = 0; c0 < cols; c0 += 16) {
      for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(in + (r0 + i) * cols + c0);
      transpose16(r);
      for (int j = 0; j < 16; ++j) _mm512_storeu_ps(out + (c0 + j) * rows + r0, r[j]);
    }
}
}  // namespace

bool transpose_avx512(const KernelContext& ctx, const float* in, size_t rows, size_t cols, float* out) {
  if (rows % 16 != 0 || cols % 16 != 0) return false;
  parallel(ctx, rows / 16, 4, [&](size_t rb, size_t re) { transpose_blocks(in, rows, cols, out, rb, re); });
  return true;
}

ScratchNeed gemm_lanes_scratch(const KernelLimits& lim) {
  const int K = lim.matmul_cols;
  const size_t each = FloatArena::rounded(kBlockedTiles * kLaneSums) + FloatArena::rounded(panel_floats(K));
  return {FloatArena::rounded(packed_tokens_floats(lim.tokens, K)) + each, each};
}

}  // namespace hybridlm::cpu
