// The scan backward kernels (training): ref against directional finite differences of the ref
// forward, cpu against ref, as in backward_test.cc. The perturbation is the one actually stored:
// with x+ = f32(x + h v) and x- = f32(x - h v), <dy, F(x+) - F(x-)> must equal <dx, x+ - x-> up to
// the O(h^2) curvature and the forward's f32 rounding. The shapes cover a T that is not a multiple
// of the checkpoint interval (Mamba-1: 64 steps) or of the chunk, a T below it and one equal to
// it, channel counts that leave a partial 16-lane block, strided inputs and outputs, two groups of
// two heads, nonzero and null (zero) initial states, and dh0 / dS0 wanted or null. The measured
// errors are recorded as test properties (--gtest_output=xml).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
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

// dt as the model feeds it: softplus of normals, positive and moderate (0.05 .. 3).
std::vector<float> rand_dt(size_t n, uint32_t seed) {
  std::vector<float> v = randv(n, seed);
  for (float& x : v) x = std::log1p(std::exp(x));
  return v;
}

// A = -exp(A_log) with A_log ~ N(0, 0.5^2): decays between ~0.2 and ~5 per unit of dt.
std::vector<float> rand_A(size_t n, uint32_t seed) {
  std::vector<float> v = randv(n, seed, 0.5f);
  for (float& x : v) x = -std::exp(x);
  return v;
}

// sum over rows t < T, columns i < cols of a[t * ld_a + i] * b[t * ld_b + i]: strided buffers,
// their padding left out.
double dot_rows(const std::vector<float>& a, int ld_a, const std::vector<float>& b, int ld_b, int T, int cols) {
  double s = 0;
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < cols; ++i)
      s += static_cast<double>(a[static_cast<size_t>(t) * ld_a + i]) * b[static_cast<size_t>(t) * ld_b + i];
  return s;
}
double dot(const std::vector<float>& a, const std::vector<float>& b) {
  return dot_rows(a, 0, b, 0, 1, static_cast<int>(a.size()));
}

// x +- h v as stored, and their difference.
struct Probe {
  std::vector<float> plus, minus, diff;
  Probe(const std::vector<float>& x, const std::vector<float>& v, float h)
      : plus(x.size()), minus(x.size()), diff(x.size()) {
    for (size_t i = 0; i < x.size(); ++i) {
      plus[i] = x[i] + h * v[i];
      minus[i] = x[i] - h * v[i];
      diff[i] = plus[i] - minus[i];
    }
  }
};

// A probe direction for an input of n values whose gradient is `grad` (rows t < T of `cols`
// values, strides ld_in in the input, ld_g in the gradient): |N(0, 1)| with the sign of the
// gradient, so that the terms of <grad, x+ - x-> add up instead of cancelling. With random signs
// the parameters summed over time (dA above all) cancel to 1/300 of their terms' size, and the f32
// forward's rounding of dt * (A +- h v), relative to that of the terms, becomes 1e-2 of the result
// (the ref gradient itself matches a float64 forward's differences to 1e-7 there). A gradient with
// a wrong sign or size still moves the two sides apart.
std::vector<float> aligned(size_t n, const std::vector<float>& grad, int ld_in, int ld_g, int T, int cols,
                           uint32_t seed) {
  std::vector<float> v = randv(n, seed);
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < cols; ++i) {
      float& e = v[static_cast<size_t>(t) * ld_in + i];
      e = std::abs(e) * (grad[static_cast<size_t>(t) * ld_g + i] < 0 ? -1.0f : 1.0f);
    }
  return v;
}
std::vector<float> aligned(const std::vector<float>& grad, uint32_t seed) {
  const int n = static_cast<int>(grad.size());
  return aligned(grad.size(), grad, n, n, 1, n, seed);
}

double rel(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-30); }

// max |a - b| over max |b|, on the first `cols` columns of T rows (strides ld_a, ld_b).
double max_rel_rows(const std::vector<float>& a, int ld_a, const std::vector<float>& b, int ld_b, int T, int cols) {
  double err = 0, scale = 0;
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < cols; ++i) {
      const double av = a[static_cast<size_t>(t) * ld_a + i], bv = b[static_cast<size_t>(t) * ld_b + i];
      err = std::max(err, std::abs(av - bv));
      scale = std::max(scale, std::abs(bv));
    }
  return err / std::max(scale, 1e-30);
}
double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  return max_rel_rows(a, 0, b, 0, 1, static_cast<int>(a.size()));
}

// True when the padding columns [cols, ld) of every row still hold `fill` (a strided output
// written only where it should be).
bool padding_untouched(const std::vector<float>& v, int ld, int T, int cols, float fill) {
  for (int t = 0; t < T; ++t)
    for (int i = cols; i < ld; ++i)
      if (v[static_cast<size_t>(t) * ld + i] != fill) return false;
  return true;
}

// <dy, F(x+) - F(x-)> for a forward F of one input.
template <class F>
double directional(const F& f, const Probe& p, const std::vector<float>& dy) {
  const std::vector<float> yp = f(p.plus), ym = f(p.minus);
  double s = 0;
  for (size_t i = 0; i < yp.size(); ++i) s += static_cast<double>(dy[i]) * (static_cast<double>(yp[i]) - ym[i]);
  return s;
}

class ScanBackward : public ::testing::Test {
 protected:
  ThreadPool pool{2};
  KernelContext ctx{&pool, &cpu_kernels()};
  KernelContext ctx1{nullptr, &cpu_kernels()};  // one thread: must give bitwise the same results
  KernelContext ref_ctx{nullptr, &ref_kernels()};

  // Checks err < bound and records it as the test property `name`.
  void expect_below(const std::string& name, double err, double bound) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3g", err);
    RecordProperty(name, buf);
    EXPECT_LT(err, bound) << name;
  }
};

// The outputs of one mamba1_scan_backward call, strided as the test's shapes say.
struct M1Grads {
  std::vector<float> dx, ddt, dA, dB, dC, dD, dz, dh0;
};

struct M1Case {
  int T, I, N;
  bool h0;    // a nonzero initial state; else null (zeros)
  bool want;  // dh0 wanted; else null
};

TEST_F(ScanBackward, Mamba1AgainstFiniteDifferencesAndRef) {
  for (const M1Case& k : {M1Case{150, 20, 8, true, true}, M1Case{5, 20, 8, true, true},
                          M1Case{128, 37, 16, false, false}, M1Case{150, 7, 4, true, false}}) {
    const int T = k.T, I = k.I, N = k.N;
    const std::string tag = "m1_T" + std::to_string(T) + "_I" + std::to_string(I) + "_";
    SCOPED_TRACE(tag);
    const int ld_x = I + 3, ld_z = I + 5, ld_bc = N + 3;         // inputs
    const int ld_dx = I + 2, ld_dz = I + 4, ld_dbc = N + 1;      // outputs
    const size_t TI = static_cast<size_t>(T) * I, IN = static_cast<size_t>(I) * N;
    const uint32_t s0 = 100 * static_cast<uint32_t>(T + I);
    const std::vector<float> x = randv(static_cast<size_t>(T) * ld_x, s0 + 1), dt = rand_dt(TI, s0 + 2),
                             A = rand_A(IN, s0 + 3), B = randv(static_cast<size_t>(T) * ld_bc, s0 + 4),
                             C = randv(static_cast<size_t>(T) * ld_bc, s0 + 5), D = randv(I, s0 + 6),
                             z = randv(static_cast<size_t>(T) * ld_z, s0 + 7),
                             h0 = k.h0 ? randv(IN, s0 + 8) : std::vector<float>(IN, 0.0f), dy = randv(TI, s0 + 9);
    // dA and dD accumulate: start them at a nonzero value and take it off after.
    auto run = [&](const KernelContext& c, decltype(&ref::mamba1_scan_backward) fn) {
      M1Grads g{std::vector<float>(static_cast<size_t>(T) * ld_dx, 7.0f), std::vector<float>(TI, 7.0f),
                std::vector<float>(IN, 0.5f), std::vector<float>(static_cast<size_t>(T) * ld_dbc, 7.0f),
                std::vector<float>(static_cast<size_t>(T) * ld_dbc, 7.0f), std::vector<float>(I, -1.0f),
                std::vector<float>(static_cast<size_t>(T) * ld_dz, 7.0f), std::vector<float>(IN, 7.0f)};
      fn(c, x.data(), ld_x, dt.data(), A.data(), B.data(), C.data(), ld_bc, D.data(), z.data(), ld_z,
         k.h0 ? h0.data() : nullptr, T, I, N, dy.data(), g.dx.data(), ld_dx, g.ddt.data(), g.dA.data(), g.dB.data(),
         g.dC.data(), ld_dbc, g.dD.data(), g.dz.data(), ld_dz, k.want ? g.dh0.data() : nullptr);
      for (float& v : g.dA) v -= 0.5f;
      for (float& v : g.dD) v += 1.0f;
      EXPECT_TRUE(padding_untouched(g.dx, ld_dx, T, I, 7.0f));
      EXPECT_TRUE(padding_untouched(g.dz, ld_dz, T, I, 7.0f));
      EXPECT_TRUE(padding_untouched(g.dB, ld_dbc, T, N, 7.0f));
      EXPECT_TRUE(padding_untouched(g.dC, ld_dbc, T, N, 7.0f));
      if (!k.want) {
        EXPECT_EQ(g.dh0, std::vector<float>(IN, 7.0f));  // null: not written
      }
      return g;
    };
    const M1Grads r = run(ref_ctx, &ref::mamba1_scan_backward);

    auto forward = [&](const std::vector<float>& xv, const std::vector<float>& dtv, const std::vector<float>& Av,
                       const std::vector<float>& Bv, const std::vector<float>& Cv, const std::vector<float>& Dv,
                       const std::vector<float>& zv, std::vector<float> hv) {
      std::vector<float> y(TI);
      ref::mamba1_scan(ref_ctx, xv.data(), ld_x, dtv.data(), Av.data(), Bv.data(), Cv.data(), ld_bc, Dv.data(),
                       zv.data(), ld_z, hv.data(), T, I, N, y.data());
      return y;
    };
    const float h = 1e-2f;
    const Probe px(x, aligned(x.size(), r.dx, ld_x, ld_dx, T, I, s0 + 21), h), pdt(dt, aligned(r.ddt, s0 + 22), h),
        pA(A, aligned(r.dA, s0 + 23), h), pB(B, aligned(B.size(), r.dB, ld_bc, ld_dbc, T, N, s0 + 24), h),
        pC(C, aligned(C.size(), r.dC, ld_bc, ld_dbc, T, N, s0 + 25), h), pD(D, aligned(r.dD, s0 + 26), h),
        pz(z, aligned(z.size(), r.dz, ld_z, ld_dz, T, I, s0 + 27), h),
        ph(h0, k.want ? aligned(r.dh0, s0 + 28) : randv(IN, s0 + 28), h);
    using V = std::vector<float>;
    const double bound = tol::kBackwardVsFiniteDiff;
    expect_below(tag + "fd_x", rel(dot_rows(r.dx, ld_dx, px.diff, ld_x, T, I),
                                   directional([&](const V& v) { return forward(v, dt, A, B, C, D, z, h0); }, px, dy)),
                 bound);
    expect_below(tag + "fd_dt", rel(dot(r.ddt, pdt.diff),
                                    directional([&](const V& v) { return forward(x, v, A, B, C, D, z, h0); }, pdt, dy)),
                 bound);
    expect_below(tag + "fd_A", rel(dot(r.dA, pA.diff),
                                   directional([&](const V& v) { return forward(x, dt, v, B, C, D, z, h0); }, pA, dy)),
                 bound);
    expect_below(tag + "fd_B", rel(dot_rows(r.dB, ld_dbc, pB.diff, ld_bc, T, N),
                                   directional([&](const V& v) { return forward(x, dt, A, v, C, D, z, h0); }, pB, dy)),
                 bound);
    expect_below(tag + "fd_C", rel(dot_rows(r.dC, ld_dbc, pC.diff, ld_bc, T, N),
                                   directional([&](const V& v) { return forward(x, dt, A, B, v, D, z, h0); }, pC, dy)),
                 bound);
    expect_below(tag + "fd_D", rel(dot(r.dD, pD.diff),
                                   directional([&](const V& v) { return forward(x, dt, A, B, C, v, z, h0); }, pD, dy)),
                 bound);
    expect_below(tag + "fd_z", rel(dot_rows(r.dz, ld_dz, pz.diff, ld_z, T, I),
                                   directional([&](const V& v) { return forward(x, dt, A, B, C, D, v, h0); }, pz, dy)),
                 bound);
    if (k.want)
      expect_below(tag + "fd_h0",
                   rel(dot(r.dh0, ph.diff),
                       directional([&](const V& v) { return forward(x, dt, A, B, C, D, z, v); }, ph, dy)),
                   bound);

    const M1Grads c = run(ctx, &cpu::mamba1_scan_backward);
    const double cb = tol::kBackwardCpuVsRef;
    expect_below(tag + "cpu_dx", max_rel_rows(c.dx, ld_dx, r.dx, ld_dx, T, I), cb);
    expect_below(tag + "cpu_ddt", max_rel(c.ddt, r.ddt), cb);
    expect_below(tag + "cpu_dA", max_rel(c.dA, r.dA), cb);
    expect_below(tag + "cpu_dB", max_rel_rows(c.dB, ld_dbc, r.dB, ld_dbc, T, N), cb);
    expect_below(tag + "cpu_dC", max_rel_rows(c.dC, ld_dbc, r.dC, ld_dbc, T, N), cb);
    expect_below(tag + "cpu_dD", max_rel(c.dD, r.dD), cb);
    expect_below(tag + "cpu_dz", max_rel_rows(c.dz, ld_dz, r.dz, ld_dz, T, I), cb);
    if (k.want) expect_below(tag + "cpu_dh0", max_rel(c.dh0, r.dh0), cb);
    // The split over threads depends on the shapes only.
    const M1Grads c1 = run(ctx1, &cpu::mamba1_scan_backward);
    EXPECT_TRUE(c1.dx == c.dx && c1.ddt == c.ddt && c1.dA == c.dA && c1.dB == c.dB && c1.dC == c.dC &&
                c1.dD == c.dD && c1.dz == c.dz && c1.dh0 == c.dh0);
  }
}

struct SsdGrads {
  std::vector<float> dx, ddt, dA, dB, dC, dD, dS0;
};

struct SsdCase {
  int T, chunk;
  bool S0;    // a nonzero initial state; else null (zeros)
  bool want;  // dS0 wanted; else null
};

TEST_F(ScanBackward, SsdAgainstFiniteDifferencesAndRef) {
  const SsdDims dm{4, 6, 2, 12};  // nh = 4 heads of P = 6, G = 2 groups (heads 0-1, 2-3), N = 12
  const int nh = dm.n_heads, P = dm.head_dim, G = dm.n_groups, N = dm.d_state;
  for (const SsdCase& k : {SsdCase{150, 64, true, true}, SsdCase{5, 64, true, true}, SsdCase{150, 16, false, false},
                           SsdCase{64, 64, true, false}}) {
    const int T = k.T, chunk = k.chunk;
    const std::string tag = "ssd_T" + std::to_string(T) + "_Q" + std::to_string(chunk) + "_";
    SCOPED_TRACE(tag);
    const int ld_x = nh * P + 5, ld_bc = G * N + 3;    // inputs
    const int ld_dx = nh * P + 2, ld_dbc = G * N + 1;  // outputs
    const size_t TY = static_cast<size_t>(T) * nh * P, SN = static_cast<size_t>(nh) * P * N;
    const uint32_t s0 = 1000 + 10 * static_cast<uint32_t>(T + chunk);
    const std::vector<float> x = randv(static_cast<size_t>(T) * ld_x, s0 + 1),
                             dt = rand_dt(static_cast<size_t>(T) * nh, s0 + 2), A = rand_A(nh, s0 + 3),
                             B = randv(static_cast<size_t>(T) * ld_bc, s0 + 4),
                             C = randv(static_cast<size_t>(T) * ld_bc, s0 + 5), D = randv(nh, s0 + 6),
                             S0 = k.S0 ? randv(SN, s0 + 7) : std::vector<float>(SN, 0.0f), dy = randv(TY, s0 + 8);
    auto run = [&](const KernelContext& c, decltype(&ref::ssd_scan_backward) fn) {
      SsdGrads g{std::vector<float>(static_cast<size_t>(T) * ld_dx, 7.0f),
                 std::vector<float>(static_cast<size_t>(T) * nh, 7.0f), std::vector<float>(nh, 0.5f),
                 std::vector<float>(static_cast<size_t>(T) * ld_dbc, 7.0f),
                 std::vector<float>(static_cast<size_t>(T) * ld_dbc, 7.0f), std::vector<float>(nh, -1.0f),
                 std::vector<float>(SN, 7.0f)};
      fn(c, x.data(), ld_x, dt.data(), A.data(), B.data(), C.data(), ld_bc, D.data(), dm, chunk,
         k.S0 ? S0.data() : nullptr, T, dy.data(), g.dx.data(), ld_dx, g.ddt.data(), g.dA.data(), g.dB.data(),
         g.dC.data(), ld_dbc, g.dD.data(), k.want ? g.dS0.data() : nullptr);
      for (float& v : g.dA) v -= 0.5f;
      for (float& v : g.dD) v += 1.0f;
      EXPECT_TRUE(padding_untouched(g.dx, ld_dx, T, nh * P, 7.0f));
      EXPECT_TRUE(padding_untouched(g.dB, ld_dbc, T, G * N, 7.0f));
      EXPECT_TRUE(padding_untouched(g.dC, ld_dbc, T, G * N, 7.0f));
      if (!k.want) {
        EXPECT_EQ(g.dS0, std::vector<float>(SN, 7.0f));  // null: not written
      }
      return g;
    };
    const SsdGrads r = run(ref_ctx, &ref::ssd_scan_backward);

    auto forward = [&](const std::vector<float>& xv, const std::vector<float>& dtv, const std::vector<float>& Av,
                       const std::vector<float>& Bv, const std::vector<float>& Cv, const std::vector<float>& Dv,
                       std::vector<float> Sv) {
      std::vector<float> y(TY);
      ref::ssd_scan(ref_ctx, xv.data(), ld_x, dtv.data(), Av.data(), Bv.data(), Cv.data(), ld_bc, Dv.data(), dm,
                    chunk, Sv.data(), T, y.data());
      return y;
    };
    const float h = 1e-2f;
    const int W = nh * P, GN = G * N;
    const Probe px(x, aligned(x.size(), r.dx, ld_x, ld_dx, T, W, s0 + 21), h), pdt(dt, aligned(r.ddt, s0 + 22), h),
        pA(A, aligned(r.dA, s0 + 23), h), pB(B, aligned(B.size(), r.dB, ld_bc, ld_dbc, T, GN, s0 + 24), h),
        pC(C, aligned(C.size(), r.dC, ld_bc, ld_dbc, T, GN, s0 + 25), h), pD(D, aligned(r.dD, s0 + 26), h),
        pS(S0, k.want ? aligned(r.dS0, s0 + 27) : randv(SN, s0 + 27), h);
    using V = std::vector<float>;
    const double bound = tol::kBackwardVsFiniteDiff;
    expect_below(tag + "fd_x", rel(dot_rows(r.dx, ld_dx, px.diff, ld_x, T, nh * P),
                                   directional([&](const V& v) { return forward(v, dt, A, B, C, D, S0); }, px, dy)),
                 bound);
    expect_below(tag + "fd_dt", rel(dot(r.ddt, pdt.diff),
                                    directional([&](const V& v) { return forward(x, v, A, B, C, D, S0); }, pdt, dy)),
                 bound);
    expect_below(tag + "fd_A", rel(dot(r.dA, pA.diff),
                                   directional([&](const V& v) { return forward(x, dt, v, B, C, D, S0); }, pA, dy)),
                 bound);
    expect_below(tag + "fd_B", rel(dot_rows(r.dB, ld_dbc, pB.diff, ld_bc, T, G * N),
                                   directional([&](const V& v) { return forward(x, dt, A, v, C, D, S0); }, pB, dy)),
                 bound);
    expect_below(tag + "fd_C", rel(dot_rows(r.dC, ld_dbc, pC.diff, ld_bc, T, G * N),
                                   directional([&](const V& v) { return forward(x, dt, A, B, v, D, S0); }, pC, dy)),
                 bound);
    expect_below(tag + "fd_D", rel(dot(r.dD, pD.diff),
                                   directional([&](const V& v) { return forward(x, dt, A, B, C, v, S0); }, pD, dy)),
                 bound);
    if (k.want)
      expect_below(tag + "fd_S0", rel(dot(r.dS0, pS.diff),
                                      directional([&](const V& v) { return forward(x, dt, A, B, C, D, v); }, pS, dy)),
                   bound);

    const SsdGrads c = run(ctx, &cpu::ssd_scan_backward);
    const double cb = tol::kBackwardCpuVsRef;
    expect_below(tag + "cpu_dx", max_rel_rows(c.dx, ld_dx, r.dx, ld_dx, T, nh * P), cb);
    expect_below(tag + "cpu_ddt", max_rel(c.ddt, r.ddt), cb);
    expect_below(tag + "cpu_dA", max_rel(c.dA, r.dA), cb);
    expect_below(tag + "cpu_dB", max_rel_rows(c.dB, ld_dbc, r.dB, ld_dbc, T, G * N), cb);
    expect_below(tag + "cpu_dC", max_rel_rows(c.dC, ld_dbc, r.dC, ld_dbc, T, G * N), cb);
    expect_below(tag + "cpu_dD", max_rel(c.dD, r.dD), cb);
    if (k.want) expect_below(tag + "cpu_dS0", max_rel(c.dS0, r.dS0), cb);
    const SsdGrads c1 = run(ctx1, &cpu::ssd_scan_backward);
    EXPECT_TRUE(c1.dx == c.dx && c1.ddt == c.ddt && c1.dA == c.dA && c1.dB == c.dB && c1.dC == c.dC &&
                c1.dD == c.dD && c1.dS0 == c.dS0);
  }
}

// The discrete form (m2d): the log-decay per token and head in place of dt and A.
TEST_F(ScanBackward, SsdDiscreteAgainstFiniteDifferencesAndRef) {
  const SsdDims dm{4, 6, 2, 12};
  const int nh = dm.n_heads, P = dm.head_dim, G = dm.n_groups, N = dm.d_state;
  for (const SsdCase& k : {SsdCase{150, 64, true, true}, SsdCase{5, 64, false, true}, SsdCase{70, 16, true, false}}) {
    const int T = k.T, chunk = k.chunk;
    const std::string tag = "ssd_discrete_T" + std::to_string(T) + "_Q" + std::to_string(chunk) + "_";
    SCOPED_TRACE(tag);
    const int ld_x = nh * P + 5, ld_bc = G * N + 3;
    const int ld_dx = nh * P + 2, ld_dbc = G * N + 1;
    const size_t TY = static_cast<size_t>(T) * nh * P, SN = static_cast<size_t>(nh) * P * N;
    const uint32_t s0 = 3000 + 10 * static_cast<uint32_t>(T + chunk);
    std::vector<float> log_a = rand_dt(static_cast<size_t>(T) * nh, s0 + 2);  // -softplus(normal): decays 0.05 .. 0.95
    for (float& v : log_a) v = -v;
    const std::vector<float> x = randv(static_cast<size_t>(T) * ld_x, s0 + 1),
                             B = randv(static_cast<size_t>(T) * ld_bc, s0 + 4),
                             C = randv(static_cast<size_t>(T) * ld_bc, s0 + 5), D = randv(nh, s0 + 6),
                             S0 = k.S0 ? randv(SN, s0 + 7) : std::vector<float>(SN, 0.0f), dy = randv(TY, s0 + 8);
    auto run = [&](const KernelContext& c, decltype(&ref::ssd_scan_discrete_backward) fn) {
      SsdGrads g{std::vector<float>(static_cast<size_t>(T) * ld_dx, 7.0f),
                 std::vector<float>(static_cast<size_t>(T) * nh, 7.0f), {},
                 std::vector<float>(static_cast<size_t>(T) * ld_dbc, 7.0f),
                 std::vector<float>(static_cast<size_t>(T) * ld_dbc, 7.0f), std::vector<float>(nh, -1.0f),
                 std::vector<float>(SN, 7.0f)};
      fn(c, x.data(), ld_x, log_a.data(), B.data(), C.data(), ld_bc, D.data(), dm, chunk, k.S0 ? S0.data() : nullptr,
         T, dy.data(), g.dx.data(), ld_dx, g.ddt.data(), g.dB.data(), g.dC.data(), ld_dbc, g.dD.data(),
         k.want ? g.dS0.data() : nullptr);
      for (float& v : g.dD) v += 1.0f;
      EXPECT_TRUE(padding_untouched(g.dx, ld_dx, T, nh * P, 7.0f));
      EXPECT_TRUE(padding_untouched(g.dB, ld_dbc, T, G * N, 7.0f));
      EXPECT_TRUE(padding_untouched(g.dC, ld_dbc, T, G * N, 7.0f));
      if (!k.want) {
        EXPECT_EQ(g.dS0, std::vector<float>(SN, 7.0f));
      }
      return g;
    };
    const SsdGrads r = run(ref_ctx, &ref::ssd_scan_discrete_backward);

    auto forward = [&](const std::vector<float>& xv, const std::vector<float>& lav, const std::vector<float>& Bv,
                       const std::vector<float>& Cv, const std::vector<float>& Dv, std::vector<float> Sv) {
      std::vector<float> y(TY);
      ref::ssd_scan_discrete(ref_ctx, xv.data(), ld_x, lav.data(), Bv.data(), Cv.data(), ld_bc, Dv.data(), dm, chunk,
                             Sv.data(), T, y.data());
      return y;
    };
    const float h = 1e-2f;
    const int W = nh * P, GN = G * N;
    const Probe px(x, aligned(x.size(), r.dx, ld_x, ld_dx, T, W, s0 + 21), h), pla(log_a, aligned(r.ddt, s0 + 22), h),
        pB(B, aligned(B.size(), r.dB, ld_bc, ld_dbc, T, GN, s0 + 24), h),
        pC(C, aligned(C.size(), r.dC, ld_bc, ld_dbc, T, GN, s0 + 25), h), pD(D, aligned(r.dD, s0 + 26), h),
        pS(S0, k.want ? aligned(r.dS0, s0 + 27) : randv(SN, s0 + 27), h);
    using V = std::vector<float>;
    const double bound = tol::kBackwardVsFiniteDiff;
    expect_below(tag + "fd_x", rel(dot_rows(r.dx, ld_dx, px.diff, ld_x, T, W),
                                   directional([&](const V& v) { return forward(v, log_a, B, C, D, S0); }, px, dy)),
                 bound);
    expect_below(tag + "fd_log_a", rel(dot(r.ddt, pla.diff),
                                       directional([&](const V& v) { return forward(x, v, B, C, D, S0); }, pla, dy)),
                 bound);
    expect_below(tag + "fd_B", rel(dot_rows(r.dB, ld_dbc, pB.diff, ld_bc, T, GN),
                                   directional([&](const V& v) { return forward(x, log_a, v, C, D, S0); }, pB, dy)),
                 bound);
    expect_below(tag + "fd_C", rel(dot_rows(r.dC, ld_dbc, pC.diff, ld_bc, T, GN),
                                   directional([&](const V& v) { return forward(x, log_a, B, v, D, S0); }, pC, dy)),
                 bound);
    expect_below(tag + "fd_D", rel(dot(r.dD, pD.diff),
                                   directional([&](const V& v) { return forward(x, log_a, B, C, v, S0); }, pD, dy)),
                 bound);
    if (k.want)
      expect_below(tag + "fd_S0", rel(dot(r.dS0, pS.diff),
                                      directional([&](const V& v) { return forward(x, log_a, B, C, D, v); }, pS, dy)),
                   bound);

    const SsdGrads c = run(ctx, &cpu::ssd_scan_discrete_backward);
    const double cb = tol::kBackwardCpuVsRef;
    expect_below(tag + "cpu_dx", max_rel_rows(c.dx, ld_dx, r.dx, ld_dx, T, W), cb);
    expect_below(tag + "cpu_dlog_a", max_rel(c.ddt, r.ddt), cb);
    expect_below(tag + "cpu_dB", max_rel_rows(c.dB, ld_dbc, r.dB, ld_dbc, T, GN), cb);
    expect_below(tag + "cpu_dC", max_rel_rows(c.dC, ld_dbc, r.dC, ld_dbc, T, GN), cb);
    expect_below(tag + "cpu_dD", max_rel(c.dD, r.dD), cb);
    if (k.want) expect_below(tag + "cpu_dS0", max_rel(c.dS0, r.dS0), cb);
    const SsdGrads c1 = run(ctx1, &cpu::ssd_scan_discrete_backward);
    EXPECT_TRUE(c1.dx == c.dx && c1.ddt == c.ddt && c1.dB == c.dB && c1.dC == c.dC && c1.dD == c.dD &&
                c1.dS0 == c.dS0);
  }
}

// The CPU SSD backward works in matrix products inside each chunk (register tiles of 32 columns)
// and a recurrence across chunks: head_dim and d_state of 32 take the tiles' full-width path that
// the shapes above (P = 6, N = 12) leave to the partial one. Strong decay (log-decays per chunk
// down to -100 and below, where exp underflows and a gradient of the log-decay formed as a
// difference of cumulative sums would cancel) must still match the ref's sequential float64 sums.
// Both forms; cpu against ref and one thread against two (the ref itself is checked against
// finite differences above).
TEST_F(ScanBackward, SsdFullTilesAndStrongDecay) {
  const SsdDims dm{4, 32, 2, 32};
  const int nh = dm.n_heads, P = dm.head_dim, G = dm.n_groups, N = dm.d_state;
  struct Case {
    int T, chunk;
    float decay;  // the log-decays' scale
    bool discrete;
  };
  for (const Case& k : {Case{100, 64, 1.0f, false}, Case{77, 16, 8.0f, false}, Case{100, 64, 40.0f, false},
                        Case{100, 64, 1.0f, true}, Case{70, 32, 30.0f, true}}) {
    const int T = k.T, chunk = k.chunk;
    const std::string tag = std::string(k.discrete ? "ssd_discrete" : "ssd") + "_tiles_T" + std::to_string(T) + "_Q" +
                            std::to_string(chunk) + "_decay" + std::to_string(static_cast<int>(k.decay)) + "_";
    SCOPED_TRACE(tag);
    const int ld_x = nh * P + 3, ld_bc = G * N + 1, ld_dx = nh * P + 1, ld_dbc = G * N + 2;
    const size_t TY = static_cast<size_t>(T) * nh * P, SN = static_cast<size_t>(nh) * P * N;
    const uint32_t s0 = 5000 + 10 * static_cast<uint32_t>(T + chunk);
    std::vector<float> dt = rand_dt(static_cast<size_t>(T) * nh, s0 + 2), A = rand_A(nh, s0 + 3);
    if (k.discrete)
      for (float& v : dt) v = -k.decay * v;  // the log-decay itself
    else
      for (float& v : A) v *= k.decay;
    const std::vector<float> x = randv(static_cast<size_t>(T) * ld_x, s0 + 1),
                             B = randv(static_cast<size_t>(T) * ld_bc, s0 + 4),
                             C = randv(static_cast<size_t>(T) * ld_bc, s0 + 5), D = randv(nh, s0 + 6),
                             S0 = randv(SN, s0 + 7), dy = randv(TY, s0 + 8);
    auto run = [&](const KernelContext& c, const KernelTable& t) {
      SsdGrads g{std::vector<float>(static_cast<size_t>(T) * ld_dx, 7.0f),
                 std::vector<float>(static_cast<size_t>(T) * nh, 7.0f), std::vector<float>(nh, 0.0f),
                 std::vector<float>(static_cast<size_t>(T) * ld_dbc, 7.0f),
                 std::vector<float>(static_cast<size_t>(T) * ld_dbc, 7.0f), std::vector<float>(nh, 0.0f),
                 std::vector<float>(SN, 7.0f)};
      if (k.discrete)
        t.ssd_scan_discrete_backward(c, x.data(), ld_x, dt.data(), B.data(), C.data(), ld_bc, D.data(), dm, chunk,
                                     S0.data(), T, dy.data(), g.dx.data(), ld_dx, g.ddt.data(), g.dB.data(),
                                     g.dC.data(), ld_dbc, g.dD.data(), g.dS0.data());
      else
        t.ssd_scan_backward(c, x.data(), ld_x, dt.data(), A.data(), B.data(), C.data(), ld_bc, D.data(), dm, chunk,
                            S0.data(), T, dy.data(), g.dx.data(), ld_dx, g.ddt.data(), g.dA.data(), g.dB.data(),
                            g.dC.data(), ld_dbc, g.dD.data(), g.dS0.data());
      EXPECT_TRUE(padding_untouched(g.dx, ld_dx, T, nh * P, 7.0f));
      EXPECT_TRUE(padding_untouched(g.dB, ld_dbc, T, G * N, 7.0f));
      EXPECT_TRUE(padding_untouched(g.dC, ld_dbc, T, G * N, 7.0f));
      return g;
    };
    const SsdGrads r = run(ref_ctx, ref_kernels()), c = run(ctx, cpu_kernels()), c1 = run(ctx1, cpu_kernels());
    const double cb = tol::kBackwardCpuVsRef;
    expect_below(tag + "cpu_dx", max_rel_rows(c.dx, ld_dx, r.dx, ld_dx, T, nh * P), cb);
    expect_below(tag + "cpu_ddt", max_rel(c.ddt, r.ddt), cb);
    if (!k.discrete) expect_below(tag + "cpu_dA", max_rel(c.dA, r.dA), cb);
    expect_below(tag + "cpu_dB", max_rel_rows(c.dB, ld_dbc, r.dB, ld_dbc, T, G * N), cb);
    expect_below(tag + "cpu_dC", max_rel_rows(c.dC, ld_dbc, r.dC, ld_dbc, T, G * N), cb);
    expect_below(tag + "cpu_dD", max_rel(c.dD, r.dD), cb);
    expect_below(tag + "cpu_dS0", max_rel(c.dS0, r.dS0), cb);
    EXPECT_TRUE(c1.dx == c.dx && c1.ddt == c.ddt && c1.dA == c.dA && c1.dB == c.dB && c1.dC == c.dC &&
                c1.dD == c.dD && c1.dS0 == c.dS0);
  }
}

}  // namespace
}  // namespace hybridlm
