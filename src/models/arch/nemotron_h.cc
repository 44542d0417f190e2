// Family `nemotron_h` (NemotronHForCausalLM, nvidia/Nemotron-H-*, NVIDIA-Nemotron-Nano-*).
// Config keys and defaults follow transformers' NemotronHConfig (research/hf-hybrid.md C.6).
// Pattern: `hybrid_override_pattern` (M = Mamba-2, * = attention, - = MLP, E = MoE) or a
// layers_block_type / layer_types list; each layer is ONE of them: h += op(norm(h)).
// Quirks: Mamba-2 with d_inner = mamba_num_heads x mamba_head_dim and the grouped gated norm
// (per d_inner / n_groups); dt clamped from below by time_step_min as Hugging Face's torch path
// does (docs/numerics.md); attention without positional encoding; relu^2 MLPs without a gate;
// sigmoid-routed MoE with a correction bias, group selection and a shared expert.
// Weights (prefix backbone.): embeddings.weight | layers.N.{norm.weight, mixer.* (Mamba-2 names |
// q/k/v/o_proj | up_proj, down_proj | gate.weight, gate.e_score_correction_bias,
// experts.E.{up_proj, down_proj}, shared_experts.{up_proj, down_proj})} | norm_f.weight; lm_head.weight.
#include "base/error.h"
#include "models/arch/families.h"

namespace hybridlm {

namespace {

// The key of the two spellings (transformers 5 / hub configs) that the config uses.
const char* either(const JsonKeys& k, const char* a, const char* b) { return k.has(a) || !k.has(b) ? a : b; }

}  // namespace

HybridConfig parse_nemotron_h(const JsonKeys& k, NormGrouping) {
  CommonDefaults d{/*hidden_size=*/4096, /*vocab_size=*/131072, /*tie=*/false, 1, 2, 0, "layer_norm_epsilon", 1e-5};
  d.check_hidden_act = false;  // mlp_hidden_act / mamba_hidden_act carry the activations
  HybridConfig c = read_common_keys(k, d);
  const int H = c.d_model;

  // The pattern: one character (or one list entry) per layer.
  std::vector<char> kinds;
  if (k.has("hybrid_override_pattern")) {
    const std::string pat = k.string("hybrid_override_pattern", "");
    if (pat.empty() || pat.size() > (1u << 14)) k.fail("hybrid_override_pattern", "expected a non-empty pattern");
    for (size_t i = 0; i < pat.size(); ++i) {
      if (pat[i] != 'M' && pat[i] != '*' && pat[i] != '-' && pat[i] != 'E')
        k.fail("hybrid_override_pattern", "character " + std::to_string(i) + " is '" + std::string(1, pat[i]) +
                                              "': use M (mamba), * (attention), - (mlp) or E (moe)");
      kinds.push_back(pat[i]);
    }
  } else {
    const char* key = k.has("layers_block_type") ? "layers_block_type" : "layer_types";
    if (!k.has(key)) throw Error(k.where() + ": missing 'hybrid_override_pattern' (or layers_block_type)");
    const nlohmann::json& list = k.raw(key);
    if (!list.is_array() || list.empty() || list.size() > (1u << 14)) k.fail(key, "expected a list of layer types");
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string t = list[i].is_string() ? list[i].get<std::string>() : "";
      if (t == "mamba" || t == "linear_attention") kinds.push_back('M');
      else if (t == "attention" || t == "full_attention") kinds.push_back('*');
      else if (t == "mlp") kinds.push_back('-');
      else if (t == "moe") kinds.push_back('E');
      else k.fail(key, "entry " + std::to_string(i) + ": unknown layer type (use mamba, attention, mlp or moe)");
    }
  }
  // num_hidden_layers is derived from the pattern (a stale value only warns in transformers).

  Mamba2Spec m;
  m.n_heads = k.positive("mamba_num_heads", 128, 1 << 16);
  m.head_dim = k.positive("mamba_head_dim", 64, 4096);
  m.d_inner = static_cast<int>(static_cast<int64_t>(m.n_heads) * m.head_dim);
  if (static_cast<int64_t>(m.n_heads) * m.head_dim > JsonKeys::kMaxDim)
    k.fail("mamba_num_heads", "mamba_num_heads x mamba_head_dim must be at most 2^22");
  m.d_state = k.positive("ssm_state_size", 128, 4096);
  const char* groups_key = either(k, "n_groups", "mamba_n_groups");
  m.n_groups = k.positive(groups_key, 8, 1024);
  if (m.n_heads % m.n_groups != 0) k.fail(groups_key, "must divide mamba_num_heads = " + std::to_string(m.n_heads));
  m.d_conv = k.positive(either(k, "conv_kernel", "mamba_d_conv"), 4, 64);
  m.chunk_size = k.positive(either(k, "chunk_size", "mamba_chunk_size"), 128, 1 << 16);
  m.proj_bias = k.boolean("use_bias", false);
  m.conv_bias = k.has("use_conv_bias") || !k.has("mamba_conv_bias") ? k.boolean("use_conv_bias", true)
                                                                     : k.boolean("mamba_conv_bias", true);
  m.norm_eps = c.norm_eps;
  m.norm_grouping = NormGrouping::Grouped;  // Nemotron-H normalises per group in every implementation
  m.dt_min = k.positive_number("time_step_min", 0.001);
  if (k.string("mamba_hidden_act", "silu") != "silu") k.fail("mamba_hidden_act", "only silu is supported");

  AttentionSpec a = read_attention(k, H, "num_attention_heads", 32, "num_key_value_heads",
                                   k.has("head_dim") ? "head_dim" : "attention_head_dim", /*kv_default=*/8);
  a.rope_dim = 0;  // no positional encoding
  a.qkv_bias = a.o_bias = k.boolean("attention_bias", false);

  const std::string act = k.string("mlp_hidden_act", "relu2");
  if (act != "relu2") k.fail("mlp_hidden_act", "only relu2 is supported");
  MlpSpec relu2;
  relu2.act = Activation::Relu2;
  relu2.gated = false;
  relu2.bias = k.boolean("mlp_bias", false);
  FfnSpec mlp;
  mlp.kind = FfnKind::Mlp;
  mlp.mlp = relu2;
  mlp.mlp.d_ff = k.positive("intermediate_size", 21504);

  FfnSpec moe;
  moe.kind = FfnKind::Moe;
  moe.mlp = relu2;
  moe.mlp.d_ff = k.positive("moe_intermediate_size", 7688);
  moe.n_experts = k.positive("n_routed_experts", 8, 4096);
  moe.top_k = k.positive("num_experts_per_tok", 2, 4096);
  if (moe.top_k > moe.n_experts) k.fail("num_experts_per_tok", "must be at most n_routed_experts");
  moe.routing = Routing::SigmoidGrouped;
  moe.renormalize = k.boolean("norm_topk_prob", true);
  moe.routed_scale = static_cast<float>(k.number("routed_scaling_factor", 1.0));
  moe.n_group = k.positive("n_group", 1, 4096);
  moe.topk_group = k.positive("topk_group", 1, 4096);
  if (moe.n_experts % moe.n_group != 0) k.fail("n_group", "must divide n_routed_experts");
  if (moe.topk_group > moe.n_group) k.fail("topk_group", "must be at most n_group");
  if (moe.n_group > 1 && moe.top_k > moe.topk_group * (moe.n_experts / moe.n_group))
    k.fail("num_experts_per_tok", "more than the experts of topk_group groups");
  moe.router = "gate.weight";
  moe.correction_bias = "gate.e_score_correction_bias";
  if (k.has("moe_latent_size")) k.fail("moe_latent_size", "latent MoE projections are not supported");
  const int64_t shared = k.integer("n_shared_experts", 1);
  if (shared != 0 && shared != 1) k.fail("n_shared_experts", "only 0 or 1 shared expert is supported");
  if (shared == 1) {
    moe.shared = relu2;
    moe.shared.d_ff = k.positive("moe_shared_expert_intermediate_size", 7688);
  }

  for (size_t i = 0; i < kinds.size(); ++i) {
    BlockSpec b;
    const std::string p = "backbone.layers." + std::to_string(i) + ".";
    b.mixer = MixerKind::None;
    switch (kinds[i]) {
      case 'M': b.mixer = MixerKind::Mamba2; b.m2 = m; break;
      case '*': b.mixer = MixerKind::Attention; b.attn = a; break;
      case '-': b.ffn = mlp; break;
      case 'E':
        b.ffn = moe;
        b.ffn.shared_prefix = p + "mixer.shared_experts.";
        break;
    }
    if (b.mixer != MixerKind::None) b.names = {p + "norm.weight", p + "mixer.", "", "", ""};
    else b.names = {"", "", p + "norm.weight", p + "mixer.", ""};
    c.blocks.push_back(b);
  }
  c.embedding_name = "backbone.embeddings.weight";
  c.final_norm_name = "backbone.norm_f.weight";
  return c;
}

}  // namespace hybridlm
