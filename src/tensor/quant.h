// q8_0: the 8-bit block format of the weights in memory (`--dtype q8_0`) and of the activations a
// q8_0 matmul multiplies them with. A row of n values is cut into blocks of 32; each block stores
// 32 int8 codes q in [-127, 127] and one f32 scale d = max|x| / 127, and represents q * d.
// Rows are padded with zero codes to a multiple of 64 (two blocks: one 512-bit register), so that
// a kernel never handles a partial block.
#pragma once

#include <cstddef>
#include <cstdint>

namespace hybridlm {

constexpr int kQ8Block = 32;
// Codes per stored row of a (rows, cols) q8_0 matrix: cols rounded up to a multiple of 64.
inline int q8_row_stride(int cols) { return (cols + 63) / 64 * 64; }
// Scales per stored row.
inline int q8_row_blocks(int cols) { return q8_row_stride(cols) / kQ8Block; }

// Quantizes x[0, n) into q8_row_stride(n) codes and q8_row_blocks(n) scales (the padding gets
// zero codes). Within a block: d = amax / 127, code = round-half-even(x * (1 / d)), 0 codes and a
// zero scale for an all-zero block. Deterministic and the same on every CPU path (the matmul's
// reference quantizes its activations with this very function).
void quantize_q8_0_row(const float* x, int n, int8_t* codes, float* scales);

// x[c] = codes[c] * scales[c / 32] for c in [0, n).
void dequantize_q8_0_row(const int8_t* codes, const float* scales, int n, float* x);

}  // namespace hybridlm
