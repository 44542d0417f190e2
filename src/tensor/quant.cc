#include "tensor/quant.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace hybridlm {

void quantize_q8_0_row(const float* x, int n, int8_t* codes, float* scales) {
  const int stride = q8_row_stride(n);
  for (int b0 = 0; b0 < stride; b0 += kQ8Block) {
    const int end = b0 + kQ8Block < n ? b0 + kQ8Block : n;
    float amax = 0.0f;
    bool nan = false;
    for (int c = b0; c < end; ++c) {
      nan |= x[c] != x[c];
      amax = std::fmax(amax, std::fabs(x[c]));  // fmax skips a NaN
    }
    const float d = amax / 127.0f;
    // A NaN in the block makes its scale NaN, so the products carry it (as f32 weights would).
    scales[b0 / kQ8Block] = nan ? std::nanf("") : d;
    for (int c = b0; c < b0 + kQ8Block; ++c) {
      if (c >= end || !(d > 0.0f) || x[c] != x[c]) {  // padding, an all-zero (or denormal) block, NaN
        codes[c] = 0;
        continue;
      }
      // A division, not x * (1 / d): 1 / d overflows for blocks below ~4e-37. |x / d| <= 127 up
      // to rounding; clamp anyway. nearbyint rounds half to even in the default mode.
      float v = x[c] / d;
      if (v != v) v = x[c] > 0.0f ? 127.0f : -127.0f;  // inf / inf: the block's infinity (scale inf)
      v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
      codes[c] = static_cast<int8_t>(std::nearbyint(v));
    }
  }
}

void dequantize_q8_0_row(const int8_t* codes, const float* scales, int n, float* x) {
  for (int c = 0; c < n; ++c) x[c] = static_cast<float>(codes[c]) * scales[c / kQ8Block];
}

void quantize_q8_0_matrix(const float* w, int rows, int cols, uint8_t* codes, float* scales) {
  const int ld = q8_row_stride(cols), nb = q8_row_blocks(cols);
  std::vector<int8_t> q(static_cast<size_t>(ld));
  std::vector<float> d(static_cast<size_t>(nb));
  for (int r = 0; r < q8_padded_rows(rows); ++r) {
    if (r < rows) {
      quantize_q8_0_row(w + static_cast<size_t>(r) * cols, cols, q.data(), d.data());
    } else {
      std::fill(q.begin(), q.end(), 0);
      std::fill(d.begin(), d.end(), 0.0f);
    }
    for (int i = 0; i < ld; ++i)
      codes[q8_code_index(r, i, cols)] = static_cast<uint8_t>(q[static_cast<size_t>(i)] + 128);
    for (int b = 0; b < nb; ++b) scales[q8_scale_index(r, b, cols)] = d[static_cast<size_t>(b)];
  }
}

void dequantize_q8_0_matrix_row(const uint8_t* codes, const float* scales, int r, int cols, float* x) {
  for (int c = 0; c < cols; ++c)
    x[c] = static_cast<float>(q8_weight_code(codes, q8_code_index(r, c, cols))) *
           scales[q8_scale_index(r, c / kQ8Block, cols)];
}

void quantize_q4_0_row(const float* x, int n, uint8_t* codes, float* scales) {
  const int stride = q8_row_stride(n);
  for (int b0 = 0; b0 < stride; b0 += kQ8Block) {
    const int end = std::min(b0 + kQ8Block, n);
    float amax = 0.0f, vmax = 0.0f;
    bool finite = true;
    for (int c = b0; c < end; ++c) {
      finite &= std::isfinite(x[c]);
      if (std::fabs(x[c]) > amax) {  // the first value of the largest magnitude, with its sign
        amax = std::fabs(x[c]);
        vmax = x[c];
      }
    }
    const float d = amax > 0.0f ? vmax / -8.0f : 0.0f;
    scales[b0 / kQ8Block] = finite ? d : std::nanf("");
    for (int c = b0; c < b0 + kQ8Block; ++c) {
      int code = kQ4Zero;
      if (c < end && finite && d != 0.0f) {
        // Exact: x and d are floats, so x / d in double never rounds onto a tie it is not at.
        const double q = std::floor(static_cast<double>(x[c]) / static_cast<double>(d) + 8.5);
        code = static_cast<int>(std::clamp(q, 0.0, 15.0));
      }
      codes[c] = static_cast<uint8_t>(code);
    }
  }
}

void dequantize_q4_0_row(const uint8_t* codes, const float* scales, int n, float* x) {
  for (int c = 0; c < n; ++c) x[c] = static_cast<float>(codes[c] - kQ4Zero) * scales[c / kQ8Block];
}

void quantize_q4_0_matrix(const float* w, int rows, int cols, uint8_t* codes, float* scales) {
  const int ld = q8_row_stride(cols), nb = q8_row_blocks(cols);
  std::vector<uint8_t> q(static_cast<size_t>(ld));
  std::vector<float> d(static_cast<size_t>(nb));
  for (int r = 0; r < q8_padded_rows(rows); ++r) {
    if (r < rows) {
      quantize_q4_0_row(w + static_cast<size_t>(r) * cols, cols, q.data(), d.data());
    } else {
      std::fill(q.begin(), q.end(), static_cast<uint8_t>(kQ4Zero));
      std::fill(d.begin(), d.end(), 0.0f);
    }
    for (int i = 0; i < ld; ++i) {
      uint8_t& byte = codes[q4_byte_index(r, i, cols)];
      const uint8_t code = q[static_cast<size_t>(i)];
      byte = q4_high_nibble(i) ? static_cast<uint8_t>((byte & 15) | code << 4)
                               : static_cast<uint8_t>((byte & 0xf0) | code);
    }
    for (int b = 0; b < nb; ++b) scales[q8_scale_index(r, b, cols)] = d[static_cast<size_t>(b)];
  }
}

void dequantize_q4_0_matrix_row(const uint8_t* codes, const float* scales, int r, int cols, float* x) {
  for (int c = 0; c < cols; ++c)
    x[c] =
        static_cast<float>(q4_weight_code(codes, r, c, cols) - kQ4Zero) * scales[q8_scale_index(r, c / kQ8Block, cols)];
}

}  // namespace hybridlm
