#include "models/plan.h"

#include <algorithm>
#include <cctype>

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
