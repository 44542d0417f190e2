// Family `granitemoehybrid` (GraniteMoeHybridForCausalLM, ibm-granite/granite-4.0-h-*). Config keys
// and defaults follow transformers' GraniteMoeHybridConfig (research/hf-hybrid.md C.5).
// Pattern: layer_types (alias layers_block_type; "mamba" / "attention", default all mamba).
// Quirks: Bamba's Mamba-2 mixer; attention softmax scale = attention_multiplier, RoPE (full head)
// only when position_embedding_type is "rope"; every feed-forward is a top-k-softmax MoE over
// stacked experts plus an always-on shared MLP (only the shared MLP when num_local_experts is 0);
// residual adds scaled by residual_multiplier, embeddings by embedding_multiplier, logits divided
// by logits_scaling.
// Weights (prefix model.): embed_tokens.weight | layers.N.{input_layernorm.weight,
// post_attention_layernorm.weight, mamba.* | self_attn.{q,k,v,o}_proj.weight,
// shared_mlp.{input_linear (2S, H) = [gate; up], output_linear (H, S)},
// block_sparse_moe.{router.layer.weight (E, H), input_linear.weight (E, 2I, H),
// output_linear.weight (E, H, I)}} | norm.weight; lm_head.weight.
#include "models/arch/families.h"

namespace hybridlm {

HybridConfig parse_granitemoehybrid(const JsonKeys& k, NormGrouping mamba2_norm) {
  HybridConfig c = read_common_keys(k, {/*hidden_size=*/4096, /*vocab_size=*/32000, /*tie=*/false, 1, 2, 0,
                                        "rms_norm_eps", 1e-6});
  const int H = c.d_model;
  const int n_layers = k.positive("num_hidden_layers", 32, 1 << 14);
  std::vector<bool> attn_layer(n_layers, false);
  if (k.has("layer_types")) attn_layer = read_attention_layers(k, "layer_types", n_layers);
  else if (k.has("layers_block_type")) attn_layer = read_attention_layers(k, "layers_block_type", n_layers);

  c.embedding_multiplier = static_cast<float>(k.number("embedding_multiplier", 1.0));
  c.residual_multiplier = static_cast<float>(k.number("residual_multiplier", 1.0));
  c.logits_multiplier = 1.0f / k.positive_number("logits_scaling", 1.0);

  const Mamba2Spec m = read_bamba_mamba(k, H, c.norm_eps, mamba2_norm);

  AttentionSpec a = read_attention(k, H, "num_attention_heads", 32, "num_key_value_heads", "head_dim");
  a.scale = k.positive_number("attention_multiplier", 1.0);
  a.qkv_bias = a.o_bias = k.boolean("attention_bias", false);
  const std::string pos = k.string("position_embedding_type", "nope");
  if (pos != "rope" && pos != "nope") k.fail("position_embedding_type", "use rope, nope or null");
  if (pos == "rope") {
    a.rope_theta = read_rope_theta(k, 10000.0);
    a.rope_dim = rotary_dims(k, "head_dim", 1.0, a.head_dim);
  }

  MlpSpec shared;
  shared.d_ff = k.positive("shared_intermediate_size", 1024);
  shared.fused = true;
  shared.up = "input_linear";
  shared.down = "output_linear";
  const int64_t n_experts = k.integer("num_local_experts", 8);
  if (n_experts < 0 || n_experts > 4096) k.fail("num_local_experts", "must be in [0, 4096]");
  FfnSpec ffn;
  if (n_experts > 0) {
    ffn.kind = FfnKind::Moe;
    ffn.mlp = shared;
    ffn.mlp.d_ff = k.positive("intermediate_size", 11008);
    ffn.n_experts = static_cast<int>(n_experts);
    ffn.top_k = k.positive("num_experts_per_tok", 2, 4096);
    if (ffn.top_k > ffn.n_experts) k.fail("num_experts_per_tok", "must be at most num_local_experts");
    ffn.routing = Routing::TopKSoftmax;
    ffn.router = "router.layer.weight";
    ffn.stacked_experts = true;
    ffn.shared = shared;
  } else {
    ffn.kind = FfnKind::Mlp;
    ffn.mlp = shared;
  }

  BlockSpec attn, mamba;
  attn.mixer = MixerKind::Attention;
  attn.attn = a;
  mamba.mixer = MixerKind::Mamba2;
  mamba.m2 = m;
  attn.ffn = mamba.ffn = ffn;
  add_layers(c, attn_layer, attn, mamba,
             {"input_layernorm.weight", "self_attn.", "mamba.", "post_attention_layernorm.weight",
              n_experts > 0 ? "block_sparse_moe." : "shared_mlp."},
             [](int, const std::string& p, BlockSpec& b) { b.ffn.shared_prefix = p + "shared_mlp."; });
  c.embedding_name = "model.embed_tokens.weight";
  c.final_norm_name = "model.norm.weight";
  return c;
}

}  // namespace hybridlm
