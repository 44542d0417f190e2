// Mamba-2 on AVX-512: the chunked SSD with register-tiled matrix products, and the decode step,
// see ssd_avx512.cc.
#pragma once

#include "kernels/kernels.h"

namespace hybridlm::cpu {

// cpu::ssd_scan's contract. Returns false, having done nothing, for shapes it does not cover
// (head_dim not 16, 32, 64 or 128, or chunk > 64); the caller then runs the portable kernel.
bool ssd_scan_avx512(const KernelContext& ctx, const float* x, int ld_x, const float* dt, const float* A,
                     const float* B, const float* C, int ld_bc, const float* D, const SsdDims& dims, int chunk,
                     float* S, int T, float* y);

// cpu::ssd_step's contract (S f32) and cpu::ssd_step_bf16's (S bf16, rounded to nearest even on
// the way out), the two bitwise alike up to that rounding. Returns false, having done nothing,
// unless d_state is a multiple of 16 and head_dim of 4.
bool ssd_step_avx512(const KernelContext& ctx, const float* x, const float* dt, const float* A, const float* B,
                     const float* C, const float* D, const SsdDims& dims, float* S, float* y);
bool ssd_step_avx512(const KernelContext& ctx, const float* x, const float* dt, const float* A, const float* B,
                     const float* C, const float* D, const SsdDims& dims, uint16_t* S, float* y);

}  // namespace hybridlm::cpu
