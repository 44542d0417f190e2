// The recurrent decode steps (one token per sequence) and the Mamba-1 prefill scan on AVX-512,
// on f32 or bf16 state, see ssm_step_avx512.cc.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/kernels.h"

namespace hybridlm::cpu {

// cpu::ssd_step's contract, S f32 or bf16 (bf16 rounded to nearest even on
// the way out), the two bitwise alike up to that rounding. Returns false, having done nothing,
// unless d_state is a multiple of 16 and head_dim of 4.
bool ssd_step_avx512(const KernelContext& ctx, const float* x, const float* dt, const float* A, const float* B,
                     const float* C, const float* D, const SsdDims& dims, float* S, float* y);
bool ssd_step_avx512(const KernelContext& ctx, const float* x, const float* dt, const float* A, const float* B,
                     const float* C, const float* D, const SsdDims& dims, uint16_t* S, float* y);

// The thread-range bodies of ssd_step_avx512 (heads [hb, he)) and conv_step_avx512 (channels
// [cb, ce) of the C in all), for the fused Mamba-2 step, which runs them in its own region. Each
// needs what its whole-range version checks (d_state % 16 == 0 and head_dim % 4 == 0; K == 4).
void ssd_step_avx512_heads(const float* x, const float* dt, const float* A, const float* B, const float* C,
                           const float* D, const SsdDims& dims, float* S, float* y, size_t hb, size_t he);
void ssd_step_avx512_heads(const float* x, const float* dt, const float* A, const float* B, const float* C,
                           const float* D, const SsdDims& dims, uint16_t* S, float* y, size_t hb, size_t he);
void conv4_step_avx512_channels(const float* x, const float* w, const float* bias, float* state, int C, bool apply_silu,
                                float* out, size_t cb, size_t ce);

// cpu::mamba1_scan's contract for T = 1, h f32 or bf16, alike up to
// the rounding. Returns false, having done nothing, unless d_state is a multiple of 16.
bool mamba1_step_avx512(const KernelContext& ctx, const float* x, const float* dt, const float* A, const float* B,
                        const float* C, const float* D, const float* z, float* h, int I, int N, float* y);
bool mamba1_step_avx512(const KernelContext& ctx, const float* x, const float* dt, const float* A, const float* B,
                        const float* C, const float* D, const float* z, uint16_t* h, int I, int N, float* y);

// cpu::conv1d_causal's contract for T = 1: bitwise its prefill loop's result where the compiler
// contracts that loop's multiply-add into an FMA (release builds), within rounding otherwise.
// Returns false, having done nothing, unless K == 4.
bool conv_step_avx512(const KernelContext& ctx, const float* x, const float* w, const float* bias, float* state,
                      int C, int K, bool apply_silu, float* out);

// y[i] = exp16(x[i]), the exp of the AVX-512 Mamba-1 scan (for tests; needs AVX-512F).
void exp_avx512(const float* x, size_t n, float* y);

// cpu::mamba1_scan's contract for any T, h f32 or bf16 (read once, written once). Returns false,
// having done nothing, unless d_state <= 16.
bool mamba1_scan_avx512(const KernelContext& ctx, const float* x, int ld_x, const float* dt, const float* A,
                        const float* B, const float* C, int ld_bc, const float* D, const float* z, int ld_z, float* h,
                        int T, int I, int N, float* y);
bool mamba1_scan_avx512(const KernelContext& ctx, const float* x, int ld_x, const float* dt, const float* A,
                        const float* B, const float* C, int ld_bc, const float* D, const float* z, int ld_z,
                        uint16_t* h, int T, int I, int N, float* y);

// The per-thread scratch of these kernels for calls within `limits` (ctx.scratch).
ScratchNeed ssm_step_avx512_scratch(const KernelLimits& limits);

}  // namespace hybridlm::cpu
