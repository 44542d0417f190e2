// Mamba-2 chunked SSD with register-tiled matrix products (AVX-512), see ssd_avx512.cc.
#pragma once

#include "kernels/kernels.h"

namespace hybridlm::cpu {

// cpu::ssd_scan's contract. Returns false, having done nothing, for shapes it does not cover
// (head_dim not 16, 32, 64 or 128, or chunk > 64); the caller then runs the portable kernel.
bool ssd_scan_avx512(const KernelContext& ctx, const float* x, int ld_x, const float* dt, const float* A,
                     const float* B, const float* C, int ld_bc, const float* D, const SsdDims& dims, int chunk,
                     float* S, int T, float* y);

// Its per-thread scratch for calls within `limits` (ctx.scratch): CB of every chunk on the calling
// thread, a head's working rows on every thread.
ScratchNeed ssd_scan_avx512_scratch(const KernelLimits& limits);

}  // namespace hybridlm::cpu
