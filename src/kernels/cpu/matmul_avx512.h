// The AVX-512 kernels of cpu::matmul and of the q8_0 activation quantizer (matmul_avx512.cc;
// x86-64 builds only, where matmul_cpu.cc dispatches to them on the AVX-512 path).
#pragma once

#include <cstdint>

#include "kernels/kernels.h"

namespace hybridlm::cpu {

// The activations of one call, quantized to q8_0 rows (codes with the weights' row stride), and
// per block -128 (q8_0 weights) or -8 (q4_0) * (sum of its codes).
struct Q8Acts {
  const int8_t* codes = nullptr;
  const float* scales = nullptr;
  const int32_t* bias_fix = nullptr;
  int ld = 0, nb = 0;  // codes and scales per token
};

// The dot tiles on row-major f32 or bf16 weights (W.dtype): y[t, r] for tokens [0, T) and rows
// [r_begin, r_end), y of row stride W.rows.
void matmul_rows_avx512(const WeightView& W, const float* bias, const float* x, int T, float* y, int r_begin,
                        int r_end);

// q8_0 (W.dtype I8) or q4_0 (U8) weights (the VNNI panel layouts of tensor/quant.h) on
// AVX512_VNNI: panels [pb, pe) of 16 rows for T tokens; xa.bias_fix must be filled (-128 or -8
// times each block's code sum).
void matmul_q8_vnni(const WeightView& W, const float* bias, const Q8Acts& xa, int T, float* y, int pb, int pe);

// quantize_q8_0_row with 16 lanes, bitwise its codes and scales.
void quantize_q8_0_row_avx512(const float* x, int n, int8_t* codes, float* scales);

}  // namespace hybridlm::cpu
