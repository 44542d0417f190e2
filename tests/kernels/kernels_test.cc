// Every CPU kernel against its ref twin on shapes taken from real models, with guard values after
// each output; and the ref SSD (chunked form) against an independent float64 sequential recurrence.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/cpu/attention_avx512.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/ssm_step_avx512.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/kernels.h"
#include "kernels/scratch.h"
#include "numerics.h"

namespace hybridlm {
namespace {

constexpr float kGuard = 12345.678f;

std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}
std::vector<float> uniform(size_t n, uint64_t seed, float lo, float hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Output buffer with guard values after the n elements.
struct Out {
  explicit Out(size_t n) : n(n), v(n + 16, kGuard) {}
  float* data() { return v.data(); }
  void expect_guard() const {
    for (size_t i = n; i < v.size(); ++i) ASSERT_EQ(v[i], kGuard) << "kernel wrote past its output";
  }
  size_t n;
  std::vector<float> v;
};

// max |a - b| / max(1, max |b|); NaN/Inf in either side fails.
double rel_err(const float* a, const float* b, size_t n) {
  double mx = 1, err = 0;
  for (size_t i = 0; i < n; ++i) {
    EXPECT_TRUE(std::isfinite(a[i]) && std::isfinite(b[i])) << "non-finite at " << i;
    mx = std::max(mx, std::fabs(static_cast<double>(b[i])));
    err = std::max(err, std::fabs(static_cast<double>(a[i]) - b[i]));
  }
  return err / mx;
}

class Kernels : public ::testing::Test {
 protected:
  ThreadPool pool{2};
  KernelContext ctx{&pool};
  KernelContext ref_ctx{};
};

// A (rows, cols) f32 matrix quantized to q8_0 rows, as the loader stores it.
struct Q8Matrix {
  Q8Matrix(const std::vector<float>& w, int rows, int cols)
      : rows(rows), cols(cols), codes(q8_code_count(rows, cols)), scales(q8_scale_count(rows, cols)) {
    quantize_q8_0_matrix(w.data(), rows, cols, codes.data(), scales.data());
  }
  WeightView view() const { return {DType::I8, codes.data(), rows, cols, scales.data()}; }
  int rows, cols;
  std::vector<uint8_t> codes;  // biased, in the VNNI panel layout
  std::vector<float> scales;
};

// The same for q4_0.
struct Q4Matrix {
  Q4Matrix(const std::vector<float>& w, int rows, int cols)
      : rows(rows), cols(cols), codes(q4_code_bytes(rows, cols)), scales(q4_scale_count(rows, cols)) {
    quantize_q4_0_matrix(w.data(), rows, cols, codes.data(), scales.data());
  }
  WeightView view() const { return {DType::U8, codes.data(), rows, cols, scales.data()}; }
  int rows, cols;
  std::vector<uint8_t> codes;  // packed nibbles, in the VNNI panel layout
  std::vector<float> scales;
};

// The path the test binary runs is the one HYBRIDLM_CPU_PATH names (ctest runs this file once per
// path), unless the CPU lacks it.
TEST(CpuPath, EnvironmentSelectsThePath) {
  const char* env = std::getenv("HYBRIDLM_CPU_PATH");
  std::printf("cpu path: %s\n", cpu::active_path());
  if (!env) return;
  const std::string want = env;
  const cpu::SimdPath best = cpu::best_simd_path();
  const bool supported = want == "portable" || (want == "avx2" && best != cpu::SimdPath::Portable) ||
                         (want == "avx512" && best == cpu::SimdPath::Avx512);
  if (supported) {
    EXPECT_EQ(std::string(cpu::active_path()), want);
  }
}

TEST(Q8, QuantizeRoundTripsWithinHalfAStep) {
  // 70 values: two full blocks and a partial third, padded to 128 codes.
  auto x = randn(70, 9);
  x[3] = 0.0f;
  x[40] = -5.0f;  // the largest magnitude of block 1: code -127 exactly
  std::vector<int8_t> q(q8_row_stride(70), 99);
  std::vector<float> d(q8_row_blocks(70), -1.0f);
  ASSERT_EQ(q.size(), 128u);
  ASSERT_EQ(d.size(), 4u);
  quantize_q8_0_row(x.data(), 70, q.data(), d.data());
  EXPECT_EQ(q[40], -127);
  EXPECT_FLOAT_EQ(d[1], 5.0f / 127.0f);
  EXPECT_EQ(d[3], 0.0f);  // a block of padding only
  for (int c = 70; c < 128; ++c) ASSERT_EQ(q[c], 0) << "padding code " << c;
  std::vector<float> back(70);
  dequantize_q8_0_row(q.data(), d.data(), 70, back.data());
  for (int c = 0; c < 70; ++c) {
    ASSERT_GE(q[c], -127);
    ASSERT_LE(std::fabs(back[c] - x[c]), 0.5f * d[c / 32] * 1.0001f) << c;
  }
  EXPECT_EQ(back[3], 0.0f);
  // A NaN becomes code 0 (never an undefined conversion) and its block's scale NaN, so it
  // propagates through a matmul as it would with f32 weights; the other codes are quantized
  // against the finite values.
  std::vector<float> z(32, 0.0f);
  z[5] = std::nanf("");
  z[6] = 1.0f;
  quantize_q8_0_row(z.data(), 32, q.data(), d.data());
  EXPECT_EQ(q[5], 0);
  EXPECT_EQ(q[6], 127);
  EXPECT_EQ(q[0], 0);
  EXPECT_TRUE(std::isnan(d[0]));
  // A tiny block (1 / d would overflow) still gets exact codes; an all-zero block scale 0.
  std::vector<float> tiny(32, 0.0f);
  tiny[0] = 1e-38f;
  tiny[1] = -2.5e-39f;
  quantize_q8_0_row(tiny.data(), 32, q.data(), d.data());
  EXPECT_EQ(q[0], 127);
  EXPECT_EQ(q[1], -32);  // -31.75
  EXPECT_EQ(q[2], 0);
  // An infinity: scale inf, code +-127 there and 0 elsewhere (the product stays infinite).
  std::vector<float> inf(32, 1.0f);
  inf[4] = -std::numeric_limits<float>::infinity();
  quantize_q8_0_row(inf.data(), 32, q.data(), d.data());
  EXPECT_EQ(q[4], -127);
  EXPECT_EQ(q[5], 0);
  EXPECT_TRUE(std::isinf(d[0]));
  std::vector<float> zeros(32, 0.0f);
  quantize_q8_0_row(zeros.data(), 32, q.data(), d.data());
  EXPECT_EQ(d[0], 0.0f);
  EXPECT_EQ(q[0], 0);
}

// q4_0 from its definition, written apart from tensor/quant.cc: per block of 32, d = (the first
// value of the largest magnitude) / -8 in f32, and each value's code the c in [0, 15] whose
// (c - 8) * d is nearest to it, ties to the larger c (ggml rounds x / d + 8.5 down), found by
// trying all 16 in long double.
void naive_q4_0(const std::vector<float>& x, int n, std::vector<int>& codes, std::vector<float>& scales) {
  const int blocks = (n + 63) / 64 * 2;
  codes.assign(static_cast<size_t>(blocks) * 32, 8);
  scales.assign(static_cast<size_t>(blocks), 0.0f);
  for (int b = 0; b < blocks; ++b) {
    float top = 0.0f;
    bool bad = false;
    for (int i = b * 32; i < std::min(n, b * 32 + 32); ++i) {
      if (!std::isfinite(x[i])) bad = true;
      else if (std::fabs(x[i]) > std::fabs(top)) top = x[i];
    }
    const float d = top / -8.0f;
    scales[b] = bad ? std::nanf("") : top == 0.0f ? 0.0f : d;
    if (bad || top == 0.0f) continue;
    for (int i = b * 32; i < std::min(n, b * 32 + 32); ++i) {
      long double best = 1e300L;
      for (int c = 0; c < 16; ++c) {
        const long double dist = std::fabs(static_cast<long double>(x[i]) - static_cast<long double>(c - 8) * d);
        if (dist <= best) best = dist, codes[i] = c;
      }
    }
  }
}

TEST(Q4, QuantizeIsTheNearestStepOfTheBlockScale) {
  for (int n : {70, 768, 32}) {
    for (uint64_t seed : {1, 2, 3}) {
      auto x = randn(static_cast<size_t>(n), seed, seed == 3 ? 1e-3f : 1.0f);
      if (n == 70) {
        x[5] = 8.0f, x[6] = -8.0f;  // a tie of magnitudes: the first (+8) sets d = -1
        x[7] = 0.5f, x[8] = -1.5f;  // exact halves of a step: ties to the larger code
        for (int i = 32; i < 64; ++i) x[i] = 0.0f;  // an all-zero block
      }
      std::vector<uint8_t> q(q8_row_stride(n), 99);
      std::vector<float> d(q8_row_blocks(n), -1.0f);
      quantize_q4_0_row(x.data(), n, q.data(), d.data());
      std::vector<int> want;
      std::vector<float> want_d;
      naive_q4_0(x, n, want, want_d);
      ASSERT_EQ(want.size(), q.size());
      for (size_t i = 0; i < q.size(); ++i) ASSERT_EQ(q[i], want[i]) << "n " << n << " seed " << seed << " code " << i;
      for (size_t b = 0; b < d.size(); ++b) ASSERT_EQ(d[b], want_d[b]) << "scale " << b;
      if (n == 70) {
        EXPECT_EQ(d[0], -1.0f);
        EXPECT_EQ(q[5], 0);   // +8 = (0 - 8) * -1
        EXPECT_EQ(q[6], 15);  // -8 is 8 steps up: clamped to 7 (-7)
        EXPECT_EQ(q[7], 8);   // 0.5 = -0.5 steps: halfway between codes 7 and 8
        EXPECT_EQ(q[8], 10);  // -1.5 = 1.5 steps: halfway between 9 and 10
        EXPECT_EQ(d[1], 0.0f);
        EXPECT_EQ(d[3], 0.0f);  // padding only
      }
      // Each value is within half a step of its own, but the one clamped (the largest magnitude's
      // opposite sign reaches 8 steps; q4_0 stops at 7): within a step.
      std::vector<float> back(n);
      dequantize_q4_0_row(q.data(), d.data(), n, back.data());
      for (int c = 0; c < n; ++c) {
        const float step = std::fabs(d[c / 32]);
        ASSERT_LE(std::fabs(back[c] - x[c]), (q[c] == 15 ? 1.0f : 0.5f) * step * 1.0001f) << c;
      }
      // ggml's reference rounds x * (1 / d) + 8.5 in f32: the same codes but at a near-tie,
      // which f32 rounding may push one code over.
      int differ = 0;
      for (int c = 0; c < n; ++c) {
        const float dd = d[c / 32];
        if (dd == 0.0f) continue;
        const volatile float scaled = x[c] * (1.0f / dd);
        const int ggml = std::min(15, static_cast<int>(scaled + 8.5f));
        if (ggml != q[c]) {
          ++differ;
          const double exact = static_cast<double>(x[c]) / dd + 8.5;
          ASSERT_LT(std::fabs(exact - std::round(exact)), 1e-5) << "not a near-tie, col " << c;
          ASSERT_EQ(std::abs(ggml - q[c]), 1);
        }
      }
      EXPECT_LE(differ, n / 16);
    }
  }
  // A NaN or an infinity: the block's scale is NaN (its products NaN), every code 8.
  std::vector<uint8_t> q(64);
  std::vector<float> d(2);
  for (float bad : {std::nanf(""), std::numeric_limits<float>::infinity()}) {
    std::vector<float> z(40, 1.0f);
    z[3] = bad;
    quantize_q4_0_row(z.data(), 40, q.data(), d.data());
    EXPECT_TRUE(std::isnan(d[0]));
    EXPECT_EQ(q[0], 8);
    EXPECT_EQ(d[1], -0.125f);  // the next block is its own
    EXPECT_EQ(q[32], 0);
  }
}

// The panel layout holds every code and scale of every row where q4_byte_index and
// q8_scale_index say (read back by dequantize_q4_0_matrix_row), for ragged rows and columns.
TEST(Q4, MatrixLayoutHoldsEveryRow) {
  for (auto [rows, cols] : {std::pair{37, 96}, std::pair{16, 64}, std::pair{5, 17}}) {
    auto w = randn(static_cast<size_t>(rows) * cols, 4);
    const Q4Matrix m(w, rows, cols);
    std::vector<uint8_t> q(q8_row_stride(cols));
    std::vector<float> d(q8_row_blocks(cols)), want(cols), got(cols);
    for (int r = 0; r < rows; ++r) {
      quantize_q4_0_row(w.data() + static_cast<size_t>(r) * cols, cols, q.data(), d.data());
      dequantize_q4_0_row(q.data(), d.data(), cols, want.data());
      dequantize_q4_0_matrix_row(m.codes.data(), m.scales.data(), r, cols, got.data());
      for (int c = 0; c < cols; ++c) ASSERT_EQ(got[c], want[c]) << rows << "x" << cols << " row " << r << " col " << c;
    }
    // Padding rows and columns: code 8, scale 0 (value 0 either way).
    for (int r = rows; r < q8_padded_rows(rows); ++r)
      for (int c = 0; c < q8_row_stride(cols); ++c) ASSERT_EQ(q4_weight_code(m.codes.data(), r, c, cols), 8);
    for (int r = 0; r < rows; ++r)
      for (int c = cols; c < q8_row_stride(cols); ++c) ASSERT_EQ(q4_weight_code(m.codes.data(), r, c, cols), 8);
  }
}

// The cpu kernels quantize a q8_0 matmul's activations with their own (vectorised) code: bitwise
// the codes and scales of quantize_q8_0_row, including NaN, tiny, zero, halfway and padded blocks.
TEST_F(Kernels, Q8ActivationQuantizationIsBitwiseTheScalarOne) {
  for (int n : {1, 31, 70, 768, 1000}) {
    const int T = 5;
    auto x = randn(static_cast<size_t>(T) * n, 11, 3.0f);
    x[0] = std::nanf("");
    if (n > 40) {
      for (int c = 32; c < 64 && c < n; ++c) x[c] = 0.0f;  // an all-zero block
      x[n + 1] = 1e-38f, x[n + 2] = -2.5e-39f;              // a tiny block in row 1
      x[2 * n + 3] = 127.0f, x[2 * n + 4] = 0.5f, x[2 * n + 5] = -1.5f;  // exact halves: round to even
      x[3 * n + 7] = std::numeric_limits<float>::infinity();
      x[4 * n + 9] = -std::numeric_limits<float>::infinity();
    }
    const int ld = q8_row_stride(n), nb = q8_row_blocks(n);
    std::vector<int8_t> qc(static_cast<size_t>(T) * ld, 99), qr(qc.size(), 98);
    std::vector<float> dc(static_cast<size_t>(T) * nb, -1.0f), dr(dc.size(), -2.0f);
    cpu::quantize_q8_0_rows(ctx, x.data(), T, n, qc.data(), dc.data());
    ref::quantize_q8_0_rows(ref_ctx, x.data(), T, n, qr.data(), dr.data());
    for (size_t i = 0; i < qc.size(); ++i) ASSERT_EQ(qc[i], qr[i]) << "n " << n << " code " << i;
    for (size_t i = 0; i < dc.size(); ++i)
      ASSERT_EQ(std::memcmp(&dc[i], &dr[i], sizeof(float)), 0) << "n " << n << " scale " << i << ": " << dc[i] << " vs "
                                                                << dr[i];
  }
}

struct MatmulCase {
  const char* label;
  int T, rows, cols;
};

TEST_F(Kernels, MatmulMatchesRef) {
  const MatmulCase cases[] = {
      {"decode matvec, mamba-130m in_proj shape", 1, 3072, 768},
      {"decode matvec of 2048 columns: q4_0's 4-panel tiles, then 2 and 1", 1, 100, 2048},
      {"small prefill, odd sizes", 5, 37, 17},
      {"x_proj-like, R+2N rows", 19, 80, 1536},
      {"cols not a multiple of 16", 3, 9, 100},
      {"single column", 4, 7, 1},
      {"tokens not a multiple of the tile", 17, 33, 64},
      {"prefill GEMM: several register tiles, rows and cols ragged", 77, 70, 200},
      {"prefill GEMM: more tokens than one packed block (516)", 530, 40, 33},
      {"2 sequences decoding together", 2, 40, 128},
      {"6 tokens: a q8_0 remainder tile", 6, 24, 64},
      {"7 tokens: a q8_0 remainder tile", 7, 33, 192},
      {"32 sequences decoding together: GEMM tiles of 11, 11 and 10 tokens", 32, 70, 64},
      {"GEMM tiles of 11 and 10 tokens", 21, 40, 48},
      {"a GEMM tile of 10 tokens", 10, 33, 32},
      {"a GEMM tile of 11 tokens", 11, 64, 80},
      {"13 tokens: tiles of 7 and 6", 13, 40, 48},
      {"16 tokens: tiles of 8 and 8", 16, 70, 96},
      {"16 panels, 3 tiles each: the next panel prefetched", 32, 512, 64},
      {"16 panels, one tile of 8 each, prefetching the next panel", 8, 512, 64},
      {"16 panels, one tile of 4 (tile_group), prefetching the next panel", 4, 512, 64},
      {"wide panels by blocks of 512 columns, sums carried over 2 tiles, a ragged last block", 24, 520, 3100},
      {"wide panels by blocks over 4 tiles of 10", 40, 300, 4096},
      {"bf16 panels widened for runs of 4 tiles, read in place for the run of 2", 160, 64, 48},
      {"row-major GEMM: whole 16-column chunks, a last panel of 25 rows", 70, 57, 64},
  };
  for (const auto& c : cases) {
    for (DType dt : {DType::F32, DType::BF16, DType::I8, DType::U8}) {
      const bool quantized = dt == DType::I8 || dt == DType::U8;
      SCOPED_TRACE(std::string(c.label) + " " +
                   (dt == DType::I8 ? "q8_0" : dt == DType::U8 ? "q4_0" : std::string(dtype_name(dt))));
      auto wf = randn(static_cast<size_t>(c.rows) * c.cols, 1, 0.1f);
      std::vector<uint16_t> wb(wf.size());
      for (size_t i = 0; i < wf.size(); ++i) wb[i] = f32_to_bf16(wf[i]);
      const Q8Matrix wq(wf, c.rows, c.cols);
      const Q4Matrix w4(wf, c.rows, c.cols);
      WeightView W{dt, dt == DType::BF16 ? static_cast<const void*>(wb.data()) : wf.data(), c.rows, c.cols};
      if (dt == DType::I8) W = wq.view();
      if (dt == DType::U8) W = w4.view();
      auto x = randn(static_cast<size_t>(c.T) * c.cols, 2);
      auto bias = randn(c.rows, 3);
      Out y(static_cast<size_t>(c.T) * c.rows), yr(static_cast<size_t>(c.T) * c.rows);
      cpu::matmul(ctx, W, bias.data(), x.data(), c.T, y.data());
      ref::matmul(ref_ctx, W, bias.data(), x.data(), c.T, yr.data());
      const double err = rel_err(y.data(), yr.data(), y.n);
      EXPECT_LT(err, dt == DType::BF16 ? tol::kMatmulBF16
                     : dt == DType::I8 ? tol::kMatmulQ8
                     : dt == DType::U8 ? tol::kMatmulQ4
                                       : tol::kMatmulF32);
      y.expect_guard();
      if (quantized) {
        // The quantization error itself: q8_0 / q4_0 weights and q8_0 activations vs the exact f32
        // product.
        Out yf(static_cast<size_t>(c.T) * c.rows);
        ref::matmul(ref_ctx, WeightView{DType::F32, wf.data(), c.rows, c.cols}, bias.data(), x.data(), c.T,
                    yf.data());
        const double qerr = rel_err(y.data(), yf.data(), y.n);
        if (std::getenv("HYBRIDLM_PRINT_ERR"))
          std::printf("%s %s: vs ref %.2e, vs f32 %.2e\n", c.label, dt == DType::U8 ? "q4_0" : "q8_0", err, qerr);
        EXPECT_LT(qerr, dt == DType::U8 ? tol::kQ4VsF32 : tol::kQ8VsF32);
      }
      std::vector<float> pf;
      std::vector<uint16_t> pb;
      WeightView P = W;
      if (!quantized) {
        // The lane-panel layout of copied weights: bitwise the same result as row-major (at every
        // T, where row-major runs the dot tiles below kGemmMinTokens and panels the GEMM tiles).
        pf.assign(panel_count(c.rows, c.cols), 0.0f);
        pb.assign(pf.size(), 0);
        for (int r = 0; r < c.rows; ++r)
          for (int k = 0; k < c.cols; ++k) {
            pf[panel_index(r, k, c.cols)] = wf[static_cast<size_t>(r) * c.cols + k];
            pb[panel_index(r, k, c.cols)] = wb[static_cast<size_t>(r) * c.cols + k];
          }
        P.data = dt == DType::BF16 ? static_cast<const void*>(pb.data()) : pf.data();
        P.panels = true;
        Out yp(y.n), yrp(y.n);
        cpu::matmul(ctx, P, bias.data(), x.data(), c.T, yp.data());
        ref::matmul(ref_ctx, P, bias.data(), x.data(), c.T, yrp.data());
        for (size_t i = 0; i < y.n; ++i) ASSERT_EQ(yp.v[i], y.v[i]) << "panels, output " << i;
        for (size_t i = 0; i < y.n; ++i) ASSERT_EQ(yrp.v[i], yr.v[i]) << "ref panels, output " << i;
        yp.expect_guard();
      }
      // Batch invariance: each token alone gives bitwise the same row (row-major, and for f32 /
      // bf16 the panels too: one token runs its own kernel, packed when cols % 16 != 0).
      for (int t = 0; t < c.T; ++t) {
        std::vector<float> one(c.rows);
        cpu::matmul(ctx, W, bias.data(), x.data() + static_cast<size_t>(t) * c.cols, 1, one.data());
        for (int r = 0; r < c.rows; ++r) ASSERT_EQ(one[r], y.v[static_cast<size_t>(t) * c.rows + r]);
        if (!quantized) {
          std::fill(one.begin(), one.end(), kGuard);  // an output the panel call misses cannot pass
          cpu::matmul(ctx, P, bias.data(), x.data() + static_cast<size_t>(t) * c.cols, 1, one.data());
          for (int r = 0; r < c.rows; ++r) ASSERT_EQ(one[r], y.v[static_cast<size_t>(t) * c.rows + r]) << "panels";
        }
      }
    }
  }
}

// weight_rows: rows [r0, r0 + n) of an f32 / bf16 matrix, row-major or in lane panels, as a view
// of their own. One token's matmul over it, on the calling thread, gives those rows of the whole
// matmul bitwise (Mamba-1's batch-1 decode runs dt_proj that way, a block of rows per thread);
// q8_0 weights and an r0 inside a panel are refused.
TEST_F(Kernels, WeightRowsGiveThoseRowsOfTheWholeMatmulBitwise) {
  const KernelContext one{nullptr};
  for (int cols : {48, 64, 20})
    for (DType dt : {DType::F32, DType::BF16})
      for (bool panels : {false, true}) {  // cols 20: panels padded to 32 columns
        SCOPED_TRACE(std::string(dtype_name(dt)) + (panels ? " panels" : " row-major") + ", cols " +
                     std::to_string(cols));
        const int rows = 300;  // 9 whole panels and a last one of 12 rows
        auto wf = randn(static_cast<size_t>(rows) * cols, 21, 0.1f);
        std::vector<float> pf(panels ? panel_count(rows, cols) : wf.size(), 0.0f);
        std::vector<uint16_t> pb(pf.size(), 0);
        for (int r = 0; r < rows; ++r)
          for (int k = 0; k < cols; ++k) {
            const size_t i = panels ? panel_index(r, k, cols) : static_cast<size_t>(r) * cols + k;
            pf[i] = wf[static_cast<size_t>(r) * cols + k];
            pb[i] = f32_to_bf16(pf[i]);
          }
        WeightView W{dt, dt == DType::BF16 ? static_cast<const void*>(pb.data()) : pf.data(), rows, cols};
        W.panels = panels;
        auto x = randn(cols, 22), bias = randn(rows, 23);
        Out whole(rows);
        cpu::matmul(ctx, W, bias.data(), x.data(), 1, whole.data());
        for (auto [r0, n] : {std::pair{0, 32}, {64, 96}, {288, 12}, {256, 44}, {0, 300}, {32, 20}}) {
          WeightView part;
          ASSERT_TRUE(weight_rows(W, r0, n, part));
          Out y(n);
          cpu::matmul(one, part, bias.data() + r0, x.data(), 1, y.data());
          for (int r = 0; r < n; ++r) ASSERT_EQ(y.v[r], whole.v[r0 + r]) << "row " << r0 + r;
          y.expect_guard();
        }
        WeightView part;
        EXPECT_FALSE(weight_rows(W, 16, 32, part)) << "a first row inside a panel";
        EXPECT_FALSE(weight_rows(W, 288, 13, part)) << "past the last row";
        EXPECT_FALSE(weight_rows(W, -32, 32, part)) << "a negative first row";
        EXPECT_FALSE(weight_rows(W, 0, -1, part)) << "a negative count";
      }
  const auto wf = randn(64 * 64, 24, 0.1f);
  const Q8Matrix wq(wf, 64, 64);
  const Q4Matrix w4(wf, 64, 64);
  WeightView part;
  EXPECT_FALSE(weight_rows(wq.view(), 0, 32, part)) << "q8_0";
  EXPECT_FALSE(weight_rows(w4.view(), 0, 32, part)) << "q4_0";
}

TEST_F(Kernels, RmsNormMatchesRef) {
  for (int T : {7, 41}) {  // 41 rows: more than one thread's grain
    for (int d : {768, 17, 64}) {
      auto x = randn(T * d, 4), w = randn(d, 5);
      Out y(T * d), yr(T * d);
      cpu::rmsnorm(ctx, x.data(), w.data(), T, d, 1e-5f, y.data());
      ref::rmsnorm(ref_ctx, x.data(), w.data(), T, d, 1e-5f, yr.data());
      EXPECT_LT(rel_err(y.data(), yr.data(), y.n), tol::kNorm);
      y.expect_guard();
      cpu::rmsnorm(ctx, x.data(), nullptr, T, d, 1e-6f, y.data());
      ref::rmsnorm(ref_ctx, x.data(), nullptr, T, d, 1e-6f, yr.data());
      EXPECT_LT(rel_err(y.data(), yr.data(), y.n), tol::kNorm);
    }
  }
}

TEST_F(Kernels, GatedRmsNormGroupedAndFull) {
  const int T = 37, d = 96, ld_z = 130;  // 37 rows: more than one thread's grain
  auto y = randn(T * d, 6), z = randn(T * ld_z, 7), w = randn(d, 8);
  for (int gs : {96, 48, 24}) {
    SCOPED_TRACE(gs);
    Out o(T * d), orf(T * d);
    cpu::gated_rmsnorm(ctx, y.data(), z.data(), ld_z, w.data(), T, d, gs, 1e-5f, o.data());
    ref::gated_rmsnorm(ref_ctx, y.data(), z.data(), ld_z, w.data(), T, d, gs, 1e-5f, orf.data());
    EXPECT_LT(rel_err(o.data(), orf.data(), o.n), tol::kNorm);
    o.expect_guard();
  }
  // Grouped and full differ when there is more than one group (the switch matters).
  Out a(T * d), b(T * d);
  ref::gated_rmsnorm(ref_ctx, y.data(), z.data(), ld_z, w.data(), T, d, d, 1e-5f, a.data());
  ref::gated_rmsnorm(ref_ctx, y.data(), z.data(), ld_z, w.data(), T, d, d / 4, 1e-5f, b.data());
  EXPECT_GT(rel_err(a.data(), b.data(), a.n), 1e-3);
}

TEST_F(Kernels, ConvMatchesRefAndCarriesState) {
  for (int K : {4, 2, 1}) {
    for (int T : {1, 3, 11}) {
      SCOPED_TRACE("K=" + std::to_string(K) + " T=" + std::to_string(T));
      const int C = 70, ld_x = 150;
      auto x = randn(T * ld_x, 9), w = randn(C * K, 10), b = randn(C, 11);
      auto s0 = randn((K - 1) * C, 12);
      auto s = s0, sr = s0;
      Out o(T * C), orf(T * C);
      cpu::conv1d_causal(ctx, x.data(), ld_x, w.data(), b.data(), s.data(), T, C, K, true, o.data());
      ref::conv1d_causal(ref_ctx, x.data(), ld_x, w.data(), b.data(), sr.data(), T, C, K, true, orf.data());
      EXPECT_LT(rel_err(o.data(), orf.data(), o.n), tol::kConv);
      EXPECT_LT(rel_err(s.data(), sr.data(), s.size()), tol::kF32Copy);
      o.expect_guard();
      // Conv of T tokens == conv of the first token then the rest, continuing from the state.
      if (T > 1) {
        auto s2 = s0;
        Out o2(T * C);
        cpu::conv1d_causal(ctx, x.data(), ld_x, w.data(), b.data(), s2.data(), 1, C, K, true, o2.data());
        cpu::conv1d_causal(ctx, x.data() + ld_x, ld_x, w.data(), b.data(), s2.data(), T - 1, C, K, true,
                           o2.data() + C);
        EXPECT_LT(rel_err(o2.data(), orf.data(), o2.n), tol::kConv);
        EXPECT_LT(rel_err(s2.data(), sr.data(), s2.size()), tol::kF32Copy);
        // Token by token (the decode kernel; AVX-512 with K = 4: taps transposed in registers)
        // against the reference and against one call of T tokens, with and without bias and
        // activation, on C = 70 (a 3-channel last block per thread) and C = 90 (13: the upper
        // half of the taps' quarters): the state bitwise; the outputs bitwise where both calls
        // run the same loop, and to rounding for the AVX-512 K = 4 kernel, which is bitwise the
        // prefill loop only where the compiler contracts that loop's multiply-add into an FMA
        // (release builds; GCC at -O1, the sanitizer build, does not).
        const bool same_loop = cpu::simd_path() != cpu::SimdPath::Avx512 || K != 4;
        for (int Cd : {70, 90}) {
          auto xd = randn(T * ld_x, 13), wd = randn(Cd * K, 14), bd = randn(Cd, 15), sd = randn((K - 1) * Cd, 16);
          for (bool act : {true, false}) {
            for (const float* bias : {static_cast<const float*>(bd.data()), static_cast<const float*>(nullptr)}) {
              SCOPED_TRACE("C=" + std::to_string(Cd) + (act ? " silu" : " no act") + (bias ? " bias" : " no bias"));
              auto s_all = sd, s_one = sd, s_ref = sd;
              std::vector<float> o_all(T * Cd), o_one(T * Cd), o_ref(T * Cd);
              cpu::conv1d_causal(ctx, xd.data(), ld_x, wd.data(), bias, s_all.data(), T, Cd, K, act, o_all.data());
              ref::conv1d_causal(ref_ctx, xd.data(), ld_x, wd.data(), bias, s_ref.data(), T, Cd, K, act, o_ref.data());
              for (int t = 0; t < T; ++t)
                cpu::conv1d_causal(ctx, xd.data() + t * ld_x, ld_x, wd.data(), bias, s_one.data(), 1, Cd, K, act,
                                   o_one.data() + t * Cd);
              EXPECT_LT(rel_err(o_one.data(), o_ref.data(), o_ref.size()), tol::kConv);
              if (same_loop) EXPECT_EQ(o_one, o_all);
              else EXPECT_LT(rel_err(o_one.data(), o_all.data(), o_all.size()), tol::kF32Reorder);
              EXPECT_EQ(s_one, s_all);
              EXPECT_EQ(s_one, s_ref);
            }
          }
        }
      }
    }
  }
}

TEST_F(Kernels, Mamba1ScanMatchesRef) {
  // d_state 16 (every Mamba-1 checkpoint) and one that is not a multiple of 8; whole blocks of 16
  // channels and a ragged last block.
  for (int N : {16, 12}) {
    for (int T : {1, 2, 37}) {
      for (int I : {48, 40}) {
        SCOPED_TRACE("N=" + std::to_string(N) + " T=" + std::to_string(T) + " I=" + std::to_string(I));
        const int ld_x = 96, ld_bc = N * 2 + 5;
        auto x = randn(T * ld_x, 13), z = randn(T * ld_x, 14), bc = randn(T * ld_bc, 15);
        // dt up to 20 on 40 channels: dt A reaches -160, past exp's clamp at -87.3.
        auto dt = uniform(T * I, 16, 0.001f, I == 40 ? 20.0f : 0.2f);
        auto A = uniform(I * N, 17, -8.0f, -0.5f), D = randn(I, 18);
        auto h0 = randn(I * N, 19);
        auto h = h0, hr = h0;
        Out y(T * I), yr(T * I);
        cpu::mamba1_scan(ctx, x.data(), ld_x, dt.data(), A.data(), bc.data(), bc.data() + N, ld_bc, D.data(),
                         z.data(), ld_x, h.data(), T, I, N, y.data());
        ref::mamba1_scan(ref_ctx, x.data(), ld_x, dt.data(), A.data(), bc.data(), bc.data() + N, ld_bc, D.data(),
                         z.data(), ld_x, hr.data(), T, I, N, yr.data());
        EXPECT_LT(rel_err(y.data(), yr.data(), y.n), tol::kMamba1Scan);
        EXPECT_LT(rel_err(h.data(), hr.data(), h.size()), tol::kMamba1Scan);
        y.expect_guard();
      }
    }
  }
}

// Independent oracle: the sequential Mamba-2 recurrence in double, straight from the definition
// S_t = exp(dt_t A_h) S_{t-1} + dt_t x_t B_t^T, y_t = S_t C_t + D_h x_t.
void ssd_sequential(const std::vector<float>& x, int ld_x, const std::vector<float>& dt, const std::vector<float>& A,
                    const float* B, const float* C, int ld_bc, const std::vector<float>& D, const SsdDims& dm,
                    std::vector<double>& S, int T, std::vector<double>& y) {
  const int nh = dm.n_heads, P = dm.head_dim, N = dm.d_state, hpg = nh / dm.n_groups;
  y.assign(static_cast<size_t>(T) * nh * P, 0);
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < nh; ++h) {
      const int g = h / hpg;
      const double d = dt[t * nh + h], decay = std::exp(d * A[h]);
      for (int p = 0; p < P; ++p) {
        const double xv = x[t * ld_x + h * P + p];
        double acc = 0;
        for (int n = 0; n < N; ++n) {
          double& s = S[(static_cast<size_t>(h) * P + p) * N + n];
          s = decay * s + d * xv * B[t * ld_bc + g * N + n];
          acc += s * C[t * ld_bc + g * N + n];
        }
        y[(static_cast<size_t>(t) * nh + h) * P + p] = acc + D[h] * xv;
      }
    }
}

TEST_F(Kernels, SsdRefEqualsSequentialRecurrenceAndCpuEqualsRef) {
  // Head dims 16, 32, 64 (4-row tiles) and 128 (2-row tiles) take the AVX-512 kernel where it runs;
  // d_state 33, 14, 15 and 13 leave a ragged last block of state rows.
  const SsdDims shapes[] = {{4, 8, 1, 16},  {8, 4, 2, 12},   {6, 16, 3, 8},  {4, 64, 2, 33},
                            {2, 32, 1, 14}, {2, 32, 1, 15}, {2, 128, 1, 13}};
  for (const SsdDims& dm : shapes) {
    for (int T : {1, 7, 16, 37, 130}) {
      for (int chunk : {1, 4, 16, 64}) {
        SCOPED_TRACE("nh=" + std::to_string(dm.n_heads) + " G=" + std::to_string(dm.n_groups) +
                     " T=" + std::to_string(T) + " chunk=" + std::to_string(chunk));
        const int nhP = dm.n_heads * dm.head_dim, GN = dm.n_groups * dm.d_state;
        const int ld_x = nhP + 2 * GN + 3;  // x, B, C live in one row, as in the model
        auto row = randn(static_cast<size_t>(T) * ld_x, 20);
        auto dt = uniform(T * dm.n_heads, 21, 0.001f, 0.3f);
        auto A = uniform(dm.n_heads, 22, -4.0f, -0.2f), D = randn(dm.n_heads, 23);
        const size_t sn = static_cast<size_t>(nhP) * dm.d_state;
        auto S0 = randn(sn, 24, 0.5f);
        std::vector<double> Sd(S0.begin(), S0.end()), yd;
        ssd_sequential(row, ld_x, dt, A, row.data() + nhP, row.data() + nhP + GN, ld_x, D, dm, Sd, T, yd);
        auto Sr = S0, Sc = S0;
        Out yr(static_cast<size_t>(T) * nhP), yc(static_cast<size_t>(T) * nhP);
        ref::ssd_scan(ref_ctx, row.data(), ld_x, dt.data(), A.data(), row.data() + nhP, row.data() + nhP + GN, ld_x,
                      D.data(), dm, chunk, Sr.data(), T, yr.data());
        cpu::ssd_scan(ctx, row.data(), ld_x, dt.data(), A.data(), row.data() + nhP, row.data() + nhP + GN, ld_x,
                      D.data(), dm, chunk, Sc.data(), T, yc.data());
        std::vector<float> yd32(yd.begin(), yd.end()), Sd32(Sd.begin(), Sd.end());
        EXPECT_LT(rel_err(yr.data(), yd32.data(), yr.n), tol::kSsdRefVsF64) << "ref chunked vs sequential";
        EXPECT_LT(rel_err(Sr.data(), Sd32.data(), sn), tol::kSsdRefVsF64);
        EXPECT_LT(rel_err(yc.data(), yd32.data(), yc.n), tol::kSsdScan) << "cpu vs sequential";
        EXPECT_LT(rel_err(Sc.data(), Sd32.data(), sn), tol::kSsdScan);
        yr.expect_guard();
        yc.expect_guard();
      }
    }
  }
}

// Causality, bitwise: outputs before token t do not change when token t's input becomes infinite
// (the register-tiled SSD computes y rows R at a time: 4 for head_dim <= 64, 2 for 128; a later
// row's token must not enter an earlier one, even multiplied by 0). The bad token sits at every
// position of a row block.
TEST_F(Kernels, SsdEarlierOutputsIgnoreLaterTokens) {
  for (const SsdDims& dm : {SsdDims{4, 64, 2, 32}, SsdDims{4, 16, 1, 16}, SsdDims{2, 128, 1, 16}}) {
    for (int bad = 4; bad <= 8; ++bad) {
      SCOPED_TRACE("P=" + std::to_string(dm.head_dim) + " bad=" + std::to_string(bad));
      const int T = 37, chunk = 16, nhP = dm.n_heads * dm.head_dim, GN = dm.n_groups * dm.d_state;
      const int ld_x = nhP + 2 * GN;
      auto row = randn(static_cast<size_t>(T) * ld_x, 40);
      auto dt = uniform(T * dm.n_heads, 41, 0.001f, 0.3f);
      auto A = uniform(dm.n_heads, 42, -4.0f, -0.2f), D = randn(dm.n_heads, 43);
      const size_t sn = static_cast<size_t>(nhP) * dm.d_state;
      auto run = [&](const std::vector<float>& r) {
        std::vector<float> S(sn, 0.0f), y(static_cast<size_t>(T) * nhP);
        cpu::ssd_scan(ctx, r.data(), ld_x, dt.data(), A.data(), r.data() + nhP, r.data() + nhP + GN, ld_x, D.data(),
                      dm, chunk, S.data(), T, y.data());
        return y;
      };
      const auto want = run(row);
      for (int c = 0; c < nhP; ++c) row[static_cast<size_t>(bad) * ld_x + c] = std::numeric_limits<float>::infinity();
      const auto got = run(row);
      for (size_t i = 0; i < static_cast<size_t>(bad) * nhP; ++i) ASSERT_EQ(got[i], want[i]) << "output " << i;
    }
  }
}

// Independent oracle for the discrete Mamba-2 (MOHAWK / Llamba), in double straight from the
// definition: S_t = exp(log_a_t,h) S_{t-1} + x_t B_t^T, y_t = S_t C_t + D_h x_t.
void ssd_discrete_sequential(const std::vector<float>& x, int ld_x, const std::vector<float>& log_a, const float* B,
                             const float* C, int ld_bc, const std::vector<float>& D, const SsdDims& dm,
                             std::vector<double>& S, int T, std::vector<double>& y) {
  const int nh = dm.n_heads, P = dm.head_dim, N = dm.d_state, hpg = nh / dm.n_groups;
  y.assign(static_cast<size_t>(T) * nh * P, 0);
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < nh; ++h) {
      const int g = h / hpg;
      const double decay = std::exp(static_cast<double>(log_a[t * nh + h]));
      for (int p = 0; p < P; ++p) {
        const double xv = x[t * ld_x + h * P + p];
        double acc = 0;
        for (int n = 0; n < N; ++n) {
          double& s = S[(static_cast<size_t>(h) * P + p) * N + n];
          s = decay * s + xv * B[t * ld_bc + g * N + n];
          acc += s * C[t * ld_bc + g * N + n];
        }
        y[(static_cast<size_t>(t) * nh + h) * P + p] = acc + D[h] * xv;
      }
    }
}

// log_a = -softplus(A~) for A~ uniform in [-14, 4]: decays from ~1 - 1e-6 (softplus tiny, where
// the reference code's x / softplus(A~) would blow up) to ~e^-4.
std::vector<float> discrete_log_decay(size_t n, uint64_t seed) {
  std::vector<float> a = uniform(n, seed, -14.0f, 4.0f);
  for (float& v : a) v = static_cast<float>(-std::log1p(std::exp(static_cast<double>(v))));
  return a;
}

TEST_F(Kernels, SsdDiscreteRefEqualsSequentialRecurrenceAndCpuEqualsRef) {
  // Llamba-like (nh = G), grouped, and ragged d_state; a non-zero starting state throughout (the
  // engine continues a prefill from a cached state).
  const SsdDims shapes[] = {{4, 16, 4, 16}, {4, 16, 2, 16}, {8, 4, 2, 12}, {6, 16, 3, 8}, {2, 64, 1, 33}};
  for (const SsdDims& dm : shapes) {
    for (int T : {1, 7, 16, 37, 130}) {
      for (int chunk : {1, 4, 16, 64}) {
        SCOPED_TRACE("nh=" + std::to_string(dm.n_heads) + " G=" + std::to_string(dm.n_groups) +
                     " T=" + std::to_string(T) + " chunk=" + std::to_string(chunk));
        const int nhP = dm.n_heads * dm.head_dim, GN = dm.n_groups * dm.d_state;
        const int ld_x = nhP + 2 * GN + 3;  // x, B, C live in one row, as in the model
        auto row = randn(static_cast<size_t>(T) * ld_x, 120, 0.5f);
        auto log_a = discrete_log_decay(static_cast<size_t>(T) * dm.n_heads, 121);
        auto D = randn(dm.n_heads, 123);
        const size_t sn = static_cast<size_t>(nhP) * dm.d_state;
        auto S0 = randn(sn, 124, 0.5f);
        std::vector<double> Sd(S0.begin(), S0.end()), yd;
        ssd_discrete_sequential(row, ld_x, log_a, row.data() + nhP, row.data() + nhP + GN, ld_x, D, dm, Sd, T, yd);
        auto Sr = S0, Sc = S0;
        Out yr(static_cast<size_t>(T) * nhP), yc(static_cast<size_t>(T) * nhP);
        ref::ssd_scan_discrete(ref_ctx, row.data(), ld_x, log_a.data(), row.data() + nhP, row.data() + nhP + GN, ld_x,
                               D.data(), dm, chunk, Sr.data(), T, yr.data());
        cpu::ssd_scan_discrete(ctx, row.data(), ld_x, log_a.data(), row.data() + nhP, row.data() + nhP + GN, ld_x,
                               D.data(), dm, chunk, Sc.data(), T, yc.data());
        std::vector<float> yd32(yd.begin(), yd.end()), Sd32(Sd.begin(), Sd.end());
        EXPECT_LT(rel_err(yr.data(), yd32.data(), yr.n), tol::kSsdRefVsF64) << "ref chunked vs sequential";
        EXPECT_LT(rel_err(Sr.data(), Sd32.data(), sn), tol::kSsdRefVsF64);
        EXPECT_LT(rel_err(yc.data(), yd32.data(), yc.n), tol::kSsdScan) << "cpu vs sequential";
        EXPECT_LT(rel_err(Sc.data(), Sd32.data(), sn), tol::kSsdScan);
        yr.expect_guard();
        yc.expect_guard();
      }
    }
  }
}

// Decode from the state a chunked prefill left equals the scan over the whole sequence: prefill
// k tokens (chunked), then step one token at a time, on both kernel sets.
TEST_F(Kernels, SsdDiscreteStepsContinueTheChunkedScan) {
  for (const SsdDims& dm : {SsdDims{4, 16, 2, 16}, SsdDims{8, 4, 2, 12}}) {
    const int T = 41, chunk = 16, nhP = dm.n_heads * dm.head_dim, GN = dm.n_groups * dm.d_state;
    const int ld_x = nhP + 2 * GN;
    auto row = randn(static_cast<size_t>(T) * ld_x, 130, 0.5f);
    auto log_a = discrete_log_decay(static_cast<size_t>(T) * dm.n_heads, 131);
    auto D = randn(dm.n_heads, 132);
    const size_t sn = static_cast<size_t>(nhP) * dm.d_state;
    const auto S0 = randn(sn, 133, 0.5f);
    std::vector<double> Sd(S0.begin(), S0.end()), yd;
    ssd_discrete_sequential(row, ld_x, log_a, row.data() + nhP, row.data() + nhP + GN, ld_x, D, dm, Sd, T, yd);
    const std::vector<float> want(yd.begin(), yd.end());
    for (const KernelTable* ops : {&ref_kernels(), &cpu_kernels()}) {
      const KernelContext& c = ops == &ref_kernels() ? ref_ctx : ctx;
      for (int k : {1, 16, 23}) {
        SCOPED_TRACE(std::string(ops->name) + " nh=" + std::to_string(dm.n_heads) + " k=" + std::to_string(k));
        auto S = S0;
        std::vector<float> y(static_cast<size_t>(T) * nhP);
        ops->ssd_scan_discrete(c, row.data(), ld_x, log_a.data(), row.data() + nhP, row.data() + nhP + GN, ld_x,
                               D.data(), dm, chunk, S.data(), k, y.data());
        for (int t = k; t < T; ++t) {
          const float* r = row.data() + static_cast<size_t>(t) * ld_x;
          ops->ssd_step_discrete(c, r, log_a.data() + static_cast<size_t>(t) * dm.n_heads, r + nhP, r + nhP + GN,
                                 D.data(), dm, S.data(), y.data() + static_cast<size_t>(t) * nhP);
        }
        EXPECT_LT(rel_err(y.data(), want.data(), want.size()), tol::kSsdScan);
      }
    }
  }
}

// Independent oracle for the gated delta rule, in double straight from the Qwen3-Next recurrence
// (per value head; q, k l2-normalised with eps 1e-6, q scaled by dk^-1/2):
// S <- exp(g) S; delta = beta (v - S^T k); S <- S + k delta^T; y = S^T q.
void gdn_sequential(const float* q, const float* k, int ld_qk, const float* v, int ld_v, const float* g,
                    const float* beta, const GdnDims& dm, std::vector<double>& S, int T, std::vector<double>& y) {
  const int nv = dm.n_v_heads, dk = dm.k_dim, dv = dm.v_dim, rep = nv / dm.n_k_heads;
  y.assign(static_cast<size_t>(T) * nv * dv, 0);
  std::vector<double> kn(dk), qn(dk), delta(dv);
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < nv; ++h) {
      const size_t off = static_cast<size_t>(t) * ld_qk + static_cast<size_t>(h / rep) * dk;
      double sk = 0, sq = 0;
      for (int d = 0; d < dk; ++d) {
        sk += static_cast<double>(k[off + d]) * k[off + d];
        sq += static_cast<double>(q[off + d]) * q[off + d];
      }
      for (int d = 0; d < dk; ++d) {
        kn[d] = k[off + d] / std::sqrt(sk + 1e-6);
        qn[d] = q[off + d] / std::sqrt(sq + 1e-6) / std::sqrt(static_cast<double>(dk));
      }
      double* Sh = S.data() + static_cast<size_t>(h) * dk * dv;
      const double decay = std::exp(static_cast<double>(g[t * nv + h]));
      for (size_t i = 0; i < static_cast<size_t>(dk) * dv; ++i) Sh[i] *= decay;
      for (int e = 0; e < dv; ++e) {
        double kv = 0;
        for (int d = 0; d < dk; ++d) kv += Sh[d * dv + e] * kn[d];
        delta[e] = beta[t * nv + h] * (v[static_cast<size_t>(t) * ld_v + h * dv + e] - kv);
      }
      for (int d = 0; d < dk; ++d)
        for (int e = 0; e < dv; ++e) Sh[d * dv + e] += kn[d] * delta[e];
      for (int e = 0; e < dv; ++e) {
        double acc = 0;
        for (int d = 0; d < dk; ++d) acc += Sh[d * dv + e] * qn[d];
        y[(static_cast<size_t>(t) * nv + h) * dv + e] = acc;
      }
    }
}

// Inputs of the gated delta rule over T steps as the mixer lays them out: one row per step
// [q (nk*dk) | k (nk*dk) | v (nv*dv) | 3 spare], g = -exp(A_log) softplus(a + dt_bias) with A in
// [0.1, 16] (decays from ~1 to ~e^-50 per step) and beta = sigmoid(b).
struct GdnInputs {
  std::vector<float> row, g, beta;
  int ld = 0;
};
GdnInputs gdn_inputs(const GdnDims& dm, int T, uint64_t seed) {
  GdnInputs in;
  const int nv = dm.n_v_heads;
  in.ld = 2 * dm.n_k_heads * dm.k_dim + nv * dm.v_dim + 3;
  in.row = randn(static_cast<size_t>(T) * in.ld, seed);
  const auto A = uniform(nv, seed + 1, 0.1f, 16.0f);
  const auto a = randn(static_cast<size_t>(T) * nv, seed + 2, 2.0f);
  const auto b = randn(static_cast<size_t>(T) * nv, seed + 3, 2.0f);
  in.g.resize(a.size());
  in.beta.resize(b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    in.g[i] = -A[i % nv] * ref::softplus(a[i]);
    in.beta[i] = 1.0f / (1.0f + std::exp(-b[i]));
  }
  return in;
}

// {nk, nv, dk, dv}: one head, grouped value heads (nv = 2 nk, 4 nk), d_k != d_v, ragged dims.
const GdnDims kGdnShapes[] = {{1, 1, 8, 8}, {2, 4, 16, 8}, {1, 4, 12, 20}, {2, 2, 33, 17}};

TEST_F(Kernels, GatedDeltaRefAndChunkedCpuEqualTheSequentialRecurrence) {
  double worst_ref = 0, worst_cpu = 0;
  for (const GdnDims& dm : kGdnShapes) {
    // Chunk remainders (1, 63, 65, 130) and several whole chunks (128, 192), from a non-zero state.
    for (int T : {1, 5, 63, 64, 65, 128, 130, 192}) {
      for (int chunk : {64, 16}) {
        SCOPED_TRACE("nk=" + std::to_string(dm.n_k_heads) + " nv=" + std::to_string(dm.n_v_heads) +
                     " dk=" + std::to_string(dm.k_dim) + " T=" + std::to_string(T) + " chunk=" + std::to_string(chunk));
        const GdnInputs in = gdn_inputs(dm, T, 150 + T);
        const int nkd = dm.n_k_heads * dm.k_dim, nvd = dm.n_v_heads * dm.v_dim;
        const float *q = in.row.data(), *k = q + nkd, *v = k + nkd;
        const size_t sn = static_cast<size_t>(dm.n_v_heads) * dm.k_dim * dm.v_dim;
        const auto S0 = randn(sn, 151, 0.5f);
        std::vector<double> Sd(S0.begin(), S0.end()), yd;
        gdn_sequential(q, k, in.ld, v, in.ld, in.g.data(), in.beta.data(), dm, Sd, T, yd);
        const std::vector<float> yd32(yd.begin(), yd.end()), Sd32(Sd.begin(), Sd.end());
        auto Sr = S0, Sc = S0;
        Out yr(static_cast<size_t>(T) * nvd), yc(static_cast<size_t>(T) * nvd);
        ref::gated_delta_scan(ref_ctx, q, k, in.ld, v, in.ld, in.g.data(), in.beta.data(), dm, chunk, Sr.data(), T,
                              yr.data());
        cpu::gated_delta_scan(ctx, q, k, in.ld, v, in.ld, in.g.data(), in.beta.data(), dm, chunk, Sc.data(), T,
                              yc.data());
        const double er = std::max(rel_err(yr.data(), yd32.data(), yr.n), rel_err(Sr.data(), Sd32.data(), sn));
        const double ec = std::max(rel_err(yc.data(), yd32.data(), yc.n), rel_err(Sc.data(), Sd32.data(), sn));
        EXPECT_LT(er, tol::kGdnRefVsF64) << "ref vs float64";
        EXPECT_LT(ec, tol::kGdnScan) << "cpu chunked vs float64";
        worst_ref = std::max(worst_ref, er);
        worst_cpu = std::max(worst_cpu, ec);
        yr.expect_guard();
        yc.expect_guard();
      }
    }
  }
  std::printf("gated delta vs float64 recurrence: ref %.2e, cpu chunked %.2e\n", worst_ref, worst_cpu);
}

// Decode from the state a chunked prefill left equals the scan over the whole sequence (prefill
// k tokens, then one step at a time), on both kernel sets; a single step agrees between them.
TEST_F(Kernels, GatedDeltaStepsContinueTheChunkedScan) {
  for (const GdnDims& dm : kGdnShapes) {
    const int T = 77, nkd = dm.n_k_heads * dm.k_dim, nvd = dm.n_v_heads * dm.v_dim;
    const GdnInputs in = gdn_inputs(dm, T, 160);
    const float *q = in.row.data(), *k = q + nkd, *v = k + nkd;
    const size_t sn = static_cast<size_t>(dm.n_v_heads) * dm.k_dim * dm.v_dim;
    const auto S0 = randn(sn, 161, 0.5f);
    std::vector<double> Sd(S0.begin(), S0.end()), yd;
    gdn_sequential(q, k, in.ld, v, in.ld, in.g.data(), in.beta.data(), dm, Sd, T, yd);
    const std::vector<float> want(yd.begin(), yd.end());
    for (const KernelTable* ops : {&ref_kernels(), &cpu_kernels()}) {
      const KernelContext& c = ops == &ref_kernels() ? ref_ctx : ctx;
      for (int split : {0, 1, 64, 70}) {
        SCOPED_TRACE(std::string(ops->name) + " nv=" + std::to_string(dm.n_v_heads) + " split=" + std::to_string(split));
        auto S = S0;
        std::vector<float> y(static_cast<size_t>(T) * nvd);
        if (split > 0)
          ops->gated_delta_scan(c, q, k, in.ld, v, in.ld, in.g.data(), in.beta.data(), dm, 64, S.data(), split,
                                y.data());
        for (int t = split; t < T; ++t) {
          const size_t r = static_cast<size_t>(t) * in.ld;
          ops->gated_delta_step(c, q + r, k + r, v + r, in.g.data() + static_cast<size_t>(t) * dm.n_v_heads,
                                in.beta.data() + static_cast<size_t>(t) * dm.n_v_heads, dm, S.data(),
                                y.data() + static_cast<size_t>(t) * nvd);
        }
        EXPECT_LT(rel_err(y.data(), want.data(), want.size()), tol::kGdnScan);
      }
    }
  }
}

// The inputs of one decode step: row = [x (nh*P) | B (G*N) | C (G*N)], dt, A and D per head.
struct StepInputs {
  std::vector<float> row, dt, A, D;
};
StepInputs step_inputs(const SsdDims& dm, uint32_t seed) {
  const int nhP = dm.n_heads * dm.head_dim, GN = dm.n_groups * dm.d_state;
  return {randn(nhP + 2 * GN, seed), uniform(dm.n_heads, seed + 1, 0.001f, 0.3f),
          uniform(dm.n_heads, seed + 2, -4.0f, -0.2f), randn(dm.n_heads, seed + 3)};
}
// {8, 4, 2, 16}: groups on the AVX-512 step (N % 16 == 0); {8, 4, 2, 12}: groups on the portable one.
const SsdDims kStepShapes[] = {{4, 8, 1, 16}, {8, 4, 2, 12}, {8, 4, 2, 16}, {24, 64, 1, 128}};

TEST_F(Kernels, SsdStepMatchesRefAndTheSequentialRecurrence) {
  for (const SsdDims& dm : kStepShapes) {
    SCOPED_TRACE("nh=" + std::to_string(dm.n_heads) + " N=" + std::to_string(dm.d_state));
    const int nhP = dm.n_heads * dm.head_dim, GN = dm.n_groups * dm.d_state;
    auto [row, dt, A, D] = step_inputs(dm, 40);
    const size_t sn = static_cast<size_t>(nhP) * dm.d_state;
    auto S0 = randn(sn, 44, 0.5f);
    std::vector<double> Sd(S0.begin(), S0.end()), yd;
    ssd_sequential(row, 0, dt, A, row.data() + nhP, row.data() + nhP + GN, 0, D, dm, Sd, 1, yd);
    auto Sr = S0, Sc = S0;
    Out yr(nhP), yc(nhP);
    ref::ssd_step(ref_ctx, row.data(), dt.data(), A.data(), row.data() + nhP, row.data() + nhP + GN, D.data(), dm,
                  Sr.data(), yr.data());
    cpu::ssd_step(ctx, row.data(), dt.data(), A.data(), row.data() + nhP, row.data() + nhP + GN, D.data(), dm,
                  Sc.data(), yc.data());
    std::vector<float> yd32(yd.begin(), yd.end()), Sd32(Sd.begin(), Sd.end());
    EXPECT_LT(rel_err(yr.data(), yd32.data(), nhP), tol::kSsdRefVsF64);
    EXPECT_LT(rel_err(Sr.data(), Sd32.data(), sn), tol::kSsdRefVsF64);
    EXPECT_LT(rel_err(yc.data(), yd32.data(), nhP), tol::kSsdScan);
    EXPECT_LT(rel_err(Sc.data(), Sd32.data(), sn), tol::kSsdScan);
    yr.expect_guard();
    yc.expect_guard();
  }
}

// bf16 state storage updated in place (the cache's --state-dtype bf16 in decode): bitwise the f32
// op on a widened copy followed by rounding the copy (what staging the state in f32 gives), and
// within the f32 tolerance plus one bf16 rounding (2^-8 relative) of the widen-then-ref oracle.
std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = f32_to_bf16(v[i]);
  return out;
}
std::vector<float> from_bf16(const std::vector<uint16_t>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = bf16_to_f32(v[i]);
  return out;
}
constexpr double kBf16Rounding = 1.0 / 256;

TEST_F(Kernels, SsdStepOnBf16StateIsTheF32StepRounded) {
  for (const SsdDims& dm : kStepShapes) {
    SCOPED_TRACE("nh=" + std::to_string(dm.n_heads) + " N=" + std::to_string(dm.d_state));
    const int nhP = dm.n_heads * dm.head_dim, GN = dm.n_groups * dm.d_state;
    auto [row, dt, A, D] = step_inputs(dm, 46);
    const size_t sn = static_cast<size_t>(nhP) * dm.d_state;
    const std::vector<uint16_t> S0 = to_bf16(randn(sn, 50, 0.5f));
    auto staged = from_bf16(S0);
    auto S16 = S0, Sr16 = S0;
    Out ys(nhP), yc(nhP), yr(nhP);
    cpu::ssd_step(ctx, row.data(), dt.data(), A.data(), row.data() + nhP, row.data() + nhP + GN, D.data(), dm,
                  staged.data(), ys.data());
    cpu::ssd_step(ctx, row.data(), dt.data(), A.data(), row.data() + nhP, row.data() + nhP + GN, D.data(), dm,
                       S16.data(), yc.data());
    ref::ssd_step(ref_ctx, row.data(), dt.data(), A.data(), row.data() + nhP, row.data() + nhP + GN, D.data(),
                       dm, Sr16.data(), yr.data());
    for (int i = 0; i < nhP; ++i) ASSERT_EQ(yc.v[i], ys.v[i]) << "y " << i;
    EXPECT_EQ(S16, to_bf16(staged));
    EXPECT_NE(S16, S0) << "the state should advance";
    EXPECT_LT(rel_err(yc.data(), yr.data(), nhP), tol::kSsdScan);
    EXPECT_LT(rel_err(from_bf16(S16).data(), from_bf16(Sr16).data(), sn), tol::kSsdScan + kBf16Rounding);
    yc.expect_guard();
  }
}

// The in-place bf16 rounding lane for lane as f32_to_bf16: a state decaying into subnormals (which
// the AVX-512 conversion instruction would flush) and a NaN row (kept NaN, made quiet).
TEST_F(Kernels, SsdStepBf16RoundingOfSubnormalsAndNaN) {
  const SsdDims dm{2, 4, 1, 32};
  const int nhP = dm.n_heads * dm.head_dim, GN = dm.n_groups * dm.d_state;
  std::vector<float> row(nhP + 2 * GN, 0.0f);  // x = 0: the state only decays
  for (int i = nhP; i < nhP + 2 * GN; ++i) row[i] = 1.0f;
  const std::vector<float> dt(dm.n_heads, 1.0f), A(dm.n_heads, -0.7f), D(dm.n_heads, 0.0f);
  const size_t sn = static_cast<size_t>(nhP) * dm.d_state;
  std::vector<float> s0(sn);
  for (size_t i = 0; i < sn; ++i) s0[i] = std::ldexp(1.0f + static_cast<float>(i % 7) / 8, -120 - static_cast<int>(i % 17));
  s0[5 * dm.d_state + 3] = std::numeric_limits<float>::quiet_NaN();
  // NaNs whose rounding would carry out of the exponent without the NaN select (0x7fffffff would
  // become -0): through B, every state row of the group at that column becomes that NaN.
  const auto nan_bits = [](uint32_t b) { float f; std::memcpy(&f, &b, 4); return f; };
  row[nhP + 9] = nan_bits(0x7fffffffu);
  row[nhP + 17] = nan_bits(0xffffffffu);
  const std::vector<uint16_t> S0 = to_bf16(s0);
  std::vector<float> staged = from_bf16(S0);
  std::vector<uint16_t> S16 = S0;
  std::vector<float> ys(nhP), yc(nhP);
  cpu::ssd_step(ctx, row.data(), dt.data(), A.data(), row.data() + nhP, row.data() + nhP + GN, D.data(), dm,
                staged.data(), ys.data());
  cpu::ssd_step(ctx, row.data(), dt.data(), A.data(), row.data() + nhP, row.data() + nhP + GN, D.data(), dm,
                     S16.data(), yc.data());
  EXPECT_EQ(S16, to_bf16(staged));
  EXPECT_EQ(std::memcmp(ys.data(), yc.data(), sizeof(float) * nhP), 0);
  EXPECT_TRUE(std::isnan(bf16_to_f32(S16[5 * dm.d_state + 3])));
  for (int p = 0; p < nhP; ++p) {
    EXPECT_EQ(S16[static_cast<size_t>(p) * dm.d_state + 9], 0x7fff) << "row " << p;
    EXPECT_EQ(S16[static_cast<size_t>(p) * dm.d_state + 17], 0xffff) << "row " << p;
  }
  size_t subnormal = 0;
  for (uint16_t v : S16) subnormal += std::fpclassify(bf16_to_f32(v)) == FP_SUBNORMAL;
  EXPECT_GT(subnormal, sn / 4) << "the case should exercise subnormal states";
}

// The fused Mamba-2 decode step against the separate ops it replaces (the cpu ones: bitwise, for
// f32 and bf16 state, conv with K = 4 (the AVX-512 decode conv) and K = 3 (the portable loop),
// grouped and whole-row norms, dt clamped at both ends), and the cpu step against the ref step.
TEST_F(Kernels, Mamba2StepIsTheSeparateOpsBitwise) {
  for (const SsdDims& dm : kStepShapes) {
    for (int K : {4, 3}) {
      const int nhP = dm.n_heads * dm.head_dim, GN = dm.n_groups * dm.d_state, C = nhP + 2 * GN;
      const int W = nhP + C + dm.n_heads;
      for (int group : {nhP, nhP / dm.n_groups}) {
        SCOPED_TRACE("nh=" + std::to_string(dm.n_heads) + " N=" + std::to_string(dm.d_state) +
                     " K=" + std::to_string(K) + " group=" + std::to_string(group));
        const auto zxbcdt = randn(W, 60), conv_w = randn(static_cast<size_t>(C) * K, 61, 0.5f);
        const auto conv_b = randn(C, 62);
        auto dt_bias = uniform(dm.n_heads, 63, -3.0f, 0.5f);
        dt_bias[0] = -10.0f, dt_bias[1] = 5.0f;  // below dt_min and above dt_max
        const auto A = uniform(dm.n_heads, 64, -4.0f, -0.2f), D = randn(dm.n_heads, 65);
        const auto norm_w = randn(nhP, 66), conv0 = randn(static_cast<size_t>(K - 1) * C, 67);
        const size_t sn = static_cast<size_t>(nhP) * dm.d_state;
        const auto S0 = randn(sn, 68, 0.5f);
        Mamba2StepParams p;
        p.dims = dm;
        p.conv_w = conv_w.data(), p.conv_b = group == nhP ? conv_b.data() : nullptr, p.d_conv = K;
        p.dt_bias = dt_bias.data(), p.dt_min = 0.05f, p.dt_max = 0.5f;
        p.A = A.data(), p.D = D.data(), p.norm_w = norm_w.data(), p.norm_group = group, p.norm_eps = 1e-5f;
        // The separate ops, as mamba2_forward runs them for a prompt.
        auto separate = [&](auto* S, std::vector<float>& conv, std::vector<float>& xbc, std::vector<float>& dt,
                            std::vector<float>& y, std::vector<float>& out) {
          cpu::conv1d_causal(ctx, zxbcdt.data() + nhP, W, p.conv_w, p.conv_b, conv.data(), 1, C, K, true, xbc.data());
          for (int h = 0; h < dm.n_heads; ++h) dt[h] = zxbcdt[nhP + C + h] + p.dt_bias[h];
          cpu::softplus(ctx, dt.data(), dt.size());
          for (float& v : dt) v = std::clamp(v, p.dt_min, p.dt_max);
          cpu::ssd_step(ctx, xbc.data(), dt.data(), p.A, xbc.data() + nhP, xbc.data() + nhP + GN, p.D, dm, S, y.data());
          cpu::gated_rmsnorm(ctx, y.data(), zxbcdt.data(), W, p.norm_w, 1, nhP, group, p.norm_eps, out.data());
        };
        struct Result {
          std::vector<float> conv, xbc, dt, y, out;
        };
        auto fresh = [&](const std::vector<float>& conv) {
          return Result{conv, std::vector<float>(C), std::vector<float>(dm.n_heads), std::vector<float>(nhP),
                        std::vector<float>(nhP)};
        };
        Result a = fresh(conv0), b = fresh(conv0), r = fresh(conv0);
        auto Sa = S0, Sb = S0, Sr = S0;
        separate(Sa.data(), a.conv, a.xbc, a.dt, a.y, a.out);
        cpu::mamba2_step(ctx, p, zxbcdt.data(), b.conv.data(), Sb.data(), b.xbc.data(), b.dt.data(), b.y.data(),
                         b.out.data());
        ref::mamba2_step(ref_ctx, p, zxbcdt.data(), r.conv.data(), Sr.data(), r.xbc.data(), r.dt.data(), r.y.data(),
                         r.out.data());
        EXPECT_EQ(b.conv, a.conv);
        EXPECT_EQ(b.xbc, a.xbc);
        EXPECT_EQ(b.dt, a.dt);
        EXPECT_EQ(Sb, Sa);
        EXPECT_EQ(b.y, a.y);
        EXPECT_EQ(b.out, a.out);
        EXPECT_TRUE(std::any_of(b.dt.begin(), b.dt.end(), [&](float v) { return v == p.dt_min; }));
        EXPECT_TRUE(std::any_of(b.dt.begin(), b.dt.end(), [&](float v) { return v == p.dt_max; }));
        EXPECT_EQ(b.conv, r.conv);
        EXPECT_LT(rel_err(b.xbc.data(), r.xbc.data(), C), tol::kConv);
        EXPECT_LT(rel_err(b.y.data(), r.y.data(), nhP), tol::kSsdScan);
        EXPECT_LT(rel_err(Sb.data(), Sr.data(), sn), tol::kSsdScan);
        EXPECT_LT(rel_err(b.out.data(), r.out.data(), nhP), tol::kSsdScan);
        // bf16 state: the separate ops on bf16 storage, bitwise too.
        const std::vector<uint16_t> S16 = to_bf16(S0);
        auto Sa16 = S16, Sb16 = S16;
        Result a16 = fresh(conv0), b16 = fresh(conv0);
        separate(Sa16.data(), a16.conv, a16.xbc, a16.dt, a16.y, a16.out);
        cpu::mamba2_step(ctx, p, zxbcdt.data(), b16.conv.data(), Sb16.data(), b16.xbc.data(), b16.dt.data(),
                         b16.y.data(), b16.out.data());
        EXPECT_EQ(Sb16, Sa16);
        EXPECT_NE(Sb16, S16) << "the state should advance";
        EXPECT_EQ(b16.y, a16.y);
        EXPECT_EQ(b16.out, a16.out);
      }
    }
  }
}

TEST_F(Kernels, Mamba1ScanOnBf16StateIsTheF32ScanRounded) {
  for (int N : {16, 12}) {
    for (int T : {1, 9}) {
      SCOPED_TRACE("N=" + std::to_string(N) + " T=" + std::to_string(T));
      const int I = 40, ld_x = 80, ld_bc = N * 2 + 3;
      auto x = randn(T * ld_x, 51), z = randn(T * ld_x, 52), bc = randn(T * ld_bc, 53);
      auto dt = uniform(T * I, 54, 0.001f, 0.2f);
      auto A = uniform(I * N, 55, -8.0f, -0.5f), D = randn(I, 56);
      const std::vector<uint16_t> h0 = to_bf16(randn(I * N, 57));
      auto staged = from_bf16(h0);
      auto h16 = h0, hr16 = h0;
      Out ys(T * I), yc(T * I), yr(T * I);
      cpu::mamba1_scan(ctx, x.data(), ld_x, dt.data(), A.data(), bc.data(), bc.data() + N, ld_bc, D.data(), z.data(),
                       ld_x, staged.data(), T, I, N, ys.data());
      cpu::mamba1_scan(ctx, x.data(), ld_x, dt.data(), A.data(), bc.data(), bc.data() + N, ld_bc, D.data(),
                            z.data(), ld_x, h16.data(), T, I, N, yc.data());
      ref::mamba1_scan(ref_ctx, x.data(), ld_x, dt.data(), A.data(), bc.data(), bc.data() + N, ld_bc, D.data(),
                            z.data(), ld_x, hr16.data(), T, I, N, yr.data());
      for (int i = 0; i < T * I; ++i) ASSERT_EQ(yc.v[i], ys.v[i]) << "y " << i;
      EXPECT_EQ(h16, to_bf16(staged));
      EXPECT_NE(h16, h0) << "the state should advance";
      EXPECT_LT(rel_err(yc.data(), yr.data(), yc.n), tol::kMamba1Scan);
      EXPECT_LT(rel_err(from_bf16(h16).data(), from_bf16(hr16).data(), h16.size()), tol::kMamba1Scan + kBf16Rounding);
      yc.expect_guard();
    }
  }
}

TEST_F(Kernels, SoftplusMatchesRef) {
  auto x = randn(10000, 45, 8.0f);
  x[0] = 25.0f;
  x[1] = -30.0f;
  auto xr = x;
  cpu::softplus(ctx, x.data(), x.size());
  ref::softplus(ref_ctx, xr.data(), xr.size());
  EXPECT_LT(rel_err(x.data(), xr.data(), x.size()), tol::kF32Reorder);
  EXPECT_EQ(x[0], 25.0f);
}

TEST_F(Kernels, EmbeddingMatchesRef) {
  auto E = randn(50 * 24, 25);
  std::vector<uint16_t> Eb(E.size());
  for (size_t i = 0; i < E.size(); ++i) Eb[i] = f32_to_bf16(E[i]);
  const int32_t ids[] = {0, 49, 7, 7};
  const Q8Matrix Eq(E, 50, 24);
  const Q4Matrix E4(E, 50, 24);
  std::vector<float> Ep(panel_count(50, 24), 0.0f);
  std::vector<uint16_t> Epb(panel_count(50, 24), 0);
  for (int r = 0; r < 50; ++r)
    for (int k = 0; k < 24; ++k) {
      Ep[panel_index(r, k, 24)] = E[static_cast<size_t>(r) * 24 + k];
      Epb[panel_index(r, k, 24)] = Eb[static_cast<size_t>(r) * 24 + k];
    }
  Out plain(4 * 24), plain_bf16(4 * 24);
  for (int variant = 0; variant < 6; ++variant) {
    const DType dt = variant == 1 ? DType::BF16 : variant == 2 ? DType::I8 : variant == 5 ? DType::U8 : DType::F32;
    WeightView W{dt, dt == DType::BF16 ? static_cast<const void*>(Eb.data()) : E.data(), 50, 24};
    if (dt == DType::I8) W = Eq.view();
    if (dt == DType::U8) W = E4.view();
    if (variant == 3) W = WeightView{DType::F32, Ep.data(), 50, 24, nullptr, /*panels=*/true};
    if (variant == 4) W = WeightView{DType::BF16, Epb.data(), 50, 24, nullptr, /*panels=*/true};
    Out o(4 * 24), orf(4 * 24);
    cpu::embedding(W, ids, 4, o.data());
    ref::embedding(W, ids, 4, orf.data());
    for (size_t i = 0; i < o.n; ++i) ASSERT_EQ(o.v[i], orf.v[i]);
    o.expect_guard();
    if (variant == 0) plain = o;
    if (variant == 1) plain_bf16 = o;
    if (variant == 3 || variant == 4) {
      const Out& same = variant == 3 ? plain : plain_bf16;
      for (size_t i = 0; i < o.n; ++i) ASSERT_EQ(o.v[i], same.v[i]) << "panel rows are the same rows";
    }
  }
}

// for_panel_row (loading, the embedding lookup) visits a row's columns in order at panel_index's
// positions, for whole and partial chunks and rows in the first, a middle and a ragged panel.
TEST_F(Kernels, PanelRowWalkMatchesPanelIndex) {
  for (int cols : {16, 24, 48, 768}) {
    for (int r : {0, 1, 31, 32, 70}) {
      int next = 0;
      for_panel_row(r, cols, [&](int k, size_t i) {
        ASSERT_EQ(k, next++);
        ASSERT_EQ(i, panel_index(r, k, cols)) << "cols " << cols << " row " << r << " col " << k;
      });
      EXPECT_EQ(next, cols);
    }
  }
}

// RoPE against the complex-number form: pair (j, j + r/2) as a + ib, times e^{i pos theta^(-2j/r)}.
TEST_F(Kernels, RopeMatchesComplexRotation) {
  struct Case { const char* label; int T, pos0, heads, hd, rot; float theta; };
  const Case cases[] = {{"full rotary, Falcon-H1/LFM2 style", 7, 0, 3, 16, 16, 10000.0f},
                        {"partial rotary 0.5, Bamba style, deep position", 5, 70000, 2, 32, 16, 1e6f},
                        {"rotary 0: no positions (Jamba)", 3, 4, 2, 8, 0, 10000.0f}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.label);
    const int ld = c.heads * c.hd + 5;  // a row stride wider than the heads
    auto x = randn(static_cast<size_t>(c.T) * ld, 40);
    auto got = x, want = x;
    cpu::rope(ctx, got.data(), ld, c.T, c.pos0, c.heads, c.hd, c.rot, c.theta);
    ref::rope(ref_ctx, want.data(), ld, c.T, c.pos0, c.heads, c.hd, c.rot, c.theta);
    const int half = c.rot / 2;
    for (int t = 0; t < c.T; ++t)
      for (int h = 0; h < c.heads; ++h)
        for (int i = 0; i < c.hd; ++i) {
          const size_t o = static_cast<size_t>(t) * ld + static_cast<size_t>(h) * c.hd;
          double expect = x[o + i];
          if (i < 2 * half) {
            const int j = i % half;
            const std::complex<double> z(x[o + j], x[o + j + half]);
            const double angle = static_cast<double>(c.pos0 + t) * std::pow(double(c.theta), -2.0 * j / c.rot);
            const std::complex<double> r = z * std::polar(1.0, angle);
            expect = i < half ? r.real() : r.imag();
          }
          ASSERT_NEAR(want[o + i], expect, tol::kRopeVsF64) << "ref t=" << t << " i=" << i;
          ASSERT_NEAR(got[o + i], expect, tol::kRopeVsF64) << "cpu t=" << t << " i=" << i;
        }
  }
}

// A paged KV cache with pages scattered in a pool, filled with random K and V for n tokens, stored
// as `dtype`, token-major (training's views) or with each KV head in its own region of the pool
// (the cache's layout; strides padded so none is a multiple of another): k and v hold the f32
// values (for bf16 / f16 already rounded to that dtype, so the f32 copies are the exact values the
// kernels read), k16 and v16 their 16-bit patterns.
struct PagedFixture {
  PagedFixture(int n_tokens, int block, int kv_heads, int hd, uint64_t seed, DType dtype = DType::F32,
               bool head_regions = false)
      : regions(head_regions) {
    const int n_pages = (n_tokens + block - 1) / block;
    for (int p = 0; p < n_pages; ++p) table.push_back(2 * n_pages - 1 - 2 * p);  // reversed, with gaps
    kv.block_size = block;
    kv.n_kv_heads = kv_heads;
    kv.head_dim = hd;
    kv.dtype = dtype;
    size_t pool;
    if (head_regions) {
      kv.page_stride = static_cast<size_t>(block) * hd + 3;
      kv.token_stride = static_cast<size_t>(hd);
      kv.head_stride = kv.page_stride * 2 * n_pages + 5;
      pool = kv.head_stride * kv_heads;
    } else {
      kv.page_stride = static_cast<size_t>(block) * kv_heads * hd + 3;
      kv.set_token_major();
      pool = kv.page_stride * 2 * n_pages;
    }
    k = randn(pool, seed);
    v = randn(pool, seed + 1);
    if (dtype == DType::F32) {
      kv.k = k.data();
      kv.v = v.data();
    } else {
      auto narrow = [&](std::vector<float>& x, std::vector<uint16_t>& bits) {
        bits.resize(x.size());
        for (size_t i = 0; i < x.size(); ++i) {
          bits[i] = dtype == DType::BF16 ? f32_to_bf16(x[i]) : f32_to_f16(x[i]);
          x[i] = dtype == DType::BF16 ? bf16_to_f32(bits[i]) : f16_to_f32(bits[i]);
        }
      };
      narrow(k, k16);
      narrow(v, v16);
      kv.k = k16.data();
      kv.v = v16.data();
    }
    kv.pages = table.data();
  }
  // Where element i of KV head h of token j lies in k and v, written out for each layout.
  size_t at(int j, int h, int i) const {
    const size_t page = static_cast<size_t>(table[j / kv.block_size]), row = static_cast<size_t>(j % kv.block_size);
    if (regions) return h * kv.head_stride + page * kv.page_stride + row * kv.head_dim + i;
    return page * kv.page_stride + (row * kv.n_kv_heads + h) * kv.head_dim + i;
  }
  // The other layout holding the same values for every (token, head): the pool's other positions
  // keep the fixture's random fill.
  PagedFixture relaid(int n_tokens, uint64_t seed) const {
    PagedFixture o(n_tokens, kv.block_size, kv.n_kv_heads, kv.head_dim, seed, kv.dtype, !regions);
    for (int j = 0; j < n_tokens; ++j)
      for (int h = 0; h < kv.n_kv_heads; ++h)
        for (int i = 0; i < kv.head_dim; ++i) {
          o.k[o.at(j, h, i)] = k[at(j, h, i)];
          o.v[o.at(j, h, i)] = v[at(j, h, i)];
          if (kv.dtype != DType::F32) {
            o.k16[o.at(j, h, i)] = k16[at(j, h, i)];
            o.v16[o.at(j, h, i)] = v16[at(j, h, i)];
          }
        }
    return o;
  }
  // The same values as an f32 cache (for bf16 / f16: the widened stored values).
  PagedKv as_f32() {
    PagedKv f = kv;
    f.dtype = DType::F32;
    f.k = k.data();
    f.v = v.data();
    return f;
  }
  bool regions;
  std::vector<int32_t> table;
  std::vector<float> k, v;
  std::vector<uint16_t> k16, v16;
  PagedKv kv;
};

// A head split that would leave query heads unwritten (heads not a multiple of the KV heads, no KV
// heads) or a head_dim the kernels cannot take is refused with an error naming it, before any
// output is written, on whichever path runs.
TEST_F(Kernels, AttentionRefusesImpossibleHeadSplits) {
  PagedFixture f(4, 16, 2, 32, 60);
  auto q = randn(static_cast<size_t>(4) * 3 * 32, 61);
  struct Bad { const char* label; int heads, kv_heads, hd; const char* says; };
  const Bad bad[] = {{"3 heads over 2 KV heads", 3, 2, 32, "3 heads over 2 KV heads"},
                     {"no KV heads", 2, 0, 32, "2 heads over 0 KV heads"},
                     {"head_dim 0", 2, 2, 0, "head_dim 0 outside"}};
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.label);
    PagedKv kv = f.kv;
    kv.n_kv_heads = b.kv_heads;
    kv.head_dim = b.hd;
    std::vector<float> out(static_cast<size_t>(4) * 3 * 32, 7.0f);
    try {
      cpu::attention(ctx, q.data(), 3 * 32, kv, 0, 4, b.heads, 0.1f, out.data());
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(b.says), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << "one line";
    }
    for (float x : out) ASSERT_EQ(x, 7.0f) << "output written before the refusal";
  }
  // A view whose layout was never set (no token or head stride) is refused, by the kernels and by
  // store / load, rather than read or written at one spot.
  PagedKv unset = f.kv;
  unset.token_stride = 0;
  unset.head_stride = 0;
  std::vector<float> out(static_cast<size_t>(4) * 2 * 32, 7.0f), row(2 * 32);
  for (bool use_ref : {false, true}) {
    try {
      if (use_ref)
        ref::attention(ref_ctx, q.data(), 3 * 32, unset, 0, 4, 2, 0.1f, out.data());
      else
        cpu::attention(ctx, q.data(), 3 * 32, unset, 0, 4, 2, 0.1f, out.data());
      ADD_FAILURE() << "accepted an unset layout";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("KV layout unset"), std::string::npos) << e.what();
    }
  }
  for (float x : out) ASSERT_EQ(x, 7.0f) << "output written before the refusal";
  EXPECT_THROW(unset.store(0, row.data(), row.data()), Error);
  EXPECT_THROW(unset.load_k(0, row.data()), Error);
}

TEST_F(Kernels, AttentionMatchesRefAndDenseSoftmax) {
  struct Case { const char* label; int pos0, T, heads, kv_heads, hd, block; };
  const Case cases[] = {{"prefill from empty, GQA 4:2, pages of 16", 0, 37, 4, 2, 16, 16},
                        {"decode at a page boundary", 32, 1, 4, 2, 16, 16},
                        {"decode one past a boundary", 33, 1, 4, 4, 8, 16},
                        {"continuation chunk over 300 keys, MQA, pages of 5", 270, 40, 3, 1, 24, 5},
                        {"block size 1", 3, 4, 2, 1, 8, 1},
                        {"decode over 1000 keys, 12 query heads on one KV head (two items)", 999, 1, 12, 1, 64, 16},
                        {"head_dim 256, GQA 16:2, queries across a tile boundary", 60, 8, 16, 2, 256, 32}};
  for (const Case& c : cases)
    for (bool head_regions : {false, true}) {
      SCOPED_TRACE(std::string(c.label) + (head_regions ? ", head regions" : ", token-major"));
      PagedFixture f(c.pos0 + c.T, c.block, c.kv_heads, c.hd, 50, DType::F32, head_regions);
      const int ld = c.heads * c.hd + 7;
      auto q = randn(static_cast<size_t>(c.T) * ld, 52, 0.5f);
      const size_t n = static_cast<size_t>(c.T) * c.heads * c.hd;
      const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
      Out got(n), want(n), other(n);
      cpu::attention(ctx, q.data(), ld, f.kv, c.pos0, c.T, c.heads, scale, got.data());
      ref::attention(ref_ctx, q.data(), ld, f.kv, c.pos0, c.T, c.heads, scale, want.data());
      got.expect_guard();
      EXPECT_LT(rel_err(got.data(), want.data(), n), tol::kAttention);
      // The layout moves the rows, not the arithmetic: the same values laid out the other way
      // give bitwise the same result.
      PagedFixture g = f.relaid(c.pos0 + c.T, 51);
      cpu::attention(ctx, q.data(), ld, g.kv, c.pos0, c.T, c.heads, scale, other.data());
      EXPECT_EQ(std::memcmp(got.data(), other.data(), n * sizeof(float)), 0) << "the other layout";
      // Independent check of one (query, head): the softmax written out densely.
      const int t = c.T - 1, h = c.heads - 1, kvh = h / (c.heads / c.kv_heads), n_keys = c.pos0 + t + 1;
      std::vector<double> p(n_keys);
      double mx = -1e300, sum = 0;
      for (int j = 0; j < n_keys; ++j) {
        double d = 0;
        for (int i = 0; i < c.hd; ++i)
          d += double(q[static_cast<size_t>(t) * ld + h * c.hd + i]) * f.k[f.at(j, kvh, i)];
        mx = std::max(mx, p[j] = d * scale);
      }
      for (double& x : p) sum += (x = std::exp(x - mx));
      for (int i = 0; i < c.hd; ++i) {
        double o = 0;
        for (int j = 0; j < n_keys; ++j) o += p[j] / sum * f.v[f.at(j, kvh, i)];
        EXPECT_NEAR(want.v[static_cast<size_t>(t) * c.heads * c.hd + h * c.hd + i], o, tol::kAttentionVsF64);
      }
    }
}

// bf16 / f16 KV pages: the cpu kernel reads each stored element in place (no copy of the cache).
// Over bf16 keys the query is rounded to bf16 first (ops.inc). Against ref reading the same
// pages: the f32 tolerance. Against the same kernel over f32 pages holding the widened values, with
// the query rounded beforehand for bf16: bitwise where the arithmetic is f32 multiply-adds (f16;
// bf16 on the portable path, or with the bf16 dot products turned off), within the f32 tolerance
// with them (vdpbf16ps rounds its sums its own way); and ref does exactly that f32 math on the
// rounded query (bitwise). Against attention over the unrounded f32 K and V and query:
// tol::kAttentionKvBf16 / kAttentionKvF16, the rounding of the stored values (and of the query).
// Turns the AVX-512 kernel's bf16 dot products on or off for a scope; on again after it, however
// the scope ends.
struct Bf16DotScope {
  explicit Bf16DotScope(bool on) { cpu::attention_avx512_bf16_dot(on); }
  ~Bf16DotScope() { cpu::attention_avx512_bf16_dot(true); }
  Bf16DotScope(const Bf16DotScope&) = delete;
  Bf16DotScope& operator=(const Bf16DotScope&) = delete;
};

TEST_F(Kernels, AttentionOverBf16AndF16KvPages) {
  struct Case {
    const char* label;
    int pos0, T, heads, kv_heads, hd, block;
  };
  const Case cases[] = {{"prefill from empty, GQA 4:2, pages of 16", 0, 37, 4, 2, 16, 16},
                        {"decode at a page boundary, head_dim 128", 32, 1, 4, 2, 128, 16},
                        {"continuation chunk over 300 keys, MQA, head_dim 24, pages of 5", 270, 40, 3, 1, 24, 5},
                        {"decode over 1000 keys, head_dim 64", 999, 1, 8, 2, 64, 16},
                        {"prefill over 130 keys, head_dim 256, 5 heads on 1", 60, 70, 5, 1, 256, 16},
                        {"decode over 200 keys, head_dim 96, 5 heads on 1", 199, 1, 5, 1, 96, 16},
                        {"decode over 77 keys, head_dim 128, 7 heads on 1", 76, 1, 7, 1, 128, 16}};
  int dot_differs = 0;  // bf16 cases where the dot products gave other bits than the f32 path
  for (DType dt : {DType::BF16, DType::F16})
    for (const Case& c : cases)
      for (bool head_regions : {false, true})
        for (bool dot : {true, false}) {
          if (dt == DType::F16 && !dot) continue;
          SCOPED_TRACE(std::string(dtype_name(dt)) + ": " + c.label +
                       (head_regions ? ", head regions" : ", token-major") + (dot ? "" : ", bf16 dot products off"));
          Bf16DotScope scope(dot);
          PagedFixture exact(c.pos0 + c.T, c.block, c.kv_heads, c.hd, 50, DType::F32, head_regions);
          PagedFixture f(c.pos0 + c.T, c.block, c.kv_heads, c.hd, 50, dt, head_regions);
          const int ld = c.heads * c.hd + 7;
          auto q = randn(static_cast<size_t>(c.T) * ld, 52, 0.5f);
          auto qr = q;  // the query the kernels use over these pages
          if (dt == DType::BF16)
            for (float& x : qr) x = bf16_to_f32(f32_to_bf16(x));
          const size_t n = static_cast<size_t>(c.T) * c.heads * c.hd;
          const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
          Out got(n), want(n), widened(n), want_widened(n), full(n);
          cpu::attention(ctx, q.data(), ld, f.kv, c.pos0, c.T, c.heads, scale, got.data());
          ref::attention(ref_ctx, q.data(), ld, f.kv, c.pos0, c.T, c.heads, scale, want.data());
          cpu::attention(ctx, qr.data(), ld, f.as_f32(), c.pos0, c.T, c.heads, scale, widened.data());
          ref::attention(ref_ctx, qr.data(), ld, f.as_f32(), c.pos0, c.T, c.heads, scale, want_widened.data());
          ref::attention(ref_ctx, q.data(), ld, exact.kv, c.pos0, c.T, c.heads, scale, full.data());
          got.expect_guard();
          EXPECT_LT(rel_err(got.data(), want.data(), n), tol::kAttention);
          EXPECT_EQ(std::memcmp(want.data(), want_widened.data(), n * sizeof(float)), 0)
              << "ref over 16-bit pages must be ref over f32 pages of the widened values (and rounded query)";
          const bool dot_products =
              dt == DType::BF16 && dot && cpu::has_avx512_bf16() && c.hd % 32 == 0 && c.hd <= 256;
          if (dot_products) {
            EXPECT_LT(rel_err(got.data(), widened.data(), n), tol::kAttention);
            dot_differs += std::memcmp(got.data(), widened.data(), n * sizeof(float)) != 0;
          } else {
            EXPECT_EQ(std::memcmp(got.data(), widened.data(), n * sizeof(float)), 0)
                << "16-bit pages must give the f32 kernel's result on the widened values (and rounded query)";
          }
          const double err = rel_err(want.data(), full.data(), n);
          if (dot)
            std::printf("%s %s%s: vs f32 KV %.2e\n", dtype_name(dt).data(), c.label,
                        head_regions ? " (head regions)" : "", err);
          EXPECT_LT(err, dt == DType::BF16 ? tol::kAttentionKvBf16 : tol::kAttentionKvF16);
        }
  // Where the CPU has them, the dot products ran (their sums round otherwise than the f32 path's).
  if (cpu::has_avx512_bf16()) {
    EXPECT_GT(dot_differs, 0) << "the bf16 dot products never ran";
  }
}

// Decode == prefill inside the kernel, at every KV dtype: T queries in one call give bitwise what T
// single-query calls at positions pos0, pos0 + 1, ... give (each (query, head) is computed whole,
// over the same key tiles).
TEST_F(Kernels, AttentionOneCallEqualsOneQueryAtATime) {
  const int T = 23, block = 16;
  // AVX-512: value pieces of 32 and of 64 per pass in prefill blocks; from 62, the first query's
  // keys end one short of a 64-key tile that the block's later queries reach. Decode takes the
  // scores of up to 4 query heads of a KV head together and the value sums of up to 8 / 4 / 2 per
  // pass over 32 / 64 / 96-128 dims (head_dim 160: a pass of 128, then one of 32): query heads
  // per KV head 1, 2, 3, 5, 7 and 8 reach groups of every size and their remainders.
  struct Heads {
    int heads, kv_heads;
  };
  for (auto [heads, kv_heads] : {Heads{4, 2}, Heads{2, 2}, Heads{6, 2}, Heads{5, 1}, Heads{7, 1}, Heads{8, 1}})
    for (int hd : {32, 64, 96, 128, 160, 256})
      for (int pos0 : {62, 70})
        for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
          const bool head_regions = (hd / 32 + pos0 / 8) % 2 == 0;  // each layout at every head_dim and split
          // bf16: the dot products (AVX512-BF16) at one start, multiply-adds of the rounded query at the other.
          Bf16DotScope scope(pos0 == 62);
          SCOPED_TRACE(std::string(dtype_name(dt)) + " head_dim " + std::to_string(hd) + " from " +
                       std::to_string(pos0) + ", " + std::to_string(heads) + " heads on " + std::to_string(kv_heads) +
                       (head_regions ? ", head regions" : ", token-major"));
          PagedFixture f(pos0 + T, block, kv_heads, hd, 53, dt, head_regions);
          const int ld = heads * hd;
          auto q = randn(static_cast<size_t>(T) * ld, 54, 0.5f);
          const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
          std::vector<float> all(static_cast<size_t>(T) * ld), one(all.size());
          cpu::attention(ctx, q.data(), ld, f.kv, pos0, T, heads, scale, all.data());
          for (int t = 0; t < T; ++t)
            cpu::attention(ctx, q.data() + static_cast<size_t>(t) * ld, ld, f.kv, pos0 + t, 1, heads, scale,
                           one.data() + static_cast<size_t>(t) * ld);
          EXPECT_EQ(all, one);
        }
}

// Storing a row rounds each value to the page dtype to nearest even (tensor/dtype.h), loading
// widens it exactly; f32 pages keep the bits.
TEST(PagedKvRows, StoreRoundsToNearestEvenAndLoadWidens) {
  const int32_t table[2] = {1, 0};
  // 1 + 2^-8 is halfway between bf16 1 and 1 + 2^-7: even is 1. 1 + 3 * 2^-8: even is 1 + 2^-6.
  // 1 + 2^-11 is halfway between f16 1 and 1 + 2^-10: even is 1.
  const float k_in[4] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-11f, -3.0e-7f};
  const float v_in[4] = {65504.0f, 1.0e-8f, 0.1f, -2.5f};
  for (bool head_regions : {false, true})
    for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + (head_regions ? ", head regions" : ", token-major"));
      std::vector<uint8_t> k(2 * 2 * 4 * dtype_size(dt), 0xee), v(k.size(), 0xee);
      PagedKv kv;
      kv.k = k.data();
      kv.v = v.data();
      kv.pages = table;
      kv.block_size = 2;
      kv.n_kv_heads = 2;
      kv.head_dim = 2;
      kv.dtype = dt;
      if (head_regions) {  // each head a region of 2 pages of 2 rows x 2
        kv.page_stride = 4;
        kv.token_stride = 2;
        kv.head_stride = 8;
      } else {
        kv.page_stride = 8;  // a page: 2 rows of 2 heads x 2
        kv.set_token_major();
      }
      kv.store(3, k_in, v_in);  // page 0 (table[1]), row 1
      float k_out[4], v_out[4];
      kv.load_k(3, k_out);
      kv.load_v(3, v_out);
      auto rounded = [&](float x) {
        if (dt == DType::BF16) return bf16_to_f32(f32_to_bf16(x));
        if (dt == DType::F16) return f16_to_f32(f32_to_f16(x));
        return x;
      };
      for (int i = 0; i < 4; ++i) {
        EXPECT_EQ(k_out[i], rounded(k_in[i])) << i;
        EXPECT_EQ(v_out[i], rounded(v_in[i])) << i;
      }
      if (dt == DType::BF16) {
        EXPECT_EQ(k_out[0], 1.0f);
        EXPECT_EQ(k_out[1], 1.0f + 0x1p-6f);
      }
      if (dt == DType::F16) {
        EXPECT_EQ(k_out[2], 1.0f);
      }
      // Where token 3's elements went, page 0: token-major, row 1 (elements 4-7); head regions,
      // row 1 of page 0 of head 0 (elements 2, 3) and of head 1 (10, 11). Nothing else was written.
      const int where[4] = {head_regions ? 2 : 4, head_regions ? 3 : 5, head_regions ? 10 : 6, head_regions ? 11 : 7};
      if (dt == DType::F32)
        for (int i = 0; i < 4; ++i) {
          float x;
          std::memcpy(&x, k.data() + 4 * where[i], 4);
          EXPECT_EQ(x, k_in[i]) << "K element " << i;
        }
      for (size_t b = 0; b < k.size(); ++b) {
        const size_t e = b / dtype_size(dt);
        if (std::find(where, where + 4, static_cast<int>(e)) == where + 4) {
          EXPECT_EQ(k[b], 0xee) << "byte " << b;
          EXPECT_EQ(v[b], 0xee) << "byte " << b;
        }
      }
    }
}

TEST_F(Kernels, ActivationsMatchRef) {
  const int T = 9, d = 37, ld = 50;
  auto a = randn(static_cast<size_t>(T) * ld, 60, 2.0f), b = randn(static_cast<size_t>(T) * ld, 61);
  for (Activation act : {Activation::Silu, Activation::Gelu, Activation::Relu2})
    for (const float* gate : {static_cast<const float*>(nullptr), static_cast<const float*>(b.data())}) {
      Out got(static_cast<size_t>(T) * d), want(static_cast<size_t>(T) * d);
      cpu::activation(ctx, act, a.data(), gate, ld, T, d, got.data());
      ref::activation(ref_ctx, act, a.data(), gate, ld, T, d, want.data());
      got.expect_guard();
      EXPECT_LT(rel_err(got.data(), want.data(), got.n), tol::kNorm);
    }
  // Spot values: gelu(1) = 0.8413447, relu2(-1) = 0, relu2(3) = 9.
  float x[3] = {1.0f, -1.0f, 3.0f}, y[3];
  ref::activation(ref_ctx, Activation::Gelu, x, nullptr, 1, 1, 1, y);
  EXPECT_NEAR(y[0], 0.8413447f, tol::kActivationSpot);
  ref::activation(ref_ctx, Activation::Relu2, x, nullptr, 3, 1, 3, y);
  EXPECT_EQ(y[1], 0.0f);
  EXPECT_EQ(y[2], 9.0f);
}

// vf16_to_f32 (the attention kernel's widening of f16 KV) against tensor/dtype.h's f16_to_f32 over
// every f16 bit pattern: bitwise for numbers (zeros, subnormals, infinities), NaN for NaN.
TEST(VecMath, F16WideningIsExactForEveryPattern) {
  for (uint32_t h = 0; h <= 0xffffu; ++h) {
    const float want = f16_to_f32(static_cast<uint16_t>(h)), got = cpu::vf16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << h;
    } else {
      uint32_t a, b;
      std::memcpy(&a, &want, 4);
      std::memcpy(&b, &got, 4);
      ASSERT_EQ(a, b) << std::hex << h;
    }
  }
}

TEST(VecMath, ExpMatchesLibmWithinFewUlp) {
  double worst = 0;
  for (double x = -87.0; x <= 88.0; x += 0.000731) {
    const float xf = static_cast<float>(x);
    const double want = std::exp(static_cast<double>(xf));
    worst = std::max(worst, std::fabs(cpu::vexp(xf) - want) / want);
  }
  EXPECT_LT(worst, tol::kVexp);
  EXPECT_GT(cpu::vexp(-1000.0f), 0.0f);
  EXPECT_TRUE(std::isfinite(cpu::vexp(1000.0f)));
  EXPECT_EQ(cpu::vexp(0.0f), 1.0f);
  EXPECT_TRUE(std::isnan(cpu::vexp(std::nanf(""))));
  if (cpu::simd_path() == cpu::SimdPath::Avx512) {
    // exp16, the AVX-512 Mamba-1 scan's exp: the same bound, clamps and NaN.
    std::vector<float> xs, ys;
    for (double x = -87.0; x <= 88.0; x += 0.000731) xs.push_back(static_cast<float>(x));
    xs.insert(xs.end(), {-1000.0f, 1000.0f, 0.0f, std::nanf(""), -87.3f, 88.0f});
    ys.resize(xs.size());
    cpu::exp_avx512(xs.data(), xs.size() - 5, ys.data());  // a ragged tail of 16 lanes
    cpu::exp_avx512(xs.data() + xs.size() - 5, 5, ys.data() + xs.size() - 5);
    double worst16 = 0;
    for (size_t i = 0; i + 6 < xs.size(); ++i) {
      const double want = std::exp(static_cast<double>(xs[i]));
      worst16 = std::max(worst16, std::fabs(ys[i] - want) / want);
    }
    EXPECT_LT(worst16, tol::kVexp);
    const size_t e = xs.size();
    EXPECT_GT(ys[e - 6], 0.0f);
    EXPECT_TRUE(std::isfinite(ys[e - 5]));
    EXPECT_EQ(ys[e - 4], 1.0f);
    EXPECT_TRUE(std::isnan(ys[e - 3]));
    EXPECT_EQ(ys[e - 6], ys[e - 2]) << "below -87.3 clamps";
    EXPECT_EQ(ys[e - 5], ys[e - 1]) << "above 88 clamps";
  }
  // softplus against log1p(exp(x)) in double: relative error over [-80, 20] (below ~-87 vexp clamps
  // and the result floors at ~1e-38, see numerics.md; above 20 x passes through).
  double worst_sp = 0;
  for (double x = -80.0; x <= 20.0; x += 0.000377) {
    const float xf = static_cast<float>(x);
    const double want = std::log1p(std::exp(static_cast<double>(xf)));
    worst_sp = std::max(worst_sp, std::fabs(cpu::vsoftplus(xf) - want) / want);
  }
  EXPECT_LT(worst_sp, tol::kVsoftplus);
  EXPECT_EQ(cpu::vsoftplus(25.0f), 25.0f);
  EXPECT_EQ(cpu::vsoftplus(std::numeric_limits<float>::infinity()), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(cpu::vsoftplus(std::nanf(""))));
  EXPECT_GE(cpu::vsoftplus(-std::numeric_limits<float>::infinity()), 0.0f);
  std::vector<float> a = randn(37, 30), b = randn(37, 31);
  double want = 0;
  for (int i = 0; i < 37; ++i) want += static_cast<double>(a[i]) * b[i];
  EXPECT_NEAR(cpu::vdot(a.data(), b.data(), 37), want, tol::kVdot);
}

TEST(Dtype, Bf16AndF16RoundTrips) {
  for (float f : {0.0f, 1.0f, -2.5f, 3.14159f, 1e-3f, 65504.0f, 6.1e-5f, 1e-7f}) {
    EXPECT_NEAR(bf16_to_f32(f32_to_bf16(f)), f, tol::kBf16Read * std::fabs(f) + 1e-30);
    EXPECT_NEAR(f16_to_f32(f32_to_f16(f)), f, tol::kF16Read * std::fabs(f) + 6e-8);
  }
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  // Bits worked out by hand: ties go to the even neighbour, NaN (also signalling) comes out quiet,
  // overflow rounds to infinity, the sign of zero is kept.
  auto from_bits = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  };
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808000u)), 0x3f80);  // 1 + 2^-8: tie, 0x3f80 is even
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f818000u)), 0x3f82);  // 1 + 3 * 2^-8: tie, up to even
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808001u)), 0x3f81);  // just above the tie
  EXPECT_EQ(f32_to_bf16(from_bits(0x7fc00000u)), 0x7fc0);
  EXPECT_EQ(f32_to_bf16(from_bits(0x7f800001u)), 0x7fc0);
  EXPECT_EQ(f32_to_bf16(from_bits(0x7f800000u)), 0x7f80);
  EXPECT_EQ(f32_to_bf16(from_bits(0x7f7fc99eu)), 0x7f80);  // 3.4e38 rounds to infinity
  EXPECT_EQ(f32_to_bf16(from_bits(0x80000000u)), 0x8000);
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
}

// ---- per-thread kernel scratch (kernels/scratch.h) ----------------------------------------------

TEST(KernelScratch, FramesNestRewindAndRefuseOverrun) {
  ThreadPool pool(2);
  KernelScratch scratch;
  scratch.reserve(2, {64, 32});
  const KernelContext ctx{&pool, &cpu_kernels(), &scratch};
  {
    ScratchFrame outer(ctx);
    EXPECT_NE(outer.take(16), nullptr);
    {
      ScratchFrame inner(ctx);
      EXPECT_NE(inner.take(48), nullptr);
      EXPECT_THROW(inner.take(1), Error);  // 16 + 48 of thread 0's 64 are taken
    }
    EXPECT_EQ(scratch.local().used(), 16u);  // the inner frame gave its floats back
  }
  EXPECT_EQ(scratch.local().used(), 0u);
  // The worker has its own arena of 32: it can take 32, not 33, whatever thread 0 holds.
  std::vector<int> took(2, -1);
  ScratchFrame held(ctx);
  held.take(64);
  pool.parallel_for(2, [&](size_t b, size_t) {
    ScratchFrame f(ctx);
    bool ok = true;
    try {
      f.take(ThreadPool::thread_index() == 0 ? 1 : 33);
    } catch (const Error&) {
      ok = false;
    }
    took[b] = ok ? 1 : 0;
  });
  EXPECT_EQ(took[0], 0);  // thread 0: its 64 are all held
  EXPECT_EQ(took[1], 0);  // the worker: 33 > 32
}

// The scratch the cpu table declares for a set of limits is enough for its kernels at those limits
// (a take beyond it throws), and kernels on the arena give bitwise what they give allocating.
TEST_F(Kernels, DeclaredScratchCoversTheKernelsAtTheirLimits) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  auto randv = [&](size_t n, float scale = 1.0f) {
    std::vector<float> v(n);
    for (float& x : v) x = nd(rng) * scale;
    return v;
  };
  const int T = 150, K = 200, R = 96;                      // matmul: GEMM path from 64 tokens
  const SsdDims dm{4, 64, 2, 16};                          // nh, P, G, N
  const int chunk = 48, I = dm.n_heads * dm.head_dim;      // SSD: 4 chunks, the last partial
  const int conv_c = I + 2 * dm.n_groups * dm.d_state, conv_k = 4;
  KernelLimits lim;
  lim.tokens = T;
  lim.matmul_cols = K;
  lim.conv_channels = conv_c;
  lim.conv_width = conv_k;
  lim.d_state = dm.d_state;
  lim.head_dim = dm.head_dim;
  lim.n_groups = dm.n_groups;
  lim.ssd_chunk = chunk;
  KernelScratch scratch;
  scratch.reserve(pool.size(), cpu_kernels().scratch_floats(lim));
  const KernelContext arena_ctx{&pool, &cpu_kernels(), &scratch};
  const KernelContext alloc_ctx{&pool, &cpu_kernels(), nullptr};

  const std::vector<float> w = randv(static_cast<size_t>(R) * K), x = randv(static_cast<size_t>(T) * K);
  const WeightView W{DType::F32, w.data(), R, K};
  const Q8Matrix q(w, R, K);
  for (const WeightView& view : {W, q.view()}) {
    std::vector<float> a(static_cast<size_t>(T) * R), b(a.size());
    cpu::matmul(arena_ctx, view, nullptr, x.data(), T, a.data());
    cpu::matmul(alloc_ctx, view, nullptr, x.data(), T, b.data());
    EXPECT_EQ(a, b) << dtype_name(view.dtype);
  }

  const std::vector<float> cx = randv(static_cast<size_t>(T) * conv_c), cw = randv(static_cast<size_t>(conv_c) * conv_k);
  std::vector<float> st_a(static_cast<size_t>(conv_k - 1) * conv_c, 0.0f), st_b = st_a;
  std::vector<float> co_a(static_cast<size_t>(T) * conv_c), co_b(co_a.size());
  cpu::conv1d_causal(arena_ctx, cx.data(), conv_c, cw.data(), nullptr, st_a.data(), T, conv_c, conv_k, true, co_a.data());
  cpu::conv1d_causal(alloc_ctx, cx.data(), conv_c, cw.data(), nullptr, st_b.data(), T, conv_c, conv_k, true, co_b.data());
  EXPECT_EQ(co_a, co_b);

  const int ld_bc = 2 * dm.n_groups * dm.d_state;
  const std::vector<float> sx = randv(static_cast<size_t>(T) * I), bc = randv(static_cast<size_t>(T) * ld_bc);
  std::vector<float> dt = randv(static_cast<size_t>(T) * dm.n_heads, 0.1f);
  for (float& v : dt) v = std::abs(v);
  const std::vector<float> A = {-0.5f, -1.0f, -2.0f, -0.25f}, D = randv(dm.n_heads);
  for (int steps : {T, 1}) {  // the chunked scan, then a decode step
    std::vector<float> S_a(static_cast<size_t>(I) * dm.d_state, 0.0f), S_b = S_a;
    std::vector<float> y_a(static_cast<size_t>(steps) * I), y_b(y_a.size());
    if (steps == 1) {
      cpu::ssd_step(arena_ctx, sx.data(), dt.data(), A.data(), bc.data(), bc.data() + dm.n_groups * dm.d_state,
                    D.data(), dm, S_a.data(), y_a.data());
      cpu::ssd_step(alloc_ctx, sx.data(), dt.data(), A.data(), bc.data(), bc.data() + dm.n_groups * dm.d_state,
                    D.data(), dm, S_b.data(), y_b.data());
    } else {
      cpu::ssd_scan(arena_ctx, sx.data(), I, dt.data(), A.data(), bc.data(), bc.data() + dm.n_groups * dm.d_state,
                    ld_bc, D.data(), dm, chunk, S_a.data(), steps, y_a.data());
      cpu::ssd_scan(alloc_ctx, sx.data(), I, dt.data(), A.data(), bc.data(), bc.data() + dm.n_groups * dm.d_state,
                    ld_bc, D.data(), dm, chunk, S_b.data(), steps, y_b.data());
    }
    EXPECT_EQ(y_a, y_b) << steps;
    EXPECT_EQ(S_a, S_b) << steps;
  }
  {  // The fused Mamba-2 decode step (the same conv and step, in its own region).
    const std::vector<float> zxbcdt = randv(static_cast<size_t>(I) + conv_c + dm.n_heads), nw = randv(I);
    const std::vector<float> dt_bias(dm.n_heads, -1.0f);
    Mamba2StepParams p;
    p.dims = dm, p.conv_w = cw.data(), p.d_conv = conv_k, p.dt_bias = dt_bias.data(), p.dt_max = 1e9f;
    p.A = A.data(), p.D = D.data(), p.norm_w = nw.data(), p.norm_group = I / dm.n_groups, p.norm_eps = 1e-5f;
    std::vector<float> cs_a(static_cast<size_t>(conv_k - 1) * conv_c, 0.5f), cs_b = cs_a;
    std::vector<float> S_a(static_cast<size_t>(I) * dm.d_state, 0.0f), S_b = S_a;
    std::vector<float> xbc_a(conv_c), xbc_b(conv_c), dt_a(dm.n_heads), dt_b(dm.n_heads);
    std::vector<float> y_a(I), y_b(I), g_a(I), g_b(I);
    cpu::mamba2_step(arena_ctx, p, zxbcdt.data(), cs_a.data(), S_a.data(), xbc_a.data(), dt_a.data(), y_a.data(),
                     g_a.data());
    cpu::mamba2_step(alloc_ctx, p, zxbcdt.data(), cs_b.data(), S_b.data(), xbc_b.data(), dt_b.data(), y_b.data(),
                     g_b.data());
    EXPECT_EQ(g_a, g_b);
    EXPECT_EQ(S_a, S_b);
    EXPECT_EQ(cs_a, cs_b);
  }

  // Mamba-1: channels = the SSD's x width, the same d_state, from the same limits.
  const std::vector<float> z = randv(static_cast<size_t>(T) * I);
  std::vector<float> A1n(static_cast<size_t>(I) * dm.d_state);
  for (size_t i = 0; i < A1n.size(); ++i) A1n[i] = -0.5f - static_cast<float>(i % 7) * 0.1f;
  std::vector<float> dt1 = randv(static_cast<size_t>(T) * I, 0.1f);
  for (float& v : dt1) v = std::abs(v);
  const std::vector<float> D1 = randv(I);
  for (int steps : {T, 1}) {
    std::vector<float> h_a(static_cast<size_t>(I) * dm.d_state, 0.0f), h_b = h_a;
    std::vector<float> y_a(static_cast<size_t>(steps) * I), y_b(y_a.size());
    cpu::mamba1_scan(arena_ctx, sx.data(), I, dt1.data(), A1n.data(), bc.data(), bc.data() + dm.d_state, ld_bc,
                     D1.data(), z.data(), I, h_a.data(), steps, I, dm.d_state, y_a.data());
    cpu::mamba1_scan(alloc_ctx, sx.data(), I, dt1.data(), A1n.data(), bc.data(), bc.data() + dm.d_state, ld_bc,
                     D1.data(), z.data(), I, h_b.data(), steps, I, dm.d_state, y_b.data());
    EXPECT_EQ(y_a, y_b) << steps;
  }
  // Nothing is left taken once the kernels return.
  EXPECT_EQ(scratch.local().used(), 0u);
}

}  // namespace
}  // namespace hybridlm
