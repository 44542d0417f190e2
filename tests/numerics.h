// The one tolerance table of the test suite, keyed by (op, dtype). Each entry says why it is what it is.
#pragma once

namespace hybridlm::tol {

// cpu vs ref kernels, f32: the ref accumulates in double, cpu in f32 with a different order;
// errors grow ~ sqrt(K) * 2^-24 * |terms|. Relative to max(1, max|ref|).
constexpr double kMatmulF32 = 2e-5;
// bf16 weights: both sides read the same bf16 values, so only accumulation order differs.
constexpr double kMatmulBF16 = 2e-5;
// q8_0: both sides quantize the activations with the same function and sum the same exact int32
// block products; only the f32 accumulation of the scaled block sums differs from double.
constexpr double kMatmulQ8 = 2e-5;
// q4_0 weights (q8_0 activations): the same exact integer sums on both sides.
constexpr double kMatmulQ4 = 2e-5;
// q8_0 against the exact f32 product: each code is within half a step (max|block| / 254) of its
// value, ~0.4% rms of a Gaussian block for weights and activations alike; summed over K random
// terms the output error stays ~0.5% of the output scale. 2e-2 leaves margin and still fails on
// any wrong block, scale or sign.
constexpr double kQ8VsF32 = 2e-2;
// q4_0 against the exact f32 product: a code is within half a step of its value, a step being
// max|block| / 8 (the opposite sign of the largest value clamps, within a step): ~8% rms of a
// Gaussian block's scale per weight, 16x q8_0's. Measured 4.2-8.5% of the output scale over the
// MatmulMatchesRef shapes (q8_0: 0.4-0.9%); 0.15 still fails on any wrong block, scale or sign.
constexpr double kQ4VsF32 = 0.15;
// Whole models with q8_0 weights vs f32 weights (logits, relative to their scale), and q8_0
// prefill + decode vs one q8_0 forward (the activations entering each matmul differ by f32
// rounding, which can move a code across a rounding boundary: one step is ~0.4% of a block's
// largest value).
constexpr double kQ8Model = 0.1;
// The same for the random-weight discrete Mamba-2 fixtures (llamba, hybridlm_m2d): their mixer
// has no norm between the long-memory scan and out_proj, so weight rounding is amplified about 3x
// over the hybridlm fixture at bf16 as at q8_0 (bf16 2.4e-2 vs 7e-3; q8_0 7-20% vs 3.5% measured
// over seeds 15-19), a property of the weights, not of the kernels (q8_0 prefill + decode still
// agrees with its own full forward to 3e-7).
constexpr double kQ8ModelDiscreteMamba2 = 0.25;
// The same for the lfm2_moe fixture: four of its five layers route each token to 2 of 4 experts by
// sigmoid scores, and the weights' rounding flips a near-tied choice for some tokens, which swaps
// a whole expert's output (0.26 on the test's prompt; 0.09-0.55 over eight other prompts). A flip
// is a discontinuity of hard top-k routing, not a kernel error: the q8_0 kernels are checked at
// kernel level and on the other fixtures, and q8_0 prefill + decode still equals its own full forward.
constexpr double kQ8ModelRoutedMoe = 0.5;
// The same for the random-weight gated DeltaNet fixtures (hybridlm_gdn, qwen3_next): 0.24 on both,
// from two causes found with a float64 numpy model of q8_0 on the reference (weights and
// activations rounded per 32-block), which reproduces 0.20 and 0.23 on the test's ids, so neither
// is the engine's. (1) Random q and k are nearly orthogonal, so a value head's delta-rule output is
// ~4% of |v| (median) and down to 0.2% on some tokens; the per-head RMSNorm before the gate scales
// it back to O(1), and the ~1% rounding of q and k becomes 30% of that head's output in the first
// GDN layer, 200% in the second (hybridlm_gdn: 0.20 at token 1). Rounding in_proj_qkvz alone gives
// all of it; A_log, dt_bias, conv and norm weights stay f32 (TensorSource vectors). (2) qwen3_next:
// one top-2 expert swap at the last token (layer 3 router logits 0.985 vs 1.04): 0.23, the rest of
// its tokens <= 0.04. q8_0 prefill + decode agrees with its own full forward to 3e-7. The Qwen3.5
// fixtures (qwen3_5, qwen3_5_moe), the same blocks, measured 0.05-0.10 and share this bound.
constexpr double kQ8ModelGatedDeltaNet = 0.35;
constexpr double kQ8DecodeVsPrefill = 1e-2;
// The same for q4_0 weights (steps 16x q8_0's). On the tiny random-weight fixtures (hidden sizes
// 32-64) 4-bit rounding moves the logits by the order of the logits themselves: measured 5.8e-2
// (granite) to 1.04 (nemotron_h) of their scale, discrete Mamba-2 0.57 / 0.84, lfm2_moe 0.78, gated
// DeltaNet 0.59 (qwen3_5) to 0.85 (qwen3_5_moe). So the largest deviation only bounds gross
// failure here; the correlation below is what catches a wrong layout, block or sign. Prefill +
// decode vs one q4_0 forward measured <= 2.7e-7 in the release build, as q8_0. The sanitizer build
// (-O1) computes some f32 values in decode in another order than in prefill (mamba1, no attention:
// 1.35e-3), and where such a difference crosses a rounding step (an activation's int8 code, a bf16
// K, V or query element) it becomes a whole step; nemotron_h, whose logits move by 104% under q4_0,
// amplifies that to 1.23e-2 with bf16 KV (since the query's rounding to bf16, 8e3b6d7).
constexpr double kQ4Model = 1.5;
constexpr double kQ4ModelDiscreteMamba2 = 1.5;
constexpr double kQ4ModelRoutedMoe = 1.5;
constexpr double kQ4ModelGatedDeltaNet = 1.5;
constexpr double kQ4DecodeVsPrefill = 3e-2;
// q4_0 weights against f32 weights holding the same values: only the activations' q8_0 rounding
// differs, so the error is q8_0's size, not q4_0's: measured 2.5e-3 (granite) to 5.6e-2 (lfm2_moe),
// 8.7e-2 (llamba) and 9.5e-2 (zamba2, hidden size 32: one activation block per row), against
// 0.06-1.04 for the same engines against the f32 weights.
constexpr double kQ4VsItsValues = 0.15;
// Centred correlation of the quantized model's logits (all tokens, whole vocabulary) with the f32
// model's. q8_0 measured 0.991 (lfm2_moe) to 1.0000; q4_0 0.786 (lfm2_moe), 0.84 (lfm2, zamba2),
// 0.89-0.99 the others. A model computing the wrong thing correlates near 0.
constexpr double kQ8ModelCorrelation = 0.98;
constexpr double kQ4ModelCorrelation = 0.7;
constexpr double kNorm = 1e-5;
constexpr double kConv = 1e-5;
// Scans: exp() of f32 arguments and long recurrences in f32 vs double.
constexpr double kMamba1Scan = 2e-5;
constexpr double kSsdScan = 5e-5;
// Attention: f32 online softmax (vexp, per-tile rescale) vs double two-pass softmax.
constexpr double kAttention = 2e-5;
// Attention over K and V stored bf16 (8 mantissa bits: each value within 2^-9 relative of the f32
// one) vs stored f32, both exact (ref): the output moves by the rounding of the values it averages
// and of the scores' inputs, ~2^-9 of its scale; 4x that for margin. f16 (11 bits, 2^-12): 8x less.
constexpr double kAttentionKvBf16 = 8e-3;
constexpr double kAttentionKvF16 = 1e-3;
// Full model with the recurrent state stored in bf16 / f16 between steps vs f32 storage: each
// stored value is rounded to 8 (bf16) or 11 (f16) mantissa bits, ~4e-3 / 5e-4 relative; a few
// decode steps over a few layers keep the logits within 3e-2 of their scale.
constexpr double kStateBf16 = 3e-2;
// Whole models on the cpu kernel table vs the ref table (logits relative to their scale): every
// op's f32 vs double accumulation above, compounded over a few layers and steps (the tiny
// fixtures measure 1e-7 to 2e-6).
constexpr double kModelCpuVsRef = 1e-5;
// The same with bf16 state or KV storage: where the two sides' f32 values straddle a bf16
// rounding boundary, they store values one bf16 step (2^-8 relative) apart, and later steps read
// them. How many values flip depends on the summation order (x86 with and aarch64 without FMA
// contraction in places differ): below 5e-4 on x86 and up to 2.7e-3 on aarch64 (zamba2, bf16
// state and KV). Rounding every stored value instead (bf16 vs f32 KV) moves logits by up to 9e-3.
constexpr double kModelCpuVsRef16BitCache = 1e-2;
// Full model: decode (chunk of 1) vs prefill (chunked SSD) differ only by f32 summation order.
constexpr double kDecodeVsPrefill = 1e-4;
// The same with K and V stored bf16: a decode step's K and V differ from prefill's by that f32
// order (~1e-6), which now and then moves a value across a bf16 rounding boundary, a jump of one
// bf16 step (2^-8 of the value) in that one stored value. Measured up to 1.3e-4 (zamba2, whose
// shared block writes the same rounding into four layers' caches).
constexpr double kDecodeVsPrefillKvBf16 = 1e-3;
// Full model with K and V stored bf16 / f16 vs f32 (logits relative to their scale): every stored
// value is within 2^-9 (bf16, 8 mantissa bits) or 2^-12 (f16, 11 bits) of the f32 one, and a
// logit moves by about that fraction of its scale per attention layer; over bf16 the query is
// rounded to bf16 too (kernels' ops.inc), an error of the same size. Measured on the
// random-weight fixtures: bf16 1.9e-5 (granite) to 1.16e-2 (zamba2, four layers sharing one
// block; 9.2e-3 before the query's rounding), f16 2.6e-6 to 2.3e-3; bounds 2.6x and ~4x the worst.
constexpr double kKvBf16Model = 3e-2;
constexpr double kKvF16Model = 1e-2;

// The same computation in a different f32 summation order (the decode conv's explicit FMAs vs
// the prefill loop where GCC at -O1 does not contract, the sanitizer build; the conv state after
// a split call; the cpu softplus's polynomial against libm): a few ulp of the largest value.
constexpr double kF32Reorder = 1e-6;
// Values copied, not computed (a conv state after a split run), compared as floats.
constexpr double kF32Copy = 1e-7;
// The ref SSD (chunked, f32 explicit loops) and the ref single step against a float64 sequential
// recurrence written in the test: f32 rounding of O(10) terms per output.
constexpr double kSsdRefVsF64 = 1e-6;
// The gated delta rule, ref (sequential, f32 state) and cpu (chunked WY form in f32) against a
// float64 sequential recurrence in the test: normalised keys and beta < 1 keep every term O(1),
// and the chunk's triangular solve adds O(chunk) f32 roundings per output. Reached: ref 9e-8,
// cpu 2.4e-7 (1.1e-5 when the in-chunk decays were differences of two cumulative sums).
constexpr double kGdnRefVsF64 = 1e-6;
constexpr double kGdnScan = 2e-6;
// RoPE and attention against float64 closed forms written in the test (absolute, on O(1)
// values): f32 sin/cos and an f32 softmax.
constexpr double kRopeVsF64 = 1e-5;
constexpr double kAttentionVsF64 = 1e-5;
// The sampler's penalties (one divide or multiply, one multiply-add, in f32) against the same
// formulas in float64 in the test, relative to max(1, |logit|): a few f32 roundings, ~2^-23 each.
constexpr double kPenaltyVsF64 = 1e-6;
// AdamW in f32 against the same update in double over 30 steps, relative to how far the
// parameters moved: a few f32 roundings per step (a 1e-4 error in the step size fails it).
constexpr double kAdamWVsF64 = 2e-5;
// Data parallelism (dist_mpi_test): a gradient summed in f32 per rank shard and then across ranks
// against the same f32 sum over the whole batch in one process (relative to the largest value):
// only the summation order differs, a few f32 roundings (2^-24 each) of terms of the values' size.
constexpr double kDataParallelF32 = 1e-5;
// Backward kernels: ref against central differences of the ref forward along a random direction
// (relative): f32 forward outputs differenced over h = 1e-3 .. 1e-2, plus the O(h^2) curvature.
constexpr double kBackwardVsFiniteDiff = 1e-3;
// cpu backward against ref backward (relative to the largest value): f32 sums against double.
constexpr double kBackwardCpuVsRef = 1e-5;
// RoPE backward as the transpose of the forward: <rope(a), b> against <a, rope_backward(b)>,
// relative to |a| |b|. Each side rounds its rotated vector to f32 (at most 2^-24 of |a| |b|).
constexpr double kRopeTranspose = 1e-6;
// Spot values of activations against published constants (absolute).
constexpr double kActivationSpot = 1e-6;
// vexp / exp16 / vsoftplus against libm in double over their whole argument range (relative):
// the polynomial's error is ~3 ulp of float.
constexpr double kVexp = 4e-7;
constexpr double kVsoftplus = 5e-7;
// vdot of 37 terms against a double sum (absolute, on O(1) terms).
constexpr double kVdot = 1e-5;

// Reading f16 / bf16 stored values back as f32 (safetensors to_f32): round to nearest keeps the
// relative error within half a unit of the last place, 2^-11 (f16, 11 significant bits) and 2^-8
// (bf16, 8 bits); one full unit is allowed, plus 1e-7 absolute for values near zero.
constexpr double kF16Read = 1.0 / 1024;
constexpr double kBf16Read = 1.0 / 128;
// Beam search's accumulated log-probability of 10 tokens against an independent scoring pass:
// the same f32 logits through two log-softmax implementations (absolute).
constexpr double kBeamLogprob = 1e-3;
// A sampled token's frequency over 20,000 draws against its probability: the binomial standard
// deviation is at most 0.0035, so 0.015 is over 4 standard deviations (absolute).
constexpr double kSampleFrequency = 0.015;

}  // namespace hybridlm::tol
