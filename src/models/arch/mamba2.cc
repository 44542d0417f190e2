// Family `mamba2` (Mamba2ForCausalLM: state-spaces/mamba2-*, Mamba-Codestral-7B). Config keys and
// defaults follow transformers' Mamba2Config (research/hf-hybrid.md C.2).
// Weights (prefix backbone.): embeddings.weight | layers.N.{norm.weight, mixer.in_proj.weight
// (2I + 2GN + nh, H), mixer.conv1d.weight (I + 2GN, 1, K) + bias, mixer.dt_bias (nh), mixer.A_log
// (nh), mixer.D (nh), mixer.norm.weight (I), mixer.out_proj.weight (H, I)} | norm_f.weight; lm_head.weight.
#include <cmath>

#include "models/arch/families.h"

namespace hybridlm {

HybridConfig parse_mamba2(const JsonKeys& k, NormGrouping mamba2_norm) {
  HybridConfig c = read_common_keys(k, {/*hidden_size=*/4096, /*vocab_size=*/32768, /*tie=*/false, 0, 2, 1});

  Mamba2Spec m;
  m.n_heads = k.positive("num_heads", 128);
  m.head_dim = k.positive("head_dim", 64);
  m.d_state = k.positive("state_size", 128, 4096);
  m.n_groups = k.positive("n_groups", 8, 1024);
  m.d_conv = k.positive("conv_kernel", 4, 64);
  m.chunk_size = k.positive("chunk_size", 256, 1 << 16);
  m.proj_bias = k.boolean("use_bias", false);
  m.conv_bias = k.boolean("use_conv_bias", true);
  m.norm_eps = c.norm_eps;
  m.norm_grouping = mamba2_norm;
  m.d_inner = read_expanded(k, "expand", c.d_model);
  const int64_t heads_x_dim = static_cast<int64_t>(m.n_heads) * m.head_dim;
  if (heads_x_dim != m.d_inner)
    k.fail("num_heads", "num_heads x head_dim = " + std::to_string(heads_x_dim) +
                            " must equal expand x hidden_size = " + std::to_string(m.d_inner));
  if (m.n_heads % m.n_groups != 0)
    k.fail("n_groups", "must divide num_heads = " + std::to_string(m.n_heads));
  read_time_step_limit(k, "time_step_limit", m);
  const int n_layers = k.positive("num_hidden_layers", 64, 1 << 14);
  BlockSpec b;
  b.mixer = MixerKind::Mamba2;
  b.m2 = m;
  c.blocks.assign(n_layers, b);
  name_backbone_layers(c);
  return c;
}

}  // namespace hybridlm
