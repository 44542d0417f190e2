// Mamba-2 mixer (Dao & Gu 2024, "Transformers are SSMs"): in_proj -> [z, xBC, dt] -> causal conv +
// silu over xBC -> SSD scan per head (+ D skip) -> gated RMSNorm (gate, then norm; grouped or
// full) -> out_proj.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "cache/state_pool.h"
#include "models/blocks/seq_run.h"
#include "models/config.h"
#include "models/weights.h"

namespace hybridlm {

struct Mamba2Weights {
  Matrix in_proj;   // (I + conv_dim + nh, H): [z, xBC, dt]
  Matrix out_proj;  // (H, I)
  std::vector<float> in_proj_bias, out_proj_bias;
  std::vector<float> conv_w;   // (conv_dim, K)
  std::vector<float> conv_b;   // (conv_dim) or empty
  std::vector<float> dt_bias;  // (nh)
  std::vector<float> A;        // (nh) = -exp(A_log)
  std::vector<float> D;        // (nh)
  std::vector<float> norm_w;   // (I)
};

struct Mamba2Scratch {
  std::vector<float> u, zxbcdt, xbc, dt, y, g;
};

Mamba2Weights load_mamba2(const TensorSource& r, const std::string& prefix, const Mamba2Spec& s, int d_model);
LayerStateSpec mamba2_state_spec(const Mamba2Spec& s);

void mamba2_forward(const KernelContext& ctx, const Mamba2Spec& s, const Mamba2Weights& w, const float* u,
                    int T, std::span<const SeqRun> runs, Mamba2Scratch& scratch, float* out);

}  // namespace hybridlm
