// Mamba-2 mixer (Dao & Gu 2024, "Transformers are SSMs"): in_proj -> [z, xBC, dt] -> causal conv +
// silu over xBC -> SSD scan per head (+ D skip) -> gated RMSNorm (gate, then norm; grouped or
// full) -> out_proj.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "cache/state_pool.h"
#include "models/blocks/mixer.h"
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

// The forward's scratch, taken from the step's arena (mamba2_buffers: the one list, which also
// sizes it).
struct Mamba2Buffers {
  float* u = nullptr;  // (T, H): u x in_scale (Falcon-H1), else unused
  float* zxbcdt;       // (T, in_proj rows)
  float* xbc;          // (T, conv_dim)
  float* dt;           // (T, nh)
  float* y;            // (T, I)
  float* g;            // (T, I)
};
Mamba2Buffers mamba2_buffers(const Mamba2Spec& s, int d_model, int T, FloatArena& arena);

Mamba2Weights load_mamba2(const TensorSource& r, const std::string& prefix, const Mamba2Spec& s, int d_model);
LayerStateSpec mamba2_state_spec(const Mamba2Spec& s);

void mamba2_forward(const KernelContext& ctx, const Mamba2Spec& s, const Mamba2Weights& w, const float* u,
                    int T, std::span<const SeqRun> runs, const Mamba2Buffers& buffers, float* out);

}  // namespace hybridlm
