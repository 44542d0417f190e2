// Family `lfm2` (Lfm2ForCausalLM, LiquidAI/LFM2-*). Config keys and defaults follow transformers'
// Lfm2Config (research/hf-hybrid.md C.9).
// Pattern: layer_types ("conv" / "full_attention"), else full_attn_idxs; with neither, every layer
// is attention. Every layer has a SwiGLU MLP.
// Quirks: the gated short conv (in_proj -> B, C, x; C * conv(B * x), no activation; biases from
// conv_bias); attention with per-head RMSNorm of q and k before RoPE and an `out_proj`; the MLP
// width is adjusted (2/3, multiplier, round up) when block_auto_adjust_ff_dim; final norm
// `embedding_norm`; tied embeddings.
// Weights (prefix model.): embed_tokens.weight | layers.N.{operator_norm.weight, ffn_norm.weight,
// conv.{in_proj (3H, H), conv (H, 1, L), out_proj (H, H)} | self_attn.{q_proj, k_proj, v_proj,
// out_proj, q_layernorm, k_layernorm}, feed_forward.{w1 (gate), w3 (up), w2 (down)}} |
// embedding_norm.weight.
#include "base/error.h"
#include "models/arch/families.h"

namespace hybridlm {

HybridConfig parse_lfm2(const JsonKeys& k, NormGrouping) {
  HybridConfig c = read_common_keys(k, {/*hidden_size=*/2560, /*vocab_size=*/65536, /*tie=*/true, 1, 7, 0,
                                        "norm_eps", 1e-5});
  if (k.has("tie_embedding") && !k.has("tie_word_embeddings")) c.tie_embeddings = k.boolean("tie_embedding", true);
  const int H = c.d_model;
  const int n_layers = k.positive("num_hidden_layers", 32, 1 << 14);
  std::vector<bool> attn_layer(n_layers, true);
  if (k.has("layer_types")) {
    const nlohmann::json& list = k.raw("layer_types");
    if (!list.is_array() || static_cast<int64_t>(list.size()) != n_layers)
      k.fail("layer_types", "expected a list of " + std::to_string(n_layers) + " layer types");
    for (int i = 0; i < n_layers; ++i) {
      const std::string t = list[i].is_string() ? list[i].get<std::string>() : "";
      if (t != "conv" && t != "full_attention")
        k.fail("layer_types", "entry " + std::to_string(i) + ": unknown layer type (use conv or full_attention)");
      attn_layer[i] = t == "full_attention";
    }
  } else if (k.has("full_attn_idxs")) {
    const nlohmann::json& idx = k.raw("full_attn_idxs");
    if (!idx.is_array()) k.fail("full_attn_idxs", "expected a list of layer indices");
    attn_layer.assign(n_layers, false);
    for (const auto& v : idx) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= n_layers)
        k.fail("full_attn_idxs", "entries must be layer indices in [0, " + std::to_string(n_layers) + ")");
      attn_layer[v.get<int64_t>()] = true;
    }
  }

  AttentionSpec a = read_attention(k, H, "num_attention_heads", 32, "num_key_value_heads", "head_dim", /*kv_default=*/8);
  a.rope_theta = k.has("theta") ? k.positive_number("theta", 1e6) : read_rope_theta(k, 1e6);
  a.rope_dim = rotary_dims(k, "head_dim", 1.0, a.head_dim);
  a.qk_norm = true;
  a.qk_norm_eps = c.norm_eps;
  a.o_name = "out_proj";
  a.q_norm_name = "q_layernorm";
  a.k_norm_name = "k_layernorm";

  ShortConvSpec conv;
  conv.d_conv = k.positive("conv_L_cache", 3, 64);
  conv.bias = k.boolean("conv_bias", false);

  // The MLP width, as Lfm2MLP computes it.
  const char* ff_key = k.has("intermediate_size") || !k.has("block_ff_dim") ? "intermediate_size" : "block_ff_dim";
  int64_t F = k.positive(ff_key, 12288);
  if (k.boolean("block_auto_adjust_ff_dim", true)) {
    F = static_cast<int64_t>(2.0 * static_cast<double>(F) / 3.0);
    if (!k.is_null("block_ffn_dim_multiplier")) {  // default 1.0; an explicit null skips the rounding
      const double mult = k.number("block_ffn_dim_multiplier", 1.0);
      if (!(mult > 0 && mult < 64)) k.fail("block_ffn_dim_multiplier", "must be in (0, 64)");
      const int64_t multiple = k.positive("block_multiple_of", 256, 1 << 16);
      F = static_cast<int64_t>(mult * static_cast<double>(F));
      F = multiple * ((F + multiple - 1) / multiple);
    }
  }
  if (F < 1 || F > JsonKeys::kMaxDim) k.fail(ff_key, "gives an MLP width of " + std::to_string(F));
  FfnSpec mlp;
  mlp.kind = FfnKind::Mlp;
  mlp.mlp.d_ff = static_cast<int>(F);
  mlp.mlp.gate = "w1";
  mlp.mlp.up = "w3";
  mlp.mlp.down = "w2";

  BlockSpec attn, short_conv;
  attn.mixer = MixerKind::Attention;
  attn.attn = a;
  short_conv.mixer = MixerKind::ShortConv;
  short_conv.conv = conv;
  attn.ffn = short_conv.ffn = mlp;
  add_layers(c, attn_layer, attn, short_conv,
             {"operator_norm.weight", "self_attn.", "conv.", "ffn_norm.weight", "feed_forward."});
  c.embedding_name = "model.embed_tokens.weight";
  c.final_norm_name = "model.embedding_norm.weight";
  return c;
}

}  // namespace hybridlm
