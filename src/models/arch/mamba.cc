// Family `mamba` (MambaForCausalLM, state-spaces/mamba-*-hf) and `falcon_mamba`
// (FalconMambaForCausalLM, tiiuae/falcon-mamba-7b). Config keys and defaults follow
// transformers' MambaConfig / FalconMambaConfig (research/hf-hybrid.md C.1).
// Weights (prefix backbone.): embeddings.weight | layers.N.{norm.weight, mixer.in_proj.weight (2I, H),
// mixer.conv1d.weight (I, 1, K) + bias, mixer.x_proj.weight (R + 2N, I), mixer.dt_proj.weight (I, R)
// + bias, mixer.A_log (I, N), mixer.D (I), mixer.out_proj.weight (H, I)} | norm_f.weight; lm_head.weight.
#include <cmath>

#include "models/arch/families.h"

namespace hybridlm {

static HybridConfig parse_mamba_common(const JsonKeys& k, bool falcon) {
  HybridConfig c = read_common_keys(k, {/*hidden_size=*/768, /*vocab_size=*/50280, /*tie=*/true, 0, 0, 0});
  Mamba1Spec m;
  m.d_inner = k.positive("intermediate_size", read_expanded(k, "expand", c.d_model));
  m.d_state = k.positive("state_size", 16, 4096);
  m.d_conv = k.positive("conv_kernel", 4, 64);
  m.dt_rank = read_dt_rank(k, "time_step_rank", c.d_model);
  m.proj_bias = k.boolean("use_bias", false);
  m.conv_bias = k.boolean("use_conv_bias", true);
  m.dt_bc_rms = falcon;
  m.dt_bc_rms_eps = k.positive_number("mixer_rms_eps", 1e-6);
  const int n_layers = k.positive("num_hidden_layers", 32, 1 << 14);
  BlockSpec b;
  b.mixer = MixerKind::Mamba1;
  b.m1 = m;
  c.blocks.assign(n_layers, b);
  name_backbone_layers(c);
  return c;
}

HybridConfig parse_mamba(const JsonKeys& k, NormGrouping) { return parse_mamba_common(k, false); }
HybridConfig parse_falcon_mamba(const JsonKeys& k, NormGrouping) { return parse_mamba_common(k, true); }

}  // namespace hybridlm
