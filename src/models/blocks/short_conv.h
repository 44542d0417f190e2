// LFM2's gated short convolution (Liquid AI, LFM2): in_proj -> B, C, x; y = C * conv(B * x) with a
// short causal depthwise conv (no activation) -> out_proj. Its cache is the conv state alone.
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

struct ShortConvWeights {
  Matrix in_proj;   // (3H, H): B, C, x
  Matrix out_proj;  // (H, H)
  std::vector<float> in_bias, out_bias;
  std::vector<float> conv_w;  // (H, K)
  std::vector<float> conv_b;  // (H) or empty
};

// The forward's scratch, from the step's arena (short_conv_buffers: the one list, which sizes it).
struct ShortConvBuffers {
  float* bcx;  // (T, 3H): B, C, x
  float* bx;   // (T, H)
  float* y;    // (T, H)
};
ShortConvBuffers short_conv_buffers(int d_model, int T, FloatArena& arena);

ShortConvWeights load_short_conv(const TensorSource& r, const std::string& prefix, const ShortConvSpec& s, int d_model);
LayerStateSpec short_conv_state_spec(const ShortConvSpec& s, int d_model);

void short_conv_forward(const KernelContext& ctx, const ShortConvSpec& s, const ShortConvWeights& w, const float* u,
                        int T, int d_model, std::span<const SeqRun> runs, const ShortConvBuffers& buffers, float* out);

}  // namespace hybridlm
