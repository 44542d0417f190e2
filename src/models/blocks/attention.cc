#include "models/blocks/attention.h"

#include <cstring>

#include "kernels/kernels.h"

namespace hybridlm {

AttentionWeights load_attention(const WeightReader& r, const std::string& p, const AttentionSpec& s, int H) {
  const int64_t q_dim = static_cast<int64_t>(s.n_heads) * s.head_dim;
  const int64_t kv_dim = static_cast<int64_t>(s.n_kv_heads) * s.head_dim;
  AttentionWeights w;
  w.q_proj = r.matrix(p + "q_proj.weight", {q_dim, H});
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
  }
  return w;
}

// y: (T, up.rows) += (u @ down^T) @ up^T
static void add_lora(const KernelContext& ctx, const Matrix& down, const Matrix& up, const float* u, int T,
                     AttentionScratch& sc, float* y) {
  if (down.rows == 0) return;
  sc.lora_r.resize(static_cast<size_t>(T) * down.rows);
  sc.lora_out.resize(static_cast<size_t>(T) * up.rows);
  cpu::matmul(ctx, down.view(), nullptr, u, T, sc.lora_r.data());
  cpu::matmul(ctx, up.view(), nullptr, sc.lora_r.data(), T, sc.lora_out.data());
  for (size_t i = 0; i < sc.lora_out.size(); ++i) y[i] += sc.lora_out[i];
}

void attention_forward(const KernelContext& ctx, const AttentionSpec& s, const AttentionWeights& w, const float* u,
                       int T, std::span<const SeqRun> runs, AttentionScratch& sc, float* out,
                       const AttentionLora* lora) {
  const int hd = s.head_dim, q_dim = s.n_heads * hd, kv_dim = s.n_kv_heads * hd;
  sc.q.resize(static_cast<size_t>(T) * q_dim);
  sc.k.resize(static_cast<size_t>(T) * kv_dim);
  sc.v.resize(static_cast<size_t>(T) * kv_dim);
  sc.y.resize(static_cast<size_t>(T) * q_dim);
  if (s.in_scale != 1.0f) {  // Falcon-H1: attention(u x attention_in_multiplier)
    sc.u.assign(u, u + static_cast<size_t>(T) * w.q_proj.cols);
    for (float& x : sc.u) x *= s.in_scale;
    u = sc.u.data();
  }
  // q: (T, nH*hd), k, v: (T, nKV*hd)
  cpu::matmul(ctx, w.q_proj.view(), data_or_null(w.q_bias), u, T, sc.q.data());
  cpu::matmul(ctx, w.k_proj.view(), data_or_null(w.k_bias), u, T, sc.k.data());
  cpu::matmul(ctx, w.v_proj.view(), data_or_null(w.v_bias), u, T, sc.v.data());
  if (lora) {
    add_lora(ctx, lora->q_down, lora->q_up, u, T, sc, sc.q.data());
    add_lora(ctx, lora->k_down, lora->k_up, u, T, sc, sc.k.data());
    add_lora(ctx, lora->v_down, lora->v_up, u, T, sc, sc.v.data());
  }
  if (s.k_scale != 1.0f)  // Falcon-H1's key_multiplier, before RoPE and the cache
    for (float& x : sc.k) x *= s.k_scale;
  if (s.qk_norm) {  // per head: rows of hd
    cpu::rmsnorm(ctx, sc.q.data(), w.q_norm.data(), T * s.n_heads, hd, s.qk_norm_eps, sc.q.data());
    cpu::rmsnorm(ctx, sc.k.data(), w.k_norm.data(), T * s.n_kv_heads, hd, s.qk_norm_eps, sc.k.data());
  }
  for (const SeqRun& r : runs) {
    const size_t o = static_cast<size_t>(r.start);
    float* q = sc.q.data() + o * q_dim;
    float* k = sc.k.data() + o * kv_dim;
    if (s.rope_dim > 0) {
      cpu::rope(ctx, q, q_dim, r.len, r.pos0, s.n_heads, hd, s.rope_dim, s.rope_theta);
      cpu::rope(ctx, k, kv_dim, r.len, r.pos0, s.n_kv_heads, hd, s.rope_dim, s.rope_theta);
    }
    // The cache rows of this run: (len, nKV, hd) each, written (rounded to the cache's KV dtype)
    // before the queries read them.
    for (int t = 0; t < r.len; ++t)
      r.kv.store(r.pos0 + t, k + static_cast<size_t>(t) * kv_dim, sc.v.data() + (o + t) * kv_dim);
    cpu::attention(ctx, q, q_dim, r.kv, r.pos0, r.len, s.n_heads, s.softmax_scale(), sc.y.data() + o * q_dim);
  }
  // out: (T, H) = y @ o_proj^T
  cpu::matmul(ctx, w.o_proj.view(), data_or_null(w.o_bias), sc.y.data(), T, out);
  if (s.out_scale != 1.0f)
    for (size_t i = 0; i < static_cast<size_t>(T) * w.o_proj.rows; ++i) out[i] *= s.out_scale;
}

}  // namespace hybridlm
