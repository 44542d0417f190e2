// Shared plumbing of the CPU kernel files: the two instantiation attributes (a loop body written
// once, always_inline, then compiled inside an AVX-512 target function and a portable one) and the
// split of a range over the thread pool.
#pragma once

#include <cstddef>
#include <functional>

#include "base/thread_pool.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/kernels.h"

#define HYBRIDLM_INLINE inline __attribute__((always_inline))
#define HYBRIDLM_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,fma")))

namespace hybridlm::cpu {

inline void parallel(const KernelContext& ctx, size_t n, size_t grain, const std::function<void(size_t, size_t)>& fn) {
  if (ctx.pool) ctx.pool->parallel_for(n, fn, grain);
  else fn(0, n);
}

inline bool use_avx512() { return simd_path() == SimdPath::Avx512; }

}  // namespace hybridlm::cpu
