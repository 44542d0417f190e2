#include "tensor/quant.h"

#include <cmath>

namespace hybridlm {

void quantize_q8_0_row(const float* x, int n, int8_t* codes, float* scales) {
  const int stride = q8_row_stride(n);
  for (int b0 = 0; b0 < stride; b0 += kQ8Block) {
    const int end = b0 + kQ8Block < n ? b0 + kQ8Block : n;
    float amax = 0.0f;
    for (int c = b0; c < end; ++c) amax = std::fmax(amax, std::fabs(x[c]));  // fmax drops a NaN
    const float d = amax / 127.0f;
    const float inv = d > 0.0f ? 1.0f / d : 0.0f;
    scales[b0 / kQ8Block] = d;
    for (int c = b0; c < b0 + kQ8Block; ++c) {
      if (c >= end) {
        codes[c] = 0;
        continue;
      }
      float v = x[c] * inv;
      v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
      // nearbyint rounds half to even in the default mode, as the SIMD conversion would; a NaN
      // (only from a NaN weight or activation) becomes code 0, never an undefined conversion.
      codes[c] = v == v ? static_cast<int8_t>(std::nearbyint(v)) : 0;
    }
  }
}

void dequantize_q8_0_row(const int8_t* codes, const float* scales, int n, float* x) {
  for (int c = 0; c < n; ++c) x[c] = static_cast<float>(codes[c]) * scales[c / kQ8Block];
}

}  // namespace hybridlm
