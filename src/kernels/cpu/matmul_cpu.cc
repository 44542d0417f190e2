// y = x @ W^T for f32, bf16, q8_0 or q4_0 weights. Each output element is one dot product whose
// summation order depends only on K and the SIMD path (16-lane partial sums, then a fixed
// reduction), never on T or on the tiling, so a token's result is bitwise identical alone or
// inside any batch. On AVX-512, gemm_cpu.cc computes the same sums as outer products: for weights
// in lane panels at any T, for row-major weights from kGemmMinTokens tokens on.
// Paths: AVX-512 register tiles (q8_0, q4_0: AVX512_VNNI int8 dot products; matmul_avx512.cc, x86-64
// builds only); the portable loops, compiled once for AVX2 + FMA (the compiler vectorises them
// with 8 lanes) and once for the baseline ISA.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/gemm_cpu.h"
#include "kernels/cpu/matmul_avx512.h"
#include "kernels/kernels.h"

namespace hybridlm::cpu {

namespace {

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
HYBRIDLM_SIMD_VARIANTS(rows_f32, rows_generic<false>)
HYBRIDLM_SIMD_VARIANTS(rows_bf16, rows_generic<true>)

// ---- q8_0 and q4_0 weights -------------------------------------------------------------------
// Every path sums each (token, row) the same way: per block of 32 columns an exact integer sum
// of code products, then acc = acc + float(isum) * (dw * dx) over the blocks in order, then the
// bias (the VNNI kernel fuses the last multiply-add, the portable loops may not: paths differ by
// rounding, each is batch-invariant). The VNNI kernel is written for the panel layout
// (tensor/quant.h): 16 rows per vector, a token's 4 codes of a group broadcast to every lane, the
// bias of the unsigned weight codes (q8_0: q + 128; q4_0: q + 8, two groups unpacked from one
// load) removed by starting each block's sum at -128 (-8) * (sum of the token's codes in the
// block). Its per-output operations do not depend on the tile, so
// results are batch-invariant.

// Portable: one dot product at a time (q4_0 the same, its codes unpacked per group).
template <bool kQ4>
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
          const int c0 = b * kQ8Block + g;
          if constexpr (kQ4) {
            const uint8_t* wg = codes + q4_byte_index(r, c0, K);  // a group's 4 codes, in one nibble each
            const int shift = q4_high_nibble(c0) ? 4 : 0;
            for (int i = 0; i < kQ8Group; ++i) isum += ((wg[i] >> shift & 15) - kQ4Zero) * xq[c0 + i];
          } else {
            const uint8_t* wg = codes + q8_code_index(r, c0, K);  // a group's 4 codes
            for (int i = 0; i < kQ8Group; ++i) isum += q8_weight_code(wg, i) * xq[c0 + i];
          }
        }
        acc += static_cast<float>(isum) * (W.scales[q8_scale_index(r, b, K)] * xs[b]);
      }
      y[static_cast<size_t>(t) * W.rows + r] = acc + (bias ? bias[r] : 0.0f);
    }
  }
}
HYBRIDLM_SIMD_VARIANTS(q8_rows, q8_rows_generic<false>)
HYBRIDLM_SIMD_VARIANTS(q4_rows, q8_rows_generic<true>)

// The quantized activations of one q8_0 matmul (the calling thread's scratch): codes, scales and
// the VNNI kernel's bias corrections of T rows of K.
size_t q8_acts_floats(int T, int K) {
  const size_t rows = static_cast<size_t>(T);
  return FloatArena::rounded(ScratchFrame::floats_for<int8_t>(rows * q8_row_stride(K))) +
         FloatArena::rounded(rows * q8_row_blocks(K)) +
         FloatArena::rounded(ScratchFrame::floats_for<int32_t>(rows * q8_row_blocks(K)));
}

// q8_0 (W.dtype I8) and q4_0 (U8) weights.
void matmul_q8(const KernelContext& ctx, const WeightView& W, const float* bias, const float* x, int T, float* y) {
  const int K = W.cols, ld = q8_row_stride(K), nb = q8_row_blocks(K);
  const bool q4 = W.dtype == DType::U8;
  // The weight codes' bias: q8_0 stores q + 128, q4_0 c = q + 8.
  const int32_t code_bias = q4 ? kQ4Zero : 128;
  ScratchFrame frame(ctx);
  int8_t* codes = frame.take_as<int8_t>(static_cast<size_t>(T) * ld);
  float* scales = frame.take(static_cast<size_t>(T) * nb);
  int32_t* fix = frame.take_as<int32_t>(static_cast<size_t>(T) * nb);
  quantize_q8_0_rows(ctx, x, T, K, codes, scales);
  const SimdPath path = simd_path();
  const bool vnni = has_avx512_vnni();
  if (path == SimdPath::Avx512 && vnni)  // only the VNNI kernel reads the biased weight codes raw
    parallel(ctx, static_cast<size_t>(T), 16, [&](size_t b, size_t e) {
      for (size_t t = b; t < e; ++t)
        for (int blk = 0; blk < nb; ++blk) {
          int32_t sum = 0;
          for (int i = 0; i < kQ8Block; ++i) sum += codes[t * ld + static_cast<size_t>(blk) * kQ8Block + i];
          fix[t * nb + blk] = -code_bias * sum;
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
      if (path == SimdPath::Avx512 && vnni)
        matmul_q8_vnni(W, bias, xb, nt, yb, static_cast<int>(pb), static_cast<int>(pe));
      else if (q4) q4_rows_dispatch(W, bias, xb, nt, yb, rb, re);
      else q8_rows_dispatch(W, bias, xb, nt, yb, rb, re);
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
      if (avx512) quantize_q8_0_row_avx512(x + t * n, n, codes + t * ld, scales + t * nb);
      else quantize_q8_0_row(x + t * n, n, codes + t * ld, scales + t * nb);
    }
  });
}

void matmul(const KernelContext& ctx, const WeightView& W, const float* bias, const float* x,
            int T, float* y) {
  if (W.dtype == DType::I8 || W.dtype == DType::U8) return matmul_q8(ctx, W, bias, x, T, y);
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
      if (path == SimdPath::Avx512) matmul_rows_avx512(W, bias, xb, nt, yb, rb, re);
      else if (bf16) rows_bf16_dispatch(W, bias, xb, nt, yb, rb, re);
      else rows_f32_dispatch(W, bias, xb, nt, yb, rb, re);
    }
  };
  const size_t n_groups = (static_cast<size_t>(W.rows) + kRowGroup - 1) / kRowGroup;
  if (ctx.pool) ctx.pool->parallel_for(n_groups, run, 2);
  else run(0, n_groups);
}

ScratchNeed matmul_scratch(const KernelLimits& lim) {
  ScratchNeed need = most(gemm_lanes_scratch(lim), {q8_acts_floats(lim.tokens, lim.matmul_cols), 0});
  if (lim.backward && simd_path() == SimdPath::Avx512) {
    // matmul_backward runs both products on the strided GEMM (gemm_train_avx512.cc).
    need = most(need, gemm_strided_scratch(std::max(lim.matmul_cols, lim.matmul_rows), lim.matmul_rows));
  } else if (lim.backward) {
    // matmul_backward (backward_cpu.cc): dW's products take `rows` tokens of `tokens` columns, on
    // top of its copies dy^T, x^T and the product (dx's W^T, taken before, is smaller).
    KernelLimits p = lim;
    p.backward = false;
    p.tokens = std::max(lim.tokens, lim.matmul_rows);
    p.matmul_cols = std::max({lim.matmul_cols, lim.tokens, lim.matmul_rows});
    need = most(need, matmul_scratch(p));
    need.caller += matmul_backward_floats(lim.matmul_rows, lim.matmul_cols, lim.tokens);
  }
  return need;
}

}  // namespace hybridlm::cpu
