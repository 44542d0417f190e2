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

// log(1 + u) for u in [0, 1]: w = 1 + u = 2^e m with m in [sqrt(1/2), sqrt(2)], log m =
// 2 atanh(f / (2 + f)) with f = m - 1 (exact) by its odd series to s^9 (|s| <= 0.172: truncation
// < 1e-9), and the rounding of 1 + u corrected by u / (w - 1) (exact when w == 1: log1p(u) = u).
inline __attribute__((always_inline)) float vlog1p_unit(float u) {
  const float w = 1.0f + u;
  const bool hi = w > 1.41421356f;
  const float m = hi ? w * 0.5f : w;
  const float f = m - 1.0f;
  const float s = f / (2.0f + f), s2 = s * s;
  const float p = s2 * (1.0f / 3.0f + s2 * (1.0f / 5.0f + s2 * (1.0f / 7.0f + s2 * (1.0f / 9.0f))));
  const float log_w = (2.0f * s + 2.0f * s * p) + (hi ? 0.693147181f : 0.0f);
  return w == 1.0f ? u : log_w * (u / (w - 1.0f));
}

// softplus(x) = log(1 + e^x) = max(x, 0) + log1p(e^-|x|); x itself above 20 (as the ref and
// PyTorch's threshold). NaN stays NaN.
inline __attribute__((always_inline)) float vsoftplus(float x) {
  const float ax = x < 0.0f ? -x : x;
  const float r = (x > 0.0f ? x : 0.0f) + vlog1p_unit(vexp(-ax));
  return x > 20.0f ? x : (x == x ? r : x);
}

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

// f16 bits to f32, exact for every input (subnormals, infinities, NaN payloads) and branch-free,
// so a loop over a row of f16 values vectorises (tensor/dtype.h's f16_to_f32 is the scalar
// original it equals, checked over all 65536 inputs in kernels_test). The 15 exponent and
// mantissa bits move up to f32's positions and one multiply by 2^112 rebiases the exponent from
// 15 to 127 (exact: a power of two, for normal and subnormal f16 alike; the latter are f32
// subnormals before the multiply, so this assumes the default MXCSR, no denormals-are-zero);
// exponent 31 (inf / NaN) becomes 255 by a mask. Masks, not ?:, so the compiler sees no branch.
inline __attribute__((always_inline)) float vf16_to_f32(uint16_t h) {
  const uint32_t em = h & 0x7fffu;
  const uint32_t inf_nan = 0u - static_cast<uint32_t>(em >= 0x7c00u);
  const uint32_t shifted = em << 13;
  float f;
  std::memcpy(&f, &shifted, 4);
  f *= 0x1p112f;
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u |= (inf_nan & 0x7f800000u) | (static_cast<uint32_t>(h & 0x8000u) << 16);
  float out;
  std::memcpy(&out, &u, 4);
  return out;
}

}  // namespace hybridlm::cpu
