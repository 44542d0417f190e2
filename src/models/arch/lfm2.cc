// Families `lfm2` (Lfm2ForCausalLM, LiquidAI/LFM2-*) and `lfm2_moe` (Lfm2MoeForCausalLM,
// LiquidAI/LFM2-8B-A1B). Config keys and defaults follow transformers' Lfm2Config and Lfm2MoeConfig
// (research/hf-hybrid.md C.9; modeling_lfm2_moe.py pinned in docs/numerics.md).
// Pattern: layer_types ("conv" / "full_attention"), else full_attn_idxs; with neither, every layer
// is attention (lfm2; lfm2_moe requires one of them, as its modeling file does).
// Quirks: the gated short conv (in_proj -> B, C, x; C * conv(B * x), no activation; biases from
// conv_bias); attention with per-head RMSNorm of q and k before RoPE and an `out_proj`; final norm
// `embedding_norm`; tied embeddings.
// lfm2: every layer has a SwiGLU MLP whose width is adjusted (2/3, multiplier, round up) when
// block_auto_adjust_ff_dim.
// lfm2_moe: the first num_dense_layers layers have a SwiGLU MLP of intermediate_size as is; the
// others a mixture of num_experts SwiGLU experts (moe_intermediate_size): s = sigmoid(gate(x)),
// the top num_experts_per_tok by s + expert_bias (bias only for the choice; no bias without
// use_expert_bias), weights s / (sum + 1e-6) when norm_topk_prob, times routed_scaling_factor.
// Weights (prefix model.): embed_tokens.weight | layers.N.{operator_norm.weight, ffn_norm.weight,
// conv.{in_proj (3H, H), conv (H, 1, L), out_proj (H, H)} | self_attn.{q_proj, k_proj, v_proj,
// out_proj, q_layernorm, k_layernorm}, feed_forward.{w1 (gate), w3 (up), w2 (down)}} |
// embedding_norm.weight. lfm2_moe's MoE layers: layers.N.feed_forward.{gate.weight (E, H),
// expert_bias (E), experts.E.{w1, w3, w2}.weight} (the hub layout; transformers 5 stacks them in
// memory only).
#include <cmath>

#include "base/error.h"
#include "models/arch/families.h"

namespace hybridlm {

namespace {

// What lfm2 and lfm2_moe share: the common keys, the layer pattern and the two mixers' specs.
struct Lfm2Base {
  HybridConfig c;
  std::vector<bool> attn_layer;
  BlockSpec attn, short_conv;  // mixer specs; feed-forwards left to the family
};

Lfm2Base read_lfm2_base(const JsonKeys& k, int hidden_default, bool require_layer_types) {
  Lfm2Base r;
  HybridConfig& c = r.c;
  c = read_common_keys(k, {hidden_default, /*vocab_size=*/65536, /*tie=*/true, 1, 7, 0, "norm_eps", 1e-5});
  if (k.has("tie_embedding") && !k.has("tie_word_embeddings")) c.tie_embeddings = k.boolean("tie_embedding", true);
  const int H = c.d_model;
  const int n_layers = k.positive("num_hidden_layers", 32, 1 << 14);
  std::vector<bool>& attn_layer = r.attn_layer;
  attn_layer.assign(n_layers, true);
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
  } else if (require_layer_types) {
    k.fail("layer_types", "required: a list of \"conv\" / \"full_attention\", one per layer");
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

  r.attn.mixer = MixerKind::Attention;
  r.attn.attn = a;
  r.short_conv.mixer = MixerKind::ShortConv;
  r.short_conv.conv = conv;
  return r;
}

// A SwiGLU of width F with LFM2's names w1 (gate), w3 (up), w2 (down).
MlpSpec lfm2_swiglu(int F) {
  MlpSpec m;
  m.d_ff = F;
  m.gate = "w1";
  m.up = "w3";
  m.down = "w2";
  return m;
}

const LayerNames kLfm2Names = {"operator_norm.weight", "self_attn.", "conv.", "ffn_norm.weight", "feed_forward."};

void name_lfm2_globals(HybridConfig& c) {
  c.embedding_name = "model.embed_tokens.weight";
  c.final_norm_name = "model.embedding_norm.weight";
}

}  // namespace

HybridConfig parse_lfm2(const JsonKeys& k, NormGrouping) {
  Lfm2Base base = read_lfm2_base(k, /*hidden_size=*/2560, /*require_layer_types=*/false);
  HybridConfig& c = base.c;

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
  mlp.mlp = lfm2_swiglu(static_cast<int>(F));

  base.attn.ffn = base.short_conv.ffn = mlp;
  add_layers(c, base.attn_layer, base.attn, base.short_conv, kLfm2Names);
  name_lfm2_globals(c);
  return c;
}

HybridConfig parse_lfm2_moe(const JsonKeys& k, NormGrouping) {
  Lfm2Base base = read_lfm2_base(k, /*hidden_size=*/2048, /*require_layer_types=*/true);
  HybridConfig& c = base.c;
  FfnSpec dense;  // Lfm2MoeMLP(intermediate_size): no width adjustment
  dense.kind = FfnKind::Mlp;
  dense.mlp = lfm2_swiglu(k.positive("intermediate_size", 7168));
  const int n_dense = static_cast<int>(k.integer("num_dense_layers", 2));
  if (n_dense < 0) k.fail("num_dense_layers", "must be >= 0");

  FfnSpec moe;
  moe.kind = FfnKind::Moe;
  moe.mlp = lfm2_swiglu(k.positive("moe_intermediate_size", 1792));
  moe.n_experts = k.positive("num_experts", 32, 4096);
  moe.top_k = k.positive("num_experts_per_tok", 4, 4096);
  if (moe.top_k > moe.n_experts) k.fail("num_experts_per_tok", "must be at most num_experts");
  moe.routing = Routing::SigmoidGrouped;  // one group: plain top-k of sigmoid + expert_bias
  moe.renormalize = k.boolean("norm_topk_prob", true);
  moe.renorm_eps = 1e-6f;
  const double scale = k.number("routed_scaling_factor", 1.0);
  if (!(std::isfinite(scale) && scale > 0)) k.fail("routed_scaling_factor", "must be a positive number");
  moe.routed_scale = static_cast<float>(scale);
  moe.router = "gate.weight";
  if (k.boolean("use_expert_bias", true)) moe.correction_bias = "expert_bias";

  add_layers(c, base.attn_layer, base.attn, base.short_conv, kLfm2Names,
             [&](int i, const std::string&, BlockSpec& b) { b.ffn = i < n_dense ? dense : moe; });
  name_lfm2_globals(c);
  return c;
}

}  // namespace hybridlm
