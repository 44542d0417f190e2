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
  const std::string f = p + "feed_forward.";
  if (s.mlp.fused) {
    b.gate_up = r.matrix(f + s.mlp.up + ".weight", {2 * F, H});
  } else {
    b.gate = r.matrix(f + s.mlp.gate + ".weight", {F, H});
    b.up = r.matrix(f + s.mlp.up + ".weight", {F, H});
  }
  b.down = r.matrix(f + s.mlp.down + ".weight", {H, F});
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

namespace {

struct Zamba2Buffers {
  float *s, *a, *f, *gu, *g, *r, *m;
};

Zamba2Buffers zamba2_buffers(const SharedTransformerSpec& s, int H, int T, FloatArena& arena) {
  const size_t n = static_cast<size_t>(T), TH = n * H, F = static_cast<size_t>(s.mlp.d_ff);
  Zamba2Buffers b;
  b.s = arena.take(2 * TH);
  b.a = arena.take(TH);
  b.f = arena.take(TH);
  b.gu = arena.take(n * 2 * F);
  b.g = arena.take(n * (s.mlp_adapters ? 2 : 1) * F);  // the gate_up LoRA's output first
  b.r = s.mlp_adapters ? arena.take(n * s.adapter_rank) : nullptr;
  b.m = arena.take(TH);
  return b;
}

}  // namespace

size_t zamba2_scratch_floats(const SharedTransformerSpec& s, int H, int T) {
  FloatArena count;
  zamba2_buffers(s, H, T, count);
  return count.used() + attention_scratch_floats(s.attn, 2 * H, T, s.attn_adapters ? s.adapter_rank : 0);
}

void zamba2_shared_forward(const KernelContext& ctx, const SharedTransformerSpec& s, const SharedBlockWeights& b,
                           const Zamba2LayerWeights& l, const float* h, const float* emb, int T, int H,
                           std::span<const SeqRun> runs, FloatArena& arena, float* t) {
  const int F = s.mlp.d_ff;
  const Zamba2Buffers sc = zamba2_buffers(s, H, T, arena);
  // s: (T, 2H) = rmsnorm(concat(h, emb)) * in_norm
  for (int i = 0; i < T; ++i) {
    std::copy_n(h + static_cast<size_t>(i) * H, H, sc.s + static_cast<size_t>(i) * 2 * H);
    std::copy_n(emb + static_cast<size_t>(i) * H, H, sc.s + static_cast<size_t>(i) * 2 * H + H);
  }
  ctx.ops->rmsnorm(ctx, sc.s, b.in_norm.data(), T, 2 * H, s.norm_eps, sc.s);
  // a: (T, H) = attention(s) with this layer's adapters, over this layer's KV cache
  const size_t mark = arena.used();
  attention_forward(ctx, s.attn, b.attn, sc.s, T, runs, arena, sc.a, &l.lora);
  arena.rewind(mark);
  // f: (T, H) = rmsnorm(a) * pre_ff_norm
  ctx.ops->rmsnorm(ctx, sc.a, b.pre_ff_norm.data(), T, H, s.norm_eps, sc.f);
  if (s.mlp.fused) {
    // gu: (T, 2F) = f @ gate_up^T (+ LoRA); m = down(act(gu[:, :F]) * gu[:, F:])
    ctx.ops->matmul(ctx, b.gate_up.view(), nullptr, sc.f, T, sc.gu);
    if (l.gu_down.rows > 0) {
      ctx.ops->matmul(ctx, l.gu_down.view(), nullptr, sc.f, T, sc.r);
      ctx.ops->matmul(ctx, l.gu_up.view(), nullptr, sc.r, T, sc.g);
      for (size_t i = 0; i < static_cast<size_t>(T) * 2 * F; ++i) sc.gu[i] += sc.g[i];
    }
    ctx.ops->activation(ctx, s.mlp.act, sc.gu, sc.gu + F, 2 * F, T, F, sc.g);
  } else {
    // gu: (T, F) gate then (T, F) up; m = down(act(gate) * up)
    float* up = sc.gu + static_cast<size_t>(T) * F;
    ctx.ops->matmul(ctx, b.gate.view(), nullptr, sc.f, T, sc.gu);
    ctx.ops->matmul(ctx, b.up.view(), nullptr, sc.f, T, up);
    ctx.ops->activation(ctx, s.mlp.act, sc.gu, up, F, T, F, sc.g);
  }
  ctx.ops->matmul(ctx, b.down.view(), nullptr, sc.g, T, sc.m);
  // t: (T, H) = m @ linear^T
  ctx.ops->matmul(ctx, l.linear.view(), nullptr, sc.m, T, t);
}

}  // namespace hybridlm
