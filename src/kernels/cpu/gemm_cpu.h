// Prefill GEMM for f32 and bf16 weights on the AVX-512 path (used by cpu::matmul from
// kGemmMinTokens tokens up). Bitwise the same result as the dot-product tiles, see gemm_cpu.cc.
#pragma once

#include "kernels/kernels.h"

namespace hybridlm::cpu {

// Below this, packing the weights per call costs more than the faster tile saves (mamba2-130m,
// 16 sequences decoding together: dot tiles 236 t/s, GEMM 183 t/s; equal at 32).
constexpr int kGemmMinTokens = 32;

// y[t, r] = sum_k x[t, k] W[r, k] + bias[r] for W.dtype F32 or BF16 (row-major or panels).
void gemm_lanes_avx512(const KernelContext& ctx, const WeightView& W, const float* bias, const float* x, int T,
                       float* y);

}  // namespace hybridlm::cpu
