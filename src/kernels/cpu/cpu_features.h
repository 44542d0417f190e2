// Runtime choice of the SIMD path of the CPU kernels: the best the CPU supports, or a lower one
// named by HYBRIDLM_CPU_PATH=portable|avx2|avx512 (tests use it to check every path against ref/
// on the same machine; a path the CPU lacks is never chosen). CPUs other than x86-64 have the
// portable path only.
#pragma once

namespace hybridlm::cpu {

enum class SimdPath { Portable, Avx2, Avx512 };
SimdPath simd_path();
// The best path this CPU supports, whatever HYBRIDLM_CPU_PATH says.
SimdPath best_simd_path();
// AVX512_VNNI (int8 dot products for q8_0 weights); only consulted on the AVX-512 path.
bool has_avx512_vnni();
// AVX512_BF16 (bf16 dot products: attention's scores over bf16 KV); only on the AVX-512 path.
bool has_avx512_bf16();

}  // namespace hybridlm::cpu
