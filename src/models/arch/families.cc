#include "models/arch/families.h"

namespace hybridlm {

const std::vector<Family>& families() {
  static const std::vector<Family> table = {
      {"mamba", {"MambaForCausalLM"}, parse_mamba},
      {"falcon_mamba", {"FalconMambaForCausalLM"}, parse_falcon_mamba},
      {"mamba2", {"Mamba2ForCausalLM"}, parse_mamba2},
      {"hybridlm", {"HybridLMForCausalLM"}, parse_hybridlm},
  };
  return table;
}

HybridConfig read_common_keys(const JsonKeys& k, const CommonDefaults& d) {
  HybridConfig c;
  c.d_model = k.positive("hidden_size", d.hidden_size);
  c.vocab_size = k.positive("vocab_size", d.vocab_size, 1 << 24);
  c.norm_eps = k.positive_number(d.eps_key, d.eps);
  c.tie_embeddings = k.boolean("tie_word_embeddings", d.tie_embeddings);
  c.bos_token_id = k.token_id("bos_token_id", d.bos);
  c.eos_token_id = k.token_id("eos_token_id", d.eos);
  c.pad_token_id = k.token_id("pad_token_id", d.pad);
  if (k.string("hidden_act", "silu") != "silu") k.fail("hidden_act", "only silu is supported");
  // residual_in_fp32 is read by nobody: the residual stream is always f32 here (with false, HF
  // would round it to the model dtype each layer, which only matters for bf16/f16 models).
  return c;
}

AttentionSpec read_attention(const JsonKeys& k, int hidden, const char* heads_key, int heads_default,
                             const char* kv_key, const char* head_dim_key) {
  AttentionSpec a;
  a.n_heads = k.positive(heads_key, heads_default, 4096);
  a.n_kv_heads = k.positive(kv_key, a.n_heads, 4096);
  if (a.n_heads % a.n_kv_heads != 0)
    k.fail(kv_key, "must divide " + std::string(heads_key) + " = " + std::to_string(a.n_heads));
  if (!k.has(head_dim_key) && hidden % a.n_heads != 0)
    k.fail(heads_key, "must divide hidden_size = " + std::to_string(hidden) + " (or give " + head_dim_key + ")");
  a.head_dim = k.positive(head_dim_key, hidden / std::max(1, a.n_heads), 1024);
  return a;
}

int rotary_dims(const JsonKeys& k, const char* key, double factor, int head_dim) {
  if (!(factor >= 0 && factor <= 1)) k.fail(key, "must be in [0, 1]");
  const int dims = static_cast<int>(factor * head_dim);
  if (dims % 2 != 0) k.fail(key, "gives " + std::to_string(dims) + " rotary dims; need an even number");
  return dims;
}

void name_backbone_layers(HybridConfig& c) {
  c.embedding_name = "backbone.embeddings.weight";
  c.final_norm_name = "backbone.norm_f.weight";
  for (int i = 0; i < c.n_layers(); ++i) {
    const std::string p = "backbone.layers." + std::to_string(i) + ".";
    c.blocks[i].names = {p + "norm.weight", p + "mixer.", "", ""};
  }
}

}  // namespace hybridlm
