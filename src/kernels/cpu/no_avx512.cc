// Builds for CPUs other than x86-64 (aarch64): CMakeLists.txt compiles this file in place of the
// AVX-512 kernel files (attention_avx512.cc, attention_backward_avx512.cc, gemm_cpu.cc,
// gemm_train_avx512.cc, matmul_avx512.cc, ssd_avx512.cc, ssm_step_avx512.cc), and simd_path() is
// always Portable there, so the kernels' dispatch never calls them. Their entry points are defined
// here so that the dispatching code links unchanged: those that may decline a call decline every
// call (false: the caller runs the portable loops); the others stop the program, as reaching one
// would be a dispatch bug.
#if defined(__x86_64__)
#error "no_avx512.cc is for builds without the x86-64 kernel files (see CMakeLists.txt)"
#endif

#include <cstdio>
#include <cstdlib>

#include "kernels/cpu/attention_avx512.h"
#include "kernels/cpu/gemm_cpu.h"
#include "kernels/cpu/matmul_avx512.h"
#include "kernels/cpu/ssd_avx512.h"
#include "kernels/cpu/ssm_step_avx512.h"

namespace hybridlm::cpu {

namespace {
[[noreturn]] void unreachable(const char* kernel) {
  std::fprintf(stderr, "hybridlm: internal error: %s called in a build without the AVX-512 kernels\n", kernel);
  std::abort();
}
}  // namespace

bool attention_avx512(const KernelContext&, const float*, int, const PagedKv&, int, int, int, float, float*) {
  return false;
}

void attention_avx512_bf16_dot(bool) {}

bool attention_backward_avx512(const KernelContext&, const float*, int, const float*, const float*, int, int, int, int,
                               float, const float*, float*, float*, float*) {
  return false;
}

bool transpose_avx512(const KernelContext&, const float*, size_t, size_t, float*) { return false; }

bool ssd_scan_avx512(const KernelContext&, const float*, int, const float*, const float*, const float*, const float*,
                     int, const float*, const SsdDims&, int, float*, int, float*) {
  return false;
}

bool ssd_step_avx512(const KernelContext&, const float*, const float*, const float*, const float*, const float*,
                     const float*, const SsdDims&, float*, float*) {
  return false;
}
bool ssd_step_avx512(const KernelContext&, const float*, const float*, const float*, const float*, const float*,
                     const float*, const SsdDims&, uint16_t*, float*) {
  return false;
}

bool mamba1_step_avx512(const KernelContext&, const float*, const float*, const float*, const float*, const float*,
                        const float*, const float*, float*, int, int, float*) {
  return false;
}
bool mamba1_step_avx512(const KernelContext&, const float*, const float*, const float*, const float*, const float*,
                        const float*, const float*, uint16_t*, int, int, float*) {
  return false;
}

bool conv_step_avx512(const KernelContext&, const float*, const float*, const float*, float*, int, int, bool,
                      float*) {
  return false;
}

bool mamba1_scan_avx512(const KernelContext&, const float*, int, const float*, const float*, const float*,
                        const float*, int, const float*, const float*, int, float*, int, int, int, float*) {
  return false;
}
bool mamba1_scan_avx512(const KernelContext&, const float*, int, const float*, const float*, const float*,
                        const float*, int, const float*, const float*, int, uint16_t*, int, int, int, float*) {
  return false;
}

// No AVX-512 kernel runs, so none takes scratch.
ScratchNeed ssd_scan_avx512_scratch(const KernelLimits&) { return {}; }
ScratchNeed ssm_step_avx512_scratch(const KernelLimits&) { return {}; }
ScratchNeed gemm_lanes_scratch(const KernelLimits&) { return {}; }
ScratchNeed gemm_strided_scratch(int, int) { return {}; }

void exp_avx512(const float*, size_t, float*) { unreachable("exp_avx512"); }

void ssd_step_avx512_heads(const float*, const float*, const float*, const float*, const float*, const float*,
                           const SsdDims&, float*, float*, size_t, size_t) {
  unreachable("ssd_step_avx512_heads");
}
void ssd_step_avx512_heads(const float*, const float*, const float*, const float*, const float*, const float*,
                           const SsdDims&, uint16_t*, float*, size_t, size_t) {
  unreachable("ssd_step_avx512_heads");
}
void conv4_step_avx512_channels(const float*, const float*, const float*, float*, int, bool, float*, size_t, size_t) {
  unreachable("conv4_step_avx512_channels");
}

void gemm_lanes_avx512(const KernelContext&, const WeightView&, const float*, const float*, int, float*) {
  unreachable("gemm_lanes_avx512");
}

void gemm_strided_avx512(const KernelContext&, int, int, int, StridedView, StridedView, float*, size_t, bool) {
  unreachable("gemm_strided_avx512");
}

void matmul_rows_avx512(const WeightView&, const float*, const float*, int, float*, int, int) {
  unreachable("matmul_rows_avx512");
}

void matmul_q8_vnni(const WeightView&, const float*, const Q8Acts&, int, float*, int, int) {
  unreachable("matmul_q8_vnni");
}

void quantize_q8_0_row_avx512(const float*, int, int8_t*, float*) { unreachable("quantize_q8_0_row_avx512"); }

}  // namespace hybridlm::cpu
