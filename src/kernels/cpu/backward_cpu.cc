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

namespace {

// out: (cols, rows) = in: (rows, cols) transposed, in 16 x 16 tiles over threads (rows of tiles).
// A whole tile goes through a local block with constant loop bounds, which the compiler unrolls
// and vectorises; the ragged edges take the plain loop.
void transpose(const KernelContext& ctx, const float* in, size_t rows, size_t cols, float* out) {
  constexpr size_t kTile = 16;
  const size_t row_tiles = (rows + kTile - 1) / kTile;
  parallel(ctx, row_tiles, 4, [&](size_t tb, size_t te) {
    float block[kTile][kTile];
    for (size_t r0 = tb * kTile; r0 < std::min(rows, te * kTile); r0 += kTile) {
      size_t c0 = 0;
      if (r0 + kTile <= rows)
        for (; c0 + kTile <= cols; c0 += kTile) {
          for (size_t i = 0; i < kTile; ++i)
            for (size_t j = 0; j < kTile; ++j) block[j][i] = in[(r0 + i) * cols + c0 + j];
          for (size_t j = 0; j < kTile; ++j)
            for (size_t i = 0; i < kTile; ++i) out[(c0 + j) * rows + r0 + i] = block[j][i];
        }
      const size_t r_end = std::min(rows, r0 + kTile);
      for (size_t r = r0; r < r_end; ++r)
        for (size_t c = c0; c < cols; ++c) out[c * rows + r] = in[r * cols + c];
    }
  });
}

}  // namespace

// Both products run on the forward GEMM (matmul: y = x W^T) over transposed copies:
// dx = dy W = dy (W^T)^T, with W^T as the weight; dW = dy^T x = (dy^T) (x^T)^T, with dy^T as the
// input and x^T as the weight. The copies cost O(size) against the O(T R C) products.
void matmul_backward(const KernelContext& ctx, const WeightView& W, const float* x, const float* dy, int T, float* dx,
                     float* dW, float* dbias) {
  check(W.dtype == DType::F32 && !W.panels, "matmul_backward: needs f32 row-major weights");
  const float* w = static_cast<const float*>(W.data);
  const size_t R = W.rows, C = W.cols, n = static_cast<size_t>(T);
  if (T == 0) return;
  if (dx) {
    std::vector<float> wt(R * C);
    transpose(ctx, w, R, C, wt.data());
    matmul(ctx, {DType::F32, wt.data(), static_cast<int>(C), static_cast<int>(R)}, nullptr, dy, T, dx);
  }
  if (dW) {
    std::vector<float> dyt(R * n), xt(C * n), prod(R * C);
    transpose(ctx, dy, n, R, dyt.data());
    transpose(ctx, x, n, C, xt.data());
    matmul(ctx, {DType::F32, xt.data(), static_cast<int>(C), T}, nullptr, dyt.data(), static_cast<int>(R),
           prod.data());
    parallel(ctx, R, 16, [&](size_t rb, size_t re) {
      for (size_t i = rb * C; i < re * C; ++i) dW[i] += prod[i];
    });
  }
  if (dbias)  // column sums of dy, each column by one thread
    parallel(ctx, R, 64, [&](size_t rb, size_t re) {
      for (size_t r = rb; r < re; ++r) {
        float s = 0;
        for (size_t t = 0; t < n; ++t) s += dy[t * R + r];
        dbias[r] += s;
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
