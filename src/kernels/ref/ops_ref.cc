// Scalar reference kernels: the oracle the optimized kernels are tested against. Plain loops in
// the order of the math, double accumulators where a sum runs long. Not fast, obviously correct.
#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "base/error.h"
#include "kernels/kernels.h"

namespace hybridlm::ref {

float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }
float silu(float x) { return x / (1.0f + std::exp(-x)); }

static float weight_at(const WeightView& W, int r, int c) {
  if (W.dtype == DType::I8) {
    const int code = q8_weight_code(static_cast<const uint8_t*>(W.data), q8_code_index(r, c, W.cols));
    return static_cast<float>(code) * W.scales[q8_scale_index(r, c / kQ8Block, W.cols)];
  }
  if (W.dtype == DType::U8) {
    const int code = q4_weight_code(static_cast<const uint8_t*>(W.data), r, c, W.cols) - kQ4Zero;
    return static_cast<float>(code) * W.scales[q8_scale_index(r, c / kQ8Block, W.cols)];
  }
  const size_t i = W.panels ? panel_index(r, c, W.cols) : static_cast<size_t>(r) * W.cols + c;
  if (W.dtype == DType::BF16) return bf16_to_f32(static_cast<const uint16_t*>(W.data)[i]);
  return static_cast<const float*>(W.data)[i];
}

// q8_0 and q4_0: each activation row quantized to q8_0 (the same function the CPU kernel calls),
// exact integer block sums of the weights' signed codes, then sum over blocks of isum * dw * dx in
// double.
static int signed_code(const WeightView& W, int r, int i) {
  const uint8_t* codes = static_cast<const uint8_t*>(W.data);
  if (W.dtype == DType::U8) return q4_weight_code(codes, r, i, W.cols) - kQ4Zero;
  return q8_weight_code(codes, q8_code_index(r, i, W.cols));
}
static void matmul_quantized(const WeightView& W, const float* bias, const float* x, int T, float* y) {
  const int ld = q8_row_stride(W.cols), nb = q8_row_blocks(W.cols);
  std::vector<int8_t> xq(static_cast<size_t>(ld));
  std::vector<float> xs(static_cast<size_t>(nb));
  for (int t = 0; t < T; ++t) {
    quantize_q8_0_row(x + static_cast<size_t>(t) * W.cols, W.cols, xq.data(), xs.data());
    for (int r = 0; r < W.rows; ++r) {
      double acc = bias ? bias[r] : 0.0;
      for (int b = 0; b < nb; ++b) {
        int64_t isum = 0;
        for (int i = b * kQ8Block; i < (b + 1) * kQ8Block; ++i)
          isum += static_cast<int64_t>(signed_code(W, r, i)) * xq[i];
        acc += static_cast<double>(isum) * W.scales[q8_scale_index(r, b, W.cols)] * xs[b];
      }
      y[static_cast<size_t>(t) * W.rows + r] = static_cast<float>(acc);
    }
  }
}

void quantize_q8_0_rows(const KernelContext&, const float* x, int T, int n, int8_t* codes, float* scales) {
  for (int t = 0; t < T; ++t)
    quantize_q8_0_row(x + static_cast<size_t>(t) * n, n, codes + static_cast<size_t>(t) * q8_row_stride(n),
                      scales + static_cast<size_t>(t) * q8_row_blocks(n));
}

void matmul(const KernelContext&, const WeightView& W, const float* bias, const float* x, int T,
            float* y) {
  if (W.dtype == DType::I8 || W.dtype == DType::U8) return matmul_quantized(W, bias, x, T, y);
  for (int t = 0; t < T; ++t) {
    for (int r = 0; r < W.rows; ++r) {
      double acc = bias ? bias[r] : 0.0;
      for (int c = 0; c < W.cols; ++c) acc += static_cast<double>(weight_at(W, r, c)) * x[static_cast<size_t>(t) * W.cols + c];
      y[static_cast<size_t>(t) * W.rows + r] = static_cast<float>(acc);
    }
  }
}

void rmsnorm(const KernelContext&, const float* x, const float* w, int T, int d, float eps,
             float* y) {
  for (int t = 0; t < T; ++t) {
    const float* xr = x + static_cast<size_t>(t) * d;
    float* yr = y + static_cast<size_t>(t) * d;
    double ss = 0;
    for (int i = 0; i < d; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    float inv = static_cast<float>(1.0 / std::sqrt(ss / d + eps));
    for (int i = 0; i < d; ++i) yr[i] = xr[i] * inv * (w ? w[i] : 1.0f);
  }
}

void gated_rmsnorm(const KernelContext&, const float* y, const float* z, int ld_z,
                   const float* w, int T, int d, int group_size, float eps, float* out) {
  std::vector<float> g(d);
  for (int t = 0; t < T; ++t) {
    for (int i = 0; i < d; ++i) g[i] = y[static_cast<size_t>(t) * d + i] * silu(z[static_cast<size_t>(t) * ld_z + i]);
    for (int g0 = 0; g0 < d; g0 += group_size) {
      double ss = 0;
      for (int i = g0; i < g0 + group_size; ++i) ss += static_cast<double>(g[i]) * g[i];
      float inv = static_cast<float>(1.0 / std::sqrt(ss / group_size + eps));
      for (int i = g0; i < g0 + group_size; ++i) out[static_cast<size_t>(t) * d + i] = g[i] * inv * w[i];
    }
  }
}

void conv1d_causal(const KernelContext&, const float* x, int ld_x, const float* w,
                   const float* bias, float* state, int T, int C, int K, bool apply_silu,
                   float* out) {
  // window: (K-1+T, C) = previous inputs followed by this run's inputs.
  std::vector<float> win(static_cast<size_t>(K - 1 + T) * C);
  for (int k = 0; k < K - 1; ++k)
    for (int c = 0; c < C; ++c) win[static_cast<size_t>(k) * C + c] = state[static_cast<size_t>(k) * C + c];
  for (int t = 0; t < T; ++t)
    for (int c = 0; c < C; ++c) win[static_cast<size_t>(K - 1 + t) * C + c] = x[static_cast<size_t>(t) * ld_x + c];
  for (int t = 0; t < T; ++t) {
    for (int c = 0; c < C; ++c) {
      double acc = bias ? bias[c] : 0.0;
      for (int k = 0; k < K; ++k) acc += static_cast<double>(w[static_cast<size_t>(c) * K + k]) * win[static_cast<size_t>(t + k) * C + c];
      float v = static_cast<float>(acc);
      out[static_cast<size_t>(t) * C + c] = apply_silu ? silu(v) : v;
    }
  }
  for (int k = 0; k < K - 1; ++k)
    for (int c = 0; c < C; ++c) state[static_cast<size_t>(k) * C + c] = win[static_cast<size_t>(T + k) * C + c];
}

void mamba1_scan(const KernelContext&, const float* x, int ld_x, const float* dt,
                 const float* A, const float* B, const float* C, int ld_bc, const float* D,
                 const float* z, int ld_z, float* h, int T, int I, int N, float* y) {
  for (int t = 0; t < T; ++t) {
    const float* Bt = B + static_cast<size_t>(t) * ld_bc;
    const float* Ct = C + static_cast<size_t>(t) * ld_bc;
    for (int i = 0; i < I; ++i) {
      float xt = x[static_cast<size_t>(t) * ld_x + i];
      float d = dt[static_cast<size_t>(t) * I + i];
      double acc = 0;
      for (int n = 0; n < N; ++n) {
        float& hs = h[static_cast<size_t>(i) * N + n];
        hs = std::exp(d * A[static_cast<size_t>(i) * N + n]) * hs + d * Bt[n] * xt;
        acc += static_cast<double>(hs) * Ct[n];
      }
      float out = static_cast<float>(acc) + D[i] * xt;
      y[static_cast<size_t>(t) * I + i] = out * silu(z[static_cast<size_t>(t) * ld_z + i]);
    }
  }
}

// The SSD chunked form (Dao & Gu 2024, "Transformers are SSMs", section 6), written as explicit
// loops. Within a chunk with cumulative log-decay s_i = sum_{k<=i} dt_k A:
//   y_i = sum_{j<=i} exp(s_i - s_j) (C_i . B_j) dt_j x_j   (intra-chunk, the "diagonal block")
//       + exp(s_i) C_i . S_in                               (contribution of the incoming state)
//   S_out = exp(s_last) S_in + sum_j exp(s_last - s_j) dt_j x_j B_j^T
// plus D x_i. This equals the sequential recurrence exactly in exact arithmetic.
void ssd_scan(const KernelContext&, const float* x, int ld_x, const float* dt, const float* A,
              const float* B, const float* C, int ld_bc, const float* D, const SsdDims& dims,
              int chunk, float* S, int T, float* y) {
  const int nh = dims.n_heads, P = dims.head_dim, N = dims.d_state;
  const int heads_per_group = nh / dims.n_groups;
  std::vector<double> s(chunk);
  for (int h = 0; h < nh; ++h) {
    const int g = h / heads_per_group;
    float* Sh = S + static_cast<size_t>(h) * P * N;
    for (int c0 = 0; c0 < T; c0 += chunk) {
      const int Q = std::min(chunk, T - c0);
      double acc_s = 0;
      for (int i = 0; i < Q; ++i) {
        acc_s += static_cast<double>(dt[static_cast<size_t>(c0 + i) * nh + h]) * A[h];
        s[i] = acc_s;
      }
      for (int i = 0; i < Q; ++i) {
        const int ti = c0 + i;
        const float* Ci = C + static_cast<size_t>(ti) * ld_bc + static_cast<size_t>(g) * N;
        for (int p = 0; p < P; ++p) {
          double acc = 0;
          for (int j = 0; j <= i; ++j) {
            const int tj = c0 + j;
            const float* Bj = B + static_cast<size_t>(tj) * ld_bc + static_cast<size_t>(g) * N;
            double cb = 0;
            for (int n = 0; n < N; ++n) cb += static_cast<double>(Ci[n]) * Bj[n];
            acc += std::exp(s[i] - s[j]) * cb * dt[static_cast<size_t>(tj) * nh + h] *
                   x[static_cast<size_t>(tj) * ld_x + static_cast<size_t>(h) * P + p];
          }
          double off = 0;
          for (int n = 0; n < N; ++n) off += static_cast<double>(Ci[n]) * Sh[static_cast<size_t>(p) * N + n];
          acc += std::exp(s[i]) * off;
          const float xi = x[static_cast<size_t>(ti) * ld_x + static_cast<size_t>(h) * P + p];
          y[static_cast<size_t>(ti) * nh * P + static_cast<size_t>(h) * P + p] = static_cast<float>(acc + D[h] * xi);
        }
      }
      const double s_last = s[Q - 1];
      for (int p = 0; p < P; ++p) {
        for (int n = 0; n < N; ++n) {
          double acc = std::exp(s_last) * Sh[static_cast<size_t>(p) * N + n];
          for (int j = 0; j < Q; ++j) {
            const int tj = c0 + j;
            acc += std::exp(s_last - s[j]) * dt[static_cast<size_t>(tj) * nh + h] *
                   x[static_cast<size_t>(tj) * ld_x + static_cast<size_t>(h) * P + p] *
                   B[static_cast<size_t>(tj) * ld_bc + static_cast<size_t>(g) * N + n];
          }
          Sh[static_cast<size_t>(p) * N + n] = static_cast<float>(acc);
        }
      }
    }
  }
}

void ssd_step(const KernelContext&, const float* x, const float* dt, const float* A, const float* B,
              const float* C, const float* D, const SsdDims& dims, float* S, float* y) {
  const int nh = dims.n_heads, P = dims.head_dim, N = dims.d_state;
  const int heads_per_group = nh / dims.n_groups;
  for (int h = 0; h < nh; ++h) {
    const int g = h / heads_per_group;
    const double decay = std::exp(static_cast<double>(dt[h]) * A[h]);
    for (int p = 0; p < P; ++p) {
      const double xv = x[h * P + p];
      double acc = 0;
      for (int n = 0; n < N; ++n) {
        float& s = S[(static_cast<size_t>(h) * P + p) * N + n];
        s = static_cast<float>(decay * s + dt[h] * xv * B[g * N + n]);
        acc += static_cast<double>(s) * C[g * N + n];
      }
      y[h * P + p] = static_cast<float>(acc + D[h] * xv);
    }
  }
}

// The discrete Mamba-2 scan in the same chunked form as ssd_scan, with the cumulative log-decay
// s_i = sum_{k<=i} log_a_k and input weights 1 in place of dt:
//   y_i = sum_{j<=i} exp(s_i - s_j) (C_i . B_j) x_j + exp(s_i) C_i . S_in + D x_i
//   S_out = exp(s_last) S_in + sum_j exp(s_last - s_j) x_j B_j^T
void ssd_scan_discrete(const KernelContext&, const float* x, int ld_x, const float* log_a, const float* B,
                       const float* C, int ld_bc, const float* D, const SsdDims& dims, int chunk, float* S, int T,
                       float* y) {
  const int nh = dims.n_heads, P = dims.head_dim, N = dims.d_state;
  const int heads_per_group = nh / dims.n_groups;
  std::vector<double> s(chunk);
  auto xv = [&](int t, int h, int p) {
    return static_cast<double>(x[static_cast<size_t>(t) * ld_x + static_cast<size_t>(h) * P + p]);
  };
  for (int h = 0; h < nh; ++h) {
    const size_t goff = static_cast<size_t>(h / heads_per_group) * N;
    float* Sh = S + static_cast<size_t>(h) * P * N;
    for (int c0 = 0; c0 < T; c0 += chunk) {
      const int Q = std::min(chunk, T - c0);
      double acc_s = 0;
      for (int i = 0; i < Q; ++i) {
        acc_s += log_a[static_cast<size_t>(c0 + i) * nh + h];
        s[i] = acc_s;
      }
      for (int i = 0; i < Q; ++i) {
        const float* Ci = C + static_cast<size_t>(c0 + i) * ld_bc + goff;
        for (int p = 0; p < P; ++p) {
          double acc = 0;
          for (int j = 0; j <= i; ++j) {
            const float* Bj = B + static_cast<size_t>(c0 + j) * ld_bc + goff;
            double cb = 0;
            for (int n = 0; n < N; ++n) cb += static_cast<double>(Ci[n]) * Bj[n];
            acc += std::exp(s[i] - s[j]) * cb * xv(c0 + j, h, p);
          }
          double off = 0;
          for (int n = 0; n < N; ++n) off += static_cast<double>(Ci[n]) * Sh[static_cast<size_t>(p) * N + n];
          acc += std::exp(s[i]) * off;
          y[static_cast<size_t>(c0 + i) * nh * P + static_cast<size_t>(h) * P + p] =
              static_cast<float>(acc + D[h] * xv(c0 + i, h, p));
        }
      }
      const double s_last = s[Q - 1];
      for (int p = 0; p < P; ++p) {
        for (int n = 0; n < N; ++n) {
          double acc = std::exp(s_last) * Sh[static_cast<size_t>(p) * N + n];
          for (int j = 0; j < Q; ++j)
            acc += std::exp(s_last - s[j]) * xv(c0 + j, h, p) * B[static_cast<size_t>(c0 + j) * ld_bc + goff + n];
          Sh[static_cast<size_t>(p) * N + n] = static_cast<float>(acc);
        }
      }
    }
  }
}

void ssd_step_discrete(const KernelContext&, const float* x, const float* log_a, const float* B, const float* C,
                       const float* D, const SsdDims& dims, float* S, float* y) {
  const int nh = dims.n_heads, P = dims.head_dim, N = dims.d_state;
  const int heads_per_group = nh / dims.n_groups;
  for (int h = 0; h < nh; ++h) {
    const int g = h / heads_per_group;
    const double decay = std::exp(static_cast<double>(log_a[h]));
    for (int p = 0; p < P; ++p) {
      const double xv = x[h * P + p];
      double acc = 0;
      for (int n = 0; n < N; ++n) {
        float& s = S[(static_cast<size_t>(h) * P + p) * N + n];
        s = static_cast<float>(decay * s + xv * B[g * N + n]);
        acc += static_cast<double>(s) * C[g * N + n];
      }
      y[h * P + p] = static_cast<float>(acc + D[h] * xv);
    }
  }
}

// The gated delta rule as its sequential recurrence, one step at a time in the order of the math
// (double sums, the state kept in f32 between steps as the cache holds it). The scan ignores
// `chunk`: it is the oracle the chunked cpu version is checked against.
namespace {
// 1 / sqrt(sum x^2 + 1e-6) over n values (Hugging Face's and FLA's l2norm).
double inv_l2(const float* x, int n) {
  double ss = 0;
  for (int i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  return 1.0 / std::sqrt(ss + 1e-6);
}
}  // namespace

void gated_delta_scan(const KernelContext&, const float* q, const float* k, int ld_qk, const float* v, int ld_v,
                      const float* g, const float* beta, const GdnDims& dims, int, float* S, int T, float* y) {
  const int nv = dims.n_v_heads, dk = dims.k_dim, dv = dims.v_dim, rep = nv / dims.n_k_heads;
  const double q_scale = 1.0 / std::sqrt(static_cast<double>(dk));
  std::vector<double> kn(dk), qn(dk), delta(dv);
  for (int t = 0; t < T; ++t) {
    for (int h = 0; h < nv; ++h) {
      const size_t kh = static_cast<size_t>(t) * ld_qk + static_cast<size_t>(h / rep) * dk;
      const double rk = inv_l2(k + kh, dk), rq = inv_l2(q + kh, dk) * q_scale;
      for (int d = 0; d < dk; ++d) {
        kn[d] = k[kh + d] * rk;
        qn[d] = q[kh + d] * rq;
      }
      const double decay = std::exp(static_cast<double>(g[static_cast<size_t>(t) * nv + h]));
      const double b = beta[static_cast<size_t>(t) * nv + h];
      const float* vt = v + static_cast<size_t>(t) * ld_v + static_cast<size_t>(h) * dv;
      float* Sh = S + static_cast<size_t>(h) * dk * dv;
      // delta = beta (v - (exp(g) S)^T k)
      for (int e = 0; e < dv; ++e) {
        double kv = 0;
        for (int d = 0; d < dk; ++d) kv += decay * Sh[static_cast<size_t>(d) * dv + e] * kn[d];
        delta[e] = b * (vt[e] - kv);
      }
      // S = exp(g) S + k delta^T;  y = S^T q
      for (int d = 0; d < dk; ++d)
        for (int e = 0; e < dv; ++e) {
          float& s = Sh[static_cast<size_t>(d) * dv + e];
          s = static_cast<float>(decay * s + kn[d] * delta[e]);
        }
      for (int e = 0; e < dv; ++e) {
        double acc = 0;
        for (int d = 0; d < dk; ++d) acc += static_cast<double>(Sh[static_cast<size_t>(d) * dv + e]) * qn[d];
        y[static_cast<size_t>(t) * nv * dv + static_cast<size_t>(h) * dv + e] = static_cast<float>(acc);
      }
    }
  }
}

void gated_delta_step(const KernelContext& ctx, const float* q, const float* k, const float* v, const float* g,
                      const float* beta, const GdnDims& dims, float* S, float* y) {
  gated_delta_scan(ctx, q, k, dims.n_k_heads * dims.k_dim, v, dims.n_v_heads * dims.v_dim, g, beta, dims, 1, S, 1, y);
}

namespace {
std::vector<float> widen_bf16(const uint16_t* v, size_t n) {
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = bf16_to_f32(v[i]);
  return out;
}
void round_bf16(const std::vector<float>& v, uint16_t* out) {
  for (size_t i = 0; i < v.size(); ++i) out[i] = f32_to_bf16(v[i]);
}
}  // namespace

void ssd_step(const KernelContext& ctx, const float* x, const float* dt, const float* A, const float* B,
              const float* C, const float* D, const SsdDims& dims, uint16_t* S, float* y) {
  std::vector<float> s = widen_bf16(S, static_cast<size_t>(dims.n_heads) * dims.head_dim * dims.d_state);
  ssd_step(ctx, x, dt, A, B, C, D, dims, s.data(), y);
  round_bf16(s, S);
}

namespace {
// mamba2_step as the composition it is defined by, for either state storage.
template <class St>
void mamba2_step_composed(const KernelContext& ctx, const Mamba2StepParams& p, const float* zxbcdt, float* conv_state,
                          St* S, float* xbc, float* dt, float* y, float* out) {
  const SsdDims& dm = p.dims;
  const int nh = dm.n_heads, I = nh * dm.head_dim, GN = dm.n_groups * dm.d_state, C = I + 2 * GN;
  conv1d_causal(ctx, zxbcdt + I, C, p.conv_w, p.conv_b, conv_state, 1, C, p.d_conv, true, xbc);
  for (int h = 0; h < nh; ++h) dt[h] = zxbcdt[I + C + h] + p.dt_bias[h];
  softplus(ctx, dt, static_cast<size_t>(nh));
  for (int h = 0; h < nh; ++h) dt[h] = std::clamp(dt[h], p.dt_min, p.dt_max);
  ssd_step(ctx, xbc, dt, p.A, xbc + I, xbc + I + GN, p.D, dm, S, y);
  gated_rmsnorm(ctx, y, zxbcdt, I, p.norm_w, 1, I, p.norm_group, p.norm_eps, out);
}
}  // namespace

void mamba2_step(const KernelContext& ctx, const Mamba2StepParams& p, const float* zxbcdt, float* conv_state, float* S,
                 float* xbc, float* dt, float* y, float* out) {
  mamba2_step_composed(ctx, p, zxbcdt, conv_state, S, xbc, dt, y, out);
}
void mamba2_step(const KernelContext& ctx, const Mamba2StepParams& p, const float* zxbcdt, float* conv_state,
                 uint16_t* S, float* xbc, float* dt, float* y, float* out) {
  mamba2_step_composed(ctx, p, zxbcdt, conv_state, S, xbc, dt, y, out);
}

void mamba1_scan(const KernelContext& ctx, const float* x, int ld_x, const float* dt,
                 const float* A, const float* B, const float* C, int ld_bc, const float* D,
                 const float* z, int ld_z, uint16_t* h, int T, int I, int N, float* y) {
  std::vector<float> s = widen_bf16(h, static_cast<size_t>(I) * N);
  mamba1_scan(ctx, x, ld_x, dt, A, B, C, ld_bc, D, z, ld_z, s.data(), T, I, N, y);
  round_bf16(s, h);
}

void softplus(const KernelContext&, float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] = softplus(x[i]);
}

void embedding(const WeightView& E, const int32_t* ids, int T, float* out) {
  for (int t = 0; t < T; ++t)
    for (int c = 0; c < E.cols; ++c) out[static_cast<size_t>(t) * E.cols + c] = weight_at(E, ids[t], c);
}

void rope(const KernelContext&, float* x, int ld_x, int T, int pos0, int n_heads, int head_dim, int rot_dim,
          float theta) {
  const int half = rot_dim / 2;
  for (int t = 0; t < T; ++t) {
    for (int j = 0; j < half; ++j) {
      const double angle = static_cast<double>(pos0 + t) * std::pow(static_cast<double>(theta), -2.0 * j / rot_dim);
      const double c = std::cos(angle), s = std::sin(angle);
      for (int h = 0; h < n_heads; ++h) {
        float* v = x + static_cast<size_t>(t) * ld_x + static_cast<size_t>(h) * head_dim;
        const double a = v[j], b = v[j + half];
        v[j] = static_cast<float>(a * c - b * s);
        v[j + half] = static_cast<float>(b * c + a * s);
      }
    }
  }
}

void attention(const KernelContext&, const float* q, int ld_q, const PagedKv& kv, int pos0, int T, int n_heads,
               float scale, float* out) {
  check(kv.token_stride > 0 && kv.head_stride > 0, "attention: KV layout unset");
  const int hd = kv.head_dim, rep = n_heads / kv.n_kv_heads;
  std::vector<double> score, acc(static_cast<size_t>(hd)), qd(static_cast<size_t>(hd));
  std::vector<float> row(kv.row_elems());  // one token's K or V widened to f32 (exact)
  for (int t = 0; t < T; ++t) {
    const int n_keys = pos0 + t + 1;
    score.resize(n_keys);
    for (int h = 0; h < n_heads; ++h) {
      const float* qh = q + static_cast<size_t>(t) * ld_q + static_cast<size_t>(h) * hd;
      const size_t kv_off = static_cast<size_t>(h / rep) * hd;
      // Over bf16 keys the query is rounded to bf16 first (ops.inc).
      for (int i = 0; i < hd; ++i) qd[i] = kv.dtype == DType::BF16 ? bf16_to_f32(f32_to_bf16(qh[i])) : qh[i];
      double mx = -INFINITY;
      for (int j = 0; j < n_keys; ++j) {
        kv.load_k(j, row.data());
        double d = 0;
        for (int i = 0; i < hd; ++i) d += qd[i] * row[kv_off + i];
        score[j] = d * scale;
        mx = std::max(mx, score[j]);
      }
      double sum = 0;
      for (int j = 0; j < n_keys; ++j) sum += (score[j] = std::exp(score[j] - mx));
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int j = 0; j < n_keys; ++j) {
        kv.load_v(j, row.data());
        for (int i = 0; i < hd; ++i) acc[i] += score[j] * row[kv_off + i];
      }
      float* o = out + static_cast<size_t>(t) * n_heads * hd + static_cast<size_t>(h) * hd;
      for (int i = 0; i < hd; ++i) o[i] = static_cast<float>(acc[i] / sum);
    }
  }
}

static double act_ref(Activation act, double x) {
  switch (act) {
    case Activation::Silu: return x / (1.0 + std::exp(-x));
    case Activation::Gelu: return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    case Activation::Relu2: return x > 0 ? x * x : 0.0;
  }
  return 0;
}

void activation(const KernelContext&, Activation act, const float* a, const float* b, int ld, int T, int d,
                float* out) {
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < d; ++i) {
      const size_t s = static_cast<size_t>(t) * ld + i;
      const double v = act_ref(act, a[s]) * (b ? b[s] : 1.0f);
      out[static_cast<size_t>(t) * d + i] = static_cast<float>(v);
    }
}

// ---- backward -------------------------------------------------------------------------------------

void matmul_train(const KernelContext& ctx, const WeightView& W, const float* bias, const float* x, int T, float* y) {
  check(W.dtype == DType::F32 && !W.panels, "matmul_train: needs f32 row-major weights");
  matmul(ctx, W, bias, x, T, y);
}

void matmul_backward(const KernelContext&, const WeightView& W, const float* x, const float* dy, int T, float* dx,
                     float* dW, float* dbias) {
  check(W.dtype == DType::F32 && !W.panels, "matmul_backward: needs f32 row-major weights");
  const float* w = static_cast<const float*>(W.data);
  const size_t R = W.rows, C = W.cols;
  if (dx)
    for (int t = 0; t < T; ++t)
      for (size_t c = 0; c < C; ++c) {
        double acc = 0;
        for (size_t r = 0; r < R; ++r) acc += static_cast<double>(dy[t * R + r]) * w[r * C + c];
        dx[t * C + c] = static_cast<float>(acc);
      }
  if (dW)
    for (size_t r = 0; r < R; ++r)
      for (size_t c = 0; c < C; ++c) {
        double acc = 0;
        for (int t = 0; t < T; ++t) acc += static_cast<double>(dy[t * R + r]) * x[t * C + c];
        dW[r * C + c] += static_cast<float>(acc);
      }
  if (dbias)
    for (size_t r = 0; r < R; ++r) {
      double acc = 0;
      for (int t = 0; t < T; ++t) acc += dy[t * R + r];
      dbias[r] += static_cast<float>(acc);
    }
}

void rmsnorm_backward(const KernelContext&, const float* x, const float* w, const float* dy, int T, int d, float eps,
                      float* dx, float* dw) {
  for (int t = 0; t < T; ++t) {
    const float* xr = x + static_cast<size_t>(t) * d;
    const float* gr = dy + static_cast<size_t>(t) * d;
    double ss = 0, ux = 0;
    for (int i = 0; i < d; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const double r = 1.0 / std::sqrt(ss / d + eps);
    for (int i = 0; i < d; ++i) ux += static_cast<double>(gr[i]) * (w ? w[i] : 1.0f) * xr[i];
    for (int i = 0; i < d; ++i) {
      const double u = static_cast<double>(gr[i]) * (w ? w[i] : 1.0f);
      if (dx) dx[static_cast<size_t>(t) * d + i] = static_cast<float>(r * u - xr[i] * r * r * r * ux / d);
      if (dw && w) dw[i] += static_cast<float>(static_cast<double>(gr[i]) * xr[i] * r);
    }
  }
}

void embedding_backward(const KernelContext&, const int32_t* ids, const float* dy, int T, int d, float* dE) {
  for (int t = 0; t < T; ++t)
    for (int c = 0; c < d; ++c) dE[static_cast<size_t>(ids[t]) * d + c] += dy[static_cast<size_t>(t) * d + c];
}

double cross_entropy(const KernelContext&, const float* logits, const int32_t* targets, int T, int V, float scale,
                     float* dlogits) {
  double loss = 0;
  for (int t = 0; t < T; ++t) {
    const float* l = logits + static_cast<size_t>(t) * V;
    float* g = dlogits ? dlogits + static_cast<size_t>(t) * V : nullptr;
    if (targets[t] < 0) {
      if (g) std::fill(g, g + V, 0.0f);
      continue;
    }
    check(targets[t] < V, "cross_entropy: target ", targets[t], " outside the vocabulary (size ", V, ")");
    double mx = l[0];
    for (int v = 1; v < V; ++v) mx = std::max(mx, static_cast<double>(l[v]));
    double sum = 0;
    for (int v = 0; v < V; ++v) sum += std::exp(l[v] - mx);
    const double lse = mx + std::log(sum);
    loss += lse - l[targets[t]];
    if (g) {
      for (int v = 0; v < V; ++v) g[v] = static_cast<float>(scale * std::exp(static_cast<double>(l[v]) - lse));
      g[targets[t]] -= scale;
    }
  }
  return loss;
}

static double act_grad_ref(Activation act, double x) {
  switch (act) {
    case Activation::Silu: {
      const double s = 1.0 / (1.0 + std::exp(-x));
      return s * (1.0 + x * (1.0 - s));
    }
    case Activation::Gelu:
      return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * std::numbers::pi);
    case Activation::Relu2: return x > 0 ? 2.0 * x : 0.0;
  }
  return 0;
}

void activation_backward(const KernelContext&, Activation act, const float* a, const float* b, int ld, int T, int d,
                         const float* dout, float* da, float* db) {
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < d; ++i) {
      const size_t s = static_cast<size_t>(t) * ld + i;
      const double g = dout[static_cast<size_t>(t) * d + i];
      if (da) da[s] = static_cast<float>(g * (b ? b[s] : 1.0f) * act_grad_ref(act, a[s]));
      if (db && b) db[s] = static_cast<float>(g * act_ref(act, a[s]));
    }
}

void conv1d_causal_backward(const KernelContext&, const float* x, int ld_x, const float* w, const float* bias,
                            const float* state, int T, int C, int K, bool apply_silu, const float* dout, float* dx,
                            int ld_dx, float* dw, float* dbias, float* dstate) {
  // win: (K-1+T, C) as in the forward; dwin its gradient.
  const size_t n = static_cast<size_t>(K - 1 + T) * C;
  std::vector<double> win(n), dwin(n, 0.0);
  for (int k = 0; k < K - 1; ++k)
    for (int c = 0; c < C; ++c) win[static_cast<size_t>(k) * C + c] = state[static_cast<size_t>(k) * C + c];
  for (int t = 0; t < T; ++t)
    for (int c = 0; c < C; ++c) win[static_cast<size_t>(K - 1 + t) * C + c] = x[static_cast<size_t>(t) * ld_x + c];
  for (int t = 0; t < T; ++t)
    for (int c = 0; c < C; ++c) {
      double pre = bias ? bias[c] : 0.0;
      for (int k = 0; k < K; ++k) pre += static_cast<double>(w[static_cast<size_t>(c) * K + k]) * win[static_cast<size_t>(t + k) * C + c];
      double dpre = dout[static_cast<size_t>(t) * C + c];
      if (apply_silu) dpre *= act_grad_ref(Activation::Silu, pre);
      if (dbias) dbias[c] += static_cast<float>(dpre);
      for (int k = 0; k < K; ++k) {
        const size_t at = static_cast<size_t>(t + k) * C + c;
        dwin[at] += static_cast<double>(w[static_cast<size_t>(c) * K + k]) * dpre;
        if (dw) dw[static_cast<size_t>(c) * K + k] += static_cast<float>(win[at] * dpre);
      }
    }
  if (dstate)
    for (size_t i = 0; i < static_cast<size_t>(K - 1) * C; ++i) dstate[i] = static_cast<float>(dwin[i]);
  if (dx)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < C; ++c)
        dx[static_cast<size_t>(t) * ld_dx + c] = static_cast<float>(dwin[static_cast<size_t>(K - 1 + t) * C + c]);
}

}  // namespace hybridlm::ref

namespace hybridlm {
namespace ref {
// The reference kernels keep their working memory in plain vectors of each call (they are the
// oracle, written for clarity; a model run on them allocates per step).
ScratchNeed scratch_floats(const KernelLimits&) { return {}; }
#include "kernels/table.inc"
}  // namespace ref

const KernelTable& ref_kernels() {
  static const KernelTable table = ref::kernel_table("ref");
  return table;
}
}  // namespace hybridlm
