// Families `qwen3_5` and `qwen3_5_moe`, text part (Qwen3_5ForConditionalGeneration,
// Qwen3_5MoeForConditionalGeneration, Qwen/Qwen3.5-*; and their text-only ForCausalLM forms,
// model_type qwen3_5_text / qwen3_5_moe_text). transformers' modeling_qwen3_5.py,
// modular_qwen3_5_moe.py and configuration_qwen3_5.py, pinned in docs/numerics.md.
// The blocks are Qwen3-Next's (qwen3_next.cc: gated DeltaNet / gated attention every
// full_attention_interval-th layer, zero-centred norms), with these differences:
// - the DeltaNet's projections are stored apart and in order: linear_attn.{in_proj_qkv (2 nk dk +
//   nv dv = [q | k | v]), in_proj_z, in_proj_b, in_proj_a}.weight (GdnSpec::interleaved = false);
// - qwen3_5: every feed-forward is a dense SwiGLU `mlp.{gate,up,down}_proj` of intermediate_size;
//   qwen3_5_moe: every one is a MoE (no decoder_sparse_step / mlp_only_layers), its router
//   `mlp.gate.weight` always renormalising the top-k (no norm_topk_prob), its experts two stacked
//   tensors `mlp.experts.gate_up_proj` (E, 2F, H) and `mlp.experts.down_proj` (E, H, F) (no
//   .weight suffix), plus Qwen3-Next's gated shared expert;
// - the multimodal checkpoints nest the text keys in `text_config` (tie_word_embeddings and the
//   token ids may sit at the top) and prefix the text weights model.language_model.; model.visual.*
//   and mtp.* are not read. Text-only positions make the interleaved MRoPE (mrope_section) plain
//   RoPE on the first partial_rotary_factor of each head: its three position streams are equal.
// Weights: <p>embed_tokens.weight | <p>layers.N.{input_layernorm, post_attention_layernorm}.weight,
// linear_attn.{in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, conv1d, norm, out_proj}.weight +
// linear_attn.{dt_bias, A_log} | self_attn.{q_proj, k_proj, v_proj, o_proj, q_norm, k_norm}.weight,
// mlp.* as above | <p>norm.weight; lm_head.weight. <p> = model.language_model. (multimodal) or model.
#include <optional>

#include "models/arch/families.h"

namespace hybridlm {

namespace {

HybridConfig read_qwen3_5(const JsonKeys& top, Qwen3HybridOptions o) {
  if (!top.has("text_config")) return read_qwen3_hybrid(top, o);  // the text-only form
  if (!top.raw("text_config").is_object()) top.fail("text_config", "expected an object of the text model's keys");
  const JsonKeys text(top.raw("text_config"), top.where() + ": text_config");
  o.prefix = "model.language_model.";
  HybridConfig c = read_qwen3_hybrid(text, o);
  // Qwen3_5Config reads tie_word_embeddings at the top; the token ids may sit at either level.
  c.tie_embeddings = top.boolean("tie_word_embeddings", c.tie_embeddings);
  if (!text.has("bos_token_id")) c.bos_token_id = top.token_id("bos_token_id", c.bos_token_id);
  if (!text.has("eos_token_id")) c.eos_token_id = top.token_id("eos_token_id", c.eos_token_id);
  if (!text.has("pad_token_id")) c.pad_token_id = top.token_id("pad_token_id", c.pad_token_id);
  return c;
}

// Qwen3_5TextConfig / Qwen3_5MoeTextConfig defaults; no token ids unless given (transformers: None).
CommonDefaults qwen3_5_common(int hidden) {
  return {hidden, /*vocab_size=*/248320, /*tie=*/false, std::nullopt, std::nullopt, std::nullopt, "rms_norm_eps", 1e-6};
}

}  // namespace

HybridConfig parse_qwen3_5(const JsonKeys& k, NormGrouping) {
  Qwen3HybridOptions o;
  o.common = qwen3_5_common(4096);
  o.layers = 32, o.heads = 16, o.kv_heads = 4, o.d_ff = 12288;
  o.interleaved_gdn = false;
  return read_qwen3_5(k, o);
}

HybridConfig parse_qwen3_5_moe(const JsonKeys& k, NormGrouping) {
  Qwen3HybridOptions o;
  o.common = qwen3_5_common(2048);
  o.layers = 40, o.heads = 16, o.kv_heads = 2, o.experts = 256, o.top_k = 8;
  o.dense_ffn = false;
  o.interleaved_gdn = false;
  o.stacked_experts = true;
  return read_qwen3_5(k, o);
}

}  // namespace hybridlm
