// config.json for every family: any text. A config that parses must describe consistent sizes.
#include <cstdlib>

#include "base/error.h"
#include "models/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hybridlm;
  const std::string text(reinterpret_cast<const char*>(data), size);
  for (NormGrouping g : {NormGrouping::Grouped, NormGrouping::Full}) {
    try {
      const HybridConfig c = parse_config_text(text, "config.json", g);
      if (c.d_model <= 0 || c.vocab_size <= 0 || c.blocks.empty()) std::abort();
      for (const BlockSpec& b : c.blocks) {
        if (b.mixer == MixerKind::Mamba2 || b.mixer == MixerKind::Mamba2Attention) {
          const Mamba2Spec& m = b.m2;
          if (m.n_heads * m.head_dim != m.d_inner || m.n_heads % m.n_groups != 0) std::abort();
          if (m.conv_dim() <= 0 || m.in_proj_dim() <= 0 || !(m.dt_min <= m.dt_max)) std::abort();
        } else if (b.mixer == MixerKind::Mamba1) {
          if (b.m1.d_inner <= 0 || b.m1.dt_rank <= 0 || b.m1.d_conv <= 0) std::abort();
        } else if (b.mixer == MixerKind::ShortConv) {
          if (b.conv.d_conv <= 0) std::abort();
        } else if (b.mixer == MixerKind::None && b.ffn.kind == FfnKind::None) {
          std::abort();  // a block with neither mixer nor feed-forward
        }
        const AttentionSpec& a = b.shared_block >= 0 ? c.shared.attn : b.attn;
        if (b.mixer == MixerKind::Attention || b.mixer == MixerKind::Mamba2Attention || b.shared_block >= 0) {
          if (a.n_heads <= 0 || a.n_kv_heads <= 0 || a.n_heads % a.n_kv_heads != 0 || a.head_dim <= 0) std::abort();
          if (a.head_dim > 1024 || a.rope_dim < 0 || a.rope_dim > a.head_dim || a.rope_dim % 2 != 0) std::abort();
        }
        if (b.shared_block >= c.shared.n_blocks) std::abort();
        if (b.ffn.kind != FfnKind::None && b.ffn.mlp.d_ff <= 0) std::abort();
        if (b.ffn.kind == FfnKind::Moe && (b.ffn.top_k <= 0 || b.ffn.top_k > b.ffn.n_experts)) std::abort();
        if (b.ffn.kind == FfnKind::Moe && (b.ffn.n_experts % b.ffn.n_group != 0 || b.ffn.topk_group > b.ffn.n_group))
          std::abort();
      }
      (void)c.layer_pattern();
    } catch (const Error&) {
    }
  }
  return 0;
}
