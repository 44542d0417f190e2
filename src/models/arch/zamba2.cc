// Family `zamba2` (Zamba2ForCausalLM, Zyphra/Zamba2-*). Config keys and defaults follow
// transformers' Zamba2Config (research/hf-hybrid.md C.8).
// Pattern: layers_block_type ("mamba" / "hybrid"). Every layer is Mamba-2; a hybrid layer first
// runs a shared transformer block (block j % num_mem_blocks for the j-th hybrid layer, with its
// own LoRA adapters j) on concat(h, embeddings), maps its output through the layer's `linear` and
// adds it to the Mamba input: h += mamba(norm(h + linear(block(h, emb)))).
// Quirks: attention over 2H with head_dim = 2H / heads and scale (head_dim / 2)^-0.5, RoPE only
// with use_mem_rope; MLP gate_up (gelu by default); Mamba-2 grouped gated norm with eps 1e-5; dt
// clamped from below by time_step_min as the torch path does; conv bias always present.
// Weights (prefix model.): embed_tokens.weight | layers.N.{input_layernorm.weight, mamba.*} for
// mamba layers | layers.N.{mamba_decoder.{input_layernorm.weight, mamba.*}, linear.weight} for
// hybrid layers | layers.L.shared_transformer.{input_layernorm, pre_ff_layernorm,
// self_attn.{q,k,v,o}_proj, self_attn.linear_{q,k,v}_adapter_list.A.{0,1},
// feed_forward.{gate_up_proj, down_proj}, feed_forward.gate_up_proj_adapter_list.A.{0,1}}.weight
// stored under the first hybrid layer L of each block | final_layernorm.weight.
#include <algorithm>
#include <cmath>

#include "base/error.h"
#include "models/arch/families.h"

namespace hybridlm {

HybridConfig parse_zamba2(const JsonKeys& k, NormGrouping) {
  CommonDefaults d{/*hidden_size=*/2560, /*vocab_size=*/32000, /*tie=*/true, 1, 2, 0, "rms_norm_eps", 1e-5};
  d.check_hidden_act = false;  // hidden_act is the shared MLP's (gelu by default)
  HybridConfig c = read_common_keys(k, d);
  const int H = c.d_model;

  std::vector<bool> hybrid;
  if (k.has("layers_block_type")) {
    hybrid = read_hybrid_layers(k);
  } else {  // Zamba2Config's default (54 layers)
    const char* unit = "mmmmmh";
    hybrid.push_back(false);
    for (int r = 0; r < 7; ++r)
      for (const char* p = unit; *p; ++p) hybrid.push_back(*p == 'h');
    for (const char* p = "mmmmhmmmhmm"; *p; ++p) hybrid.push_back(*p == 'h');
  }
  const int n_layers = static_cast<int>(hybrid.size());
  if (k.has("num_hidden_layers") && k.integer("num_hidden_layers") != n_layers)
    k.fail("num_hidden_layers", "layers_block_type has " + std::to_string(n_layers) + " entries");

  Mamba2Spec m;
  m.d_inner = read_expanded(k, "mamba_expand", H);
  m.n_heads = k.positive("n_mamba_heads", 8, 1 << 16);
  if (m.d_inner % m.n_heads != 0) k.fail("n_mamba_heads", "must divide mamba_expand x hidden_size = " + std::to_string(m.d_inner));
  m.head_dim = m.d_inner / m.n_heads;
  m.n_groups = k.positive("mamba_ngroups", 1, 1024);
  if (m.n_heads % m.n_groups != 0) k.fail("mamba_ngroups", "must divide n_mamba_heads = " + std::to_string(m.n_heads));
  m.d_state = k.positive("mamba_d_state", 64, 4096);
  m.d_conv = k.positive("mamba_d_conv", 4, 64);
  m.chunk_size = k.positive("chunk_size", 256, 1 << 16);
  m.conv_bias = true;  // Zamba2's mixer always creates the conv bias
  m.proj_bias = k.boolean("add_bias_linear", false);
  m.norm_eps = 1e-5f;  // hard-coded in Zamba2's gated norm
  m.norm_grouping = NormGrouping::Grouped;
  m.dt_min = k.positive_number("time_step_min", 0.001);

  SharedTransformerSpec& st = c.shared;
  st.n_blocks = k.positive("num_mem_blocks", 1, 64);
  st.norm_eps = c.norm_eps;
  AttentionSpec& a = st.attn;
  a.n_heads = k.positive("num_attention_heads", 32, 4096);
  a.n_kv_heads = k.positive("num_key_value_heads", a.n_heads, 4096);
  if (a.n_heads % a.n_kv_heads != 0) k.fail("num_key_value_heads", "must divide num_attention_heads");
  if ((2 * H) % a.n_heads != 0) k.fail("num_attention_heads", "must divide 2 x hidden_size = " + std::to_string(2 * H));
  a.head_dim = 2 * H / a.n_heads;
  if (a.head_dim > 1024 || a.head_dim < 2) k.fail("num_attention_heads", "gives an unsupported head_dim");
  a.scale = 1.0f / std::sqrt(static_cast<float>(a.head_dim) / 2.0f);
  if (k.boolean("use_mem_rope", false)) {
    double theta = k.positive_number("rope_theta", 10000.0);
    if (k.boolean("use_long_context", false))
      theta *= std::pow(8.0, static_cast<double>(a.head_dim) / (a.head_dim - 2));
    a.rope_theta = static_cast<float>(theta);
    a.rope_dim = rotary_dims(k, "num_attention_heads", 1.0, a.head_dim);
  }
  st.mlp.d_ff = k.positive("intermediate_size", 4 * int64_t{H});
  st.mlp.fused = true;
  st.mlp.up = "gate_up_proj";
  const std::string act = k.string("hidden_act", "gelu");
  if (act == "gelu") st.mlp.act = Activation::Gelu;
  else if (act == "silu") st.mlp.act = Activation::Silu;
  else k.fail("hidden_act", "use gelu or silu");
  st.attn_adapters = k.boolean("use_shared_attention_adapter", false);
  st.mlp_adapters = k.boolean("use_shared_mlp_adapter", false);
  st.adapter_rank = st.attn_adapters || st.mlp_adapters ? k.positive("adapter_rank", 128, 1 << 16) : 0;

  int j = 0;
  for (int i = 0; i < n_layers; ++i) {
    BlockSpec b;
    const std::string p = "model.layers." + std::to_string(i) + ".";
    b.mixer = MixerKind::Mamba2;
    b.m2 = m;
    if (hybrid[i]) {
      b.shared_block = j % st.n_blocks;
      b.adapter = j++;
      b.names = {p + "mamba_decoder.input_layernorm.weight", p + "mamba_decoder.mamba.", "", "", p};
    } else {
      b.names = {p + "input_layernorm.weight", p + "mamba.", "", "", ""};
    }
    c.blocks.push_back(b);
  }
  // transformers builds min(num_mem_blocks, hybrid layers) blocks; none without hybrid layers.
  st.n_blocks = std::min(st.n_blocks, j);
  c.embedding_name = "model.embed_tokens.weight";
  c.final_norm_name = "model.final_layernorm.weight";
  return c;
}

}  // namespace hybridlm
