#include "models/plan.h"

#include "models/blocks/mamba1.h"
#include "models/model.h"
#include "models/blocks/mamba2.h"
#include "models/blocks/short_conv.h"

namespace hybridlm {

std::vector<LayerCacheSpec> cache_specs(const HybridConfig& c) {
  std::vector<LayerCacheSpec> specs;
  for (const BlockSpec& b : c.blocks) {
    LayerCacheSpec s;
    switch (b.mixer) {
      case MixerKind::None: break;
      case MixerKind::Mamba1: s = {LayerCacheKind::Mamba, mamba1_state_spec(b.m1), {}}; break;
      case MixerKind::Mamba2:
        s = {LayerCacheKind::Mamba, mamba2_state_spec(b.m2), {}};
        if (b.shared_block >= 0) s = {LayerCacheKind::MambaAndAttention, s.state, {c.shared.attn.n_kv_heads, c.shared.attn.head_dim}};
        break;
      case MixerKind::Attention: s = {LayerCacheKind::Attention, {}, {b.attn.n_kv_heads, b.attn.head_dim}}; break;
      case MixerKind::ShortConv: s = {LayerCacheKind::Conv, short_conv_state_spec(b.conv, c.d_model), {}}; break;
      case MixerKind::Mamba2Attention:
        s = {LayerCacheKind::MambaAndAttention, mamba2_state_spec(b.m2), {b.attn.n_kv_heads, b.attn.head_dim}};
        break;
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

size_t kv_bytes_per_token(const HybridConfig& c, size_t kv_dtype_bytes) {
  size_t n = 0;
  for (const LayerCacheSpec& l : cache_specs(c))
    if (l.has_kv()) n += 2 * static_cast<size_t>(l.kv.n_kv_heads) * l.kv.head_dim * kv_dtype_bytes;
  return n;
}

}  // namespace hybridlm
