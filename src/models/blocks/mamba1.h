// Mamba-1 mixer (Gu & Dao 2023, "Mamba", Algorithm 2): in_proj -> causal conv + silu -> x_proj ->
// dt_proj + softplus -> selective scan (+ D skip, silu(z) gate) -> out_proj. Zamba's multi-head
// form (Mamba1Spec::n_heads) runs x_proj, dt_proj and the scan per head of d_inner / n_heads channels.
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

struct Mamba1Weights {
  Matrix in_proj;   // (2I, H): x then z (Zamba: interleaved)
  Matrix x_proj;    // (R + 2N, I): dt, B, C (empty with head tensors)
  Matrix dt_proj;   // (I, R) (empty with head tensors)
  Matrix out_proj;  // (H, I)
  std::vector<Matrix> x_proj_heads;   // nh x (R + 2N, P): Zamba's per-head x_proj
  std::vector<Matrix> dt_proj_heads;  // nh x (P, R)
  std::vector<float> in_proj_bias, out_proj_bias;  // empty unless use_bias
  std::vector<float> conv_w;  // (I, K)
  std::vector<float> conv_b;  // (I) or empty
  std::vector<float> dt_bias;  // (I); Zamba (nh, P), the same layout
  std::vector<float> A;       // (I, N) = -exp(A_log), precomputed at load
  std::vector<float> D;       // (I)
  std::vector<float> dt_norm, b_norm, c_norm;  // (R), (N), (N): Jamba's dt/B/C RMSNorm weights
};

// The forward's scratch, taken from the step's arena (mamba1_buffers: the one list, which also
// sizes it).
struct Mamba1Buffers {
  float* xz;     // (T, 2I): x then z
  float* xc;     // (T, I)
  float* xdbc;   // (T, R + 2N); with head tensors (nh, T, R + 2N)
  float* dt_in;  // (T, R)
  float* dt;     // (T, I); with head tensors (nh, T, P)
  float* y;      // (T, I)
  float* raw;    // (T, 2I): in_proj's rows as stored (interleaved x, z), or null
  float* xh;     // (T, P): one head's x, with head tensors (else null)
  float* yh;     // (nh, T, P): the heads' outputs, with head tensors (else null)
};
Mamba1Buffers mamba1_buffers(const Mamba1Spec& s, int T, FloatArena& arena);

Mamba1Weights load_mamba1(const TensorSource& r, const std::string& prefix, const Mamba1Spec& s, int d_model);
LayerStateSpec mamba1_state_spec(const Mamba1Spec& s);

// out: (T, H) = mixer(u: (T, H)); runs partition the T rows and carry each sequence's state.
void mamba1_forward(const KernelContext& ctx, const Mamba1Spec& s, const Mamba1Weights& w, const float* u,
                    int T, std::span<const SeqRun> runs, const Mamba1Buffers& buffers, float* out);

}  // namespace hybridlm
