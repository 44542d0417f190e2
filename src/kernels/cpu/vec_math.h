// Branch-free float math that compilers vectorise (no libm calls, no reductions across lanes).
// Used by the CPU kernels inside both the AVX-512 and the portable instantiations.
#pragma once

#include <cstdint>
#include <cstring>

namespace hybridlm::cpu {

// exp(x) for float: 2^n * p(r) with n = round(x log2 e), r = x - n ln 2 (two-part ln 2), p a
// degree-6 Taylor polynomial on |r| <= ln2/2 (truncation error < 2e-8 relative). Inputs are
// clamped to [-87.3, 88.0] (2^n stays a normal float), so results are always finite and underflow goes to ~1e-38, not 0.
// Max relative error vs a correctly rounded exp: ~3 ulp (checked in kernels_test).
inline __attribute__((always_inline)) float vexp(float x_in) {
  // Written so that NaN selects the lower bound (no NaN reaches the int conversion below) and is
  // restored at the end: vexp(NaN) is NaN, as exp(NaN) is.
  const float x = x_in >= -87.3f ? (x_in <= 88.0f ? x_in : 88.0f) : -87.3f;
  const float t = x * 1.44269504088896341f;
  // Round to nearest by the 1.5 * 2^23 trick (exact for |t| < 2^22; no libm call).
  const float n = (t + 12582912.0f) - 12582912.0f;
  const float r = (x - n * 0.693145751953125f) - n * 1.42860682030941723212e-6f;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return x_in == x_in ? p * scale : x_in;
}

inline __attribute__((always_inline)) float vsilu(float v) { return v / (1.0f + vexp(-v)); }

// Dot product with 16 independent partial sums and a fixed reduction tree: vectorises without
// reassociation flags, and its summation order depends only on n.
inline __attribute__((always_inline)) float vdot(const float* a, const float* b, int n) {
  float acc[16] = {};
  int k = 0;
  for (; k + 16 <= n; k += 16)
    for (int l = 0; l < 16; ++l) acc[l] += a[k + l] * b[k + l];
  for (int l = 0; k < n; ++k, ++l) acc[l] += a[k] * b[k];
  for (int w = 8; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  return acc[0];
}

}  // namespace hybridlm::cpu
