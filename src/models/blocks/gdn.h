// The gated DeltaNet mixer (Qwen3-Next's linear attention; GdnSpec in config.h): in_proj_qkvz and
// in_proj_ba -> causal conv with SiLU over [q, k, v] -> the gated delta rule per value head from
// the sequence's state (nv, dk, dv) -> w * rmsnorm(y) * silu(z) per value head -> out_proj.
#pragma once

#include <string>
#include <vector>

#include "models/blocks/mixer.h"
#include "models/config.h"
#include "models/weights.h"

namespace hybridlm {

struct GdnWeights {
  Matrix in_proj_qkvz;         // (2 nk dk + 2 nv dv, H), interleaved per key head (config.h)
  Matrix in_proj_ba;           // (2 nv, H), interleaved per key head
  Matrix in_proj_qkv;          // not interleaved (Qwen3.5): (2 nk dk + nv dv, H) = [q | k | v]
  Matrix in_proj_z;            //   (nv dv, H)
  Matrix in_proj_b, in_proj_a;  //   (nv, H) each
  Matrix out_proj;             // (H, nv dv)
  std::vector<float> conv_w;   // (conv_dim, K)
  std::vector<float> dt_bias;  // (nv)
  std::vector<float> A_log;    // (nv)
  std::vector<float> norm_w;   // (dv)
};

GdnWeights load_gdn(const TensorSource& r, const std::string& prefix, const GdnSpec& s, int d_model);

}  // namespace hybridlm
