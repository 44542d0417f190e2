#include "kernels/cpu/cpu_features.h"

#include <cstdlib>
#include <cstring>

#include "kernels/kernels.h"

namespace hybridlm::cpu {

static SimdPath detect() {
  const char* env = std::getenv("HYBRIDLM_CPU_PATH");
  if (env && std::strcmp(env, "portable") == 0) return SimdPath::Portable;
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl"))
    return SimdPath::Avx512;
  return SimdPath::Portable;
}

SimdPath simd_path() {
  static const SimdPath path = detect();
  return path;
}

const char* active_path() { return simd_path() == SimdPath::Avx512 ? "avx512" : "portable"; }

}  // namespace hybridlm::cpu
