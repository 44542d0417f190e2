// The backward kernels of the attention path and of the gated norm (training): ref against
// directional finite differences of the ref forward, and cpu against ref, as backward_test.cc.
// With x+ = f32(x + h v) and x- = f32(x - h v) as stored, <dout, F(x+) - F(x-)> must equal
// <dx, x+ - x-> up to the O(h^2) curvature and the forward's f32 rounding (relative to h).
// Strided inputs and outputs (ld > width) carry a sentinel in their padding that must survive.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/kernels.h"
#include "numerics.h"

namespace hybridlm {
namespace {

constexpr float kSentinel = 7.0f;  // what outputs hold before a call: written values replace it

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

double norm(const std::vector<float>& a) { return std::sqrt(dot(a, a)); }

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

double rel(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-30); }

double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return err / std::max(scale, 1e-30);
}

// <dy, F(x+) - F(x-)> for a forward F of one input.
template <class F>
double directional(const F& f, const Probe& p, const std::vector<float>& dy) {
  const std::vector<float> yp = f(p.plus), ym = f(p.minus);
  double s = 0;
  for (size_t i = 0; i < yp.size(); ++i) s += static_cast<double>(dy[i]) * (static_cast<double>(yp[i]) - ym[i]);
  return s;
}

// The (rows, width) block of a buffer with row stride ld, contiguous.
std::vector<float> block(const std::vector<float>& a, int rows, int width, int ld) {
  std::vector<float> out(static_cast<size_t>(rows) * width);
  for (int t = 0; t < rows; ++t)
    for (int i = 0; i < width; ++i) out[static_cast<size_t>(t) * width + i] = a[static_cast<size_t>(t) * ld + i];
  return out;
}

// Whether every element past `width` in each row (the padding of a strided buffer) still holds kSentinel.
bool padding_kept(const std::vector<float>& a, int rows, int width, int ld) {
  for (int t = 0; t < rows; ++t)
    for (int i = width; i < ld; ++i)
      if (a[static_cast<size_t>(t) * ld + i] != kSentinel) return false;
  return true;
}

class AttentionBackward : public ::testing::Test {
 protected:
  ThreadPool pool{2};
  KernelContext ctx{&pool, &cpu_kernels()};
  KernelContext ref_ctx{nullptr, &ref_kernels()};
};

TEST_F(AttentionBackward, GatedRmsnormAgainstFiniteDifferencesAndRef) {
  const int T = 5, d = 64, ld_z = 70, ld_dz = 72;  // z and dz strided (z is a slice of the in-projection)
  const float eps = 1e-5f;
  const std::vector<float> y = randv(static_cast<size_t>(T) * d, 61),
                           z = randv(static_cast<size_t>(T) * ld_z, 62, 1.5f), w = randv(d, 63),
                           dout = randv(static_cast<size_t>(T) * d, 64);
  for (int gs : {32, 64})  // two groups, and the ungrouped form
    for (bool want_dw : {true, false}) {
      SCOPED_TRACE(testing::Message() << "group_size " << gs << " dw " << want_dw);
      std::vector<float> dy(y.size(), kSentinel), dz(static_cast<size_t>(T) * ld_dz, kSentinel), dw(d, 0.0f);
      ref::gated_rmsnorm_backward(ref_ctx, y.data(), z.data(), ld_z, w.data(), T, d, gs, eps, dout.data(), dy.data(),
                                  dz.data(), ld_dz, want_dw ? dw.data() : nullptr);
      EXPECT_TRUE(padding_kept(dz, T, d, ld_dz));
      auto forward = [&](const std::vector<float>& yv, const std::vector<float>& zv, const std::vector<float>& wv) {
        std::vector<float> out(static_cast<size_t>(T) * d);
        ref::gated_rmsnorm(ref_ctx, yv.data(), zv.data(), ld_z, wv.data(), T, d, gs, eps, out.data());
        return out;
      };
      const float h = 1e-3f;
      const Probe py(y, randv(y.size(), 65), h), pz(z, randv(z.size(), 66), h), pw(w, randv(w.size(), 67), h);
      EXPECT_LT(rel(dot(dy, py.diff), directional([&](const std::vector<float>& v) { return forward(v, z, w); }, py,
                                                  dout)), tol::kBackwardVsFiniteDiff);
      EXPECT_LT(rel(dot(block(dz, T, d, ld_dz), block(pz.diff, T, d, ld_z)),
                    directional([&](const std::vector<float>& v) { return forward(y, v, w); }, pz, dout)),
                tol::kBackwardVsFiniteDiff);
      if (want_dw)
        EXPECT_LT(rel(dot(dw, pw.diff), directional([&](const std::vector<float>& v) { return forward(y, z, v); }, pw,
                                                    dout)), tol::kBackwardVsFiniteDiff);
      else
        for (float v : dw) EXPECT_EQ(v, 0.0f);
      // cpu: dy, dz written (dz's padding kept), dw accumulated onto what is there.
      std::vector<float> cdy(y.size(), kSentinel), cdz(dz.size(), kSentinel), cdw(d, 0.5f);
      cpu::gated_rmsnorm_backward(ctx, y.data(), z.data(), ld_z, w.data(), T, d, gs, eps, dout.data(), cdy.data(),
                                  cdz.data(), ld_dz, want_dw ? cdw.data() : nullptr);
      EXPECT_TRUE(padding_kept(cdz, T, d, ld_dz));
      for (float& v : cdw) v -= 0.5f;
      EXPECT_LT(max_rel(cdy, dy), tol::kBackwardCpuVsRef);
      EXPECT_LT(max_rel(block(cdz, T, d, ld_dz), block(dz, T, d, ld_dz)), tol::kBackwardCpuVsRef);
      if (want_dw) EXPECT_LT(max_rel(cdw, dw), tol::kBackwardCpuVsRef);
      else for (float v : cdw) EXPECT_EQ(v, 0.0f);
    }
}

TEST_F(AttentionBackward, RopeIsTheTransposeOfTheForward) {
  // Part of each head rotated (rot_dim < head_dim), rows strided, positions from pos0 > 0.
  const int T = 6, pos0 = 1000, n_heads = 3, head_dim = 16, rot_dim = 8, width = n_heads * head_dim, ld = width + 4;
  const float theta = 10000.0f;
  const size_t n = static_cast<size_t>(T) * ld;
  const std::vector<float> a = randv(n, 71), b = randv(n, 72);
  using RopeFn = void (*)(const KernelContext&, float*, int, int, int, int, int, int, float);
  struct Impl {
    const KernelContext* ctx;
    RopeFn fwd, bwd;
  };
  auto rotate = [&](const Impl& impl, RopeFn fn, std::vector<float> x) {
    fn(*impl.ctx, x.data(), ld, T, pos0, n_heads, head_dim, rot_dim, theta);
    return x;
  };
  const Impl ref_impl{&ref_ctx, &ref::rope, &ref::rope_backward}, cpu_impl{&ctx, &cpu::rope, &cpu::rope_backward};
  std::vector<float> ref_grad;
  for (const Impl& impl : {ref_impl, cpu_impl}) {
    SCOPED_TRACE(impl.ctx == &ctx ? "cpu" : "ref");
    // <rope(a), b> == <a, rope_backward(b)>: each side is exact up to the f32 rounding of its
    // rotated vector, at most 2^-24 of |a| |b| each.
    const std::vector<float> ra = block(rotate(impl, impl.fwd, a), T, width, ld),
                             rb = block(rotate(impl, impl.bwd, b), T, width, ld);
    const std::vector<float> ab = block(a, T, width, ld), bb = block(b, T, width, ld);
    EXPECT_LT(std::abs(dot(ra, bb) - dot(ab, rb)) / (norm(ab) * norm(bb)), tol::kRopeTranspose);
    // Dims past rot_dim pass through unchanged.
    for (int t = 0; t < T; ++t)
      for (int hh = 0; hh < n_heads; ++hh)
        for (int i = rot_dim; i < head_dim; ++i) {
          const size_t at = static_cast<size_t>(t) * width + static_cast<size_t>(hh) * head_dim + i;
          EXPECT_EQ(rb[at], bb[at]);
        }
    if (impl.ctx == &ref_ctx) {
      ref_grad = rb;
      // And against finite differences of the forward (linear: only the f32 rounding remains).
      const Probe px(a, randv(n, 73), 1e-2f);
      const std::vector<float> g = block(b, T, width, ld);
      auto forward = [&](const std::vector<float>& x) { return block(rotate(impl, impl.fwd, x), T, width, ld); };
      EXPECT_LT(rel(dot(rb, block(px.diff, T, width, ld)), directional(forward, px, g)), tol::kBackwardVsFiniteDiff);
    } else {
      EXPECT_LT(max_rel(rb, ref_grad), tol::kBackwardCpuVsRef);
    }
  }
}

TEST_F(AttentionBackward, AttentionAgainstFiniteDifferencesAndRef) {
  // GQA (two query heads per KV head), q and dq strided. head_dim 80 on AVX-512: a piece of 64
  // columns and one of 16; T = 21: blocks of 4 queries and a last one of 1.
  const int n_heads = 4, n_kv = 2;
  const float scale = 0.25f;
  for (auto [hd, T] : {std::pair{16, 1}, std::pair{16, 37}, std::pair{80, 21}}) {
    SCOPED_TRACE(testing::Message() << "head_dim " << hd << " T " << T);
    const int width = n_heads * hd, kv_width = n_kv * hd, ld_q = width + 8;
    const std::vector<float> q = randv(static_cast<size_t>(T) * ld_q, 81 + T, 1.5f),
                             k = randv(static_cast<size_t>(T) * kv_width, 82 + T),
                             v = randv(static_cast<size_t>(T) * kv_width, 83 + T),
                             dout = randv(static_cast<size_t>(T) * width, 84 + T);
    std::vector<float> dq(q.size(), kSentinel), dk(k.size(), kSentinel), dv(v.size(), kSentinel);
    ref::attention_backward(ref_ctx, q.data(), ld_q, k.data(), v.data(), T, n_heads, n_kv, hd, scale, dout.data(),
                            dq.data(), dk.data(), dv.data());
    EXPECT_TRUE(padding_kept(dq, T, width, ld_q));
    // The training forward: `attention` over one page holding the whole contiguous K and V.
    auto forward = [&](const std::vector<float>& qv, std::vector<float> kv_k, std::vector<float> kv_v) {
      const int32_t pages[] = {0};
      PagedKv kv{kv_k.data(), kv_v.data(), pages, T, n_kv, hd, static_cast<size_t>(T) * kv_width, DType::F32};
      kv.set_token_major();
      std::vector<float> out(static_cast<size_t>(T) * width);
      ref::attention(ref_ctx, qv.data(), ld_q, kv, 0, T, n_heads, scale, out.data());
      return out;
    };
    const float h = 1e-2f;
    const Probe pq(q, randv(q.size(), 85), h), pk(k, randv(k.size(), 86), h), pv(v, randv(v.size(), 87), h);
    const std::vector<float> dq_block = block(dq, T, width, ld_q);
    if (T == 1) {  // one key: the output is v whatever q and k, and dv sums the heads that read it
      for (float x : dq_block) EXPECT_EQ(x, 0.0f);
      for (float x : dk) EXPECT_EQ(x, 0.0f);
    } else {
      EXPECT_LT(rel(dot(dq_block, block(pq.diff, T, width, ld_q)),
                    directional([&](const std::vector<float>& x) { return forward(x, k, v); }, pq, dout)),
                tol::kBackwardVsFiniteDiff);
      EXPECT_LT(rel(dot(dk, pk.diff), directional([&](const std::vector<float>& x) { return forward(q, x, v); }, pk,
                                                  dout)), tol::kBackwardVsFiniteDiff);
    }
    EXPECT_LT(rel(dot(dv, pv.diff), directional([&](const std::vector<float>& x) { return forward(q, k, x); }, pv,
                                                dout)), tol::kBackwardVsFiniteDiff);
    // cpu: everything written, dq's padding kept.
    std::vector<float> cdq(q.size(), kSentinel), cdk(k.size(), kSentinel), cdv(v.size(), kSentinel);
    cpu::attention_backward(ctx, q.data(), ld_q, k.data(), v.data(), T, n_heads, n_kv, hd, scale, dout.data(),
                            cdq.data(), cdk.data(), cdv.data());
    EXPECT_TRUE(padding_kept(cdq, T, width, ld_q));
    if (T == 1) {
      for (float x : block(cdq, T, width, ld_q)) EXPECT_EQ(x, 0.0f);
      for (float x : cdk) EXPECT_EQ(x, 0.0f);
    } else {
      EXPECT_LT(max_rel(block(cdq, T, width, ld_q), dq_block), tol::kBackwardCpuVsRef);
      EXPECT_LT(max_rel(cdk, dk), tol::kBackwardCpuVsRef);
    }
    EXPECT_LT(max_rel(cdv, dv), tol::kBackwardCpuVsRef);
    // One thread gives bitwise what the pool gives.
    const KernelContext one{nullptr, &cpu_kernels()};
    std::vector<float> odq(q.size(), kSentinel), odk(k.size(), kSentinel), odv(v.size(), kSentinel);
    cpu::attention_backward(one, q.data(), ld_q, k.data(), v.data(), T, n_heads, n_kv, hd, scale, dout.data(),
                            odq.data(), odk.data(), odv.data());
    EXPECT_EQ(std::memcmp(odq.data(), cdq.data(), odq.size() * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(odk.data(), cdk.data(), odk.size() * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(odv.data(), cdv.data(), odv.size() * sizeof(float)), 0);
  }
}

}  // namespace
}  // namespace hybridlm
