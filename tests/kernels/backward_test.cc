// The backward kernels (training): ref against finite differences of the ref forward, and cpu
// against ref. The finite differences use the perturbation as actually stored: with x+ = f32(x + h v)
// and x- = f32(x - h v), <dy, F(x+) - F(x-)> must equal <dx, x+ - x-> up to the curvature term
// O(h^2) and the forward's f32 rounding (relative to h), whatever the rounding of x +- h v.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <random>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/kernels.h"
#include "numerics.h"

namespace hybridlm {
namespace {

std::vector<float> randv(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// x +- h v as stored, and their difference.
struct Probe {
  std::vector<float> plus, minus, diff;
  Probe(const std::vector<float>& x, const std::vector<float>& v, float h) : plus(x.size()), minus(x.size()), diff(x.size()) {
    for (size_t i = 0; i < x.size(); ++i) {
      plus[i] = x[i] + h * v[i];
      minus[i] = x[i] - h * v[i];
      diff[i] = plus[i] - minus[i];
    }
  }
};

double rel(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-30); }

double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return err / std::max(scale, 1e-30);
}

class Backward : public ::testing::Test {
 protected:
  ThreadPool pool{2};
  KernelContext ctx{&pool, &cpu_kernels()};
  KernelContext ref_ctx{nullptr, &ref_kernels()};
};

// On the AVX-512 path both products run on the strided training GEMM. On the others they run on
// the forward matmul over transposed copies: small shapes on its row path, (70, 80, 40) on its
// GEMM, (96, 48, 32), multiples of 16, through the register-block transposes too.
class BackwardMatmul : public Backward, public ::testing::WithParamInterface<std::array<int, 3>> {};

TEST_P(BackwardMatmul, AgainstFiniteDifferencesAndRef) {
  const auto [T, R, C] = GetParam();
  const std::vector<float> w = randv(static_cast<size_t>(R) * C, 1), x = randv(static_cast<size_t>(T) * C, 2),
                           b = randv(R, 3), dy = randv(static_cast<size_t>(T) * R, 4);
  const WeightView W{DType::F32, w.data(), R, C};
  std::vector<float> dx(static_cast<size_t>(T) * C), dW(w.size(), 0.0f), db(R, 0.0f);
  ref::matmul_backward(ref_ctx, W, x.data(), dy.data(), T, dx.data(), dW.data(), db.data());
  auto forward = [&](const std::vector<float>& wv, const std::vector<float>& xv, const std::vector<float>& bv) {
    std::vector<float> y(static_cast<size_t>(T) * R);
    ref::matmul(ref_ctx, {DType::F32, wv.data(), R, C}, bv.data(), xv.data(), T, y.data());
    return y;
  };
  const float h = 1e-2f;
  const Probe px(x, randv(x.size(), 5), h), pw(w, randv(w.size(), 6), h), pb(b, randv(b.size(), 7), h);
  auto fd = [&](const std::vector<float>& yp, const std::vector<float>& ym) {
    double s = 0;
    for (size_t i = 0; i < yp.size(); ++i) s += static_cast<double>(dy[i]) * (static_cast<double>(yp[i]) - ym[i]);
    return s;
  };
  EXPECT_LT(rel(dot(dx, px.diff), fd(forward(w, px.plus, b), forward(w, px.minus, b))), tol::kBackwardVsFiniteDiff);
  EXPECT_LT(rel(dot(dW, pw.diff), fd(forward(pw.plus, x, b), forward(pw.minus, x, b))), tol::kBackwardVsFiniteDiff);
  EXPECT_LT(rel(dot(db, pb.diff), fd(forward(w, x, pb.plus), forward(w, x, pb.minus))), tol::kBackwardVsFiniteDiff);
  // cpu: dx written, dW and db accumulated onto what is there.
  std::vector<float> cdx(dx.size(), 7.0f), cdW(w.size(), 0.5f), cdb(R, -1.0f);
  cpu::matmul_backward(ctx, W, x.data(), dy.data(), T, cdx.data(), cdW.data(), cdb.data());
  for (float& v : cdW) v -= 0.5f;
  for (float& v : cdb) v += 1.0f;
  EXPECT_LT(max_rel(cdx, dx), tol::kBackwardCpuVsRef);
  EXPECT_LT(max_rel(cdW, dW), tol::kBackwardCpuVsRef);
  EXPECT_LT(max_rel(cdb, db), tol::kBackwardCpuVsRef);
  // The forward product training runs (any fixed summation order) against ref's matmul.
  std::vector<float> y(static_cast<size_t>(T) * R), cy(y.size(), 3.0f);
  for (const float* bias : {static_cast<const float*>(nullptr), b.data()}) {
    ref::matmul(ref_ctx, W, bias, x.data(), T, y.data());
    cpu::matmul_train(ctx, W, bias, x.data(), T, cy.data());
    EXPECT_LT(max_rel(cy, y), tol::kBackwardCpuVsRef) << (bias ? "with" : "without") << " bias";
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, BackwardMatmul,
                         ::testing::Values(std::array<int, 3>{7, 33, 50}, std::array<int, 3>{70, 80, 40},
                                           std::array<int, 3>{96, 48, 32},
                                           // Two K blocks of the AVX-512 training GEMM in both
                                           // products, partial row tiles and column panels.
                                           std::array<int, 3>{301, 263, 45}));

TEST_F(Backward, RmsnormAgainstFiniteDifferencesAndRef) {
  const int T = 5, d = 96;
  const float eps = 1e-5f;
  const std::vector<float> x = randv(static_cast<size_t>(T) * d, 11), w = randv(d, 12),
                           dy = randv(static_cast<size_t>(T) * d, 13);
  for (bool weighted : {true, false}) {
    const float* wp = weighted ? w.data() : nullptr;
    std::vector<float> dx(x.size()), dw(d, 0.0f);
    ref::rmsnorm_backward(ref_ctx, x.data(), wp, dy.data(), T, d, eps, dx.data(), weighted ? dw.data() : nullptr);
    auto forward = [&](const std::vector<float>& xv, const float* wv) {
      std::vector<float> y(xv.size());
      ref::rmsnorm(ref_ctx, xv.data(), wv, T, d, eps, y.data());
      return y;
    };
    const float h = 1e-3f;
    const Probe px(x, randv(x.size(), 14), h);
    const std::vector<float> yp = forward(px.plus, wp), ym = forward(px.minus, wp);
    double fd = 0;
    for (size_t i = 0; i < yp.size(); ++i) fd += static_cast<double>(dy[i]) * (static_cast<double>(yp[i]) - ym[i]);
    EXPECT_LT(rel(dot(dx, px.diff), fd), tol::kBackwardVsFiniteDiff) << weighted;
    std::vector<float> cdx(x.size()), cdw(d, 0.0f);
    cpu::rmsnorm_backward(ctx, x.data(), wp, dy.data(), T, d, eps, cdx.data(), weighted ? cdw.data() : nullptr);
    EXPECT_LT(max_rel(cdx, dx), tol::kBackwardCpuVsRef) << weighted;
    if (weighted) {
      const Probe pw(w, randv(w.size(), 15), h);
      const std::vector<float> wp_ = forward(x, pw.plus.data()), wm_ = forward(x, pw.minus.data());
      double fdw = 0;
      for (size_t i = 0; i < wp_.size(); ++i) fdw += static_cast<double>(dy[i]) * (static_cast<double>(wp_[i]) - wm_[i]);
      EXPECT_LT(rel(dot(dw, pw.diff), fdw), tol::kBackwardVsFiniteDiff);
      EXPECT_LT(max_rel(cdw, dw), tol::kBackwardCpuVsRef);
    }
  }
}

TEST_F(Backward, EmbeddingScattersEveryTokensGradient) {
  const int T = 9, d = 130, V = 6;
  const std::vector<int32_t> ids = {3, 1, 3, 0, 5, 3, 1, 2, 0};  // repeats: sums
  const std::vector<float> dy = randv(static_cast<size_t>(T) * d, 21);
  std::vector<float> dE(static_cast<size_t>(V) * d, 0.0f), cdE(dE.size(), 0.0f);
  ref::embedding_backward(ref_ctx, ids.data(), dy.data(), T, d, dE.data());
  cpu::embedding_backward(ctx, ids.data(), dy.data(), T, d, cdE.data());
  // By hand: row 3 gets tokens 0, 2 and 5; row 4 none.
  for (int c = 0; c < d; ++c) {
    EXPECT_FLOAT_EQ(dE[static_cast<size_t>(3) * d + c], dy[c] + dy[2 * d + c] + dy[5 * d + c]);
    EXPECT_EQ(dE[static_cast<size_t>(4) * d + c], 0.0f);
  }
  EXPECT_LT(max_rel(cdE, dE), tol::kBackwardCpuVsRef);
}

TEST_F(Backward, CrossEntropyAgainstFiniteDifferencesAndRef) {
  const int T = 6, V = 300;
  const std::vector<float> logits = randv(static_cast<size_t>(T) * V, 31, 3.0f);
  const std::vector<int32_t> targets = {5, 299, -1, 0, 17, 123};  // row 2 not scored
  std::vector<float> g(logits.size());
  const float scale = 1.0f / 5;  // the mean over the 5 scored rows
  const double loss = ref::cross_entropy(ref_ctx, logits.data(), targets.data(), T, V, scale, g.data());
  // By hand, row 0: logsumexp - logit.
  double mx = logits[0], s = 0;
  for (int v = 0; v < V; ++v) mx = std::max(mx, static_cast<double>(logits[v]));
  for (int v = 0; v < V; ++v) s += std::exp(logits[v] - mx);
  double sum_rows = 0;
  for (int t = 0; t < T; ++t) {
    if (targets[t] < 0) continue;
    double m = -1e300, z = 0;
    for (int v = 0; v < V; ++v) m = std::max(m, static_cast<double>(logits[static_cast<size_t>(t) * V + v]));
    for (int v = 0; v < V; ++v) z += std::exp(logits[static_cast<size_t>(t) * V + v] - m);
    sum_rows += m + std::log(z) - logits[static_cast<size_t>(t) * V + targets[t]];
  }
  EXPECT_NEAR(loss, sum_rows, 1e-9 * sum_rows);
  for (int v = 0; v < V; ++v) EXPECT_EQ(g[static_cast<size_t>(2) * V + v], 0.0f);
  const Probe p(logits, randv(logits.size(), 32), 1e-2f);
  const double fd = scale * (ref::cross_entropy(ref_ctx, p.plus.data(), targets.data(), T, V, 0, nullptr) -
                             ref::cross_entropy(ref_ctx, p.minus.data(), targets.data(), T, V, 0, nullptr));
  EXPECT_LT(rel(dot(g, p.diff), fd), tol::kBackwardVsFiniteDiff);
  // cpu, in place on a copy of the logits.
  std::vector<float> cg = logits;
  const double closs = cpu::cross_entropy(ctx, cg.data(), targets.data(), T, V, scale, cg.data());
  EXPECT_NEAR(closs, loss, tol::kBackwardCpuVsRef * loss);
  EXPECT_LT(max_rel(cg, g), tol::kBackwardCpuVsRef);
}

// <dy, F(x+) - F(x-)> for a forward F of one input.
template <class F>
double directional(const F& f, const Probe& p, const std::vector<float>& dy) {
  const std::vector<float> yp = f(p.plus), ym = f(p.minus);
  double s = 0;
  for (size_t i = 0; i < yp.size(); ++i) s += static_cast<double>(dy[i]) * (static_cast<double>(yp[i]) - ym[i]);
  return s;
}

TEST_F(Backward, ActivationAgainstFiniteDifferencesAndRef) {
  const int T = 4, d = 70, ld = 80;  // rows of a and b strided, as the fused gate/up projection
  const std::vector<float> a = randv(static_cast<size_t>(T) * ld, 41, 1.5f), b = randv(a.size(), 42),
                           dout = randv(static_cast<size_t>(T) * d, 43);
  for (Activation act : {Activation::Silu, Activation::Gelu, Activation::Relu2})
    for (bool gated : {true, false}) {
      SCOPED_TRACE(static_cast<int>(act) * 2 + gated);
      const float* bp = gated ? b.data() : nullptr;
      std::vector<float> da(a.size(), 0.0f), db(b.size(), 0.0f);
      ref::activation_backward(ref_ctx, act, a.data(), bp, ld, T, d, dout.data(), da.data(), gated ? db.data() : nullptr);
      auto fa = [&](const std::vector<float>& av) {
        std::vector<float> y(static_cast<size_t>(T) * d);
        ref::activation(ref_ctx, act, av.data(), bp, ld, T, d, y.data());
        return y;
      };
      const Probe pa(a, randv(a.size(), 44), 1e-3f);
      EXPECT_LT(rel(dot(da, pa.diff), directional(fa, pa, dout)), tol::kBackwardVsFiniteDiff);
      std::vector<float> cda(a.size(), 0.0f), cdb(b.size(), 0.0f);
      cpu::activation_backward(ctx, act, a.data(), bp, ld, T, d, dout.data(), cda.data(), gated ? cdb.data() : nullptr);
      EXPECT_LT(max_rel(cda, da), tol::kBackwardCpuVsRef);
      if (gated) {
        auto fb = [&](const std::vector<float>& bv) {
          std::vector<float> y(static_cast<size_t>(T) * d);
          ref::activation(ref_ctx, act, a.data(), bv.data(), ld, T, d, y.data());
          return y;
        };
        const Probe pb(b, randv(b.size(), 45), 1e-3f);
        EXPECT_LT(rel(dot(db, pb.diff), directional(fb, pb, dout)), tol::kBackwardVsFiniteDiff);
        EXPECT_LT(max_rel(cdb, db), tol::kBackwardCpuVsRef);
      }
    }
}

// Shapes: channels in groups of 16 and a ragged rest (cpu), fewer steps than taps, two taps.
class BackwardConv : public Backward, public ::testing::WithParamInterface<std::array<int, 3>> {};

TEST_P(BackwardConv, AgainstFiniteDifferencesAndRef) {
  const auto [T, C, K] = GetParam();
  const int ld_x = C + 10;
  const std::vector<float> x = randv(static_cast<size_t>(T) * ld_x, 51), w = randv(static_cast<size_t>(C) * K, 52, 0.5f),
                           bias = randv(C, 53), state = randv(static_cast<size_t>(K - 1) * C, 54),
                           dout = randv(static_cast<size_t>(T) * C, 55);
  for (bool silu : {true, false}) {
    SCOPED_TRACE(silu);
    std::vector<float> dx(x.size(), 0.0f), dw(w.size(), 0.0f), db(C, 0.0f), ds(state.size());
    ref::conv1d_causal_backward(ref_ctx, x.data(), ld_x, w.data(), bias.data(), state.data(), T, C, K, silu,
                                dout.data(), dx.data(), ld_x, dw.data(), db.data(), ds.data());
    auto forward = [&](const std::vector<float>& xv, const std::vector<float>& wv, const std::vector<float>& bv,
                       std::vector<float> sv) {
      std::vector<float> y(static_cast<size_t>(T) * C);
      ref::conv1d_causal(ref_ctx, xv.data(), ld_x, wv.data(), bv.data(), sv.data(), T, C, K, silu, y.data());
      return y;
    };
    const float h = 1e-2f;  // the silu curvature term is ~1e-4 relative; 1e-3 left the f32 rounding at 1e-3
    const Probe px(x, randv(x.size(), 56), h), pw(w, randv(w.size(), 57), h), pb(bias, randv(C, 58), h),
        ps(state, randv(state.size(), 59), h);
    EXPECT_LT(rel(dot(dx, px.diff), directional([&](const std::vector<float>& v) { return forward(v, w, bias, state); },
                                                px, dout)), tol::kBackwardVsFiniteDiff);
    EXPECT_LT(rel(dot(dw, pw.diff), directional([&](const std::vector<float>& v) { return forward(x, v, bias, state); },
                                                pw, dout)), tol::kBackwardVsFiniteDiff);
    EXPECT_LT(rel(dot(db, pb.diff), directional([&](const std::vector<float>& v) { return forward(x, w, v, state); },
                                                pb, dout)), tol::kBackwardVsFiniteDiff);
    EXPECT_LT(rel(dot(ds, ps.diff), directional([&](const std::vector<float>& v) { return forward(x, w, bias, v); },
                                                ps, dout)), tol::kBackwardVsFiniteDiff);
    std::vector<float> cdx(x.size(), 0.0f), cdw(w.size(), 0.0f), cdb(C, 0.0f), cds(state.size());
    cpu::conv1d_causal_backward(ctx, x.data(), ld_x, w.data(), bias.data(), state.data(), T, C, K, silu, dout.data(),
                                cdx.data(), ld_x, cdw.data(), cdb.data(), cds.data());
    EXPECT_LT(max_rel(cdx, dx), tol::kBackwardCpuVsRef);
    EXPECT_LT(max_rel(cdw, dw), tol::kBackwardCpuVsRef);
    EXPECT_LT(max_rel(cdb, db), tol::kBackwardCpuVsRef);
    EXPECT_LT(max_rel(cds, ds), tol::kBackwardCpuVsRef);
  }
}
INSTANTIATE_TEST_SUITE_P(Shapes, BackwardConv,
                         ::testing::Values(std::array<int, 3>{6, 40, 4}, std::array<int, 3>{2, 16, 4},
                                           std::array<int, 3>{9, 33, 2}));

}  // namespace
}  // namespace hybridlm
