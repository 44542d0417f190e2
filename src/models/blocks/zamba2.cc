#include "models/blocks/zamba2.h"

#include <algorithm>

#include "kernels/kernels.h"

namespace hybridlm {

SharedBlockWeights load_shared_block(const TensorSource& r, const std::string& p, const SharedTransformerSpec& s,
                                     int H) {
  SharedBlockWeights b;
  b.prefix = p;
  const int64_t F = s.mlp.d_ff;
  b.in_norm = r.vector(p + "input_layernorm.weight", {2 * int64_t{H}});
  b.pre_ff_norm = r.vector(p + "pre_ff_layernorm.weight", {H});
  // q/k/v read 2H; o_proj maps heads x head_dim back to H.
  AttentionWeights& a = b.attn;
  const int64_t q_dim = static_cast<int64_t>(s.attn.n_heads) * s.attn.head_dim;
  const int64_t kv_dim = static_cast<int64_t>(s.attn.n_kv_heads) * s.attn.head_dim;
  a.q_proj = r.matrix(p + "self_attn.q_proj.weight", {q_dim, 2 * int64_t{H}});
  a.k_proj = r.matrix(p + "self_attn.k_proj.weight", {kv_dim, 2 * int64_t{H}});
  a.v_proj = r.matrix(p + "self_attn.v_proj.weight", {kv_dim, 2 * int64_t{H}});
  a.o_proj = r.matrix(p + "self_attn.o_proj.weight", {H, q_dim});
  b.gate_up = r.matrix(p + "feed_forward.gate_up_proj.weight", {2 * F, H});
  b.down = r.matrix(p + "feed_forward.down_proj.weight", {H, F});
  return b;
}

Zamba2LayerWeights load_zamba2_layer(const TensorSource& r, const std::string& bp, const std::string& lp,
                                     const SharedTransformerSpec& s, int adapter, int H) {
  Zamba2LayerWeights l;
  const int64_t R = s.adapter_rank, H2 = 2 * int64_t{H}, F = s.mlp.d_ff;
  const int64_t q_dim = static_cast<int64_t>(s.attn.n_heads) * s.attn.head_dim;
  const int64_t kv_dim = static_cast<int64_t>(s.attn.n_kv_heads) * s.attn.head_dim;
  const std::string a = std::to_string(adapter);
  if (s.attn_adapters) {
    auto pair = [&](const char* which, int64_t out, Matrix& down, Matrix& up) {
      const std::string q = bp + "self_attn.linear_" + which + "_adapter_list." + a + ".";
      down = r.matrix(q + "0.weight", {R, H2});
      up = r.matrix(q + "1.weight", {out, R});
    };
    pair("q", q_dim, l.lora.q_down, l.lora.q_up);
    pair("k", kv_dim, l.lora.k_down, l.lora.k_up);
    pair("v", kv_dim, l.lora.v_down, l.lora.v_up);
  }
  if (s.mlp_adapters) {
    const std::string q = bp + "feed_forward.gate_up_proj_adapter_list." + a + ".";
    l.gu_down = r.matrix(q + "0.weight", {R, H});
    l.gu_up = r.matrix(q + "1.weight", {2 * F, R});
  }
  l.linear = r.matrix(lp + "linear.weight", {H, H});
  return l;
}

void zamba2_shared_forward(const KernelContext& ctx, const SharedTransformerSpec& s, const SharedBlockWeights& b,
                           const Zamba2LayerWeights& l, const float* h, const float* emb, int T, int H,
                           std::span<const SeqRun> runs, Zamba2Scratch& sc, float* t) {
  const int F = s.mlp.d_ff;
  const size_t TH = static_cast<size_t>(T) * H;
  sc.s.resize(2 * TH);
  sc.a.resize(TH);
  sc.f.resize(TH);
  sc.gu.resize(static_cast<size_t>(T) * 2 * F);
  sc.g.resize(static_cast<size_t>(T) * F);
  sc.m.resize(TH);
  // s: (T, 2H) = rmsnorm(concat(h, emb)) * in_norm
  for (int i = 0; i < T; ++i) {
    std::copy_n(h + static_cast<size_t>(i) * H, H, sc.s.data() + static_cast<size_t>(i) * 2 * H);
    std::copy_n(emb + static_cast<size_t>(i) * H, H, sc.s.data() + static_cast<size_t>(i) * 2 * H + H);
  }
  ctx.ops->rmsnorm(ctx, sc.s.data(), b.in_norm.data(), T, 2 * H, s.norm_eps, sc.s.data());
  // a: (T, H) = attention(s) with this layer's adapters, over this layer's KV cache
  attention_forward(ctx, s.attn, b.attn, sc.s.data(), T, runs, sc.attn, sc.a.data(), &l.lora);
  // f: (T, H) = rmsnorm(a) * pre_ff_norm
  ctx.ops->rmsnorm(ctx, sc.a.data(), b.pre_ff_norm.data(), T, H, s.norm_eps, sc.f.data());
  // gu: (T, 2F) = f @ gate_up^T (+ LoRA); m = down(act(gu[:, :F]) * gu[:, F:])
  ctx.ops->matmul(ctx, b.gate_up.view(), nullptr, sc.f.data(), T, sc.gu.data());
  if (l.gu_down.rows > 0) {
    sc.r.resize(static_cast<size_t>(T) * l.gu_down.rows);
    sc.g.resize(std::max(sc.g.size(), static_cast<size_t>(T) * 2 * F));
    ctx.ops->matmul(ctx, l.gu_down.view(), nullptr, sc.f.data(), T, sc.r.data());
    ctx.ops->matmul(ctx, l.gu_up.view(), nullptr, sc.r.data(), T, sc.g.data());
    for (size_t i = 0; i < static_cast<size_t>(T) * 2 * F; ++i) sc.gu[i] += sc.g[i];
  }
  ctx.ops->activation(ctx, s.mlp.act, sc.gu.data(), sc.gu.data() + F, 2 * F, T, F, sc.g.data());
  ctx.ops->matmul(ctx, b.down.view(), nullptr, sc.g.data(), T, sc.m.data());
  // t: (T, H) = m @ linear^T
  ctx.ops->matmul(ctx, l.linear.view(), nullptr, sc.m.data(), T, t);
}

}  // namespace hybridlm
