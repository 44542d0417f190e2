#include "kernels/cpu/cpu_features.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kernels/kernels.h"

namespace hybridlm::cpu {

#if defined(__x86_64__)
static SimdPath best_supported() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl"))
    return SimdPath::Avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return SimdPath::Avx2;
  return SimdPath::Portable;
}

static bool cpu_has_avx512_vnni() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512vnni");
}

static bool cpu_has_avx512_bf16() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16");
}
#else
// Other CPUs (aarch64): only the portable loops are compiled (cpu_common.h), and the AVX-512
// kernel files are not (CMakeLists.txt; no_avx512.cc stands in for them).
static SimdPath best_supported() { return SimdPath::Portable; }
static bool cpu_has_avx512_vnni() { return false; }
static bool cpu_has_avx512_bf16() { return false; }
#endif

static SimdPath detect() {
  const SimdPath best = best_supported();
  const char* env = std::getenv("HYBRIDLM_CPU_PATH");
  SimdPath want = best;
  if (env && *env) {
    if (std::strcmp(env, "portable") == 0) want = SimdPath::Portable;
    else if (std::strcmp(env, "avx2") == 0) want = SimdPath::Avx2;
    else if (std::strcmp(env, "avx512") == 0) want = SimdPath::Avx512;
    else std::fprintf(stderr, "warning: HYBRIDLM_CPU_PATH=%s is not avx512, avx2 or portable; ignored\n", env);
  }
  return static_cast<int>(want) < static_cast<int>(best) ? want : best;
}

SimdPath simd_path() {
  static const SimdPath path = detect();
  return path;
}

SimdPath best_simd_path() {
  static const SimdPath best = best_supported();
  return best;
}

bool has_avx512_vnni() {
  static const bool vnni = simd_path() == SimdPath::Avx512 && cpu_has_avx512_vnni();
  return vnni;
}

bool has_avx512_bf16() {
  static const bool bf16 = simd_path() == SimdPath::Avx512 && cpu_has_avx512_bf16();
  return bf16;
}

const char* active_path() {
  switch (simd_path()) {
    case SimdPath::Avx512: return "avx512";
    case SimdPath::Avx2: return "avx2";
    default: return "portable";
  }
}

}  // namespace hybridlm::cpu
