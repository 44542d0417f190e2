#include "models/blocks/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/kernels.h"

namespace hybridlm {

AttentionWeights load_attention(const TensorSource& r, const std::string& p, const AttentionSpec& s, int H) {
  const int64_t q_dim = static_cast<int64_t>(s.n_heads) * s.head_dim;
  const int64_t kv_dim = static_cast<int64_t>(s.n_kv_heads) * s.head_dim;
  AttentionWeights w;
  w.q_proj = r.matrix(p + "q_proj.weight", {s.output_gate ? 2 * q_dim : q_dim, H});
  w.k_proj = r.matrix(p + "k_proj.weight", {kv_dim, H});
  w.v_proj = r.matrix(p + "v_proj.weight", {kv_dim, H});
  w.o_proj = r.matrix(p + s.o_name + ".weight", {H, q_dim});
  if (s.qkv_bias) {
    w.q_bias = r.vector(p + "q_proj.bias", {q_dim});
    w.k_bias = r.vector(p + "k_proj.bias", {kv_dim});
    w.v_bias = r.vector(p + "v_proj.bias", {kv_dim});
  }
  if (s.o_bias) w.o_bias = r.vector(p + s.o_name + ".bias", {H});
  if (s.qk_norm) {
    w.q_norm = r.vector(p + s.q_norm_name + ".weight", {s.head_dim});
    w.k_norm = r.vector(p + s.k_norm_name + ".weight", {s.head_dim});
    for (float& x : w.q_norm) x += s.qk_norm_offset;
    for (float& x : w.k_norm) x += s.qk_norm_offset;
  }
  return w;
}

namespace {

class AttentionMixer final : public MixerOf<AttentionSpec, AttentionWeights, load_attention> {
 public:
  using MixerOf::MixerOf;
  LayerCacheSpec cache_spec() const override { return {LayerCacheKind::Attention, {}, {s_.n_kv_heads, s_.head_dim}}; }
  size_t scratch_floats(int T) const override { return attention_scratch_floats(s_, H_, T); }
  void forward(const KernelContext& ctx, const float* u, int T, std::span<const SeqRun> runs, FloatArena& arena,
               float* out) const override {
    attention_forward(ctx, s_, w_, u, T, runs, arena, out);
  }
};

struct AttentionBuffers {
  float *u = nullptr, *q, *k, *v, *y;
  float *qg = nullptr, *gate = nullptr;  // output_gate: q_proj's output (T, 2 q_dim), the gates (T, q_dim)
};

AttentionBuffers attention_buffers(const AttentionSpec& s, int in_dim, int T, FloatArena& a) {
  const size_t n = static_cast<size_t>(T), q_dim = static_cast<size_t>(s.n_heads) * s.head_dim,
               kv_dim = static_cast<size_t>(s.n_kv_heads) * s.head_dim;
  AttentionBuffers b;
  if (s.in_scale != 1.0f) b.u = a.take(n * in_dim);
  b.q = a.take(n * q_dim);
  b.k = a.take(n * kv_dim);
  b.v = a.take(n * kv_dim);
  b.y = a.take(n * q_dim);
  if (s.output_gate) {
    b.qg = a.take(n * 2 * q_dim);
    b.gate = a.take(n * q_dim);
  }
  return b;
}

// y: (T, up.rows) += (u @ down^T) @ up^T, through two buffers taken from the arena and given back.
void add_lora(const KernelContext& ctx, const Matrix& down, const Matrix& up, const float* u, int T,
              FloatArena& arena, float* y) {
  if (down.rows == 0) return;
  const size_t mark = arena.used(), n_out = static_cast<size_t>(T) * up.rows;
  float* r = arena.take(static_cast<size_t>(T) * down.rows);
  float* o = arena.take(n_out);
  ctx.ops->matmul(ctx, down.view(), nullptr, u, T, r);
  ctx.ops->matmul(ctx, up.view(), nullptr, r, T, o);
  for (size_t i = 0; i < n_out; ++i) y[i] += o[i];
  arena.rewind(mark);
}

}  // namespace

std::unique_ptr<Mixer> make_attention_mixer(const AttentionSpec& s, const std::string& prefix, int H) {
  return std::make_unique<AttentionMixer>(s, prefix, H);
}

size_t attention_scratch_floats(const AttentionSpec& s, int in_dim, int T, int lora_rank) {
  FloatArena count;
  attention_buffers(s, in_dim, T, count);
  if (lora_rank > 0) {  // add_lora's two buffers, for the widest projection
    count.take(static_cast<size_t>(T) * lora_rank);
    count.take(static_cast<size_t>(T) * std::max(s.n_heads, s.n_kv_heads) * s.head_dim);
  }
  return count.used();
}

void attention_forward(const KernelContext& ctx, const AttentionSpec& s, const AttentionWeights& w, const float* u,
                       int T, std::span<const SeqRun> runs, FloatArena& arena, float* out,
                       const AttentionLora* lora) {
  const int hd = s.head_dim, q_dim = s.n_heads * hd, kv_dim = s.n_kv_heads * hd;
  const AttentionBuffers sc = attention_buffers(s, w.q_proj.cols, T, arena);
  if (s.in_scale != 1.0f) {  // Falcon-H1: attention(u x attention_in_multiplier)
    for (size_t i = 0; i < static_cast<size_t>(T) * w.q_proj.cols; ++i) sc.u[i] = u[i] * s.in_scale;
    u = sc.u;
  }
  // q: (T, nH*hd), k, v: (T, nKV*hd)
  if (s.output_gate) {  // q_proj rows per head [hd query | hd gate]: split them
    ctx.ops->matmul(ctx, w.q_proj.view(), data_or_null(w.q_bias), u, T, sc.qg);
    for (size_t t = 0; t < static_cast<size_t>(T); ++t)
      for (int h = 0; h < s.n_heads; ++h) {
        const float* src = sc.qg + t * 2 * q_dim + static_cast<size_t>(h) * 2 * hd;
        std::copy_n(src, hd, sc.q + t * q_dim + static_cast<size_t>(h) * hd);
        std::copy_n(src + hd, hd, sc.gate + t * q_dim + static_cast<size_t>(h) * hd);
      }
  } else {
    ctx.ops->matmul(ctx, w.q_proj.view(), data_or_null(w.q_bias), u, T, sc.q);
  }
  ctx.ops->matmul(ctx, w.k_proj.view(), data_or_null(w.k_bias), u, T, sc.k);
  ctx.ops->matmul(ctx, w.v_proj.view(), data_or_null(w.v_bias), u, T, sc.v);
  if (lora) {
    add_lora(ctx, lora->q_down, lora->q_up, u, T, arena, sc.q);
    add_lora(ctx, lora->k_down, lora->k_up, u, T, arena, sc.k);
    add_lora(ctx, lora->v_down, lora->v_up, u, T, arena, sc.v);
  }
  if (s.k_scale != 1.0f)  // Falcon-H1's key_multiplier, before RoPE and the cache
    for (size_t i = 0; i < static_cast<size_t>(T) * kv_dim; ++i) sc.k[i] *= s.k_scale;
  if (s.qk_norm) {  // per head: rows of hd
    ctx.ops->rmsnorm(ctx, sc.q, w.q_norm.data(), T * s.n_heads, hd, s.qk_norm_eps, sc.q);
    ctx.ops->rmsnorm(ctx, sc.k, w.k_norm.data(), T * s.n_kv_heads, hd, s.qk_norm_eps, sc.k);
  }
  for (const SeqRun& r : runs) {
    const size_t o = static_cast<size_t>(r.start);
    float* q = sc.q + o * q_dim;
    float* k = sc.k + o * kv_dim;
    if (s.rope_dim > 0) {
      ctx.ops->rope(ctx, q, q_dim, r.len, r.pos0, s.n_heads, hd, s.rope_dim, s.rope_theta);
      ctx.ops->rope(ctx, k, kv_dim, r.len, r.pos0, s.n_kv_heads, hd, s.rope_dim, s.rope_theta);
    }
    // The cache rows of this run: (len, nKV, hd) each, written (rounded to the cache's KV dtype)
    // before the queries read them.
    for (int t = 0; t < r.len; ++t) r.kv.store(r.pos0 + t, k + static_cast<size_t>(t) * kv_dim, sc.v + (o + t) * kv_dim);
    ctx.ops->attention(ctx, q, q_dim, r.kv, r.pos0, r.len, s.n_heads, s.softmax_scale(), sc.y + o * q_dim);
  }
  if (s.output_gate)  // y *= sigmoid(gate)
    for (size_t i = 0; i < static_cast<size_t>(T) * q_dim; ++i) sc.y[i] *= 1.0f / (1.0f + std::exp(-sc.gate[i]));
  // out: (T, H) = y @ o_proj^T
  ctx.ops->matmul(ctx, w.o_proj.view(), data_or_null(w.o_bias), sc.y, T, out);
  if (s.out_scale != 1.0f)
    for (size_t i = 0; i < static_cast<size_t>(T) * w.o_proj.rows; ++i) out[i] *= s.out_scale;
}

}  // namespace hybridlm
