// The outer-product GEMM for f32 and bf16 weights on the AVX-512 path (cpu::matmul runs it on lane
// panels at any token count, on row-major weights from kGemmMinTokens tokens up). Bitwise the same
// result as the dot-product tiles, see gemm_cpu.cc.
#pragma once

#include "kernels/kernels.h"

namespace hybridlm::cpu {

// Row-major weights: below this, packing the weights per call costs more than the faster tile saves. bench_gemm on the
// mamba2-130m projections, best of 10: dot tiles ahead by 8-11% at T = 32 and 3-9% at 48, even at
// 56, GEMM ahead by 5-8% at 64 (and 32 sequences decoding together: dot tiles 300-380 t/s, GEMM
// 241-300 with bf16 state).
constexpr int kGemmMinTokens = 64;

// y[t, r] = sum_k x[t, k] W[r, k] + bias[r] for W.dtype F32 or BF16 (row-major or panels).
void gemm_lanes_avx512(const KernelContext& ctx, const WeightView& W, const float* bias, const float* x, int T,
                       float* y);
// out: (cols, rows) = in: (rows, cols) transposed, 16 x 16 blocks through registers, over threads
// (matmul_backward's copies). False when rows or cols is not a multiple of 16 (the caller's loop
// takes those).
bool transpose_avx512(const KernelContext& ctx, const float* in, size_t rows, size_t cols, float* out);
// A matrix read through strides: element (i, j) at data[i * row + j * col].
struct StridedView {
  const float* data;
  size_t row, col;
};
// Training's GEMM (gemm_train_avx512.cc): C (M x N, row stride ldc) = [C +] A (M x K) B (K x N),
// B with col == 1 or row == 1; each output one sum over k in order, on any thread count.
void gemm_strided_avx512(const KernelContext& ctx, int M, int N, int K, StridedView A, StridedView B, float* C,
                         size_t ldc, bool accumulate);
// Its scratch for N <= max_n and, where A is transposed (A.row == 1), M <= max_m: the packed B
// block and a transposed A's block on the calling thread, A's tile on every thread.
ScratchNeed gemm_strided_scratch(int max_n, int max_m);
// Its per-thread scratch for calls within `limits` (ctx.scratch): the packed activations on the
// calling thread; a widened or packed weight panel and one tile's lane sums on every thread.
ScratchNeed gemm_lanes_scratch(const KernelLimits& limits);

}  // namespace hybridlm::cpu
