// Shared plumbing of the CPU kernel files: the instantiation attributes (a loop body written once,
// always_inline, then compiled inside an AVX-512, an AVX2 and a portable target function, the
// compiler vectorising each for its ISA; on CPUs other than x86-64 the portable one only) and the
// split of a range over the thread pool.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/thread_pool.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/kernels.h"
#include "kernels/scratch.h"
#include "tensor/dtype.h"

#define HYBRIDLM_INLINE inline __attribute__((always_inline))

#if defined(__x86_64__)
#define HYBRIDLM_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,fma")))
// The same with AVX512-BF16 (vdpbf16ps), for code run only where has_avx512_bf16().
#define HYBRIDLM_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,fma,avx512bf16")))
#define HYBRIDLM_AVX2 __attribute__((target("avx2,fma")))

// Instantiates the always_inline `body` once per SIMD path (name_avx512, name_avx2,
// name_portable) and defines name_dispatch(args...), which calls the active path's instance.
#define HYBRIDLM_SIMD_VARIANTS(name, body)                                   \
  template <class... Args>                                                   \
  HYBRIDLM_AVX512 void name##_avx512(Args... a) {                            \
    body(a...);                                                              \
  }                                                                          \
  template <class... Args>                                                   \
  HYBRIDLM_AVX2 void name##_avx2(Args... a) {                                \
    body(a...);                                                              \
  }                                                                          \
  template <class... Args>                                                   \
  void name##_portable(Args... a) {                                          \
    body(a...);                                                              \
  }                                                                          \
  template <class... Args>                                                   \
  void name##_dispatch(Args... a) {                                          \
    switch (simd_path()) {                                                   \
      case SimdPath::Avx512: name##_avx512(a...); break;                     \
      case SimdPath::Avx2: name##_avx2(a...); break;                         \
      default: name##_portable(a...); break;                                 \
    }                                                                        \
  }
#else
// Other CPUs (aarch64): the portable instance only, compiled for the target's baseline ISA (the
// compiler vectorises it with NEON on aarch64); simd_path() is always Portable there.
#define HYBRIDLM_SIMD_VARIANTS(name, body)                                   \
  template <class... Args>                                                   \
  void name##_portable(Args... a) {                                          \
    body(a...);                                                              \
  }                                                                          \
  template <class... Args>                                                   \
  void name##_dispatch(Args... a) {                                          \
    name##_portable(a...);                                                   \
  }
#endif

namespace hybridlm::cpu {

// A recurrent state element as f32, and back: f32 storage as is, bf16 storage (uint16_t) widened
// and rounded to nearest even. Both are branch-free and vectorise.
HYBRIDLM_INLINE float widen(float v) { return v; }
HYBRIDLM_INLINE float widen(uint16_t v) { return bf16_to_f32(v); }
HYBRIDLM_INLINE void narrow(float v, float& out) { out = v; }
HYBRIDLM_INLINE void narrow(float v, uint16_t& out) { out = f32_to_bf16(v); }

inline void parallel(const KernelContext& ctx, size_t n, size_t grain, FunctionRef<void(size_t, size_t)> fn) {
  if (ctx.pool) ctx.pool->parallel_for(n, fn, grain);
  else fn(0, n);
}

// The per-thread scratch (ScratchFrame) of the kernels in matmul_cpu.cc (with the GEMM) and in
// ssm_cpu.cc (with the AVX-512 scans and steps) for calls within `limits`; scratch_floats (the
// table's entry) is the larger of the two.
ScratchNeed matmul_scratch(const KernelLimits& limits);
// matmul_backward's own copies (backward_cpu.cc) for a (rows, cols) weight and T tokens.
size_t matmul_backward_floats(int rows, int cols, int T);
ScratchNeed ssm_scratch(const KernelLimits& limits);
// The scans' backward (scan_backward_cpu.cc): checkpoints and partial sums on the caller, a
// segment's or chunk's states on every thread. Empty unless limits.backward.
ScratchNeed scan_backward_scratch(const KernelLimits& limits);
// The gated delta rule's (gdn_cpu.cc).
ScratchNeed gdn_scratch(const KernelLimits& limits);

}  // namespace hybridlm::cpu
