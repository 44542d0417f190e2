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


// q4_0: 4-bit weights (`--dtype q4_0`), with ggml's q4_0 semantics. A row is cut into blocks of 32;
// each block stores 32 codes c in [0, 15] and one f32 scale d, and represents (c - 8) * d. d is the
// block's value of largest magnitude (the first one, with its sign) divided by -8, so that value
// is code 0 exactly and the codes span [-8, 7] steps of d; c = min(15, floor(x / d + 8.5)) (the
// nearest step, ties upwards), with x / d taken exactly: computed in double, where a quotient of
// two floats never lands on a half unless it is one (ggml's reference rounds x * (1 / d) in f32,
// which can move a near-tie by one code). An all-zero block has d = 0 and codes 8; a block
// holding a NaN or an infinity has a NaN scale and codes 8, so its outputs are NaN (as f32
// weights' would be, inf * 0 included). Rows are padded as q8_0's (to q8_row_stride, with code 8:
// value 0).
//
// The panel layout (what the AVX512_VNNI kernel reads): panels of 16 rows as q8_0 (rows padded to
// q8_padded_rows), and within a panel, block b (32 columns) is 256 bytes: 4 registers of 64 bytes,
// register j (0..3) holding in lane r (bytes 4r..4r+3) row r's codes of columns 4j..4j+3 in the
// low nibbles and of columns 16+4j..16+4j+3 in the high nibbles. One load and two masks give the
// unsigned code vectors of two q8_0 groups, ready for vpdpbusd against a token's 4 activation
// codes broadcast (the codes' bias of 8 removed as q8_0's is: each block's sum starts at
// -8 * (sum of the token's codes in the block)). Scales: f32, exactly where q8_0's are
// (q8_scale_index). 0.625 bytes per weight (16 bytes of codes + a 4-byte scale per 32).
constexpr int kQ4Zero = 8;  // the code of value 0
inline size_t q4_code_bytes(int rows, int cols) { return q8_code_count(rows, cols) / 2; }
inline size_t q4_scale_count(int rows, int cols) { return q8_scale_count(rows, cols); }
// The byte holding code i of row r, and whether it is the high nibble.
inline size_t q4_byte_index(int r, int i, int cols) {
  return static_cast<size_t>(r / kQ8PanelRows) * kQ8PanelRows * q8_row_stride(cols) / 2 +
         static_cast<size_t>(i / kQ8Block) * kQ8Block * kQ8PanelRows / 2 +
         static_cast<size_t>(i % (kQ8Block / 2) / kQ8Group) * kQ8Group * kQ8PanelRows +
         static_cast<size_t>(r % kQ8PanelRows) * kQ8Group + i % kQ8Group;
}
inline bool q4_high_nibble(int i) { return i % kQ8Block >= kQ8Block / 2; }
// The unsigned code (0..15) of row r, column i of a panel-layout matrix.
inline int q4_weight_code(const uint8_t* codes, int r, int i, int cols) {
  const uint8_t b = codes[q4_byte_index(r, i, cols)];
  return q4_high_nibble(i) ? b >> 4 : b & 15;
}

// Quantizes x[0, n) into q8_row_stride(n) unpacked codes (0..15, one a byte; padding 8) and
// q8_row_blocks(n) scales, by the rule above.
void quantize_q4_0_row(const float* x, int n, uint8_t* codes, float* scales);
// x[c] = (codes[c] - 8) * scales[c / 32] for c in [0, n) (unpacked codes).
void dequantize_q4_0_row(const uint8_t* codes, const float* scales, int n, float* x);
// A (rows, cols) row-major f32 matrix into the panel layout above (codes: q4_code_bytes; scales:
// q4_scale_count).
void quantize_q4_0_matrix(const float* w, int rows, int cols, uint8_t* codes, float* scales);
// Row r of a panel-layout q4_0 matrix, dequantized into x[0, cols).
void dequantize_q4_0_matrix_row(const uint8_t* codes, const float* scales, int r, int cols, float* x);

}  // namespace hybridlm
