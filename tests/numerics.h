// The one tolerance table of the test suite, keyed by (op, dtype). Each entry says why it is what it is.
#pragma once

namespace hybridlm::tol {

// cpu vs ref kernels, f32: the ref accumulates in double, cpu in f32 with a different order;
// errors grow ~ sqrt(K) * 2^-24 * |terms|. Relative to max(1, max|ref|).
constexpr double kMatmulF32 = 2e-5;
// bf16 weights: both sides read the same bf16 values, so only accumulation order differs.
constexpr double kMatmulBF16 = 2e-5;
constexpr double kNorm = 1e-5;
constexpr double kConv = 1e-5;
// Scans: exp() of f32 arguments and long recurrences in f32 vs double.
constexpr double kMamba1Scan = 2e-5;
constexpr double kSsdScan = 5e-5;
// Attention: f32 online softmax (vexp, per-tile rescale) vs double two-pass softmax.
constexpr double kAttention = 2e-5;
// Full model with the recurrent state stored in bf16 / f16 between steps vs f32 storage: each
// stored value is rounded to 8 (bf16) or 11 (f16) mantissa bits, ~4e-3 / 5e-4 relative; a few
// decode steps over a few layers keep the logits within 3e-2 of their scale.
constexpr double kStateBf16 = 3e-2;
// Full model: decode (chunk of 1) vs prefill (chunked SSD) differ only by f32 summation order.
constexpr double kDecodeVsPrefill = 1e-4;

}  // namespace hybridlm::tol
