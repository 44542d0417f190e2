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

// A q8_0 weight matrix is stored in panels of 16 rows (rows padded with zeros to a multiple of
// 16) laid out for AVX512_VNNI's vpdpbusd, which sums 4 adjacent byte products into each 32-bit
// lane: within a panel, block b (32 columns) is 512 bytes, 8 groups of 4 columns, each group the
// 16 rows' 4 codes one after another (64 bytes: one register, lane j = row j). The block's 16
// scales follow the same row order (one 512-bit load). Weight codes are stored biased, as
// unsigned bytes q + 128 in [1, 255] (vpdpbusd's unsigned operand), so that the activation can
// be the signed operand; q8_weight_code() undoes the bias.
constexpr int kQ8PanelRows = 16;
constexpr int kQ8Group = 4;  // columns per 32-bit lane
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
         static_cast<size_t>(i / kQ8Block) * kQ8Block * kQ8PanelRows +
         static_cast<size_t>(i % kQ8Block / kQ8Group) * kQ8Group * kQ8PanelRows +
         static_cast<size_t>(r % kQ8PanelRows) * kQ8Group + i % kQ8Group;
}
inline size_t q8_scale_index(int r, int b, int cols) {
  return static_cast<size_t>(r / kQ8PanelRows) * kQ8PanelRows * q8_row_blocks(cols) +
         static_cast<size_t>(b) * kQ8PanelRows + static_cast<size_t>(r % kQ8PanelRows);
}
// The signed code stored (biased) at index i of a weight matrix's codes.
inline int q8_weight_code(const uint8_t* codes, size_t i) { return static_cast<int>(codes[i]) - 128; }

// Quantizes a (rows, cols) row-major f32 matrix into the panel layout above (codes:
// q8_code_count, biased; scales: q8_scale_count).
void quantize_q8_0_matrix(const float* w, int rows, int cols, uint8_t* codes, float* scales);

// Quantizes x[0, n) into q8_row_stride(n) codes and q8_row_blocks(n) scales (the padding gets
// zero codes). Within a block: d = amax / 127, code = round-half-even(x / d), 0 codes and a
// zero scale for an all-zero block. Deterministic and the same on every CPU path (the matmul's
// reference quantizes its activations with this very function).
void quantize_q8_0_row(const float* x, int n, int8_t* codes, float* scales);

// x[c] = codes[c] * scales[c / 32] for c in [0, n).
void dequantize_q8_0_row(const int8_t* codes, const float* scales, int n, float* x);
// Row r of a panel-layout matrix, dequantized into x[0, cols).
void dequantize_q8_0_matrix_row(const uint8_t* codes, const float* scales, int r, int cols, float* x);

}  // namespace hybridlm
