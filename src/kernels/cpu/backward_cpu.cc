// The backward kernels (training) on the CPU: the ref formulas (ops.inc) in f32, split over
// threads so that each output has one writer and one summation order (rows of dx and dW, the
// columns of dbias; cross-entropy by row). Written for clarity first; the SIMD work of the
// training issue's benchmark comes later.
#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "base/error.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/vec_math.h"

namespace hybridlm::cpu {

void matmul_backward(const KernelContext& ctx, const WeightView& W, const float* x, const float* dy, int T, float* dx,
                     float* dW, float* dbias) {
  check(W.dtype == DType::F32 && !W.panels, "matmul_backward: needs f32 row-major weights");
  const float* w = static_cast<const float*>(W.data);
  const size_t R = W.rows, C = W.cols;
  if (dx)  // dx[t] = sum_r dy[t, r] W[r]: each token's row by one thread
    parallel(ctx, static_cast<size_t>(T), 1, [&](size_t tb, size_t te) {
      for (size_t t = tb; t < te; ++t) {
        float* o = dx + t * C;
        std::fill(o, o + C, 0.0f);
        for (size_t r = 0; r < R; ++r) {
          const float g = dy[t * R + r];
          const float* wr = w + r * C;
          for (size_t c = 0; c < C; ++c) o[c] += g * wr[c];
        }
      }
    });
  if (dW || dbias)  // dW[r] += sum_t dy[t, r] x[t]: each weight row by one thread
    parallel(ctx, R, 4, [&](size_t rb, size_t re) {
      for (size_t r = rb; r < re; ++r) {
        float sum_b = 0;
        float* o = dW ? dW + r * C : nullptr;
        for (int t = 0; t < T; ++t) {
          const float g = dy[static_cast<size_t>(t) * R + r];
          sum_b += g;
          if (o) {
            const float* xt = x + static_cast<size_t>(t) * C;
            for (size_t c = 0; c < C; ++c) o[c] += g * xt[c];
          }
        }
        if (dbias) dbias[r] += sum_b;
      }
    });
}

void rmsnorm_backward(const KernelContext& ctx, const float* x, const float* w, const float* dy, int T, int d,
                      float eps, float* dx, float* dw) {
  // dx row by row over threads; dw (a sum over rows) by column blocks, each over every row.
  if (dx)
    parallel(ctx, static_cast<size_t>(T), 1, [&](size_t tb, size_t te) {
      for (size_t t = tb; t < te; ++t) {
        const float* xr = x + t * d;
        const float* gr = dy + t * d;
        float ss = 0, ux = 0;
        for (int i = 0; i < d; ++i) {
          ss += xr[i] * xr[i];
          ux += gr[i] * (w ? w[i] : 1.0f) * xr[i];
        }
        const float r = 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
        const float k = r * r * r * ux / static_cast<float>(d);
        for (int i = 0; i < d; ++i) dx[t * d + i] = r * gr[i] * (w ? w[i] : 1.0f) - xr[i] * k;
      }
    });
  if (dw && w) {
    parallel(ctx, static_cast<size_t>(d), 64, [&](size_t ib, size_t ie) {
      for (int t = 0; t < T; ++t) {
        const float* xr = x + static_cast<size_t>(t) * d;
        float ss = 0;
        for (int i = 0; i < d; ++i) ss += xr[i] * xr[i];
        const float r = 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
        for (size_t i = ib; i < ie; ++i) dw[i] += dy[static_cast<size_t>(t) * d + i] * xr[i] * r;
      }
    });
  }
}

void embedding_backward(const KernelContext& ctx, const int32_t* ids, const float* dy, int T, int d, float* dE) {
  // Tokens repeat, so split the columns: every thread walks all tokens over its columns.
  parallel(ctx, static_cast<size_t>(d), 64, [&](size_t cb, size_t ce) {
    for (int t = 0; t < T; ++t) {
      float* row = dE + static_cast<size_t>(ids[t]) * d;
      const float* g = dy + static_cast<size_t>(t) * d;
      for (size_t c = cb; c < ce; ++c) row[c] += g[c];
    }
  });
}

double cross_entropy(const KernelContext& ctx, const float* logits, const int32_t* targets, int T, int V, float scale,
                     float* dlogits) {
  for (int t = 0; t < T; ++t)
    check(targets[t] < V, "cross_entropy: target ", targets[t], " outside the vocabulary (size ", V, ")");
  std::vector<double> row_loss(static_cast<size_t>(T), 0.0);
  parallel(ctx, static_cast<size_t>(T), 1, [&](size_t tb, size_t te) {
    for (size_t t = tb; t < te; ++t) {
      const float* l = logits + t * V;
      float* g = dlogits ? dlogits + t * V : nullptr;
      if (targets[t] < 0) {
        if (g) std::fill(g, g + V, 0.0f);
        continue;
      }
      const float mx = *std::max_element(l, l + V);
      double sum = 0;
      for (int v = 0; v < V; ++v) sum += vexp(l[v] - mx);
      const double lse = mx + std::log(sum);
      row_loss[t] = lse - l[targets[t]];
      if (g) {
        const float lse_f = static_cast<float>(lse);
        for (int v = 0; v < V; ++v) g[v] = scale * vexp(l[v] - lse_f);
        g[targets[t]] -= scale;
      }
    }
  });
  double loss = 0;
  for (double x : row_loss) loss += x;  // in row order: the same sum for any thread count
  return loss;
}

namespace {
float act_grad(Activation act, float x) {
  switch (act) {
    case Activation::Silu: {
      const float s = 1.0f / (1.0f + vexp(-x));
      return s * (1.0f + x * (1.0f - s));
    }
    case Activation::Gelu:
      return 0.5f * (1.0f + std::erf(x * static_cast<float>(1.0 / std::numbers::sqrt2))) +
             x * vexp(-0.5f * x * x) * static_cast<float>(1.0 / std::sqrt(2.0 * std::numbers::pi));
    case Activation::Relu2: return x > 0 ? 2.0f * x : 0.0f;
  }
  return 0;
}
float act_value(Activation act, float x) {
  switch (act) {
    case Activation::Silu: return vsilu(x);
    case Activation::Gelu: return 0.5f * x * (1.0f + std::erf(x * static_cast<float>(1.0 / std::numbers::sqrt2)));
    case Activation::Relu2: return x > 0 ? x * x : 0.0f;
  }
  return 0;
}
}  // namespace

void activation_backward(const KernelContext& ctx, Activation act, const float* a, const float* b, int ld, int T, int d,
                         const float* dout, float* da, float* db) {
  parallel(ctx, static_cast<size_t>(T), 1, [&](size_t tb, size_t te) {
    for (size_t t = tb; t < te; ++t)
      for (int i = 0; i < d; ++i) {
        const size_t s = t * ld + i;
        const float g = dout[t * d + i];
        if (da) da[s] = g * (b ? b[s] : 1.0f) * act_grad(act, a[s]);
        if (db && b) db[s] = g * act_value(act, a[s]);
      }
  });
}

void conv1d_causal_backward(const KernelContext& ctx, const float* x, int ld_x, const float* w, const float* bias,
                            const float* state, int T, int C, int K, bool apply_silu, const float* dout, float* dx,
                            int ld_dx, float* dw, float* dbias, float* dstate) {
  // Channels are independent: each thread takes a block of them, all of their outputs.
  parallel(ctx, static_cast<size_t>(C), 16, [&](size_t cb, size_t ce) {
    std::vector<float> win(static_cast<size_t>(K - 1 + T)), dwin(win.size());
    for (size_t c = cb; c < ce; ++c) {
      for (int k = 0; k < K - 1; ++k) win[k] = state[static_cast<size_t>(k) * C + c];
      for (int t = 0; t < T; ++t) win[K - 1 + t] = x[static_cast<size_t>(t) * ld_x + c];
      std::fill(dwin.begin(), dwin.end(), 0.0f);
      const float* wc = w + c * K;
      float sum_b = 0;
      for (int t = 0; t < T; ++t) {
        float pre = bias ? bias[c] : 0.0f;
        for (int k = 0; k < K; ++k) pre += wc[k] * win[t + k];
        float dpre = dout[static_cast<size_t>(t) * C + c];
        if (apply_silu) dpre *= act_grad(Activation::Silu, pre);
        sum_b += dpre;
        for (int k = 0; k < K; ++k) {
          dwin[t + k] += wc[k] * dpre;
          if (dw) dw[c * K + k] += win[t + k] * dpre;
        }
      }
      if (dbias) dbias[c] += sum_b;
      if (dstate)
        for (int k = 0; k < K - 1; ++k) dstate[static_cast<size_t>(k) * C + c] = dwin[k];
      if (dx)
        for (int t = 0; t < T; ++t) dx[static_cast<size_t>(t) * ld_dx + c] = dwin[K - 1 + t];
    }
  });
}

}  // namespace hybridlm::cpu
