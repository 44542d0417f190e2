// Family `qwen3_next` (Qwen3NextForCausalLM, Qwen/Qwen3-Next-80B-A3B-*). Config keys and defaults
// follow transformers' Qwen3NextConfig (research/hf-hybrid.md C.10; modeling_qwen3_next.py pinned
// in docs/numerics.md).
// Pattern: layer i is gated attention where layer_types[i] == "full_attention" (default: iff
// (i + 1) % full_attention_interval == 0), else gated DeltaNet; its feed-forward is a sparse MoE
// with a sigmoid-gated shared expert iff num_experts > 0, (i + 1) % decoder_sparse_step == 0 and
// i is not in mlp_only_layers, else a SwiGLU MLP of intermediate_size.
// Quirks: every RMSNorm but the DeltaNet's output norm is zero-centred (weight applied as 1 + w),
// q/k norms included; attention's q_proj is doubled (per head [query | gate], output x
// sigmoid(gate)) with RoPE on the first partial_rotary_factor (0.25) of each head; the router is a
// softmax over all experts, top-k, renormalised iff norm_topk_prob.
// Weights (prefix model.): embed_tokens.weight | layers.N.{input_layernorm.weight,
// post_attention_layernorm.weight, linear_attn.{in_proj_qkvz, in_proj_ba, conv1d, dt_bias, A_log,
// norm, out_proj} | self_attn.{q_proj, k_proj, v_proj, o_proj, q_norm, k_norm}.weight,
// mlp.{gate_proj, up_proj, down_proj}.weight | mlp.gate.weight + mlp.experts.E.{gate_proj, up_proj,
// down_proj}.weight + mlp.shared_expert.{gate_proj, up_proj, down_proj}.weight +
// mlp.shared_expert_gate.weight} | norm.weight; lm_head.weight. The multi-token-prediction head's
// mtp.* tensors are not read (the loader ignores tensors nobody asks for; model_test loads a
// fixture that has them). read_qwen3_hybrid also serves Qwen3.5 (qwen3_5.cc).
#include <algorithm>

#include "base/error.h"
#include "models/arch/families.h"

namespace hybridlm {

namespace {

// The layers listed in `mlp_only_layers` (a list of layer indices).
std::vector<bool> read_mlp_only_layers(const JsonKeys& k, int n_layers) {
  std::vector<bool> only(n_layers, false);
  if (!k.has("mlp_only_layers") || k.raw("mlp_only_layers").is_null()) return only;
  const nlohmann::json& list = k.raw("mlp_only_layers");
  if (!list.is_array()) k.fail("mlp_only_layers", "expected a list of layer indices");
  for (const nlohmann::json& v : list) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= n_layers)
      k.fail("mlp_only_layers", "entries must be layer indices in [0, num_hidden_layers)");
    only[v.get<int64_t>()] = true;
  }
  return only;
}

}  // namespace

HybridConfig read_qwen3_hybrid(const JsonKeys& k, const Qwen3HybridOptions& o) {
  HybridConfig c = read_common_keys(k, o.common);
  const int H = c.d_model;
  c.norm_offset = 1.0f;
  const int n_layers = k.positive("num_hidden_layers", o.layers, 1 << 14);
  std::vector<bool> attn_layer(n_layers);
  if (k.has("layer_types")) {
    attn_layer = read_attention_layers(k, "layer_types", n_layers);
  } else {
    const int interval = k.positive("full_attention_interval", 4, 1 << 14);
    for (int i = 0; i < n_layers; ++i) attn_layer[i] = (i + 1) % interval == 0;
  }

  AttentionSpec a = read_attention(k, H, "num_attention_heads", o.heads, "num_key_value_heads", "head_dim", o.kv_heads);
  if (!k.has("head_dim")) a.head_dim = 256;  // the configs' default, not hidden / heads
  a.rope_theta = read_rope_theta(k, 10000.0);
  double factor = k.number("partial_rotary_factor", 0.25);
  if (k.has("rope_parameters") && k.raw("rope_parameters").is_object()) {
    const JsonKeys rp(k.raw("rope_parameters"), k.where() + ": rope_parameters");
    factor = rp.number("partial_rotary_factor", factor);
  }
  a.rope_dim = rotary_dims(k, "partial_rotary_factor", factor, a.head_dim);
  a.qkv_bias = a.o_bias = k.boolean("attention_bias", false);
  a.qk_norm = true;
  a.qk_norm_eps = c.norm_eps;
  a.qk_norm_offset = 1.0f;
  a.output_gate = true;

  GdnSpec g;
  g.n_k_heads = k.positive("linear_num_key_heads", 16, 1024);
  g.n_v_heads = k.positive("linear_num_value_heads", 32, 1024);
  if (g.n_v_heads % g.n_k_heads != 0)
    k.fail("linear_num_value_heads", "must be a multiple of linear_num_key_heads = " + std::to_string(g.n_k_heads));
  g.k_dim = k.positive("linear_key_head_dim", 128, 1024);
  g.v_dim = k.positive("linear_value_head_dim", 128, 1024);
  g.d_conv = k.positive("linear_conv_kernel_dim", 4, 64);
  g.norm_eps = c.norm_eps;
  g.interleaved = o.interleaved_gdn;

  FfnSpec mlp;
  mlp.kind = FfnKind::Mlp;
  if (o.dense_ffn) mlp.mlp.d_ff = k.positive("intermediate_size", o.d_ff);
  int64_t n_experts = 0;
  if (o.experts > 0) {
    n_experts = k.integer("num_experts", o.experts);
    if (n_experts < (o.dense_ffn ? 0 : 1) || n_experts > 4096)
      k.fail("num_experts", o.dense_ffn ? "must be in [0, 4096] (0 = dense MLPs)" : "must be in [1, 4096]");
  }
  const int sparse_step = o.dense_ffn ? k.positive("decoder_sparse_step", 1, 1 << 14) : 1;
  const std::vector<bool> mlp_only =
      o.dense_ffn && o.experts > 0 ? read_mlp_only_layers(k, n_layers) : std::vector<bool>(n_layers, false);
  FfnSpec moe;
  if (n_experts > 0) {
    moe.kind = FfnKind::Moe;
    moe.n_experts = static_cast<int>(n_experts);
    moe.top_k = k.positive("num_experts_per_tok", o.top_k, 4096);
    if (moe.top_k > moe.n_experts) k.fail("num_experts_per_tok", "must be at most num_experts");
    moe.routing = Routing::SoftmaxTopK;
    // Qwen3.5-MoE has no norm_topk_prob: its router always renormalises.
    moe.renormalize = o.dense_ffn ? k.boolean("norm_topk_prob", true) : true;
    moe.mlp.d_ff = k.positive("moe_intermediate_size", 512);
    moe.router = "gate.weight";
    moe.experts = "experts.";
    if (o.stacked_experts) {  // experts.gate_up_proj (E, 2F, H) = per expert [gate | up]; experts.down_proj (E, H, F)
      moe.stacked_experts = true;
      moe.stacked_suffix = "";
      moe.mlp.fused = true;
      moe.mlp.up = "experts.gate_up_proj";
      moe.mlp.down = "experts.down_proj";
    }
    moe.shared.d_ff = k.positive("shared_expert_intermediate_size", 512);
  }

  BlockSpec attn, lin;
  attn.mixer = MixerKind::Attention;
  attn.attn = a;
  lin.mixer = MixerKind::GatedDeltaNet;
  lin.gdn = g;
  const std::string layers = o.prefix + "layers.";
  add_layers(c, attn_layer, attn, lin,
             {"input_layernorm.weight", "self_attn.", "linear_attn.", "post_attention_layernorm.weight", "mlp.",
              layers.c_str()},
             [&](int i, const std::string& p, BlockSpec& b) {
               if (n_experts > 0 && (i + 1) % sparse_step == 0 && !mlp_only[i]) {
                 b.ffn = moe;
                 b.ffn.shared_prefix = p + "mlp.shared_expert.";
                 b.ffn.shared_gate = p + "mlp.shared_expert_gate.weight";
               } else {
                 b.ffn = mlp;
               }
             });
  c.embedding_name = o.prefix + "embed_tokens.weight";
  c.final_norm_name = o.prefix + "norm.weight";
  return c;
}

HybridConfig parse_qwen3_next(const JsonKeys& k, NormGrouping) {
  Qwen3HybridOptions o;
  o.common = {/*hidden_size=*/2048, /*vocab_size=*/151936, /*tie=*/false, 151643, 151645, 151643};
  o.common.eps_key = "rms_norm_eps", o.common.eps = 1e-6;
  o.layers = 48, o.heads = 16, o.kv_heads = 2, o.d_ff = 5632, o.experts = 512, o.top_k = 10;
  return read_qwen3_hybrid(k, o);
}

}  // namespace hybridlm
