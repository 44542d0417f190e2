#include "models/plan.h"

#include "models/blocks/mamba1.h"
#include "models/blocks/mamba2.h"

namespace hybridlm {

std::vector<LayerStateSpec> state_specs(const HybridConfig& c) {
  std::vector<LayerStateSpec> specs;
  for (const BlockSpec& b : c.blocks)
    specs.push_back(b.mixer == MixerKind::Mamba1 ? mamba1_state_spec(b.m1) : mamba2_state_spec(b.m2));
  return specs;
}

namespace {
struct Counts {
  size_t matrices = 0, vectors = 0;
};

// The tensors of load_mamba1 / load_mamba2 and Model::load, by shape.
Counts count(const HybridConfig& c) {
  const size_t H = c.d_model, V = c.vocab_size;
  Counts n;
  n.matrices += V * H;              // embedding
  if (!c.tie_embeddings) n.matrices += V * H;  // lm_head
  n.vectors += H;                   // norm_f
  for (const BlockSpec& b : c.blocks) {
    n.vectors += H;  // pre-mixer norm
    if (b.mixer == MixerKind::Mamba1) {
      const Mamba1Spec& m = b.m1;
      const size_t I = m.d_inner, N = m.d_state, R = m.dt_rank, K = m.d_conv;
      n.matrices += 2 * I * H + (R + 2 * N) * I + I * R + H * I;  // in, x, dt, out projections
      n.vectors += I * K + (m.conv_bias ? I : 0) + I + I * N + I;  // conv, dt bias, A_log, D
      if (m.proj_bias) n.vectors += 2 * I + H;
    } else {
      const Mamba2Spec& m = b.m2;
      const size_t I = m.d_inner, nh = m.n_heads, K = m.d_conv, cd = m.conv_dim(), W = m.in_proj_dim();
      n.matrices += W * H + H * I;                                       // in, out projections
      n.vectors += cd * K + (m.conv_bias ? cd : 0) + 3 * nh + I;         // conv, dt_bias/A_log/D, norm
      if (m.proj_bias) n.vectors += W + H;
    }
  }
  return n;
}
}  // namespace

size_t param_count(const HybridConfig& c) {
  const Counts n = count(c);
  return n.matrices + n.vectors;
}

size_t matrix_param_count(const HybridConfig& c) { return count(c).matrices; }

size_t kv_bytes_per_token(const HybridConfig&, size_t) { return 0; }  // no attention mixers yet

}  // namespace hybridlm
