#include "models/plan.h"

#include "models/blocks/mamba1.h"
#include "models/blocks/mamba2.h"
#include "models/blocks/short_conv.h"

namespace hybridlm {

std::vector<LayerCacheSpec> cache_specs(const HybridConfig& c) {
  std::vector<LayerCacheSpec> specs;
  for (const BlockSpec& b : c.blocks) {
    LayerCacheSpec s;
    switch (b.mixer) {
      case MixerKind::None: break;
      case MixerKind::Mamba1: s = {LayerCacheKind::Mamba, mamba1_state_spec(b.m1), {}}; break;
      case MixerKind::Mamba2:
        s = {LayerCacheKind::Mamba, mamba2_state_spec(b.m2), {}};
        if (b.shared_block >= 0) s = {LayerCacheKind::MambaAndAttention, s.state, {c.shared.attn.n_kv_heads, c.shared.attn.head_dim}};
        break;
      case MixerKind::Attention: s = {LayerCacheKind::Attention, {}, {b.attn.n_kv_heads, b.attn.head_dim}}; break;
      case MixerKind::ShortConv: s = {LayerCacheKind::Conv, short_conv_state_spec(b.conv, c.d_model), {}}; break;
      case MixerKind::Mamba2Attention:
        s = {LayerCacheKind::MambaAndAttention, mamba2_state_spec(b.m2), {b.attn.n_kv_heads, b.attn.head_dim}};
        break;
    }
    specs.push_back(s);
  }
  return specs;
}

namespace {
struct Counts {
  size_t matrices = 0, vectors = 0;
};

void count_mlp(const MlpSpec& m, size_t H, size_t copies, Counts& n) {
  const size_t F = m.d_ff;
  if (F == 0) return;
  n.matrices += copies * ((m.gated || m.fused ? 3 : 2) * F * H);
  if (m.bias) n.vectors += copies * ((m.gated || m.fused ? 2 * F : F) + H);
}

// The tensors of the block loaders and Model::load, by shape.
Counts count(const HybridConfig& c) {
  const size_t H = c.d_model, V = c.vocab_size;
  Counts n;
  n.matrices += V * H;              // embedding
  if (!c.tie_embeddings) n.matrices += V * H;  // lm_head
  n.vectors += H;                   // norm_f
  const SharedTransformerSpec& st = c.shared;
  const size_t sq = static_cast<size_t>(st.attn.n_heads) * st.attn.head_dim;
  const size_t skv = static_cast<size_t>(st.attn.n_kv_heads) * st.attn.head_dim;
  const size_t sF = st.mlp.d_ff, R = st.adapter_rank;
  for (int sb = 0; sb < st.n_blocks; ++sb) {  // Zamba2 shared blocks: norms, attention, MLP
    n.vectors += 3 * H;
    n.matrices += sq * 2 * H + 2 * skv * 2 * H + H * sq + 2 * sF * H + H * sF;
  }
  for (const BlockSpec& b : c.blocks) {
    if (b.shared_block >= 0) {  // per hybrid layer: adapters and the output linear
      n.matrices += H * H;
      if (st.attn_adapters) n.matrices += 3 * R * 2 * H + R * (sq + 2 * skv);
      if (st.mlp_adapters) n.matrices += R * H + 2 * sF * R;
    }
    if (b.mixer != MixerKind::None) n.vectors += H;  // pre-mixer norm
    if (b.ffn.kind != FfnKind::None) {
      const FfnSpec& f = b.ffn;
      const size_t experts = f.kind == FfnKind::Moe ? f.n_experts : 1;
      n.vectors += H;  // pre-ffn norm
      count_mlp(f.mlp, H, experts, n);
      count_mlp(f.shared, H, 1, n);
      if (f.kind == FfnKind::Moe) {
        n.matrices += f.n_experts * H;  // router
        if (!f.correction_bias.empty()) n.vectors += f.n_experts;
      }
    }
    if (b.mixer == MixerKind::ShortConv) {
      const size_t K = b.conv.d_conv;
      n.matrices += 4 * H * H;  // in_proj (3H, H), out_proj (H, H)
      n.vectors += H * K + (b.conv.bias ? 3 * H + H + H : 0);
    }
    if (b.mixer == MixerKind::Attention || b.mixer == MixerKind::Mamba2Attention) {
      const AttentionSpec& a = b.attn;
      const size_t q = static_cast<size_t>(a.n_heads) * a.head_dim, kv = static_cast<size_t>(a.n_kv_heads) * a.head_dim;
      n.matrices += 2 * q * H + 2 * kv * H;
      if (a.qkv_bias) n.vectors += q + 2 * kv;
      if (a.o_bias) n.vectors += H;
      if (a.qk_norm) n.vectors += 2 * static_cast<size_t>(a.head_dim);
    }
    if (b.mixer == MixerKind::Mamba1) {
      const Mamba1Spec& m = b.m1;
      const size_t I = m.d_inner, N = m.d_state, R = m.dt_rank, K = m.d_conv;
      n.matrices += 2 * I * H + (R + 2 * N) * I + I * R + H * I;  // in, x, dt, out projections
      n.vectors += I * K + (m.conv_bias ? I : 0) + I + I * N + I;  // conv, dt bias, A_log, D
      if (m.proj_bias) n.vectors += 2 * I + H;
      if (m.dt_bc_rms_weights) n.vectors += R + 2 * N;
    }
    if (b.mixer == MixerKind::Mamba2 || b.mixer == MixerKind::Mamba2Attention) {
      const Mamba2Spec& m = b.m2;
      const size_t I = m.d_inner, nh = m.n_heads, K = m.d_conv, cd = m.conv_dim(), W = m.in_proj_dim();
      n.matrices += W * H + H * I;                                       // in, out projections
      n.vectors += cd * K + (m.conv_bias ? cd : 0) + 3 * nh + (m.gate_norm ? I : 0);  // conv, dt_bias/A_log/D, norm
      if (m.proj_bias) n.vectors += W;
      if (m.has_out_bias()) n.vectors += H;
    }
  }
  return n;
}
}  // namespace

size_t param_count(const HybridConfig& c) {
  const Counts n = count(c);
  return n.matrices + n.vectors;
}

size_t matrix_param_count(const HybridConfig& c) { return count(c).matrices; }

size_t kv_bytes_per_token(const HybridConfig& c, size_t kv_dtype_bytes) {
  size_t n = 0;
  for (const LayerCacheSpec& l : cache_specs(c))
    if (l.has_kv()) n += 2 * static_cast<size_t>(l.kv.n_kv_heads) * l.kv.head_dim * kv_dtype_bytes;
  return n;
}

}  // namespace hybridlm
