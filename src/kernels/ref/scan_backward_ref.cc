// Reference backward of the two scans (docs/derivations/mamba1-scan.md, mamba2-ssd.md): the
// oracle the cpu kernels are tested against. The forward is rerun in double and every state kept
// (T + 1 of them), then the adjoint of the state is walked back in time exactly as in the
// derivations. Memory O(T) states: fine for an oracle, which is why the cpu kernels checkpoint.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/kernels.h"

namespace hybridlm::ref {

void mamba1_scan_backward(const KernelContext&, const float* x, int ld_x, const float* dt, const float* A,
                          const float* B, const float* C, int ld_bc, const float* D, const float* z, int ld_z,
                          const float* h0, int T, int I, int N, const float* dy, float* dx, int ld_dx, float* ddt,
                          float* dA, float* dB, float* dC, int ld_dbc, float* dD, float* dz, int ld_dz,
                          float* dh0) {
  const size_t IN = static_cast<size_t>(I) * N;
  auto X = [&](int t, int i) { return static_cast<double>(x[static_cast<size_t>(t) * ld_x + i]); };
  auto Dt = [&](int t, int i) { return static_cast<double>(dt[static_cast<size_t>(t) * I + i]); };
  auto Bv = [&](int t, int n) { return static_cast<double>(B[static_cast<size_t>(t) * ld_bc + n]); };
  auto Cv = [&](int t, int n) { return static_cast<double>(C[static_cast<size_t>(t) * ld_bc + n]); };
  // hs[t + 1] = h_t, hs[0] = h0.
  std::vector<double> hs((static_cast<size_t>(T) + 1) * IN, 0.0);
  if (h0)
    for (size_t k = 0; k < IN; ++k) hs[k] = h0[k];
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < I; ++i)
      for (int n = 0; n < N; ++n) {
        const size_t k = static_cast<size_t>(i) * N + n;
        hs[(t + 1) * IN + k] = std::exp(Dt(t, i) * A[k]) * hs[t * IN + k] + Dt(t, i) * Bv(t, n) * X(t, i);
      }
  std::vector<double> g(IN, 0.0), gA(IN, 0.0), gD(I, 0.0), gB(N), gC(N);  // g = dL/dh_t
  for (int t = T - 1; t >= 0; --t) {
    const double* ht = &hs[(t + 1) * IN];
    const double* hp = &hs[t * IN];
    std::fill(gB.begin(), gB.end(), 0.0);
    std::fill(gC.begin(), gC.end(), 0.0);
    for (int i = 0; i < I; ++i) {
      // The gate: out = y silu(z), so dz = dout y silu'(z) and the scan sees dy = dout silu(z).
      double y = D[i] * X(t, i);
      for (int n = 0; n < N; ++n) y += ht[static_cast<size_t>(i) * N + n] * Cv(t, n);
      const double zv = z[static_cast<size_t>(t) * ld_z + i];
      const double sg = 1.0 / (1.0 + std::exp(-zv));
      const double dout = dy[static_cast<size_t>(t) * I + i];
      dz[static_cast<size_t>(t) * ld_dz + i] = static_cast<float>(dout * y * sg * (1.0 + zv * (1.0 - sg)));
      const double dys = dout * zv * sg;
      gD[i] += dys * X(t, i);
      double gb = 0, dd = 0;
      for (int n = 0; n < N; ++n) {
        const size_t k = static_cast<size_t>(i) * N + n;
        g[k] += dys * Cv(t, n);  // y_t reads h_t
        gC[n] += dys * ht[k];
        const double decay = std::exp(Dt(t, i) * A[k]);
        const double hd = decay * hp[k];  // the decayed previous state
        gb += g[k] * Bv(t, n);
        dd += g[k] * (Bv(t, n) * X(t, i) + A[k] * hd);
        gB[n] += g[k] * Dt(t, i) * X(t, i);
        gA[k] += g[k] * Dt(t, i) * hd;
        g[k] *= decay;  // now dL/dh_{t-1}
      }
      dx[static_cast<size_t>(t) * ld_dx + i] = static_cast<float>(D[i] * dys + Dt(t, i) * gb);
      ddt[static_cast<size_t>(t) * I + i] = static_cast<float>(dd);
    }
    for (int n = 0; n < N; ++n) {
      dB[static_cast<size_t>(t) * ld_dbc + n] = static_cast<float>(gB[n]);
      dC[static_cast<size_t>(t) * ld_dbc + n] = static_cast<float>(gC[n]);
    }
  }
  for (size_t k = 0; k < IN; ++k) dA[k] += static_cast<float>(gA[k]);
  for (int i = 0; i < I; ++i) dD[i] += static_cast<float>(gD[i]);
  if (dh0)
    for (size_t k = 0; k < IN; ++k) dh0[k] = static_cast<float>(g[k]);
}

namespace {

// Both SSD scans' backward: Mamba-2 (A given: input scale dt, decay exp(dt A); writes ddt and adds
// dA) and the discrete form (A null: `dt` holds the log-decay, input scale 1; writes its gradient
// into ddt). The sequential recurrence, not the chunked form: the chunk only shapes the forward's
// arithmetic, and the gradient of the math is the same for any chunk.
void ssd_backward(const float* x, int ld_x, const float* dt, const float* A, const float* B, const float* C, int ld_bc,
                  const float* D, const SsdDims& dims, const float* S0, int T, const float* dy, float* dx, int ld_dx,
                  float* ddt, float* dA, float* dB, float* dC, int ld_dbc, float* dD, float* dS0) {
  const int nh = dims.n_heads, P = dims.head_dim, N = dims.d_state, G = dims.n_groups;
  const int hpg = nh / G;
  const size_t PN = static_cast<size_t>(P) * N, GN = static_cast<size_t>(G) * N;
  std::vector<double> gB(static_cast<size_t>(T) * GN, 0.0), gC(gB.size(), 0.0);
  std::vector<double> Ss((static_cast<size_t>(T) + 1) * PN), gS(PN);  // Ss[t + 1] = S_t; gS = dL/dS_t
  for (int h = 0; h < nh; ++h) {
    const int g = h / hpg;
    auto X = [&](int t, int p) { return static_cast<double>(x[static_cast<size_t>(t) * ld_x + h * P + p]); };
    auto Bv = [&](int t, int n) { return static_cast<double>(B[static_cast<size_t>(t) * ld_bc + g * N + n]); };
    auto Cv = [&](int t, int n) { return static_cast<double>(C[static_cast<size_t>(t) * ld_bc + g * N + n]); };
    for (size_t k = 0; k < PN; ++k) Ss[k] = S0 ? S0[h * PN + k] : 0.0;
    // The input scale and decay of step t.
    auto coeffs = [&](int t, double& d, double& a) {
      const double v = dt[static_cast<size_t>(t) * nh + h];
      d = A ? v : 1.0;
      a = std::exp(A ? v * A[h] : v);
    };
    for (int t = 0; t < T; ++t) {
      double d, a;
      coeffs(t, d, a);
      for (int p = 0; p < P; ++p)
        for (int n = 0; n < N; ++n) {
          const size_t k = static_cast<size_t>(p) * N + n;
          Ss[(t + 1) * PN + k] = a * Ss[t * PN + k] + d * X(t, p) * Bv(t, n);
        }
    }
    std::fill(gS.begin(), gS.end(), 0.0);
    double gA = 0, gD = 0;
    for (int t = T - 1; t >= 0; --t) {
      const double* St = &Ss[(t + 1) * PN];
      const double* Sp = &Ss[t * PN];
      double d, a;
      coeffs(t, d, a);
      auto Dy = [&](int p) { return static_cast<double>(dy[static_cast<size_t>(t) * nh * P + h * P + p]); };
      double gss = 0, xgb = 0;
      for (int p = 0; p < P; ++p) {
        gD += Dy(p) * X(t, p);
        double gb = 0;
        for (int n = 0; n < N; ++n) {
          const size_t k = static_cast<size_t>(p) * N + n;
          gS[k] += Dy(p) * Cv(t, n);  // y_t reads S_t
          gC[t * GN + g * N + n] += St[k] * Dy(p);
          gb += gS[k] * Bv(t, n);
          gB[t * GN + g * N + n] += d * gS[k] * X(t, p);
          gss += gS[k] * Sp[k];
        }
        dx[static_cast<size_t>(t) * ld_dx + h * P + p] = static_cast<float>(D[h] * Dy(p) + d * gb);
        xgb += X(t, p) * gb;
      }
      const double da = a * gss;  // dL/d(log decay): <dL/dS_t, a S_{t-1}>
      ddt[static_cast<size_t>(t) * nh + h] = static_cast<float>(A ? xgb + A[h] * da : da);
      gA += d * da;
      for (double& v : gS) v *= a;  // now dL/dS_{t-1}
    }
    if (A) dA[h] += static_cast<float>(gA);
    dD[h] += static_cast<float>(gD);
    if (dS0)
      for (size_t k = 0; k < PN; ++k) dS0[h * PN + k] = static_cast<float>(gS[k]);
  }
  for (int t = 0; t < T; ++t)
    for (size_t k = 0; k < GN; ++k) {
      dB[static_cast<size_t>(t) * ld_dbc + k] = static_cast<float>(gB[t * GN + k]);
      dC[static_cast<size_t>(t) * ld_dbc + k] = static_cast<float>(gC[t * GN + k]);
    }
}

}  // namespace

void ssd_scan_backward(const KernelContext&, const float* x, int ld_x, const float* dt, const float* A,
                       const float* B, const float* C, int ld_bc, const float* D, const SsdDims& dims, int,
                       const float* S0, int T, const float* dy, float* dx, int ld_dx, float* ddt, float* dA,
                       float* dB, float* dC, int ld_dbc, float* dD, float* dS0) {
  ssd_backward(x, ld_x, dt, A, B, C, ld_bc, D, dims, S0, T, dy, dx, ld_dx, ddt, dA, dB, dC, ld_dbc, dD, dS0);
}

void ssd_scan_discrete_backward(const KernelContext&, const float* x, int ld_x, const float* log_a, const float* B,
                                const float* C, int ld_bc, const float* D, const SsdDims& dims, int, const float* S0,
                                int T, const float* dy, float* dx, int ld_dx, float* dlog_a, float* dB, float* dC,
                                int ld_dbc, float* dD, float* dS0) {
  ssd_backward(x, ld_x, log_a, nullptr, B, C, ld_bc, D, dims, S0, T, dy, dx, ld_dx, dlog_a, nullptr, dB, dC, ld_dbc,
               dD, dS0);
}

}  // namespace hybridlm::ref
