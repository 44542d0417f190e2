// The backward kernels of the attention path and of the gated norm on the CPU (training): the ref
// formulas (ops.inc, docs/derivations) in f32, each output with one writer and one summation order
// whatever the thread count. Loop bodies are compiled per SIMD path (cpu_common.h) so the inner
// loops over head_dim and channels vectorise.
#include <algorithm>
#include <cmath>
#include <vector>

#include "base/error.h"
#include "kernels/cpu/attention_avx512.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/vec_math.h"

namespace hybridlm::cpu {

namespace {

// The forward's cap on head_dim and rotary dims (attention_cpu.cc): stack buffers of this size.
constexpr int kMaxHeadDim = 1024;

// ---- gated RMSNorm ------------------------------------------------------------------------------
// Rows [tb, te): dy and dz written, and each (row, group)'s r = 1 / sqrt(mean(g^2) + eps) kept in
// r_out (T, d / gs) for the dw pass. g, u: d floats of the thread's own.
HYBRIDLM_INLINE void gated_backward_rows(const float* y, const float* z, int ld_z, const float* w, int d, int gs,
                                         float eps, const float* dout, float* dy, float* dz, int ld_dz, float* r_out,
                                         float* g, float* u, size_t tb, size_t te) {
  const int n_groups = d / gs;
  for (size_t t = tb; t < te; ++t) {
    const float* yr = y + t * d;
    const float* zr = z + t * ld_z;
    const float* gr = dout + t * d;
    float* dyr = dy + t * d;
    float* dzr = dz + t * ld_dz;
    for (int i = 0; i < d; ++i) {
      g[i] = yr[i] * vsilu(zr[i]);
      u[i] = gr[i] * w[i];
    }
    for (int grp = 0; grp < n_groups; ++grp) {
      const int g0 = grp * gs;
      const float r = 1.0f / std::sqrt(vdot(g + g0, g + g0, gs) / static_cast<float>(gs) + eps);
      // dg = r (u - n mean(u n)) with n = g r, i.e. r u - g r^3 mean(u g).
      const float k = r * r * r * vdot(u + g0, g + g0, gs) / static_cast<float>(gs);
      r_out[t * n_groups + grp] = r;
      for (int i = g0; i < g0 + gs; ++i) {
        const float s = 1.0f / (1.0f + vexp(-zr[i]));
        const float dg = r * u[i] - g[i] * k;
        dyr[i] = dg * zr[i] * s;
        dzr[i] = dg * yr[i] * s * (1.0f + zr[i] * (1.0f - s));
      }
    }
  }
}
HYBRIDLM_SIMD_VARIANTS(gated_backward, gated_backward_rows)

// dw[ib, ie) += sum_t dout n over every row (n = y silu(z) r), rows in order.
HYBRIDLM_INLINE void gated_dw_columns(const float* y, const float* z, int ld_z, int T, int d, int gs,
                                      const float* dout, const float* r, float* dw, size_t ib, size_t ie) {
  const int n_groups = d / gs;
  for (int t = 0; t < T; ++t) {
    const float* yr = y + static_cast<size_t>(t) * d;
    const float* zr = z + static_cast<size_t>(t) * ld_z;
    const float* gr = dout + static_cast<size_t>(t) * d;
    for (size_t i = ib; i < ie;) {  // the columns of one group at a time: one r each
      const size_t grp = i / gs, end = std::min(ie, (grp + 1) * gs);
      const float rg = r[static_cast<size_t>(t) * n_groups + grp];
      for (; i < end; ++i) dw[i] += gr[i] * yr[i] * vsilu(zr[i]) * rg;
    }
  }
}
HYBRIDLM_SIMD_VARIANTS(gated_dw, gated_dw_columns)

// ---- causal attention ---------------------------------------------------------------------------
// KV heads [gb, ge), with every query head that reads them: dq rows of those heads written, dk and
// dv of those KV heads zeroed and summed (over query heads in order, then queries in order). Each
// softmax row is recomputed in two passes over its keys: scores with their max and sum, then dP
// with D = rowsum(P dP) and the gradients. p, dp: T floats of the thread's own.
HYBRIDLM_INLINE void attention_backward_kv_heads(const float* q, int ld_q, const float* k, const float* v, int T,
                                                 int n_heads, int n_kv_heads, int hd, float scale, const float* dout,
                                                 float* dq, float* dk, float* dv, float* p, float* dp, size_t gb,
                                                 size_t ge) {
  const int rep = n_heads / n_kv_heads;
  const size_t kv_ld = static_cast<size_t>(n_kv_heads) * hd, o_ld = static_cast<size_t>(n_heads) * hd;
  float acc[kMaxHeadDim];
  for (size_t kvh = gb; kvh < ge; ++kvh) {
    const size_t off = kvh * hd;
    for (int j = 0; j < T; ++j) {
      std::fill_n(dk + j * kv_ld + off, hd, 0.0f);
      std::fill_n(dv + j * kv_ld + off, hd, 0.0f);
    }
    for (int h = static_cast<int>(kvh) * rep; h < (static_cast<int>(kvh) + 1) * rep; ++h) {
      for (int t = 0; t < T; ++t) {
        const float* qt = q + static_cast<size_t>(t) * ld_q + static_cast<size_t>(h) * hd;
        const float* gt = dout + static_cast<size_t>(t) * o_ld + static_cast<size_t>(h) * hd;
        const int n_keys = t + 1;
        float m = -INFINITY;
        for (int j = 0; j < n_keys; ++j) {
          p[j] = vdot(qt, k + j * kv_ld + off, hd) * scale;
          m = std::max(m, p[j]);
        }
        float l = 0.0f;
        for (int j = 0; j < n_keys; ++j) l += (p[j] = vexp(p[j] - m));
        const float inv = 1.0f / l;
        float D = 0.0f;
        for (int j = 0; j < n_keys; ++j) {
          p[j] *= inv;
          dp[j] = vdot(gt, v + j * kv_ld + off, hd);
          D += p[j] * dp[j];
        }
        // dS = P (dP - D): dq = scale dS k, dk += scale dS^T q, dv += P^T dout.
        std::fill_n(acc, hd, 0.0f);
        for (int j = 0; j < n_keys; ++j) {
          const float ds = p[j] * (dp[j] - D), sds = scale * ds, pj = p[j];
          const float* kj = k + j * kv_ld + off;
          float* dkj = dk + j * kv_ld + off;
          float* dvj = dv + j * kv_ld + off;
          for (int i = 0; i < hd; ++i) {
            acc[i] += ds * kj[i];
            dkj[i] += sds * qt[i];
            dvj[i] += pj * gt[i];
          }
        }
        float* dqt = dq + static_cast<size_t>(t) * ld_q + static_cast<size_t>(h) * hd;
        for (int i = 0; i < hd; ++i) dqt[i] = scale * acc[i];
      }
    }
  }
}
HYBRIDLM_SIMD_VARIANTS(attention_backward, attention_backward_kv_heads)

}  // namespace

void gated_rmsnorm_backward(const KernelContext& ctx, const float* y, const float* z, int ld_z, const float* w, int T,
                            int d, int group_size, float eps, const float* dout, float* dy, float* dz, int ld_dz,
                            float* dw) {
  check(group_size > 0 && d % group_size == 0, "gated_rmsnorm_backward: group_size ", group_size,
        " does not divide d = ", d);
  // dy and dz by rows; dw, a sum over rows, by column blocks, each over every row with the rows' r.
  std::vector<float> r(static_cast<size_t>(T) * (d / group_size));
  parallel(ctx, static_cast<size_t>(T), 4, [&](size_t tb, size_t te) {
    std::vector<float> g(static_cast<size_t>(d)), u(static_cast<size_t>(d));
    gated_backward_dispatch(y, z, ld_z, w, d, group_size, eps, dout, dy, dz, ld_dz, r.data(), g.data(), u.data(), tb,
                            te);
  });
  if (dw)
    parallel(ctx, static_cast<size_t>(d), 64, [&](size_t ib, size_t ie) {
      gated_dw_dispatch(y, z, ld_z, T, d, group_size, dout, static_cast<const float*>(r.data()), dw, ib, ie);
    });
}

void rope_backward(const KernelContext& ctx, float* dx, int ld_x, int T, int pos0, int n_heads, int head_dim,
                   int rot_dim, float theta) {
  // The forward's rotation R(phi) transposed, R(-phi): the forward's cos and sin (same angles, same
  // roundings), the sin with the other sign, so this is exactly the transpose of cpu::rope.
  const int half = rot_dim / 2;
  if (half == 0) return;
  check(rot_dim <= kMaxHeadDim, "rotary dims above ", kMaxHeadDim);
  double inv_freq[kMaxHeadDim / 2];
  for (int j = 0; j < half; ++j) inv_freq[j] = std::pow(static_cast<double>(theta), -2.0 * j / rot_dim);
  parallel(ctx, T, 4, [&](size_t tb, size_t te) {
    float cs[kMaxHeadDim / 2], sn[kMaxHeadDim / 2];
    for (size_t t = tb; t < te; ++t) {
      for (int j = 0; j < half; ++j) {
        const double angle = static_cast<double>(pos0 + static_cast<int>(t)) * inv_freq[j];
        cs[j] = static_cast<float>(std::cos(angle));
        sn[j] = static_cast<float>(std::sin(angle));
      }
      for (int h = 0; h < n_heads; ++h) {
        float* g = dx + t * ld_x + static_cast<size_t>(h) * head_dim;
        for (int j = 0; j < half; ++j) {
          const float a = g[j], b = g[j + half];
          g[j] = a * cs[j] + b * sn[j];
          g[j + half] = b * cs[j] - a * sn[j];
        }
      }
    }
  });
}

void attention_backward(const KernelContext& ctx, const float* q, int ld_q, const float* k, const float* v, int T,
                        int n_heads, int n_kv_heads, int head_dim, float scale, const float* dout, float* dq,
                        float* dk, float* dv) {
  check(head_dim <= kMaxHeadDim, "attention head_dim above ", kMaxHeadDim);
  check(n_kv_heads > 0 && n_heads % n_kv_heads == 0, "attention_backward: ", n_heads, " heads over ", n_kv_heads,
        " KV heads");
  if (simd_path() == SimdPath::Avx512 &&
      attention_backward_avx512(ctx, q, ld_q, k, v, T, n_heads, n_kv_heads, head_dim, scale, dout, dq, dk, dv))
    return;
  // By KV head: all the query heads of one KV head on one thread, so dk and dv have one writer.
  parallel(ctx, static_cast<size_t>(n_kv_heads), 1, [&](size_t gb, size_t ge) {
    std::vector<float> p(static_cast<size_t>(T)), dp(static_cast<size_t>(T));
    attention_backward_dispatch(q, ld_q, k, v, T, n_heads, n_kv_heads, head_dim, scale, dout, dq, dk, dv, p.data(),
                                dp.data(), gb, ge);
  });
}

}  // namespace hybridlm::cpu
