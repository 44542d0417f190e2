#include "models/plan.h"

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

}  // namespace hybridlm
