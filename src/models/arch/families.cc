#include "models/arch/families.h"

#include <limits>

#include "base/json.h"

namespace hybridlm {

const std::vector<Family>& families() {
  static const std::vector<Family> table = {
      {"mamba", {"MambaForCausalLM"}, parse_mamba},
      {"falcon_mamba", {"FalconMambaForCausalLM"}, parse_falcon_mamba},
      {"mamba2", {"Mamba2ForCausalLM"}, parse_mamba2},
      {"hybridlm", {"HybridLMForCausalLM"}, parse_hybridlm},
      {"jamba", {"JambaForCausalLM"}, parse_jamba},
      {"bamba", {"BambaForCausalLM"}, parse_bamba},
      {"lfm2", {"Lfm2ForCausalLM"}, parse_lfm2},
      {"nemotron_h", {"NemotronHForCausalLM"}, parse_nemotron_h},
      {"granitemoehybrid", {"GraniteMoeHybridForCausalLM"}, parse_granitemoehybrid},
      {"qwen3_next", {"Qwen3NextForCausalLM"}, parse_qwen3_next},
      {"qwen3_5", {"Qwen3_5ForConditionalGeneration"}, parse_qwen3_5},
      {"qwen3_5_text", {"Qwen3_5ForCausalLM"}, parse_qwen3_5},
      {"qwen3_5_moe", {"Qwen3_5MoeForConditionalGeneration"}, parse_qwen3_5_moe},
      {"qwen3_5_moe_text", {"Qwen3_5MoeForCausalLM"}, parse_qwen3_5_moe},
      {"falcon_h1", {"FalconH1ForCausalLM"}, parse_falcon_h1},
      {"zamba2", {"Zamba2ForCausalLM"}, parse_zamba2},
      // cartesia's configs name no architecture; Fast-LLM's Llamba export writes LlambaForCausalLM.
      {"llamba", {"LlambaForCausalLM"}, parse_llamba},
      {"lfm2_moe", {"Lfm2MoeForCausalLM"}, parse_lfm2_moe},
      {"zamba", {"ZambaForCausalLM"}, parse_zamba},
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
  if (d.check_hidden_act && k.string("hidden_act", "silu") != "silu") k.fail("hidden_act", "only silu is supported");
  // residual_in_fp32 is read by nobody: the residual stream is always f32 here (with false, HF
  // would round it to the model dtype each layer, which only matters for bf16/f16 models).
  return c;
}

AttentionSpec read_attention(const JsonKeys& k, int hidden, const char* heads_key, int heads_default,
                             const char* kv_key, const char* head_dim_key, int kv_default) {
  AttentionSpec a;
  a.n_heads = k.positive(heads_key, heads_default, 4096);
  a.n_kv_heads = k.positive(kv_key, kv_default > 0 ? kv_default : a.n_heads, 4096);
  if (a.n_heads % a.n_kv_heads != 0)
    k.fail(kv_key, "must divide " + std::string(heads_key) + " = " + std::to_string(a.n_heads));
  if (!k.has(head_dim_key) && hidden % a.n_heads != 0)
    k.fail(heads_key, "must divide hidden_size = " + std::to_string(hidden) + " (or give " + head_dim_key + ")");
  a.head_dim = k.positive(head_dim_key, hidden / std::max(1, a.n_heads), 1024);
  if (a.head_dim > 1024) k.fail(heads_key, "gives head_dim " + std::to_string(a.head_dim) + ", above 1024");
  return a;
}

int read_expanded(const JsonKeys& k, const char* key, int hidden) {
  const double expand = k.number(key, 2);
  if (!(expand > 0 && expand * hidden >= 1 && expand * hidden <= JsonKeys::kMaxDim))
    k.fail(key, std::string(key) + " x hidden_size must be in [1, 2^22]");
  return static_cast<int>(expand * hidden);
}

int read_dt_rank(const JsonKeys& k, const char* key, int hidden) {
  const int automatic = (hidden + 15) / 16;
  if (k.has(key) && k.raw(key).is_string()) {
    if (k.string(key, "auto") != "auto") k.fail(key, "expected an integer or \"auto\"");
    return automatic;
  }
  return k.positive(key, automatic);
}

int rotary_dims(const JsonKeys& k, const char* key, double factor, int head_dim) {
  if (!(factor >= 0 && factor <= 1)) k.fail(key, "must be in [0, 1]");
  const int dims = static_cast<int>(factor * head_dim);
  if (dims % 2 != 0) k.fail(key, "gives " + std::to_string(dims) + " rotary dims; need an even number");
  return dims;
}

std::vector<bool> read_attention_layers(const JsonKeys& k, const char* key, int n_layers) {
  const nlohmann::json& list = k.raw(key);
  if (!list.is_array()) k.fail(key, "expected a list of layer types");
  if (static_cast<int64_t>(list.size()) != n_layers)
    k.fail(key, "has " + std::to_string(list.size()) + " entries for " + std::to_string(n_layers) + " layers");
  std::vector<bool> attn;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string t = list[i].is_string() ? list[i].get<std::string>() : "";
    if (t == "attention" || t == "full_attention") attn.push_back(true);
    else if (t == "mamba" || t == "linear_attention") attn.push_back(false);
    else
      k.fail(key, "entry " + std::to_string(i) + " is " + json_brief(list[i]) +
                      ": unknown layer type (use mamba / linear_attention or attention / full_attention)");
  }
  return attn;
}

std::vector<bool> read_hybrid_layers(const JsonKeys& k) {
  const nlohmann::json& list = k.raw("layers_block_type");
  if (!list.is_array() || list.empty() || list.size() > (1u << 14))
    k.fail("layers_block_type", "expected a list of \"mamba\" / \"hybrid\"");
  std::vector<bool> hybrid;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string t = list[i].is_string() ? list[i].get<std::string>() : "";
    if (t != "mamba" && t != "hybrid")
      k.fail("layers_block_type", "entry " + std::to_string(i) + ": unknown layer type (use mamba or hybrid)");
    hybrid.push_back(t == "hybrid");
  }
  if (k.has("num_hidden_layers") && k.integer("num_hidden_layers") != static_cast<int64_t>(hybrid.size()))
    k.fail("num_hidden_layers", "layers_block_type has " + std::to_string(hybrid.size()) + " entries");
  return hybrid;
}

float read_rope_theta(const JsonKeys& k, double def) {
  if (k.has("rope_parameters")) {
    if (!k.raw("rope_parameters").is_object()) k.fail("rope_parameters", "expected an object");
    const JsonKeys rp(k.raw("rope_parameters"), k.where() + ": rope_parameters");
    const std::string type = rp.string("rope_type", "default");
    if (type != "default") rp.fail("rope_type", "only default RoPE is supported");
    if (rp.has("rope_theta")) return rp.positive_number("rope_theta", def);
  }
  return k.positive_number("rope_theta", def);
}

void read_time_step_limit(const JsonKeys& k, const char* key, Mamba2Spec& m) {
  if (!k.has(key)) return;
  const auto& lim = k.raw(key);
  if (!lim.is_array() || lim.size() != 2) k.fail(key, "expected [min, max]");
  auto bound = [&](const nlohmann::json& v, float missing) {
    if (v.is_number()) return v.get<float>();
    if (v.is_string() && (v.get<std::string>() == "inf" || v.get<std::string>() == "Infinity"))
      return std::numeric_limits<float>::infinity();
    if (v.is_null()) return missing;
    k.fail(key, "expected numbers");
  };
  m.dt_min = bound(lim[0], 0.0f);
  m.dt_max = bound(lim[1], std::numeric_limits<float>::infinity());
  if (!(m.dt_min <= m.dt_max) || m.dt_min < 0) k.fail(key, "need 0 <= min <= max");
}

void add_layers(HybridConfig& c, const std::vector<bool>& attn_layer, const BlockSpec& attn, const BlockSpec& other,
                const LayerNames& n, const std::function<void(int, const std::string&, BlockSpec&)>& per_layer) {
  for (size_t i = 0; i < attn_layer.size(); ++i) {
    const std::string p = n.layers + std::to_string(i) + ".";
    BlockSpec b = attn_layer[i] ? attn : other;
    b.names = {p + n.mixer_norm, p + (attn_layer[i] ? n.attn : n.other), p + n.ffn_norm, p + n.ffn, ""};
    if (per_layer) per_layer(static_cast<int>(i), p, b);
    c.blocks.push_back(std::move(b));
  }
}

void name_backbone_layers(HybridConfig& c) {
  c.embedding_name = "backbone.embeddings.weight";
  c.embedding_alias = "backbone.embedding.weight";  // hub files of some Mamba checkpoints
  c.final_norm_name = "backbone.norm_f.weight";
  for (int i = 0; i < c.n_layers(); ++i) {
    const std::string p = "backbone.layers." + std::to_string(i) + ".";
    c.blocks[i].names = {p + "norm.weight", p + "mixer.", "", "", ""};
  }
}

}  // namespace hybridlm
