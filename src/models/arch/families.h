// The table of model families. Each family lives in one file of src/models/arch/ that owns its
// config keys (with Hugging Face defaults), its weight names and its quirks.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "models/arch/json_keys.h"
#include "models/config.h"

namespace hybridlm {

struct Family {
  const char* model_type;                  // config.json "model_type"
  std::vector<const char*> architectures;  // config.json "architectures"[0]
  HybridConfig (*parse)(const JsonKeys& keys, NormGrouping mamba2_norm);
};

const std::vector<Family>& families();

// The keys every Hugging Face causal-LM config here shares, read with the family's defaults:
// hidden_size, vocab_size, layer_norm_epsilon, tie_word_embeddings, bos/eos/pad_token_id,
// hidden_act (silu only).
struct CommonDefaults {
  int hidden_size, vocab_size;
  bool tie_embeddings;
  std::optional<int32_t> bos, eos, pad;        // nullopt: none unless the config gives one
  const char* eps_key = "layer_norm_epsilon";  // jamba, bamba, ...: "rms_norm_eps"
  double eps = 1e-5;
  bool check_hidden_act = true;  // refuse a hidden_act other than silu
};
HybridConfig read_common_keys(const JsonKeys& keys, const CommonDefaults& defaults);

// The mamba_ssm layout shared by mamba, falcon_mamba and mamba2: backbone.embeddings.weight,
// backbone.layers.N.{norm.weight, mixer.*}, backbone.norm_f.weight, lm_head.weight.
void name_backbone_layers(HybridConfig& c);

// Attention heads read from `heads_key` / `kv_key` (kv defaults to heads), head_dim from
// `head_dim_key` (default hidden / heads), checked for GQA divisibility and the kernel's caps.
// kv_default <= 0: the head count.
AttentionSpec read_attention(const JsonKeys& k, int hidden, const char* heads_key, int heads_default,
                             const char* kv_key, const char* head_dim_key, int kv_default = 0);
// rope_dim from a partial rotary factor in [0, 1] (0 = no positions); must give an even count.
int rotary_dims(const JsonKeys& k, const char* key, double factor, int head_dim);

// Which layers are attention, from a list of layer types (`layers_block_type`, `layer_types`):
// "attention" / "full_attention" and "mamba" / "linear_attention"; anything else, or a list
// whose length is not n_layers, is an error naming the entry.
std::vector<bool> read_attention_layers(const JsonKeys& k, const char* key, int n_layers);
// Zamba and Zamba2's `layers_block_type`: true for "hybrid" (a shared-block layer), false for
// "mamba"; must be a non-empty list of those, and num_hidden_layers (if given) its length.
std::vector<bool> read_hybrid_layers(const JsonKeys& k);
// RoPE base from `rope_parameters.rope_theta` (transformers 5) or `rope_theta`.
float read_rope_theta(const JsonKeys& k, double def);
// The Hugging Face Mamba-2 time_step_limit pair [min, max] (null / "inf" / Infinity allowed).
void read_time_step_limit(const JsonKeys& k, const char* key, Mamba2Spec& m);

// The mamba_* keys of BambaConfig (shared by granitemoehybrid): Mamba-2 with d_inner =
// mamba_expand x hidden, mamba_d_head "auto" = d_inner / mamba_n_heads.
Mamba2Spec read_bamba_mamba(const JsonKeys& k, int hidden, float norm_eps, NormGrouping mamba2_norm);

// The common two-sublayer layout `model.layers.N.{<mixer_norm>, <attention | other mixer>,
// <ffn_norm>, <ffn>}`: block i is `attn` where attn_layer[i], else `other` (their mixer specs and
// feed-forwards are templates); names are suffixes after "model.layers.N.". `per_layer` may
// adjust block i (its layer prefix given) after the template is copied.
struct LayerNames {
  const char* mixer_norm;
  const char* attn;   // attention mixer prefix, e.g. "self_attn."
  const char* other;  // the other mixer's prefix, e.g. "mamba."
  const char* ffn_norm;
  const char* ffn;
  const char* layers = "model.layers.";  // the layer prefix before N (Qwen3.5: model.language_model.layers.)
};
void add_layers(HybridConfig& c, const std::vector<bool>& attn_layer, const BlockSpec& attn, const BlockSpec& other,
                const LayerNames& names,
                const std::function<void(int, const std::string&, BlockSpec&)>& per_layer = nullptr);

// d_inner = <key> x hidden (the Mamba expand factor, default 2), checked to lie in [1, 2^22].
int read_expanded(const JsonKeys& k, const char* key, int hidden);

// Mamba-1's dt rank: a positive integer or "auto" (absent too), which is ceil(hidden / 16).
int read_dt_rank(const JsonKeys& k, const char* key, int hidden);

// Qwen3-Next and Qwen3.5 (qwen3_next.cc): their text model's keys, read with these defaults.
struct Qwen3HybridOptions {
  CommonDefaults common;
  int layers = 48, heads = 16, kv_heads = 2, d_ff = 0;
  int experts = 0, top_k = 0;     // experts 0: no `num_experts` key (dense Qwen3.5)
  bool dense_ffn = true;          // Qwen3-Next's decoder_sparse_step, mlp_only_layers, norm_topk_prob,
                                  // intermediate_size; false: every layer a MoE (Qwen3.5-MoE)
  bool interleaved_gdn = true;    // GdnSpec::interleaved
  bool stacked_experts = false;   // experts.gate_up_proj / experts.down_proj (Qwen3.5-MoE)
  std::string prefix = "model.";  // before layers., embed_tokens., norm.
};
HybridConfig read_qwen3_hybrid(const JsonKeys& keys, const Qwen3HybridOptions& o);

// Adapters (one file each).
HybridConfig parse_mamba(const JsonKeys& keys, NormGrouping);
HybridConfig parse_falcon_mamba(const JsonKeys& keys, NormGrouping);
HybridConfig parse_mamba2(const JsonKeys& keys, NormGrouping mamba2_norm);
HybridConfig parse_hybridlm(const JsonKeys& keys, NormGrouping mamba2_norm);
HybridConfig parse_jamba(const JsonKeys& keys, NormGrouping mamba2_norm);
HybridConfig parse_bamba(const JsonKeys& keys, NormGrouping mamba2_norm);
HybridConfig parse_lfm2(const JsonKeys& keys, NormGrouping mamba2_norm);
HybridConfig parse_lfm2_moe(const JsonKeys& keys, NormGrouping mamba2_norm);
HybridConfig parse_zamba(const JsonKeys& keys, NormGrouping mamba2_norm);
HybridConfig parse_nemotron_h(const JsonKeys& keys, NormGrouping mamba2_norm);
HybridConfig parse_granitemoehybrid(const JsonKeys& keys, NormGrouping mamba2_norm);
HybridConfig parse_falcon_h1(const JsonKeys& keys, NormGrouping mamba2_norm);
HybridConfig parse_zamba2(const JsonKeys& keys, NormGrouping mamba2_norm);
HybridConfig parse_llamba(const JsonKeys& keys, NormGrouping mamba2_norm);
HybridConfig parse_qwen3_next(const JsonKeys& keys, NormGrouping mamba2_norm);
HybridConfig parse_qwen3_5(const JsonKeys& keys, NormGrouping mamba2_norm);
HybridConfig parse_qwen3_5_moe(const JsonKeys& keys, NormGrouping mamba2_norm);

}  // namespace hybridlm
