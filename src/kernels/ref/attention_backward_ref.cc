// Scalar reference backward kernels of the attention path and of the gated norm (training): the
// formulas of docs/derivations/norms.md and attention-rope.md in the order written there, with
// double accumulators. The oracle the cpu versions are tested against; not fast.
#include <algorithm>
#include <cmath>
#include <vector>

#include "base/error.h"
#include "kernels/kernels.h"

namespace hybridlm::ref {

namespace {
double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
}  // namespace

void gated_rmsnorm_backward(const KernelContext&, const float* y, const float* z, int ld_z, const float* w, int T,
                            int d, int group_size, float eps, const float* dout, float* dy, float* dz, int ld_dz,
                            float* dw) {
  check(group_size > 0 && d % group_size == 0, "gated_rmsnorm_backward: group_size ", group_size,
        " does not divide d = ", d);
  // Per row and group, with g = y silu(z), r = 1 / sqrt(mean(g^2) + eps), n = g r, u = dout w:
  // dg = r (u - n mean(u n)) = r u - g r^3 mean(u g); dy = dg silu(z); dz = dg y silu'(z).
  std::vector<double> g(static_cast<size_t>(d)), dw_sum(static_cast<size_t>(d), 0.0);
  for (int t = 0; t < T; ++t) {
    const float* yr = y + static_cast<size_t>(t) * d;
    const float* zr = z + static_cast<size_t>(t) * ld_z;
    const float* gr = dout + static_cast<size_t>(t) * d;
    for (int i = 0; i < d; ++i) g[i] = yr[i] * (zr[i] * sigmoid(zr[i]));
    for (int g0 = 0; g0 < d; g0 += group_size) {
      double ss = 0, ug = 0;
      for (int i = g0; i < g0 + group_size; ++i) {
        ss += g[i] * g[i];
        ug += static_cast<double>(gr[i]) * w[i] * g[i];
      }
      const double r = 1.0 / std::sqrt(ss / group_size + eps);
      const double k = r * r * r * ug / group_size;
      for (int i = g0; i < g0 + group_size; ++i) {
        const double s = sigmoid(zr[i]);
        const double dg = r * gr[i] * w[i] - g[i] * k;
        dy[static_cast<size_t>(t) * d + i] = static_cast<float>(dg * zr[i] * s);
        dz[static_cast<size_t>(t) * ld_dz + i] = static_cast<float>(dg * yr[i] * s * (1.0 + zr[i] * (1.0 - s)));
        dw_sum[i] += gr[i] * g[i] * r;
      }
    }
  }
  if (dw)
    for (int i = 0; i < d; ++i) dw[i] += static_cast<float>(dw_sum[i]);
}

void rope_backward(const KernelContext&, float* dx, int ld_x, int T, int pos0, int n_heads, int head_dim, int rot_dim,
                   float theta) {
  // The forward's rotation R(phi) transposed, R(-phi): the same angles (so the same cos), sin negated.
  const int half = rot_dim / 2;
  for (int t = 0; t < T; ++t) {
    for (int j = 0; j < half; ++j) {
      const double angle = static_cast<double>(pos0 + t) * std::pow(static_cast<double>(theta), -2.0 * j / rot_dim);
      const double c = std::cos(angle), s = std::sin(angle);
      for (int h = 0; h < n_heads; ++h) {
        float* v = dx + static_cast<size_t>(t) * ld_x + static_cast<size_t>(h) * head_dim;
        const double a = v[j], b = v[j + half];
        v[j] = static_cast<float>(a * c + b * s);
        v[j + half] = static_cast<float>(b * c - a * s);
      }
    }
  }
}

void attention_backward(const KernelContext&, const float* q, int ld_q, const float* k, const float* v, int T,
                        int n_heads, int n_kv_heads, int head_dim, float scale, const float* dout, float* dq,
                        float* dk, float* dv) {
  check(n_kv_heads > 0 && n_heads % n_kv_heads == 0, "attention_backward: ", n_heads, " heads over ", n_kv_heads,
        " KV heads");
  const int hd = head_dim, rep = n_heads / n_kv_heads;
  const size_t kv_ld = static_cast<size_t>(n_kv_heads) * hd, o_ld = static_cast<size_t>(n_heads) * hd;
  // dk, dv sum over the rep query heads of each KV head and over the queries: kept in double.
  std::vector<double> dk_sum(static_cast<size_t>(T) * kv_ld, 0.0), dv_sum(dk_sum.size(), 0.0);
  std::vector<double> p(static_cast<size_t>(T)), dp(static_cast<size_t>(T)), dq_sum(static_cast<size_t>(hd));
  for (int h = 0; h < n_heads; ++h) {
    const size_t off = static_cast<size_t>(h / rep) * hd;
    for (int t = 0; t < T; ++t) {
      const float* qt = q + static_cast<size_t>(t) * ld_q + static_cast<size_t>(h) * hd;
      const float* gt = dout + static_cast<size_t>(t) * o_ld + static_cast<size_t>(h) * hd;
      // The forward's softmax row P over keys 0..t.
      double mx = -INFINITY;
      for (int j = 0; j <= t; ++j) {
        double s = 0;
        for (int i = 0; i < hd; ++i) s += static_cast<double>(qt[i]) * k[j * kv_ld + off + i];
        p[j] = s * scale;
        mx = std::max(mx, p[j]);
      }
      double sum = 0;
      for (int j = 0; j <= t; ++j) sum += (p[j] = std::exp(p[j] - mx));
      for (int j = 0; j <= t; ++j) p[j] /= sum;
      // dP = dout v^T; the softmax Jacobian needs D = rowsum(dP * P).
      double D = 0;
      for (int j = 0; j <= t; ++j) {
        double s = 0;
        for (int i = 0; i < hd; ++i) s += static_cast<double>(gt[i]) * v[j * kv_ld + off + i];
        dp[j] = s;
        D += p[j] * dp[j];
      }
      // dS = P (dP - D); dq = scale dS k; dk += scale dS^T q; dv += P^T dout.
      std::fill(dq_sum.begin(), dq_sum.end(), 0.0);
      for (int j = 0; j <= t; ++j) {
        const double ds = p[j] * (dp[j] - D);
        for (int i = 0; i < hd; ++i) {
          dq_sum[i] += ds * k[j * kv_ld + off + i];
          dk_sum[j * kv_ld + off + i] += scale * ds * qt[i];
          dv_sum[j * kv_ld + off + i] += p[j] * gt[i];
        }
      }
      for (int i = 0; i < hd; ++i)
        dq[static_cast<size_t>(t) * ld_q + static_cast<size_t>(h) * hd + i] = static_cast<float>(scale * dq_sum[i]);
    }
  }
  for (size_t i = 0; i < dk_sum.size(); ++i) {
    dk[i] = static_cast<float>(dk_sum[i]);
    dv[i] = static_cast<float>(dv_sum[i]);
  }
}

}  // namespace hybridlm::ref
