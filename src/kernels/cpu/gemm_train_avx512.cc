// The training GEMM on the AVX-512 path: C = [C +] A B for operands read through strides, so that
// matmul_train (y = x W^T) and matmul_backward's two products (dx = dy W, dW += dy^T x) run on the
// weights, activations and gradients where they lie (no transposed copies), and each output is one
// plain sum (no lane classes: training needs no batch invariance, only results that do not depend
// on the thread count).
//
// Blocking (the usual register-tile GEMM): K in blocks of kKc. Per block, B's rows are packed
// into panels of kNR columns, [panel][k][kNR] (zero past N), on the calling thread's scratch and
// shared by all threads; then threads take tiles of kMR rows of A from a shared counter, pack the
// tile's A block as [k][kMR] on their own scratch (a transposed A, read a row at a time, is packed
// for all tiles before, on the caller's) and run it against every panel: 2 vector loads of
// B and kMR broadcasts of A per 2 kMR FMAs, the kMR x kNR sums in registers. C is read back (the
// second K block on, or `accumulate`) and stored once per block. Every output is summed over k in
// order by one FMA chain, whichever thread computes it.
#include <algorithm>
#include <atomic>
#include <cstring>

#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/gemm_cpu.h"
#include "kernels/cpu/intrinsics.h"
#include "kernels/scratch.h"

namespace hybridlm::cpu {

namespace {

constexpr int kMR = 12;   // rows of A per register tile
constexpr int kNR = 32;   // columns of B per register tile (two vectors)
constexpr int kKc = 256;  // k per block: a packed A tile (12 KB) and a B panel (32 KB) near L1

size_t padded_cols(int N) { return (static_cast<size_t>(N) + kNR - 1) / kNR * kNR; }

// B's rows [k0, k0 + kc), columns of panels [pb, pe), into bp: [panel][k][kNR].
void pack_b(StridedView B, int N, int k0, int kc, float* bp, size_t pb, size_t pe) {
  for (size_t p = pb; p < pe; ++p) {
    float* out = bp + p * static_cast<size_t>(kc) * kNR;
    const int n0 = static_cast<int>(p) * kNR, nn = std::min(kNR, N - n0);
    const float* base = B.data + static_cast<size_t>(k0) * B.row + static_cast<size_t>(n0) * B.col;
    if (B.col == 1) {  // rows of B are contiguous
      for (int k = 0; k < kc; ++k) {
        float* o = out + static_cast<size_t>(k) * kNR;
        std::memcpy(o, base + static_cast<size_t>(k) * B.row, static_cast<size_t>(nn) * sizeof(float));
        std::fill(o + nn, o + kNR, 0.0f);
      }
    } else {  // columns of B are contiguous (B.row == 1: a weight read as W^T) or strided
      for (int j = 0; j < nn; ++j) {
        const float* src = base + static_cast<size_t>(j) * B.col;
        for (int k = 0; k < kc; ++k) out[static_cast<size_t>(k) * kNR + j] = src[static_cast<size_t>(k) * B.row];
      }
      for (int k = 0; k < kc; ++k)
        std::fill(out + static_cast<size_t>(k) * kNR + nn, out + static_cast<size_t>(k + 1) * kNR, 0.0f);
    }
  }
}

// A's rows [i0, i0 + mr) and columns [k0, k0 + kc) into ap: [k][kMR] (rows past mr: zero).
HYBRIDLM_AVX512 void pack_a(StridedView A, int i0, int mr, int k0, int kc, float* ap) {
  const __mmask16 tile = static_cast<__mmask16>((1u << kMR) - 1);
  if (A.col == 1) {  // A's rows are contiguous: 16 x 16 blocks transposed in registers
    __m512 r[16];
    for (int k = 0; k < kc; k += 16) {
      const int nk = std::min(16, kc - k);
      const __mmask16 cols = static_cast<__mmask16>((1u << nk) - 1);
      for (int i = 0; i < 16; ++i)
        r[i] = i < mr ? _mm512_maskz_loadu_ps(cols, A.data + static_cast<size_t>(i0 + i) * A.row + k0 + k)
                      : _mm512_setzero_ps();
      transpose16(r);
      for (int j = 0; j < nk; ++j) _mm512_mask_storeu_ps(ap + static_cast<size_t>(k + j) * kMR, tile, r[j]);
    }
    return;
  }
  for (int k = 0; k < kc; ++k)
    for (int i = 0; i < kMR; ++i)
      ap[static_cast<size_t>(k) * kMR + i] =
          i < mr ? A.data[static_cast<size_t>(i0 + i) * A.row + static_cast<size_t>(k0 + k) * A.col] : 0.0f;
}

// With A.row == 1 (A transposed: dW's dy^T), its block [k0, k0 + kc) of every tile at once, k in
// runs of kRun from run kb to ke: a run reads kRun rows of A front to back, together, and writes
// each tile's kRun x kMR block whole (per tile, one k per cache line, a page apart, was a cache and
// TLB miss per load; a row at a time, a page per store). ap: [tile][k][kMR], rows past M zero.
constexpr int kRun = 16;
HYBRIDLM_AVX512 void pack_a_transposed(StridedView A, int M, int k0, int kc, float* ap, size_t kb, size_t ke) {
  const __mmask16 tile = static_cast<__mmask16>((1u << kMR) - 1);
  const int n_tiles = (M + kMR - 1) / kMR;
  for (size_t run = kb; run < ke; ++run) {
    const int k_begin = static_cast<int>(run) * kRun, k_end = std::min(kc, k_begin + kRun);
    const float* src = A.data + static_cast<size_t>(k0 + k_begin) * A.col;
    for (int t = 0; t < n_tiles; ++t) {
      const int mr = std::min(kMR, M - t * kMR);
      const __mmask16 rows = static_cast<__mmask16>((1u << mr) - 1);
      float* out = ap + (static_cast<size_t>(t) * kc + k_begin) * kMR;
      const float* in = src + static_cast<size_t>(t) * kMR;
      for (int k = 0; k < k_end - k_begin; ++k)
        _mm512_mask_storeu_ps(out + static_cast<size_t>(k) * kMR, tile,
                              _mm512_maskz_loadu_ps(rows, in + static_cast<size_t>(k) * A.col));
    }
  }
}

// C[0 .. MR) x [0 .. nn) (row stride ldc) = [C +] sum over k < kc of ap[k][i] bp[k][j].
template <int MR>
HYBRIDLM_AVX512 void tile(const float* __restrict__ ap, const float* __restrict__ bp, int kc, float* c, size_t ldc,
                          int nn, bool load) {
  const __mmask16 m0 = nn >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << nn) - 1);
  const __mmask16 m1 = nn >= 32 ? __mmask16(0xffff) : nn > 16 ? static_cast<__mmask16>((1u << (nn - 16)) - 1) : 0;
  __m512 acc0[MR], acc1[MR];
  for (int i = 0; i < MR; ++i) {
    acc0[i] = load ? _mm512_maskz_loadu_ps(m0, c + i * ldc) : _mm512_setzero_ps();
    acc1[i] = load ? _mm512_maskz_loadu_ps(m1, c + i * ldc + 16) : _mm512_setzero_ps();
  }
  for (int k = 0; k < kc; ++k) {
    const __m512 b0 = _mm512_loadu_ps(bp + static_cast<size_t>(k) * kNR);
    const __m512 b1 = _mm512_loadu_ps(bp + static_cast<size_t>(k) * kNR + 16);
    const float* a = ap + static_cast<size_t>(k) * kMR;
    for (int i = 0; i < MR; ++i) {
      const __m512 av = _mm512_set1_ps(a[i]);
      acc0[i] = _mm512_fmadd_ps(av, b0, acc0[i]);
      acc1[i] = _mm512_fmadd_ps(av, b1, acc1[i]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    _mm512_mask_storeu_ps(c + i * ldc, m0, acc0[i]);
    _mm512_mask_storeu_ps(c + i * ldc + 16, m1, acc1[i]);
  }
}

HYBRIDLM_AVX512 void tile_n(int mr, const float* ap, const float* bp, int kc, float* c, size_t ldc, int nn,
                            bool load) {
  switch (mr) {
    case 12: return tile<12>(ap, bp, kc, c, ldc, nn, load);
    case 11: return tile<11>(ap, bp, kc, c, ldc, nn, load);
    case 10: return tile<10>(ap, bp, kc, c, ldc, nn, load);
    case 9: return tile<9>(ap, bp, kc, c, ldc, nn, load);
    case 8: return tile<8>(ap, bp, kc, c, ldc, nn, load);
    case 7: return tile<7>(ap, bp, kc, c, ldc, nn, load);
    case 6: return tile<6>(ap, bp, kc, c, ldc, nn, load);
    case 5: return tile<5>(ap, bp, kc, c, ldc, nn, load);
    case 4: return tile<4>(ap, bp, kc, c, ldc, nn, load);
    case 3: return tile<3>(ap, bp, kc, c, ldc, nn, load);
    case 2: return tile<2>(ap, bp, kc, c, ldc, nn, load);
    default: return tile<1>(ap, bp, kc, c, ldc, nn, load);
  }
}

}  // namespace

void gemm_strided_avx512(const KernelContext& ctx, int M, int N, int K, StridedView A, StridedView B, float* C,
                         size_t ldc, bool accumulate) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    if (!accumulate)
      for (int i = 0; i < M; ++i) std::fill(C + static_cast<size_t>(i) * ldc, C + static_cast<size_t>(i) * ldc + N, 0.f);
    return;
  }
  const size_t n_panels = padded_cols(N) / kNR, n_tiles = (static_cast<size_t>(M) + kMR - 1) / kMR;
  const size_t threads = static_cast<size_t>(ctx.pool ? ctx.pool->size() : 1);
  ScratchFrame frame(ctx);
  float* bp = frame.take(static_cast<size_t>(std::min(K, kKc)) * padded_cols(N));
  const bool a_transposed = A.row == 1;  // packed for all tiles up front, else per tile
  float* ap_all = a_transposed ? frame.take(static_cast<size_t>(std::min(K, kKc)) * n_tiles * kMR) : nullptr;
  for (int k0 = 0; k0 < K; k0 += kKc) {
    const int kc = std::min(kKc, K - k0);
    const bool load = accumulate || k0 > 0;
    parallel(ctx, n_panels, 1, [&](size_t pb, size_t pe) { pack_b(B, N, k0, kc, bp, pb, pe); });
    if (a_transposed)
      parallel(ctx, static_cast<size_t>((kc + kRun - 1) / kRun), 1,
               [&](size_t kb, size_t ke) { pack_a_transposed(A, M, k0, kc, ap_all, kb, ke); });
    // Tiles from a shared counter: on a shared host one thread often runs slower for a while.
    std::atomic<size_t> next{0};
    parallel(ctx, std::min(threads, n_tiles), 1, [&](size_t, size_t) {
      ScratchFrame own(ctx);
      float* own_ap = a_transposed ? nullptr : own.take(static_cast<size_t>(kKc) * kMR);
      for (size_t t; (t = next.fetch_add(1, std::memory_order_relaxed)) < n_tiles;) {
        const int i0 = static_cast<int>(t) * kMR, mr = std::min(kMR, M - i0);
        const float* ap = own_ap;
        if (a_transposed) ap = ap_all + t * static_cast<size_t>(kc) * kMR;
        else pack_a(A, i0, mr, k0, kc, own_ap);
        for (size_t p = 0; p < n_panels; ++p) {
          const int n0 = static_cast<int>(p) * kNR;
          tile_n(mr, ap, bp + p * static_cast<size_t>(kc) * kNR, kc, C + static_cast<size_t>(i0) * ldc + n0, ldc,
                 std::min(kNR, N - n0), load);
        }
      }
    });
  }
}

ScratchNeed gemm_strided_scratch(int max_n, int max_m) {
  const size_t own = FloatArena::rounded(static_cast<size_t>(kKc) * kMR);
  const size_t a_all = static_cast<size_t>(kKc) * ((static_cast<size_t>(max_m) + kMR - 1) / kMR * kMR);
  return {FloatArena::rounded(static_cast<size_t>(kKc) * padded_cols(max_n)) + FloatArena::rounded(a_all) + own, own};
}

}  // namespace hybridlm::cpu
