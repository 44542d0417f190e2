// q8_0: the 8-bit block format of the weights in memory (`--dtype q8_0`) and of the activations a
// q8_0 matmul multiplies them with. A row of n values is cut into blocks of 32; each block stores
// 32 int8 codes q in [-127, 127] and one f32 scale d = max|x| / 127, and represents q * d
// (a block holding a NaN gets a NaN scale, so a NaN propagates as through f32 weights).
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

// A q8_0 weight matrix is stored in panels of 8 rows (rows padded with zeros to a multiple of 8),
// so that a kernel computing 8 rows streams one contiguous run of memory: within a panel, each
// 64-code step holds the 8 rows' 64 codes one after another (512 bytes), and the scales of that
// step the 8 rows' 2 scales one after another (16 floats, one 512-bit load).
constexpr int kQ8PanelRows = 8;
inline int q8_padded_rows(int rows) { return (rows + kQ8PanelRows - 1) / kQ8PanelRows * kQ8PanelRows; }
inline size_t q8_code_count(int rows, int cols) {
  return static_cast<size_t>(q8_padded_rows(rows)) * q8_row_stride(cols);
}
inline size_t q8_scale_count(int rows, int cols) {
  return static_cast<size_t>(q8_padded_rows(rows)) * q8_row_blocks(cols);
}
// Where code i of row r and scale b of row r live (cols gives the row stride).
inline size_t q8_code_index(int r, int i, int cols) {
  return static_cast<size_t>(r / kQ8PanelRows) * kQ8PanelRows * q8_row_stride(cols) +
         static_cast<size_t>(i / 64) * 64 * kQ8PanelRows + static_cast<size_t>(r % kQ8PanelRows) * 64 + i % 64;
}
inline size_t q8_scale_index(int r, int b, int cols) {
  return static_cast<size_t>(r / kQ8PanelRows) * kQ8PanelRows * q8_row_blocks(cols) +
         static_cast<size_t>(b / 2) * 2 * kQ8PanelRows + static_cast<size_t>(r % kQ8PanelRows) * 2 + b % 2;
}

// Quantizes a (rows, cols) row-major f32 matrix into the panel layout above (codes:
// q8_code_count, scales: q8_scale_count).
void quantize_q8_0_matrix(const float* w, int rows, int cols, int8_t* codes, float* scales);

// Quantizes x[0, n) into q8_row_stride(n) codes and q8_row_blocks(n) scales (the padding gets
// zero codes). Within a block: d = amax / 127, code = round-half-even(x / d), 0 codes and a
// zero scale for an all-zero block. Deterministic and the same on every CPU path (the matmul's
// reference quantizes its activations with this very function).
void quantize_q8_0_row(const float* x, int n, int8_t* codes, float* scales);

// x[c] = codes[c] * scales[c / 32] for c in [0, n).
void dequantize_q8_0_row(const int8_t* codes, const float* scales, int n, float* x);
// Row r of a panel-layout matrix, dequantized into x[0, cols).
void dequantize_q8_0_matrix_row(const int8_t* codes, const float* scales, int r, int cols, float* x);

}  // namespace hybridlm
