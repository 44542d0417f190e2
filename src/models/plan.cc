#include "models/plan.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "io/safetensors.h"

#include "models/blocks/mixer.h"
#include "models/model.h"

namespace hybridlm {

std::vector<LayerCacheSpec> cache_specs(const HybridConfig& c) {
  std::vector<LayerCacheSpec> specs;
  for (const BlockSpec& b : c.blocks) {
    LayerCacheSpec s;
    if (const std::unique_ptr<Mixer> m = make_mixer(b, c.d_model)) s = m->cache_spec();
    if (b.shared_block >= 0) {  // Zamba2 hybrid layer: its shared block's attention keeps KV too
      s.kind = s.has_state() ? LayerCacheKind::MambaAndAttention : LayerCacheKind::Attention;
      s.kv = {c.shared.attn.n_kv_heads, c.shared.attn.head_dim};
    }
    specs.push_back(s);
  }
  return specs;
}

size_t param_count(const HybridConfig& c) {
  size_t n = 0;
  for (const TensorEntry& t : Model::tensors(c)) n += static_cast<size_t>(t.numel());
  return n;
}

size_t matrix_param_count(const HybridConfig& c) {
  size_t n = 0;
  for (const TensorEntry& t : Model::tensors(c))
    if (t.kind != TensorEntry::Vector) n += static_cast<size_t>(t.numel());
  return n;
}

size_t weight_bytes(const HybridConfig& c, WeightDType dtype) {
  size_t n = 0;
  for (const TensorEntry& t : Model::tensors(c)) n += t.bytes(dtype);
  return n;
}

WeightReads decode_weight_reads(const HybridConfig& c, WeightDType dtype, int batch) {
  // The expected share of each mixture's experts that the step touches, by tensor-name prefix.
  struct Experts {
    std::string prefix;
    bool stacked;    // one (E, rows, cols) tensor per projection under the prefix
    double touched;  // the expected share of the experts read
    double pick;     // the share of the experts each token multiplies by
  };
  std::vector<Experts> experts;
  for (const BlockSpec& b : c.blocks) {
    const FfnSpec& f = b.ffn;
    if (f.kind != FfnKind::Moe || f.n_experts <= 0) continue;
    const double pick = std::min(1.0, static_cast<double>(f.top_k) / f.n_experts);
    experts.push_back({f.stacked_experts ? b.names.ffn : b.names.ffn + f.experts, f.stacked_experts,
                       1.0 - std::pow(1.0 - pick, std::max(batch, 1)), pick});
  }
  WeightReads w;
  for (const TensorEntry& t : Model::tensors(c)) {
    const double bytes = static_cast<double>(t.bytes(dtype));
    double share = 1.0, per_token = 1.0;
    const bool gathered =
        !c.tie_embeddings && (t.name == c.embedding_name || t.name == c.embedding_alias) && !t.shape.empty();
    if (gathered) share = std::min(1.0, static_cast<double>(std::max(batch, 1)) / static_cast<double>(t.shape.front()));
    for (const Experts& e : experts)
      if (t.name.starts_with(e.prefix) && (!e.stacked || t.kind == TensorEntry::Stacked)) {
        share = e.touched;
        per_token = e.pick;
      }
    w.all += bytes;
    w.read += bytes * share;
    if (t.kind != TensorEntry::Vector && !gathered) {
      w.matmul_bytes += bytes * share;
      w.matmul_macs += static_cast<double>(t.numel()) * per_token;
    }
  }
  return w;
}

StoredDType stored_dtype(const std::filesystem::path& dir) {
  if (Checkpoint::present(dir)) {
    const DType t = checkpoint_weight_dtype(Checkpoint::open(dir));
    return {t, "the safetensors headers: " + std::string(dtype_name(t))};
  }
  return stored_dtype(load_config(dir));
}

StoredDType stored_dtype(const HybridConfig& c) {
  // A torch_dtype from a stranger's file: named in the report only when it is a plain word.
  const std::string& t = c.torch_dtype;
  if (t.empty()) return {DType::F32, "config.json, which has no torch_dtype: f32"};
  const bool plain = t.size() <= 32 && std::all_of(t.begin(), t.end(), [](char ch) {
                       return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '.';
                     });
  return {torch_dtype_of(t), "config.json torch_dtype " + (plain ? t : std::string("(not a dtype name)"))};
}

WeightDType resolve_weight_dtype(const std::string& flag, const std::function<StoredDType()>& stored) {
  return flag == "auto" ? auto_weight_dtype(stored().dtype) : parse_weight_dtype(flag);
}

}  // namespace hybridlm
