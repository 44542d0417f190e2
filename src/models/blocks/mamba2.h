// Mamba-2 mixer (Dao & Gu 2024, "Transformers are SSMs"): in_proj -> [z, xBC, dt] -> causal conv +
// silu over xBC -> SSD scan per head (+ D skip) -> gated RMSNorm (gate, then norm; grouped or
// full) -> out_proj.
#pragma once

#include <algorithm>
#include <span>
#include <string>
#include <vector>

#include "cache/state_pool.h"
#include "models/blocks/mixer.h"
#include "models/blocks/seq_run.h"
#include "models/config.h"
#include "models/weights.h"

namespace hybridlm {

// The SSD chunk on CPU: min(chunk_size, this) (see mamba2_forward); the chunked form is exact
// for any length. Mamba-2 and the discrete Mamba-2 share it.
constexpr int kCpuSsdChunk = 64;

// Widens `lim` to what an SSD mixer (Mamba-2 or discrete Mamba-2) hands the conv and scan
// kernels (Mixer::kernel_limits).
template <class Spec>
void widen_ssd_limits(const Spec& s, KernelLimits& lim) {
  lim.conv_channels = std::max(lim.conv_channels, s.conv_dim());
  lim.conv_width = std::max(lim.conv_width, s.d_conv);
  lim.d_state = std::max(lim.d_state, s.d_state);
  lim.head_dim = std::max(lim.head_dim, s.head_dim);
  lim.n_groups = std::max(lim.n_groups, s.n_groups);
  const int chunk = std::min(s.chunk_size, kCpuSsdChunk);
  lim.ssd_chunk = std::max(lim.ssd_chunk, chunk);
  lim.ssd_chunk_min = lim.ssd_chunk_min > 0 ? std::min(lim.ssd_chunk_min, chunk) : chunk;
}

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
