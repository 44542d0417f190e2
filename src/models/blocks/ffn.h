// Feed-forwards: the MLP (gated: down(act(gate x) * up x), e.g. SwiGLU; or ungated:
// down(act(up x)), e.g. Nemotron-H's relu^2) and a mixture of such experts with a softmax top-k
// router (Shazeer et al. 2017; Jamba, Granite).
#pragma once

#include <string>
#include <vector>

#include "models/config.h"
#include "models/weights.h"

namespace hybridlm {

struct MlpWeights {
  Matrix gate, up, down;  // (F, H), (F, H), (H, F); gate empty when ungated
  std::vector<float> gate_bias, up_bias, down_bias;
};

struct FfnWeights {
  MlpWeights mlp;                  // FfnKind::Mlp
  Matrix router;                   // (E, H), FfnKind::Moe
  std::vector<MlpWeights> experts;  // E
};

struct FfnScratch {
  std::vector<float> a, b, g;             // (rows, F)
  std::vector<float> logits;              // (T, E)
  std::vector<int> choice;                // (T, top_k) expert ids
  std::vector<float> weight;              // (T, top_k)
  std::vector<int> rows;                  // tokens routed to one expert
  std::vector<float> xe, ye;              // gathered inputs / expert outputs
};

FfnWeights load_ffn(const WeightReader& r, const std::string& prefix, const FfnSpec& s, int d_model);

// out: (T, H) = ffn(x: (T, H)).
void ffn_forward(const KernelContext& ctx, const FfnSpec& s, const FfnWeights& w, const float* x, int T,
                 FfnScratch& scratch, float* out);

}  // namespace hybridlm
