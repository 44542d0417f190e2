// Family `llamba` (cartesia-ai/Llamba-1B/3B/8B: Llama-3 distilled into discrete Mamba-2 by MOHAWK).
// Config keys and defaults follow cartesia-pytorch's LlambaConfig and DiscreteMamba2 (pinned in
// docs/numerics.md): d_model, n_layer, vocab_size (padded up to pad_vocab_size_multiple),
// tie_embeddings, lm_head_bias, norm_epsilon, mlp_cfg {intermediate_size, bias, act_fn}, ssm_cfg
// {d_state, n_v_heads, n_qk_heads, expand, d_conv, chunk_size, activation, bias, conv_bias}.
// Block (Llama-shaped): h += mixer(rmsnorm(h)); h += mlp(rmsnorm(h)); the block norms use eps 1e-5
// whatever norm_epsilon says (cartesia hard-codes it), the final norm norm_epsilon.
// Weights: backbone.embedding.weight | backbone.layers.N.{input_layernorm.weight, mixer.{in_proj
// (2I + 2GN + nh, H) as [x, B, C, z, A~], conv1d.weight (I + 2GN, 1, K) + bias, D (nh), z_bias (I),
// out_proj (H, I)}, post_attention_layernorm.weight, mlp.{gate_proj, up_proj, down_proj}.weight}
// | backbone.final_layernorm.weight; lm_head.weight.
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

int required_positive(const JsonKeys& k, const char* key, int64_t max = JsonKeys::kMaxDim) {
  if (!k.has(key)) throw Error(k.where() + ": missing required key '" + key + "'");
  return k.positive(key, 1, max);
}

}  // namespace

HybridConfig parse_llamba(const JsonKeys& k, NormGrouping) {
  HybridConfig c;
  c.d_model = required_positive(k, "d_model");
  const int64_t vocab = required_positive(k, "vocab_size", 1 << 24);
  // LlambaLMHeadModel pads the vocabulary (embedding and head rows) up to a multiple.
  const int64_t pad = k.positive("pad_vocab_size_multiple", 8, 1 << 16);
  c.vocab_size = static_cast<int>((vocab + pad - 1) / pad * pad);
  if (c.vocab_size > (1 << 24)) k.fail("vocab_size", "padded to a multiple of pad_vocab_size_multiple exceeds 2^24");
  c.norm_eps = k.positive_number("norm_epsilon", 1e-5);
  c.block_norm_eps = 1e-5f;
  c.tie_embeddings = k.boolean("tie_embeddings", false);
  if (k.boolean("lm_head_bias", false)) k.fail("lm_head_bias", "an LM head with a bias is not supported");
  c.bos_token_id = k.token_id("bos_token_id", std::nullopt);
  c.eos_token_id = k.token_id("eos_token_id", std::nullopt);
  c.pad_token_id = k.token_id("pad_token_id", std::nullopt);
  const int H = c.d_model;

  const JsonKeys ssm(section(k, "ssm_cfg"), k.where() + ": ssm_cfg");
  Mamba2DiscreteSpec m;
  m.d_inner = read_expanded(ssm, "expand", H);
  if (!ssm.has("expand")) m.d_inner = H;  // DiscreteMamba2's default expand is 1, not Mamba's 2
  m.d_state = ssm.positive("d_state", 64, 4096);
  m.n_heads = ssm.positive("n_v_heads", 32, 1 << 16);
  m.n_groups = ssm.positive("n_qk_heads", 32, 1 << 16);
  m.d_conv = ssm.positive("d_conv", 4, 64);
  m.chunk_size = ssm.positive("chunk_size", 128, 1 << 16);
  m.proj_bias = ssm.boolean("bias", false);
  m.conv_bias = ssm.boolean("conv_bias", true);
  const std::string act = ssm.string("activation", "identity");
  if (act == "silu" || act == "swish")
    m.conv_silu = true;
  else if (act != "identity")
    ssm.fail("activation", "use identity, silu or swish");
  if (m.d_inner % m.n_heads != 0) ssm.fail("n_v_heads", "must divide expand x d_model = " + std::to_string(m.d_inner));
  if (m.n_heads % m.n_groups != 0) ssm.fail("n_qk_heads", "must divide n_v_heads = " + std::to_string(m.n_heads));
  m.head_dim = m.d_inner / m.n_heads;

  const JsonKeys mlp(section(k, "mlp_cfg"), k.where() + ": mlp_cfg");
  FfnSpec ffn;
  ffn.kind = FfnKind::Mlp;
  ffn.mlp.d_ff = mlp.positive("intermediate_size", 14336);
  ffn.mlp.bias = mlp.boolean("bias", false);
  const std::string mlp_act = mlp.string("act_fn", "silu");
  if (mlp_act == "silu" || mlp_act == "swish")
    ffn.mlp.act = Activation::Silu;
  else if (mlp_act == "gelu")
    ffn.mlp.act = Activation::Gelu;
  else
    mlp.fail("act_fn", "use silu or gelu");

  const int n_layers = k.positive("n_layer", 32, 1 << 14);
  for (int i = 0; i < n_layers; ++i) {
    BlockSpec b;
    b.mixer = MixerKind::Mamba2Discrete;
    b.m2d = m;
    b.ffn = ffn;
    const std::string p = "backbone.layers." + std::to_string(i) + ".";
    b.names = {p + "input_layernorm.weight", p + "mixer.", p + "post_attention_layernorm.weight", p + "mlp.", ""};
    c.blocks.push_back(b);
  }
  c.embedding_name = "backbone.embedding.weight";
  c.final_norm_name = "backbone.final_layernorm.weight";
  return c;
}

}  // namespace hybridlm
