// Family `falcon_h1` (FalconH1ForCausalLM, tiiuae/Falcon-H1-*). Config keys and defaults follow
// transformers' FalconH1Config (research/hf-hybrid.md C.7).
// Every layer is parallel: x = input_layernorm(h); h += mamba2(x) x ssm_out_multiplier +
// attention(x x attention_in_multiplier) x attention_out_multiplier; then h += mlp(pre_ff_layernorm(h)).
// Quirks (µP): ssm_in_multiplier on the mixer input, ssm_multipliers [z, x, B, C, dt] on in_proj's
// output segments, key_multiplier on k before RoPE, mlp_multipliers [gate, down],
// embedding_multiplier, lm_head_multiplier. The Mamba-2 output gate has no norm unless
// mamba_rms_norm (then per group, before or after the gate by mamba_norm_before_gate). The torch
// path applies no dt clamp (its time_step_limit is hard-coded to (0, inf)).
// Weights (prefix model.): embed_tokens.weight | layers.N.{input_layernorm.weight,
// pre_ff_layernorm.weight, mamba.{in_proj, conv1d (+bias), dt_bias, A_log, D, [norm.weight],
// out_proj (+ bias with projectors_bias)}, self_attn.{q,k,v,o}_proj.weight,
// feed_forward.{gate,up,down}_proj.weight} | final_layernorm.weight; lm_head.weight.
#include <cmath>

#include "models/arch/families.h"

namespace hybridlm {

namespace {

// A list of `n` numbers (multipliers), or the default when absent.
std::vector<double> numbers(const JsonKeys& k, const char* key, size_t n, double def) {
  if (!k.has(key)) return std::vector<double>(n, def);
  const nlohmann::json& v = k.raw(key);
  if (!v.is_array() || v.size() != n) k.fail(key, "expected a list of " + std::to_string(n) + " numbers");
  std::vector<double> out;
  for (const auto& x : v) {
    if (!x.is_number() || !std::isfinite(x.get<double>())) k.fail(key, "expected finite numbers");
    out.push_back(x.get<double>());
  }
  return out;
}

float finite(const JsonKeys& k, const char* key, double def) {
  const double v = k.number(key, def);
  if (!std::isfinite(v)) k.fail(key, "must be finite");
  return static_cast<float>(v);
}

}  // namespace

HybridConfig parse_falcon_h1(const JsonKeys& k, NormGrouping) {
  HybridConfig c = read_common_keys(k, {/*hidden_size=*/4096, /*vocab_size=*/128000, /*tie=*/false, 1, 11, 0,
                                        "rms_norm_eps", 1e-5});
  const int H = c.d_model;
  const int n_layers = k.positive("num_hidden_layers", 32, 1 << 14);
  c.embedding_multiplier = finite(k, "embedding_multiplier", 1.0);
  c.logits_multiplier = finite(k, "lm_head_multiplier", 1.0);

  Mamba2Spec m;
  // FalconH1Config: mamba_d_ssm defaults to 1024; an explicit null means mamba_expand x hidden.
  m.d_inner = k.is_null("mamba_d_ssm") ? read_expanded(k, "mamba_expand", H) : k.positive("mamba_d_ssm", 1024);
  m.n_heads = k.positive("mamba_n_heads", 128, 1 << 16);
  if (k.has("mamba_d_head") && !k.raw("mamba_d_head").is_string()) {
    m.head_dim = k.positive("mamba_d_head", 64, 4096);
  } else {
    if (k.string("mamba_d_head", "auto") != "auto") k.fail("mamba_d_head", "expected an integer or \"auto\"");
    if (m.d_inner % m.n_heads != 0) k.fail("mamba_n_heads", "must divide the Mamba inner size " + std::to_string(m.d_inner));
    m.head_dim = m.d_inner / m.n_heads;
  }
  if (static_cast<int64_t>(m.n_heads) * m.head_dim != m.d_inner)
    k.fail("mamba_d_head", "mamba_n_heads x mamba_d_head must equal the Mamba inner size " + std::to_string(m.d_inner));
  m.n_groups = k.positive("mamba_n_groups", 1, 1024);
  if (m.n_heads % m.n_groups != 0) k.fail("mamba_n_groups", "must divide mamba_n_heads = " + std::to_string(m.n_heads));
  m.d_state = k.positive("mamba_d_state", 256, 4096);
  m.d_conv = k.positive("mamba_d_conv", 4, 64);
  m.chunk_size = k.positive("mamba_chunk_size", 256, 1 << 16);
  m.conv_bias = k.boolean("mamba_conv_bias", true);
  m.proj_bias = k.boolean("mamba_proj_bias", false);
  m.out_proj_bias = k.boolean("projectors_bias", false);
  m.gate_norm = k.boolean("mamba_rms_norm", false);
  m.norm_before_gate = m.gate_norm && k.boolean("mamba_norm_before_gate", true);
  m.norm_grouping = NormGrouping::Grouped;  // FalconH1RMSNormGated normalises per group
  m.norm_eps = c.norm_eps;
  m.in_scale = finite(k, "ssm_in_multiplier", 1.0);
  m.out_scale = finite(k, "ssm_out_multiplier", 1.0);
  const std::vector<double> mup = numbers(k, "ssm_multipliers", 5, 1.0);
  for (int i = 0; i < 5; ++i) m.mup[i] = static_cast<float>(mup[i]);

  AttentionSpec a = read_attention(k, H, "num_attention_heads", 32, "num_key_value_heads", "head_dim", /*kv_default=*/8);
  a.rope_theta = read_rope_theta(k, 100000.0);
  a.rope_dim = rotary_dims(k, "head_dim", 1.0, a.head_dim);
  a.qkv_bias = a.o_bias = k.boolean("attention_bias", false);
  a.in_scale = finite(k, "attention_in_multiplier", 1.0);
  a.k_scale = finite(k, "key_multiplier", 1.0);
  a.out_scale = finite(k, "attention_out_multiplier", 1.0);

  FfnSpec mlp;
  mlp.kind = FfnKind::Mlp;
  mlp.mlp.d_ff = k.positive("intermediate_size", 14336);
  mlp.mlp.bias = k.boolean("mlp_bias", false);
  const std::vector<double> mm = numbers(k, "mlp_multipliers", 2, 1.0);
  mlp.mlp.gate_scale = static_cast<float>(mm[0]);
  mlp.mlp.down_scale = static_cast<float>(mm[1]);

  for (int i = 0; i < n_layers; ++i) {
    BlockSpec b;
    const std::string p = "model.layers." + std::to_string(i) + ".";
    b.mixer = MixerKind::Mamba2Attention;
    b.m2 = m;
    b.attn = a;
    b.ffn = mlp;
    b.names = {p + "input_layernorm.weight", p + "mamba.", p + "pre_ff_layernorm.weight", p + "feed_forward.",
               p + "self_attn."};
    c.blocks.push_back(b);
  }
  c.embedding_name = "model.embed_tokens.weight";
  c.final_norm_name = "model.final_layernorm.weight";
  return c;
}

}  // namespace hybridlm
