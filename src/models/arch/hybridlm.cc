// Family `hybridlm`: our own block-pattern models (docs/model-format.md). The config names the
// pattern directly, e.g. "block_pattern": ["m2", "m2", "t", "m2"] with m = Mamba-1, m2 = Mamba-2,
// m2d = discrete Mamba-2 (Llamba's mixer), gdn = gated DeltaNet (Qwen3-Next's), t = attention;
// every block is mixer + optional MLP.
// Per-kind sections: "ssm" (the Mamba kinds), "gdn", "attention", "mlp".
// Weights: model.embed_tokens.weight | model.layers.N.{mixer_norm.weight, mixer.* (mamba_ssm
// names for m / m2; Llamba's names for m2d; Qwen3-Next's linear_attn names for gdn: in_proj_qkvz,
// in_proj_ba, conv1d, dt_bias, A_log, norm, out_proj; q_proj, k_proj, v_proj, o_proj [, q_norm,
// k_norm] for t), ffn_norm.weight, ffn.{gate_proj, up_proj, down_proj}.weight} | model.norm.weight;
// lm_head.weight.
#include "base/error.h"
#include "models/arch/families.h"

namespace hybridlm {

namespace {

const nlohmann::json& section(const JsonKeys& k, const char* name) {
  static const nlohmann::json empty = nlohmann::json::object();
  if (!k.has(name)) return empty;
  if (!k.raw(name).is_object()) k.fail(name, "expected an object");
  return k.raw(name);
}

Activation parse_activation(const JsonKeys& k, const char* key) {
  const std::string a = k.string(key, "silu");
  if (a == "silu" || a == "swish") return Activation::Silu;
  if (a == "gelu") return Activation::Gelu;
  if (a == "relu2") return Activation::Relu2;
  k.fail(key, "unknown activation (use silu, gelu or relu2)");
}

}  // namespace

HybridConfig parse_hybridlm(const JsonKeys& k, NormGrouping mamba2_norm) {
  HybridConfig c = read_common_keys(k, {/*hidden_size=*/768, /*vocab_size=*/50280, /*tie=*/true, 0, 0, 0,
                                        "rms_norm_eps", 1e-5});
  if (!k.has("block_pattern")) throw Error(k.where() + ": missing required key 'block_pattern'");
  const nlohmann::json& pattern = k.raw("block_pattern");
  if (!pattern.is_array() || pattern.empty() || pattern.size() > (1u << 14))
    k.fail("block_pattern", "expected a non-empty list such as [\"m2\", \"t\", \"m2\"]");
  if (k.has("num_hidden_layers") && k.integer("num_hidden_layers") != static_cast<int64_t>(pattern.size()))
    k.fail("num_hidden_layers", "block_pattern has " + std::to_string(pattern.size()) + " blocks");

  const JsonKeys ssm(section(k, "ssm"), k.where() + ": ssm");
  const JsonKeys att(section(k, "attention"), k.where() + ": attention");
  const JsonKeys mlp(section(k, "mlp"), k.where() + ": mlp");
  const JsonKeys gdn_keys(section(k, "gdn"), k.where() + ": gdn");
  const int H = c.d_model;

  // Mamba sizes shared by m and m2 blocks.
  const int d_inner = read_expanded(ssm, "expand", H);
  Mamba1Spec m1;
  m1.d_inner = d_inner;
  m1.d_state = ssm.positive("d_state", 16, 4096);
  m1.d_conv = ssm.positive("d_conv", 4, 64);
  m1.dt_rank = read_dt_rank(ssm, "dt_rank", H);
  m1.conv_bias = ssm.boolean("conv_bias", true);
  m1.proj_bias = ssm.boolean("proj_bias", false);
  Mamba2Spec m2;
  m2.d_inner = d_inner;
  m2.d_state = m1.d_state;
  m2.d_conv = m1.d_conv;
  m2.conv_bias = m1.conv_bias;
  m2.proj_bias = m1.proj_bias;
  m2.head_dim = ssm.positive("head_dim", 64, 4096);
  m2.n_groups = ssm.positive("n_groups", 1, 1024);
  m2.chunk_size = ssm.positive("chunk_size", 256, 1 << 16);
  m2.norm_eps = c.norm_eps;
  m2.norm_grouping = mamba2_norm;

  // Gated DeltaNet sizes (Qwen3-Next's linear_* keys without the prefix).
  GdnSpec gdn;
  gdn.n_k_heads = gdn_keys.positive("num_key_heads", 4, 1024);
  gdn.n_v_heads = gdn_keys.positive("num_value_heads", gdn.n_k_heads, 1024);
  gdn.k_dim = gdn_keys.positive("key_head_dim", 16, 1024);
  gdn.v_dim = gdn_keys.positive("value_head_dim", gdn.k_dim, 1024);
  gdn.d_conv = gdn_keys.positive("conv_kernel_dim", 4, 64);
  gdn.chunk_size = gdn_keys.positive("chunk_size", 64, 1 << 16);
  gdn.norm_eps = c.norm_eps;

  BlockSpec t;
  t.mixer = MixerKind::Attention;
  t.attn = read_attention(att, H, "num_heads", 8, "num_kv_heads", "head_dim");
  t.attn.rope_theta = att.positive_number("rope_theta", 10000.0);
  t.attn.rope_dim = rotary_dims(att, "partial_rotary_factor", att.number("partial_rotary_factor", 1.0), t.attn.head_dim);
  t.attn.qk_norm = att.boolean("qk_norm", false);
  t.attn.qk_norm_eps = c.norm_eps;
  t.attn.qkv_bias = att.boolean("bias", false);

  FfnSpec ffn;
  const int64_t d_ff = mlp.integer("intermediate_size", 0);
  if (d_ff < 0 || d_ff > JsonKeys::kMaxDim) mlp.fail("intermediate_size", "must be in [0, 2^22] (0 = no MLP)");
  if (d_ff > 0) {
    ffn.kind = FfnKind::Mlp;
    ffn.mlp.d_ff = static_cast<int>(d_ff);
    ffn.mlp.act = parse_activation(mlp, "activation");
    ffn.mlp.gated = mlp.boolean("gated", true);
  }

  for (size_t i = 0; i < pattern.size(); ++i) {
    const std::string at = "block_pattern[" + std::to_string(i) + "]";
    if (!pattern[i].is_string()) throw Error(k.where() + ": " + at + ": expected a string (m, m2, m2d, gdn or t)");
    const std::string kind = pattern[i].get<std::string>();
    BlockSpec b;
    if (kind == "m") {
      b.mixer = MixerKind::Mamba1;
      b.m1 = m1;
    } else if (kind == "m2") {
      if (d_inner % m2.head_dim != 0)
        ssm.fail("head_dim", "must divide expand x hidden_size = " + std::to_string(d_inner));
      b.mixer = MixerKind::Mamba2;
      b.m2 = m2;
      b.m2.n_heads = d_inner / m2.head_dim;
      if (b.m2.n_heads % m2.n_groups != 0)
        ssm.fail("n_groups", "must divide the Mamba-2 head count " + std::to_string(b.m2.n_heads));
    } else if (kind == "m2d") {
      // The discrete Mamba-2 with the m2 sizes: value heads d_inner / head_dim, n_groups B/C heads.
      if (d_inner % m2.head_dim != 0)
        ssm.fail("head_dim", "must divide expand x hidden_size = " + std::to_string(d_inner));
      b.mixer = MixerKind::Mamba2Discrete;
      Mamba2DiscreteSpec& d = b.m2d;
      d.d_inner = d_inner;
      d.d_state = m2.d_state;
      d.d_conv = m2.d_conv;
      d.head_dim = m2.head_dim;
      d.n_heads = d_inner / m2.head_dim;
      d.n_groups = m2.n_groups;
      d.chunk_size = m2.chunk_size;
      d.conv_bias = m2.conv_bias;
      d.proj_bias = m2.proj_bias;
      if (d.n_heads % d.n_groups != 0)
        ssm.fail("n_groups", "must divide the discrete Mamba-2 head count " + std::to_string(d.n_heads));
    } else if (kind == "gdn") {
      if (gdn.n_v_heads % gdn.n_k_heads != 0)
        gdn_keys.fail("num_value_heads", "must be a multiple of num_key_heads = " + std::to_string(gdn.n_k_heads));
      b.mixer = MixerKind::GatedDeltaNet;
      b.gdn = gdn;
    } else if (kind == "t") {
      b = t;
    } else {
      throw Error(k.where() + ": " + at + " = \"" + kind.substr(0, 32) +
                  "\": unknown block kind (use m = Mamba-1, m2 = Mamba-2, m2d = discrete Mamba-2, gdn = gated DeltaNet, t = attention)");
    }
    b.ffn = ffn;
    const std::string p = "model.layers." + std::to_string(i) + ".";
    b.names = {p + "mixer_norm.weight", p + "mixer.", p + "ffn_norm.weight", p + "ffn.", ""};
    c.blocks.push_back(b);
  }
  c.embedding_name = "model.embed_tokens.weight";
  c.final_norm_name = "model.norm.weight";
  return c;
}

}  // namespace hybridlm
