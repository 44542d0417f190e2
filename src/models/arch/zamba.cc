// Family `zamba` (ZambaForCausalLM, Zyphra/Zamba-7B-v1). Config keys and defaults follow
// transformers' ZambaConfig; semantics its modeling_zamba.py (both pinned in docs/numerics.md).
// Pattern: layers_block_type ("mamba" / "hybrid"); without it, transformers' rule: layers 0, 1 mamba,
// layer 2 hybrid, then layer 3 + i hybrid when i % attn_layer_period == attn_layer_offset. Every
// layer is a multi-head Mamba-1; a hybrid layer first runs the one shared transformer block on
// concat(h, embeddings), maps its output through the layer's `linear` and adds it to the Mamba
// input: h += mamba(norm(h + linear(block(h, emb)))).
// Quirks: the Mamba-1 splits d_inner into n_mamba_heads independent heads, each with its own
// x_proj / dt_proj (3-D tensors x_proj_weight, dt_proj_weight, dt_proj_bias), and in_proj's rows
// alternate x and z; no dt clamp. Attention over 2H with head_dim attention_head_dim (default
// 2H / heads), scale (head_dim / 2)^-0.5, no positional encoding; a gated MLP gate/up/down with
// hidden_act (gelu by default); each hybrid layer has its own KV cache. Tied embeddings by default.
// Weights (prefix model.): embed_tokens.weight | layers.N.{input_layernorm.weight, mamba.*} for
// mamba layers | layers.N.{mamba_decoder.{input_layernorm.weight, mamba.*}, linear.weight} for
// hybrid layers, with mamba.* = {in_proj.weight (2I, H), conv1d.{weight (I, 1, K), bias},
// x_proj_weight (nh, R + 2N, P), dt_proj_weight (nh, P, R), dt_proj_bias (nh, P), A_log (nh, P, N),
// D (nh, P), out_proj.weight (H, I)} | layers.L.shared_transf.{input_layernorm (2H),
// pre_ff_layernorm (H), self_attn.{q,k,v,o}_proj, feed_forward.{gate_proj, up_proj,
// down_proj}}.weight under any hybrid layer L (tied; the loader takes the first it finds) |
// final_layernorm.weight.
#include <cmath>

#include "base/error.h"
#include "models/arch/families.h"

namespace hybridlm {

HybridConfig parse_zamba(const JsonKeys& k, NormGrouping) {
  CommonDefaults d{/*hidden_size=*/3712, /*vocab_size=*/32000, /*tie=*/true, 1, 2, 0, "rms_norm_eps", 1e-5};
  d.check_hidden_act = false;  // hidden_act is the shared MLP's (gelu by default)
  HybridConfig c = read_common_keys(k, d);
  const int H = c.d_model;

  std::vector<bool> hybrid;
  if (k.has("layers_block_type")) {
    hybrid = read_hybrid_layers(k);
  } else {  // ZambaConfig._layers_block_type
    const int n = k.positive("num_hidden_layers", 76, 1 << 14);
    if (n < 3) k.fail("num_hidden_layers", "must be at least 3 (layer 2 is Zamba's first hybrid layer)");
    const int period = k.positive("attn_layer_period", 6, 1 << 14);
    const int offset = static_cast<int>(k.integer("attn_layer_offset", 4));
    hybrid = {false, false, true};
    for (int i = 0; i < n - 3; ++i) hybrid.push_back(i % period == offset);
  }
  const int n_layers = static_cast<int>(hybrid.size());

  if (k.string("hidden_mamba_act", "silu") != "silu") k.fail("hidden_mamba_act", "only silu is supported");
  Mamba1Spec m;
  m.d_inner = read_expanded(k, "mamba_expand", H);
  m.n_heads = k.positive("n_mamba_heads", 2, 1 << 16);
  if (m.d_inner % m.n_heads != 0)
    k.fail("n_mamba_heads", "must divide mamba_expand x hidden_size = " + std::to_string(m.d_inner));
  m.head_tensors = true;
  m.in_proj_interleaved = true;
  m.d_state = k.positive("mamba_d_state", 16, 4096);
  m.d_conv = k.positive("mamba_d_conv", 4, 64);
  m.dt_rank = read_dt_rank(k, "mamba_dt_rank", H);
  m.conv_bias = k.boolean("mamba_conv_bias", true);
  m.proj_bias = k.boolean("mamba_proj_bias", false);

  SharedTransformerSpec& st = c.shared;
  st.n_blocks = 1;
  st.name = "shared_transf.";
  st.norm_eps = c.norm_eps;
  if (k.has("attention_hidden_size") && k.integer("attention_hidden_size") != 2 * int64_t{H})
    k.fail("attention_hidden_size", "must be 2 x hidden_size = " + std::to_string(2 * H) +
                                        " (the block reads concat(hidden, embeddings))");
  AttentionSpec& a = st.attn;
  a.n_heads = k.positive("num_attention_heads", 16, 4096);
  a.n_kv_heads = k.positive("num_key_value_heads", a.n_heads, 4096);  // null (the default): = heads
  if (a.n_heads % a.n_kv_heads != 0) k.fail("num_key_value_heads", "must divide num_attention_heads");
  if (k.has("attention_head_dim")) {
    a.head_dim = k.positive("attention_head_dim", 0, 1024);
  } else {
    if ((2 * H) % a.n_heads != 0)
      k.fail("num_attention_heads", "must divide 2 x hidden_size = " + std::to_string(2 * H));
    a.head_dim = 2 * H / a.n_heads;
  }
  if (a.head_dim > 1024 || a.head_dim < 2) k.fail("num_attention_heads", "gives an unsupported head_dim");
  a.scale = 1.0f / std::sqrt(static_cast<float>(a.head_dim) / 2.0f);
  a.rope_dim = 0;  // Zamba's attention has no positional encoding
  st.mlp.d_ff = k.positive("intermediate_size", 14848);
  const std::string act = k.string("hidden_act", "gelu");
  if (act == "gelu") st.mlp.act = Activation::Gelu;
  else if (act == "silu") st.mlp.act = Activation::Silu;
  else k.fail("hidden_act", "use gelu or silu");

  int j = 0;
  for (int i = 0; i < n_layers; ++i) {
    BlockSpec b;
    const std::string p = "model.layers." + std::to_string(i) + ".";
    b.mixer = MixerKind::Mamba1;
    b.m1 = m;
    if (hybrid[i]) {
      b.shared_block = 0;
      b.adapter = j++;
      b.names = {p + "mamba_decoder.input_layernorm.weight", p + "mamba_decoder.mamba.", "", "", p};
    } else {
      b.names = {p + "input_layernorm.weight", p + "mamba.", "", "", ""};
    }
    c.blocks.push_back(b);
  }
  if (j == 0) st.n_blocks = 0;  // no hybrid layer: no shared block to load
  c.embedding_name = "model.embed_tokens.weight";
  c.final_norm_name = "model.final_layernorm.weight";
  return c;
}

}  // namespace hybridlm
