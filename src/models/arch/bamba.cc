// Family `bamba` (BambaForCausalLM, ibm-ai-platform/Bamba-9B). Config keys and defaults follow
// transformers' BambaConfig (research/hf-hybrid.md C.4).
// Pattern: layer i is attention iff i is in attn_layer_indices (or an explicit
// layers_block_type list), else Mamba-2; every layer has a SwiGLU MLP.
// Quirks: RoPE on the first half of each head (partial_rotary_factor 0.5, rotate-half within
// those dims); Mamba-2 with d_head "auto" = expand x hidden / n_heads; the gated norm follows
// --mamba2-norm (Hugging Face's torch path normalises the full width; released checkpoints have
// n_groups 1, where both forms agree).
// Weights (prefix model.): embed_tokens.weight | layers.N.{input_layernorm.weight,
// pre_ff_layernorm.weight, mamba.{in_proj, conv1d (+bias), dt_bias, A_log, D, norm.weight,
// out_proj} | self_attn.{q,k,v,o}_proj.weight, feed_forward.{gate,up,down}_proj.weight} |
// final_layernorm.weight; lm_head.weight.
#include <algorithm>

#include "models/arch/families.h"

namespace hybridlm {

Mamba2Spec read_bamba_mamba(const JsonKeys& k, int H, float norm_eps, NormGrouping mamba2_norm) {
  Mamba2Spec m;
  m.d_inner = read_expanded(k, "mamba_expand", H);
  m.n_heads = k.positive("mamba_n_heads", 128, 1 << 16);
  if (k.has("mamba_d_head") && k.raw("mamba_d_head").is_string()) {
    if (k.string("mamba_d_head", "auto") != "auto") k.fail("mamba_d_head", "expected an integer or \"auto\"");
    if (m.d_inner % m.n_heads != 0)
      k.fail("mamba_n_heads", "must divide mamba_expand x hidden_size = " + std::to_string(m.d_inner));
    m.head_dim = m.d_inner / m.n_heads;
  } else {
    m.head_dim = k.positive("mamba_d_head", std::max(1, m.d_inner / m.n_heads), 4096);
  }
  if (static_cast<int64_t>(m.n_heads) * m.head_dim != m.d_inner)
    k.fail("mamba_d_head", "mamba_n_heads x mamba_d_head must equal mamba_expand x hidden_size = " +
                               std::to_string(m.d_inner));
  m.n_groups = k.positive("mamba_n_groups", 1, 1024);
  if (m.n_heads % m.n_groups != 0) k.fail("mamba_n_groups", "must divide mamba_n_heads = " + std::to_string(m.n_heads));
  m.d_state = k.positive("mamba_d_state", 256, 4096);
  m.d_conv = k.positive("mamba_d_conv", 4, 64);
  m.chunk_size = k.positive("mamba_chunk_size", 256, 1 << 16);
  m.conv_bias = k.boolean("mamba_conv_bias", true);
  m.proj_bias = k.boolean("mamba_proj_bias", false);
  m.norm_eps = norm_eps;
  m.norm_grouping = mamba2_norm;
  read_time_step_limit(k, "time_step_limit", m);
  return m;
}

HybridConfig parse_bamba(const JsonKeys& k, NormGrouping mamba2_norm) {
  HybridConfig c = read_common_keys(k, {/*hidden_size=*/4096, /*vocab_size=*/128000, /*tie=*/false, 1, 2, 0,
                                        "rms_norm_eps", 1e-5});
  const int H = c.d_model;
  const int n_layers = k.positive("num_hidden_layers", 32, 1 << 14);
  std::vector<bool> attn_layer(n_layers, false);
  if (k.has("layers_block_type")) {
    attn_layer = read_attention_layers(k, "layers_block_type", n_layers);
  } else if (k.has("attn_layer_indices")) {
    const nlohmann::json& idx = k.raw("attn_layer_indices");
    if (!idx.is_array()) k.fail("attn_layer_indices", "expected a list of layer indices");
    for (const auto& v : idx) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= n_layers)
        k.fail("attn_layer_indices", "entries must be layer indices in [0, num_hidden_layers = " +
                                         std::to_string(n_layers) + ")");
      attn_layer[v.get<int64_t>()] = true;
    }
  }

  const Mamba2Spec m = read_bamba_mamba(k, H, c.norm_eps, mamba2_norm);

  AttentionSpec a = read_attention(k, H, "num_attention_heads", 32, "num_key_value_heads", "head_dim", /*kv_default=*/8);
  a.rope_theta = read_rope_theta(k, 10000.0);
  a.rope_dim = rotary_dims(k, "partial_rotary_factor", 0.5, a.head_dim);  // fixed at 0.5 by BambaConfig
  a.qkv_bias = a.o_bias = k.boolean("attention_bias", false);

  FfnSpec mlp;
  mlp.kind = FfnKind::Mlp;
  mlp.mlp.d_ff = k.positive("intermediate_size", 14336);
  mlp.mlp.bias = k.boolean("mlp_bias", false);

  BlockSpec attn, mamba;
  attn.mixer = MixerKind::Attention;
  attn.attn = a;
  mamba.mixer = MixerKind::Mamba2;
  mamba.m2 = m;
  attn.ffn = mamba.ffn = mlp;
  add_layers(c, attn_layer, attn, mamba,
             {"input_layernorm.weight", "self_attn.", "mamba.", "pre_ff_layernorm.weight", "feed_forward."});
  c.embedding_name = "model.embed_tokens.weight";
  c.final_norm_name = "model.final_layernorm.weight";
  return c;
}

}  // namespace hybridlm
