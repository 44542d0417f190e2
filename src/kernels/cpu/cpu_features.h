// Runtime choice of the SIMD path of the CPU kernels. HYBRIDLM_CPU_PATH=portable forces the
// portable path (tests use it to check each path against ref/ on the same machine).
#pragma once

namespace hybridlm::cpu {

enum class SimdPath { Portable, Avx512 };
SimdPath simd_path();

}  // namespace hybridlm::cpu
