// Family `jamba` (JambaForCausalLM, ai21labs/Jamba-*). Config keys and defaults follow
// transformers' JambaConfig (research/hf-hybrid.md C.3).
// Pattern: layer i is attention iff i % attn_layer_period == attn_layer_offset (or an explicit
// layers_block_type list), else Mamba-1; its feed-forward is a mixture of num_experts experts iff
// i % expert_layer_period == expert_layer_offset and num_experts > 1, else a SwiGLU MLP.
// Quirks: Mamba-1 with RMSNorms (with weights, eps rms_norm_eps) on dt, B and C after x_proj;
// attention without any positional encoding; router softmax top-k without renormalisation.
// Weights (prefix model.): embed_tokens.weight | layers.N.{input_layernorm.weight,
// pre_ff_layernorm.weight, mamba.{in_proj, conv1d (+bias), x_proj, dt_proj (+bias), A_log, D,
// out_proj, dt_layernorm, b_layernorm, c_layernorm} | self_attn.{q,k,v,o}_proj.weight,
// feed_forward.{gate,up,down}_proj.weight | feed_forward.router.weight +
// feed_forward.experts.E.{gate,up,down}_proj.weight} | final_layernorm.weight; lm_head.weight.
#include "models/arch/families.h"

namespace hybridlm {

HybridConfig parse_jamba(const JsonKeys& k, NormGrouping) {
  HybridConfig c = read_common_keys(k, {/*hidden_size=*/4096, /*vocab_size=*/65536, /*tie=*/false, 1, 2, 0,
                                        "rms_norm_eps", 1e-6});
  const int H = c.d_model;
  const int n_layers = k.positive("num_hidden_layers", 32, 1 << 14);
  const int attn_period = k.positive("attn_layer_period", 8, 1 << 14);
  const int64_t attn_offset = k.integer("attn_layer_offset", 4);
  if (attn_offset < 0 || attn_offset >= attn_period) k.fail("attn_layer_offset", "must be in [0, attn_layer_period)");
  const int expert_period = k.positive("expert_layer_period", 2, 1 << 14);
  const int64_t expert_offset = k.integer("expert_layer_offset", 1);
  if (expert_offset < 0 || expert_offset >= expert_period)
    k.fail("expert_layer_offset", "must be in [0, expert_layer_period)");
  std::vector<bool> attn_layer(n_layers);
  if (k.has("layers_block_type")) {
    attn_layer = read_attention_layers(k, "layers_block_type", n_layers);
  } else {
    for (int i = 0; i < n_layers; ++i) attn_layer[i] = i % attn_period == attn_offset;
  }

  Mamba1Spec m;
  m.d_inner = read_expanded(k, "mamba_expand", H);
  m.d_state = k.positive("mamba_d_state", 16, 4096);
  m.d_conv = k.positive("mamba_d_conv", 4, 64);
  m.dt_rank = read_dt_rank(k, "mamba_dt_rank", H);
  m.conv_bias = k.boolean("mamba_conv_bias", true);
  m.proj_bias = k.boolean("mamba_proj_bias", false);
  m.dt_bc_rms = true;
  m.dt_bc_rms_weights = true;
  m.dt_bc_rms_eps = c.norm_eps;

  AttentionSpec a = read_attention(k, H, "num_attention_heads", 32, "num_key_value_heads", "head_dim", /*kv_default=*/8);
  a.rope_dim = 0;  // Jamba has no positional encoding

  FfnSpec mlp;
  mlp.kind = FfnKind::Mlp;
  mlp.mlp.d_ff = k.positive("intermediate_size", 14336);
  const int n_experts = k.positive("num_experts", 16, 4096);
  FfnSpec moe = mlp;
  if (n_experts > 1) {
    moe.kind = FfnKind::Moe;
    moe.n_experts = n_experts;
    moe.top_k = k.positive("num_experts_per_tok", 2, 4096);
    if (moe.top_k > n_experts) k.fail("num_experts_per_tok", "must be at most num_experts");
    moe.routing = Routing::SoftmaxTopK;
    moe.renormalize = false;
  }

  BlockSpec attn, mamba;
  attn.mixer = MixerKind::Attention;
  attn.attn = a;
  mamba.mixer = MixerKind::Mamba1;
  mamba.m1 = m;
  add_layers(c, attn_layer, attn, mamba,
             {"input_layernorm.weight", "self_attn.", "mamba.", "pre_ff_layernorm.weight", "feed_forward."},
             [&](int i, const std::string&, BlockSpec& b) { b.ffn = i % expert_period == expert_offset ? moe : mlp; });
  c.embedding_name = "model.embed_tokens.weight";
  c.final_norm_name = "model.final_layernorm.weight";
  return c;
}

}  // namespace hybridlm
