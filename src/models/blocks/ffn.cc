#include "models/blocks/ffn.h"

#include <algorithm>
#include <cmath>

#include "kernels/kernels.h"

namespace hybridlm {

static MlpWeights load_mlp(const WeightReader& r, const std::string& p, const FfnSpec& s, int H) {
  const int64_t F = s.d_ff;
  MlpWeights w;
  if (s.gated) w.gate = r.matrix(p + s.gate + ".weight", {F, H});
  w.up = r.matrix(p + s.up + ".weight", {F, H});
  w.down = r.matrix(p + s.down + ".weight", {H, F});
  if (s.bias) {
    if (s.gated) w.gate_bias = r.vector(p + s.gate + ".bias", {F});
    w.up_bias = r.vector(p + s.up + ".bias", {F});
    w.down_bias = r.vector(p + s.down + ".bias", {H});
  }
  return w;
}

FfnWeights load_ffn(const WeightReader& r, const std::string& p, const FfnSpec& s, int H) {
  FfnWeights w;
  if (s.kind == FfnKind::Mlp) w.mlp = load_mlp(r, p, s, H);
  if (s.kind == FfnKind::Moe) {
    w.router = r.matrix(p + s.router + ".weight", {s.n_experts, H});
    for (int e = 0; e < s.n_experts; ++e) w.experts.push_back(load_mlp(r, p + "experts." + std::to_string(e) + ".", s, H));
  }
  return w;
}

// out: (T, H) = mlp(x: (T, H))
static void mlp_forward(const KernelContext& ctx, const FfnSpec& s, const MlpWeights& w, const float* x, int T,
                        FfnScratch& sc, float* out) {
  const int F = s.d_ff;
  sc.a.resize(static_cast<size_t>(T) * F);
  sc.g.resize(static_cast<size_t>(T) * F);
  if (s.gated) {
    sc.b.resize(static_cast<size_t>(T) * F);
    cpu::matmul(ctx, w.gate.view(), data_or_null(w.gate_bias), x, T, sc.a.data());  // a: (T, F)
    cpu::matmul(ctx, w.up.view(), data_or_null(w.up_bias), x, T, sc.b.data());      // b: (T, F)
    cpu::activation(ctx, s.act, sc.a.data(), sc.b.data(), F, T, F, sc.g.data());   // g = act(a) * b
  } else {
    cpu::matmul(ctx, w.up.view(), data_or_null(w.up_bias), x, T, sc.a.data());
    cpu::activation(ctx, s.act, sc.a.data(), nullptr, F, T, F, sc.g.data());
  }
  cpu::matmul(ctx, w.down.view(), data_or_null(w.down_bias), sc.g.data(), T, out);  // (T, H)
}

// Softmax over the experts, the top_k largest (ties: lower expert id first), optionally
// renormalised. Per token, independent of the rest of the batch.
static void route(const FfnSpec& s, const float* logits, int* choice, float* weight) {
  const int E = s.n_experts, k = s.top_k;
  float mx = logits[0];
  for (int e = 1; e < E; ++e) mx = std::max(mx, logits[e]);
  double sum = 0;
  for (int e = 0; e < E; ++e) sum += std::exp(static_cast<double>(logits[e] - mx));
  std::vector<int> order(E);
  for (int e = 0; e < E; ++e) order[e] = e;
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  double kept = 0;
  for (int i = 0; i < k; ++i) {
    choice[i] = order[i];
    weight[i] = static_cast<float>(std::exp(static_cast<double>(logits[order[i]] - mx)) / sum);
    kept += weight[i];
  }
  if (s.renormalize)
    for (int i = 0; i < k; ++i) weight[i] = static_cast<float>(weight[i] / kept);
}

void ffn_forward(const KernelContext& ctx, const FfnSpec& s, const FfnWeights& w, const float* x, int T,
                 FfnScratch& sc, float* out) {
  if (s.kind == FfnKind::Mlp) return mlp_forward(ctx, s, w.mlp, x, T, sc, out);
  const int H = w.router.cols, E = s.n_experts, k = s.top_k;
  sc.logits.resize(static_cast<size_t>(T) * E);
  sc.choice.resize(static_cast<size_t>(T) * k);
  sc.weight.resize(static_cast<size_t>(T) * k);
  cpu::matmul(ctx, w.router.view(), nullptr, x, T, sc.logits.data());  // (T, E)
  for (int t = 0; t < T; ++t)
    route(s, sc.logits.data() + static_cast<size_t>(t) * E, sc.choice.data() + static_cast<size_t>(t) * k,
          sc.weight.data() + static_cast<size_t>(t) * k);
  std::fill_n(out, static_cast<size_t>(T) * H, 0.0f);
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
    mlp_forward(ctx, s, w.experts[e], sc.xe.data(), n, sc, sc.ye.data());
    for (int j = 0; j < n; ++j) {
      const float wt = sc.weight[sc.rows[j]];
      float* o = out + static_cast<size_t>(sc.rows[j] / k) * H;
      const float* y = sc.ye.data() + static_cast<size_t>(j) * H;
      for (int c = 0; c < H; ++c) o[c] += wt * y[c];
    }
  }
}

}  // namespace hybridlm
