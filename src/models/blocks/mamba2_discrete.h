// The discrete Mamba-2 mixer (MOHAWK, Bick et al. 2024, as in Llamba): in_proj -> [xBC, z, A~] ->
// causal conv over xBC (no activation after it by default) -> SSD scan with decay
// exp(-softplus(A~)) per token and value head and input x B^T without dt (+ D skip per value head)
// -> y * silu(z + z_bias) -> out_proj. No gated norm, no dt_bias, no learned A.
#pragma once

#include <string>
#include <vector>

#include "models/blocks/mixer.h"
#include "models/config.h"
#include "models/weights.h"

namespace hybridlm {

struct Mamba2DiscreteWeights {
  Matrix in_proj;   // (2I + 2GN + nh, H): [x, B, C, z, A~]
  Matrix out_proj;  // (H, I)
  std::vector<float> in_proj_bias, out_proj_bias;  // with proj_bias
  std::vector<float> conv_w;  // (conv_dim, K)
  std::vector<float> conv_b;  // (conv_dim) or empty
  std::vector<float> D;       // (nh)
  std::vector<float> z_bias;  // (I) without proj_bias; with it, empty (the reference's 0)
};

Mamba2DiscreteWeights load_mamba2_discrete(const TensorSource& r, const std::string& prefix,
                                           const Mamba2DiscreteSpec& s, int d_model);

}  // namespace hybridlm
