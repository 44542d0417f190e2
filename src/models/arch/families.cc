#include "models/arch/families.h"

namespace hybridlm {

const std::vector<Family>& families() {
  static const std::vector<Family> table = {
      {"mamba", {"MambaForCausalLM"}, parse_mamba},
      {"falcon_mamba", {"FalconMambaForCausalLM"}, parse_falcon_mamba},
      {"mamba2", {"Mamba2ForCausalLM"}, parse_mamba2},
  };
  return table;
}

HybridConfig read_common_keys(const JsonKeys& k, const CommonDefaults& d) {
  HybridConfig c;
  c.d_model = k.positive("hidden_size", d.hidden_size);
  c.vocab_size = k.positive("vocab_size", d.vocab_size, 1 << 24);
  c.norm_eps = k.positive_number("layer_norm_epsilon", 1e-5);
  c.tie_embeddings = k.boolean("tie_word_embeddings", d.tie_embeddings);
  c.bos_token_id = k.token_id("bos_token_id", d.bos);
  c.eos_token_id = k.token_id("eos_token_id", d.eos);
  c.pad_token_id = k.token_id("pad_token_id", d.pad);
  if (k.string("hidden_act", "silu") != "silu") k.fail("hidden_act", "only silu is supported");
  // residual_in_fp32 is read by nobody: the residual stream is always f32 here (with false, HF
  // would round it to the model dtype each layer, which only matters for bf16/f16 models).
  return c;
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
