#include "models/blocks/ffn.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "base/error.h"
#include "kernels/kernels.h"

namespace hybridlm {

static MlpWeights load_mlp(const TensorSource& r, const std::string& p, const MlpSpec& s, int H) {
  const int64_t F = s.d_ff;
  MlpWeights w;
  if (s.fused) {
    w.up = r.matrix(p + s.up + ".weight", {2 * F, H});
    if (s.bias) w.up_bias = r.vector(p + s.up + ".bias", {2 * F});
  } else {
    if (s.gated) w.gate = r.matrix(p + s.gate + ".weight", {F, H});
    w.up = r.matrix(p + s.up + ".weight", {F, H});
    if (s.bias) {
      if (s.gated) w.gate_bias = r.vector(p + s.gate + ".bias", {F});
      w.up_bias = r.vector(p + s.up + ".bias", {F});
    }
  }
  w.down = r.matrix(p + s.down + ".weight", {H, F});
  if (s.bias) w.down_bias = r.vector(p + s.down + ".bias", {H});
  return w;
}

FfnWeights load_ffn(const TensorSource& r, const std::string& p, const FfnSpec& s, int H) {
  FfnWeights w;
  if (s.kind == FfnKind::Mlp) w.mlp = load_mlp(r, p, s.mlp, H);
  if (s.kind == FfnKind::Moe) {
    const int64_t E = s.n_experts, F = s.mlp.d_ff;
    w.router = r.matrix(p + s.router, {E, H});
    if (!s.correction_bias.empty()) w.correction = r.vector(p + s.correction_bias, {E});
    if (s.stacked_experts) {  // one (E, rows, cols) tensor per projection, sliced per expert
      check(s.mlp.fused && !s.mlp.bias, "stacked experts must be fused gate/up without biases");
      std::vector<Matrix> up = r.stacked(p + s.mlp.up + s.stacked_suffix, {E, 2 * F, H});
      std::vector<Matrix> down = r.stacked(p + s.mlp.down + s.stacked_suffix, {E, H, F});
      for (int64_t e = 0; e < E; ++e) w.experts.push_back({{}, std::move(up[e]), std::move(down[e]), {}, {}, {}});
    } else {
      for (int64_t e = 0; e < E; ++e)
        w.experts.push_back(load_mlp(r, p + s.experts + std::to_string(e) + ".", s.mlp, H));
    }
  }
  if (s.shared.d_ff > 0) w.shared = load_mlp(r, s.shared_prefix, s.shared, H);
  if (!s.shared_gate.empty()) w.shared_gate = r.vector(s.shared_gate, {1, H});
  return w;
}

// out: (T, H) = mlp(x: (T, H))
static void mlp_forward(const KernelContext& ctx, const MlpSpec& s, const MlpWeights& w, const float* x, int T,
                        FfnScratch& sc, float* out) {
  const int F = s.d_ff;
  sc.g.resize(static_cast<size_t>(T) * F);
  if (s.fused) {  // a: (T, 2F) = [gate | up]
    sc.a.resize(static_cast<size_t>(T) * 2 * F);
    ctx.ops->matmul(ctx, w.up.view(), data_or_null(w.up_bias), x, T, sc.a.data());
    ctx.ops->activation(ctx, s.act, sc.a.data(), sc.a.data() + F, 2 * F, T, F, sc.g.data());
  } else if (s.gated) {
    sc.a.resize(static_cast<size_t>(T) * F);
    sc.b.resize(static_cast<size_t>(T) * F);
    ctx.ops->matmul(ctx, w.gate.view(), data_or_null(w.gate_bias), x, T, sc.a.data());  // a: (T, F)
    ctx.ops->matmul(ctx, w.up.view(), data_or_null(w.up_bias), x, T, sc.b.data());      // b: (T, F)
    if (s.gate_scale != 1.0f)  // Falcon-H1: act(gate(x) x gate_multiplier)
      for (float& v : sc.a) v *= s.gate_scale;
    ctx.ops->activation(ctx, s.act, sc.a.data(), sc.b.data(), F, T, F, sc.g.data());   // g = act(a) * b
  } else {
    sc.a.resize(static_cast<size_t>(T) * F);
    ctx.ops->matmul(ctx, w.up.view(), data_or_null(w.up_bias), x, T, sc.a.data());
    ctx.ops->activation(ctx, s.act, sc.a.data(), nullptr, F, T, F, sc.g.data());
  }
  ctx.ops->matmul(ctx, w.down.view(), data_or_null(w.down_bias), sc.g.data(), T, out);  // (T, H)
  if (s.down_scale != 1.0f)
    for (size_t i = 0; i < static_cast<size_t>(T) * w.down.rows; ++i) out[i] *= s.down_scale;
}

// Sorts ids by key, largest first (ties: lower id first), keeping the first k.
static void top_k_ids(const std::vector<double>& key, int k, std::vector<int>& ids) {
  ids.resize(key.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(),
                    [&](int a, int b) { return key[a] > key[b] || (key[a] == key[b] && a < b); });
  ids.resize(k);
}

void route_token(const FfnSpec& s, const float* logits, const float* correction, int* choice, float* weight,
                 RouteScratch& rs) {
  const int E = s.n_experts, k = s.top_k;
  std::vector<double>& key = rs.key;
  std::vector<double>& p = rs.p;
  std::vector<int>& top = rs.top;
  key.resize(E);
  p.resize(E);
  switch (s.routing) {
    case Routing::SoftmaxTopK:
    case Routing::TopKSoftmax: {
      for (int e = 0; e < E; ++e) key[e] = logits[e];
      top_k_ids(key, k, top);
      // SoftmaxTopK normalises over all experts, TopKSoftmax over the chosen k only.
      const double mx = key[top[0]];
      double sum = 0;
      if (s.routing == Routing::SoftmaxTopK)
        for (int e = 0; e < E; ++e) sum += std::exp(key[e] - mx);
      else
        for (int e : top) sum += std::exp(key[e] - mx);
      double kept = 0;
      for (int i = 0; i < k; ++i) kept += (p[i] = std::exp(key[top[i]] - mx) / sum);
      for (int i = 0; i < k; ++i) {
        choice[i] = top[i];
        weight[i] = static_cast<float>(s.renormalize ? p[i] / kept : p[i]);
      }
      return;
    }
    case Routing::SigmoidGrouped: {
      for (int e = 0; e < E; ++e) {
        p[e] = 1.0 / (1.0 + std::exp(-static_cast<double>(logits[e])));
        key[e] = p[e] + (correction ? correction[e] : 0.0f);
      }
      // Groups of E / n_group experts, ranked by the sum of their two best keys; experts outside
      // the best topk_group groups are out.
      const int G = s.n_group, per = E / G;
      if (G > 1) {
        std::vector<double>& group_score = rs.group_score;
        group_score.resize(G);
        for (int g = 0; g < G; ++g) {  // the sum of the group's two best keys
          double best = -INFINITY, second = -INFINITY;
          for (int e = g * per; e < (g + 1) * per; ++e) {
            if (key[e] > best) {
              second = best;
              best = key[e];
            } else if (key[e] > second) {
              second = key[e];
            }
          }
          group_score[g] = best + (per > 1 ? second : 0.0);
        }
        top_k_ids(group_score, s.topk_group, rs.keep_groups);
        // Experts of the other groups score 0 (as transformers masks them), not -inf.
        for (int e = 0; e < E; ++e)
          if (std::find(rs.keep_groups.begin(), rs.keep_groups.end(), e / per) == rs.keep_groups.end()) key[e] = 0.0;
      }
      top_k_ids(key, k, top);
      double sum = 0;
      for (int e : top) sum += p[e];
      for (int i = 0; i < k; ++i) {
        choice[i] = top[i];
        const double wt = s.renormalize ? p[top[i]] / (sum + static_cast<double>(s.renorm_eps)) : p[top[i]];
        weight[i] = static_cast<float>(wt * s.routed_scale);
      }
      return;
    }
  }
}

void ffn_forward(const KernelContext& ctx, const FfnSpec& s, const FfnWeights& w, const float* x, int T,
                 FfnScratch& sc, float* out) {
  if (s.kind == FfnKind::Mlp) {
    mlp_forward(ctx, s.mlp, w.mlp, x, T, sc, out);
  } else {
    const int H = w.router.cols, E = s.n_experts, k = s.top_k;
    sc.logits.resize(static_cast<size_t>(T) * E);
    sc.choice.resize(static_cast<size_t>(T) * k);
    sc.weight.resize(static_cast<size_t>(T) * k);
    ctx.ops->matmul(ctx, w.router.view(), nullptr, x, T, sc.logits.data());  // (T, E)
    for (int t = 0; t < T; ++t)
      route_token(s, sc.logits.data() + static_cast<size_t>(t) * E, data_or_null(w.correction),
                  sc.choice.data() + static_cast<size_t>(t) * k, sc.weight.data() + static_cast<size_t>(t) * k, sc.route);
    std::fill_n(out, static_cast<size_t>(T) * H, 0.0f);
    // An expert gets at most T rows: room for that now, so that the buffers' sizes depend on T
    // alone and not on how a step's tokens happen to be routed (no allocation once warm).
    const size_t rows_max = static_cast<size_t>(T), F = static_cast<size_t>(s.mlp.d_ff);
    sc.rows.reserve(rows_max);
    sc.xe.reserve(rows_max * H);
    sc.ye.reserve(rows_max * H);
    sc.a.reserve(rows_max * 2 * F);
    sc.b.reserve(rows_max * F);
    sc.g.reserve(rows_max * F);
    // Each expert runs once on the rows routed to it (gathered into one GEMM), and its outputs are
    // added back weighted. A token's sum runs over experts in id order whatever the batch holds.
    for (int e = 0; e < E; ++e) {
      sc.rows.clear();
      for (int t = 0; t < T; ++t)
        for (int i = 0; i < k; ++i)
          if (sc.choice[static_cast<size_t>(t) * k + i] == e) sc.rows.push_back(t * k + i);
      if (sc.rows.empty()) continue;
      const int n = static_cast<int>(sc.rows.size());
      sc.xe.resize(static_cast<size_t>(n) * H);
      sc.ye.resize(static_cast<size_t>(n) * H);
      for (int j = 0; j < n; ++j)
        std::copy_n(x + static_cast<size_t>(sc.rows[j] / k) * H, H, sc.xe.data() + static_cast<size_t>(j) * H);
      mlp_forward(ctx, s.mlp, w.experts[e], sc.xe.data(), n, sc, sc.ye.data());
      for (int j = 0; j < n; ++j) {
        const float wt = sc.weight[sc.rows[j]];
        float* o = out + static_cast<size_t>(sc.rows[j] / k) * H;
        const float* y = sc.ye.data() + static_cast<size_t>(j) * H;
        for (int c = 0; c < H; ++c) o[c] += wt * y[c];
      }
    }
  }
  if (s.shared.d_ff > 0) {  // out += shared_mlp(x)
    const int H = w.shared.down.rows;
    sc.extra.resize(static_cast<size_t>(T) * H);
    mlp_forward(ctx, s.shared, w.shared, x, T, sc, sc.extra.data());
    if (w.shared_gate.empty()) {
      for (size_t i = 0; i < sc.extra.size(); ++i) out[i] += sc.extra[i];
    } else {  // out += sigmoid(x . shared_gate) x shared_mlp(x), per token
      for (size_t t = 0; t < static_cast<size_t>(T); ++t) {
        const float* xt = x + t * H;
        double dot = 0;
        for (int c = 0; c < H; ++c) dot += static_cast<double>(xt[c]) * w.shared_gate[c];
        const float gate = static_cast<float>(1.0 / (1.0 + std::exp(-dot)));
        for (int c = 0; c < H; ++c) out[t * H + c] += gate * sc.extra[t * H + c];
      }
    }
  }
}

}  // namespace hybridlm
