// The backward kernels (training) on the CPU: the ref formulas (ops.inc) in f32, split over
// threads so that each output has one writer and one summation order (rows of dx and dW, the
// columns of dbias; cross-entropy by row). The elementwise and row passes are written once and
// instantiated per SIMD path (cpu_common.h); both matmul products run on the forward GEMM.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <numbers>
#include <vector>

#include "base/error.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/gemm_cpu.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/scratch.h"

namespace hybridlm::cpu {

namespace {

// out: (cols, rows) = in: (rows, cols) transposed, in 16 x 16 tiles over threads (rows of tiles).
// A whole tile goes through a local block with constant loop bounds, which the compiler unrolls
// and vectorises; the ragged edges take the plain loop.
void transpose(const KernelContext& ctx, const float* in, size_t rows, size_t cols, float* out) {
  if (simd_path() == SimdPath::Avx512 && transpose_avx512(ctx, in, rows, cols, out)) return;
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

// Without the AVX-512 kernels both products run on the forward GEMM (matmul: y = x W^T) over
// transposed copies: dx = dy W = dy (W^T)^T, with W^T as the weight; dW = dy^T x = (dy^T) (x^T)^T,
// with dy^T as the input and x^T as the weight. The copies cost O(size) against the O(T R C)
// products and come from the caller's scratch (KernelLimits::backward sizes it).
size_t matmul_backward_floats(int rows, int cols, int T) {
  const size_t R = static_cast<size_t>(rows), C = static_cast<size_t>(cols), n = static_cast<size_t>(T);
  return FloatArena::rounded(R * n) + FloatArena::rounded(C * n) + FloatArena::rounded(R * C);
}

namespace {

void matmul_backward_copies(const KernelContext& ctx, const float* w, size_t R, size_t C, const float* x,
                            const float* dy, size_t n, float* dx, float* dW) {
  if (dx) {
    ScratchFrame frame(ctx);
    float* wt = frame.take(R * C);
    transpose(ctx, w, R, C, wt);
    matmul(ctx, {DType::F32, wt, static_cast<int>(C), static_cast<int>(R)}, nullptr, dy, static_cast<int>(n), dx);
  }
  if (dW) {
    ScratchFrame frame(ctx);
    float* dyt = frame.take(R * n);
    float* xt = frame.take(C * n);
    float* prod = frame.take(R * C);
    transpose(ctx, dy, n, R, dyt);
    transpose(ctx, x, n, C, xt);
    matmul(ctx, {DType::F32, xt, static_cast<int>(C), static_cast<int>(n)}, nullptr, dyt, static_cast<int>(R), prod);
    parallel(ctx, R, 16, [&](size_t rb, size_t re) {
      for (size_t i = rb * C; i < re * C; ++i) dW[i] += prod[i];
    });
  }
}

}  // namespace

void matmul_train(const KernelContext& ctx, const WeightView& W, const float* bias, const float* x, int T, float* y) {
  check(W.dtype == DType::F32 && !W.panels, "matmul_train: needs f32 row-major weights");
  if (simd_path() != SimdPath::Avx512) return matmul(ctx, W, bias, x, T, y);
  const size_t R = W.rows, C = W.cols;
  if (bias)
    parallel(ctx, static_cast<size_t>(T), 64, [&](size_t tb, size_t te) {
      for (size_t t = tb; t < te; ++t) std::copy(bias, bias + R, y + t * R);
    });
  // B (k, r) = W[r, k]: W read down its rows, packed into the GEMM's panels.
  gemm_strided_avx512(ctx, T, W.rows, W.cols, {x, C, 1}, {static_cast<const float*>(W.data), 1, C}, y, R,
                      bias != nullptr);
}

void matmul_backward(const KernelContext& ctx, const WeightView& W, const float* x, const float* dy, int T, float* dx,
                     float* dW, float* dbias) {
  check(W.dtype == DType::F32 && !W.panels, "matmul_backward: needs f32 row-major weights");
  const float* w = static_cast<const float*>(W.data);
  const size_t R = W.rows, C = W.cols, n = static_cast<size_t>(T);
  if (T == 0) return;
  if (simd_path() == SimdPath::Avx512) {  // both products on the operands where they lie
    const int r = W.rows, c = W.cols;
    if (dx) gemm_strided_avx512(ctx, T, c, r, {dy, R, 1}, {w, C, 1}, dx, C, false);
    if (dW) gemm_strided_avx512(ctx, r, c, T, {dy, 1, R}, {x, C, 1}, dW, C, true);
  } else {
    matmul_backward_copies(ctx, w, R, C, x, dy, n, dx, dW);
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

namespace {

// 16 independent partial sums of a[i] b[i] c[i] (c null: 1) in a fixed tree, as vdot.
HYBRIDLM_INLINE float vdot3(const float* a, const float* b, const float* c, int n) {
  float acc[16] = {};
  int k = 0;
  for (; k + 16 <= n; k += 16)
    for (int l = 0; l < 16; ++l) acc[l] += a[k + l] * b[k + l] * (c ? c[k + l] : 1.0f);
  for (int l = 0; k < n; ++k, ++l) acc[l] += a[k] * b[k] * (c ? c[k] : 1.0f);
  for (int w = 8; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  return acc[0];
}

// dx of rows [tb, te): r = 1 / rms(x), dx = r dy w - x r^3 mean(dy w x).
HYBRIDLM_INLINE void rmsnorm_dx_rows(const float* x, const float* w, const float* dy, int d, float eps, float* dx,
                                     size_t tb, size_t te) {
  for (size_t t = tb; t < te; ++t) {
    const float* xr = x + t * d;
    const float* gr = dy + t * d;
    float* o = dx + t * d;
    const float r = 1.0f / std::sqrt(vdot(xr, xr, d) / static_cast<float>(d) + eps);
    const float k = r * r * r * vdot3(gr, xr, w, d) / static_cast<float>(d);
    if (w)
      for (int i = 0; i < d; ++i) o[i] = r * gr[i] * w[i] - xr[i] * k;
    else
      for (int i = 0; i < d; ++i) o[i] = r * gr[i] - xr[i] * k;
  }
}
HYBRIDLM_SIMD_VARIANTS(rmsnorm_dx, rmsnorm_dx_rows)

// dw[ib, ie) += sum over rows, in row order, of dy x r.
HYBRIDLM_INLINE void rmsnorm_dw_columns(const float* x, const float* dy, int T, int d, float eps, float* dw, size_t ib,
                                        size_t ie) {
  for (int t = 0; t < T; ++t) {
    const float* xr = x + static_cast<size_t>(t) * d;
    const float* gr = dy + static_cast<size_t>(t) * d;
    const float r = 1.0f / std::sqrt(vdot(xr, xr, d) / static_cast<float>(d) + eps);
    for (size_t i = ib; i < ie; ++i) dw[i] += gr[i] * xr[i] * r;
  }
}
HYBRIDLM_SIMD_VARIANTS(rmsnorm_dw, rmsnorm_dw_columns)

}  // namespace

void rmsnorm_backward(const KernelContext& ctx, const float* x, const float* w, const float* dy, int T, int d,
                      float eps, float* dx, float* dw) {
  // dx row by row over threads; dw (a sum over rows) by column blocks, each over every row.
  if (dx)
    parallel(ctx, static_cast<size_t>(T), 4, [&](size_t tb, size_t te) {
      rmsnorm_dx_dispatch(x, w, dy, d, eps, dx, tb, te);
    });
  if (dw && w)
    parallel(ctx, static_cast<size_t>(d), 64, [&](size_t ib, size_t ie) {
      rmsnorm_dw_dispatch(x, dy, T, d, eps, dw, ib, ie);
    });
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

namespace {

// Rows [tb, te): the loss of each (log-sum-exp less the target's logit) and, with g, the
// gradient scale (softmax - onehot). The maximum and the sum of exponentials run in 16 lanes (the
// sum in double) combined by a fixed tree: one order for any thread count.
HYBRIDLM_INLINE void cross_entropy_rows(const float* logits, const int32_t* targets, int V, float scale,
                                        float* dlogits, double* row_loss, size_t tb, size_t te) {
  for (size_t t = tb; t < te; ++t) {
    const float* l = logits + t * V;
    float* g = dlogits ? dlogits + t * V : nullptr;
    if (targets[t] < 0) {
      if (g)
        for (int v = 0; v < V; ++v) g[v] = 0.0f;
      continue;
    }
    float mx16[16];
    for (int i = 0; i < 16; ++i) mx16[i] = -std::numeric_limits<float>::infinity();
    int v = 0;
    for (; v + 16 <= V; v += 16)
      for (int i = 0; i < 16; ++i) mx16[i] = l[v + i] > mx16[i] ? l[v + i] : mx16[i];
    for (int i = 0; v < V; ++v, ++i) mx16[i] = l[v] > mx16[i] ? l[v] : mx16[i];
    for (int w = 8; w >= 1; w /= 2)
      for (int i = 0; i < w; ++i) mx16[i] = mx16[i + w] > mx16[i] ? mx16[i + w] : mx16[i];
    const float mx = mx16[0];
    double acc[16] = {};
    v = 0;
    for (; v + 16 <= V; v += 16)
      for (int i = 0; i < 16; ++i) acc[i] += static_cast<double>(vexp(l[v + i] - mx));
    for (int i = 0; v < V; ++v, ++i) acc[i] += static_cast<double>(vexp(l[v] - mx));
    for (int w = 8; w >= 1; w /= 2)
      for (int i = 0; i < w; ++i) acc[i] += acc[i + w];
    const double lse = mx + std::log(acc[0]);
    row_loss[t] = lse - l[targets[t]];
    if (g) {
      const float lse_f = static_cast<float>(lse);
      for (int u = 0; u < V; ++u) g[u] = scale * vexp(l[u] - lse_f);
      g[targets[t]] -= scale;
    }
  }
}
HYBRIDLM_SIMD_VARIANTS(cross_entropy, cross_entropy_rows)

}  // namespace

double cross_entropy(const KernelContext& ctx, const float* logits, const int32_t* targets, int T, int V, float scale,
                     float* dlogits) {
  for (int t = 0; t < T; ++t)
    check(targets[t] < V, "cross_entropy: target ", targets[t], " outside the vocabulary (size ", V, ")");
  std::vector<double> row_loss(static_cast<size_t>(T), 0.0);
  parallel(ctx, static_cast<size_t>(T), 1, [&](size_t tb, size_t te) {
    cross_entropy_dispatch(logits, targets, V, scale, dlogits, row_loss.data(), tb, te);
  });
  double loss = 0;
  for (double x : row_loss) loss += x;  // in row order: the same sum for any thread count
  return loss;
}

namespace {
HYBRIDLM_INLINE float act_grad(Activation act, float x) {
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
HYBRIDLM_INLINE float act_value(Activation act, float x) {
  switch (act) {
    case Activation::Silu: return vsilu(x);
    case Activation::Gelu: return 0.5f * x * (1.0f + std::erf(x * static_cast<float>(1.0 / std::numbers::sqrt2)));
    case Activation::Relu2: return x > 0 ? x * x : 0.0f;
  }
  return 0;
}
}  // namespace

namespace {

// Rows [tb, te) of one activation (a template argument: the inner loops are branch-free and
// vectorise; gelu's erf is a libm call and stays scalar).
template <Activation A>
HYBRIDLM_INLINE void activation_backward_rows(std::integral_constant<Activation, A>, const float* a, const float* b,
                                              int ld, int d, const float* dout, float* da, float* db, size_t tb,
                                              size_t te) {
  for (size_t t = tb; t < te; ++t) {
    const float* ar = a + t * ld;
    const float* br = b ? b + t * ld : nullptr;
    const float* g = dout + t * d;
    if (da) {
      float* o = da + t * ld;
      if (br)
        for (int i = 0; i < d; ++i) o[i] = g[i] * br[i] * act_grad(A, ar[i]);
      else
        for (int i = 0; i < d; ++i) o[i] = g[i] * act_grad(A, ar[i]);
    }
    if (db && br) {
      float* o = db + t * ld;
      for (int i = 0; i < d; ++i) o[i] = g[i] * act_value(A, ar[i]);
    }
  }
}
HYBRIDLM_SIMD_VARIANTS(activation_backward, activation_backward_rows)

}  // namespace

void activation_backward(const KernelContext& ctx, Activation act, const float* a, const float* b, int ld, int T, int d,
                         const float* dout, float* da, float* db) {
  parallel(ctx, static_cast<size_t>(T), 4, [&](size_t tb, size_t te) {
    switch (act) {
      case Activation::Silu:
        activation_backward_dispatch(std::integral_constant<Activation, Activation::Silu>{}, a, b, ld, d, dout, da,
                                     db, tb, te);
        break;
      case Activation::Gelu:
        activation_backward_dispatch(std::integral_constant<Activation, Activation::Gelu>{}, a, b, ld, d, dout, da,
                                     db, tb, te);
        break;
      case Activation::Relu2:
        activation_backward_dispatch(std::integral_constant<Activation, Activation::Relu2>{}, a, b, ld, d, dout, da,
                                     db, tb, te);
        break;
    }
  });
}

namespace {

// Channels [c0, c0 + nc) (nc = kC = 16, one vector, but for the last group of a ragged C), all T steps, in time order with a ring of the last K values of dpre (the
// gradient at the conv's output before SiLU). With win(j) the conv's input window (j < K - 1:
// the state, then x), pre(t) = bias + sum_k w[k] win(t + k) and
// dwin(j) = sum_k w[k] dpre(j - k): complete once dpre(j) is known. dwin(j) is dstate for
// j < K - 1 and dx(j - K + 1) after. Every sum in the order of the scalar formulation (ops.inc).
template <int kC, bool kFull>
HYBRIDLM_INLINE void conv_backward_group(const float* x, int ld_x, const float* w, const float* bias,
                                         const float* state, int T, int C, int K, bool apply_silu,
                                         const float* dout, float* dx, int ld_dx, float* dw, float* dbias,
                                         float* dstate, size_t c0, int n_ragged, float* ring, float* dw_acc) {
  constexpr int kMaxK = 8;
  const int nc = kFull ? kC : n_ragged;  // a constant for full groups: fixed-width loops
  float wk[kMaxK][kC] = {};
  for (int k = 0; k < K; ++k)
    for (int c = 0; c < nc; ++c) wk[k][c] = w[(c0 + c) * K + k];
  float b[kC] = {}, db[kC] = {};
  if (bias)
    for (int c = 0; c < nc; ++c) b[c] = bias[c0 + c];
  for (int k = 0; k < K; ++k)
    for (int c = 0; c < nc; ++c) dw_acc[k * kC + c] = dw ? dw[(c0 + c) * K + k] : 0.0f;
  for (int i = 0; i < K * kC; ++i) ring[i] = 0.0f;
  auto win = [&](int j) -> const float* {
    return j < K - 1 ? state + static_cast<size_t>(j) * C + c0 : x + static_cast<size_t>(j - K + 1) * ld_x + c0;
  };
  for (int j = 0; j < T + K - 1; ++j) {
    float* slot = ring + (j % K) * kC;
    if (j < T) {
      float pre[kC];
      for (int c = 0; c < kC; ++c) pre[c] = b[c];
      for (int k = 0; k < K; ++k) {
        const float* in = win(j + k);
        for (int c = 0; c < nc; ++c) pre[c] += wk[k][c] * in[c];
      }
      const float* g = dout + static_cast<size_t>(j) * C + c0;
      for (int c = 0; c < nc; ++c) {
        const float sgm = 1.0f / (1.0f + vexp(-pre[c]));
        const float d = apply_silu ? g[c] * (sgm * (1.0f + pre[c] * (1.0f - sgm))) : g[c];
        slot[c] = d;
        db[c] += d;
      }
      for (int k = 0; k < K; ++k) {
        const float* in = win(j + k);
        for (int c = 0; c < nc; ++c) dw_acc[k * kC + c] += in[c] * slot[c];
      }
    } else {
      for (int c = 0; c < kC; ++c) slot[c] = 0.0f;
    }
    // dwin(j): dpre(j - k) for k = K - 1 down to 0 (dpre before 0 and from T on is 0).
    float acc[kC] = {};
    for (int k = K - 1; k >= 0; --k) {
      const float* dp = ring + ((j - k + K) % K) * kC;
      if (j - k < 0) continue;
      for (int c = 0; c < nc; ++c) acc[c] += wk[k][c] * dp[c];
    }
    if (j < K - 1) {
      if (dstate)
        for (int c = 0; c < nc; ++c) dstate[static_cast<size_t>(j) * C + c0 + c] = acc[c];
    } else if (dx) {
      float* o = dx + static_cast<size_t>(j - K + 1) * ld_dx + c0;
      for (int c = 0; c < nc; ++c) o[c] = acc[c];
    }
  }
  if (dw)
    for (int k = 0; k < K; ++k)
      for (int c = 0; c < nc; ++c) dw[(c0 + c) * K + k] = dw_acc[k * kC + c];
  if (dbias)
    for (int c = 0; c < nc; ++c) dbias[c0 + c] += db[c];
}

HYBRIDLM_INLINE void conv_backward_channels(const float* x, int ld_x, const float* w, const float* bias,
                                            const float* state, int T, int C, int K, bool apply_silu,
                                            const float* dout, float* dx, int ld_dx, float* dw, float* dbias,
                                            float* dstate, size_t gb, size_t ge) {
  constexpr int kC = 16;
  float ring[8 * kC], dw_acc[8 * kC];
  for (size_t grp = gb; grp < ge; ++grp) {
    const size_t c0 = grp * kC;
    const int nc = static_cast<int>(std::min<size_t>(kC, static_cast<size_t>(C) - c0));
    if (nc == kC)
      conv_backward_group<kC, true>(x, ld_x, w, bias, state, T, C, K, apply_silu, dout, dx, ld_dx, dw, dbias, dstate,
                                    c0, kC, ring, dw_acc);
    else
      conv_backward_group<kC, false>(x, ld_x, w, bias, state, T, C, K, apply_silu, dout, dx, ld_dx, dw, dbias, dstate,
                                     c0, nc, ring, dw_acc);
  }
}
HYBRIDLM_SIMD_VARIANTS(conv_backward, conv_backward_channels)

}  // namespace

void conv1d_causal_backward(const KernelContext& ctx, const float* x, int ld_x, const float* w, const float* bias,
                            const float* state, int T, int C, int K, bool apply_silu, const float* dout, float* dx,
                            int ld_dx, float* dw, float* dbias, float* dstate) {
  check(K >= 1 && K <= 8, "conv1d_causal_backward: ", K, " taps (at most 8)");
  // Channels are independent: each thread takes groups of 16, all of their outputs.
  const size_t groups = (static_cast<size_t>(C) + 15) / 16;
  parallel(ctx, groups, 1, [&](size_t gb, size_t ge) {
    conv_backward_dispatch(x, ld_x, w, bias, state, T, C, K, apply_silu, dout, dx, ld_dx, dw, dbias, dstate, gb, ge);
  });
}

}  // namespace hybridlm::cpu
