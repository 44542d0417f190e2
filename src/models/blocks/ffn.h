// Feed-forwards: the MLP (gated: down(act(gate x) * up x), e.g. SwiGLU; or ungated:
// down(act(up x)), e.g. Nemotron-H's relu^2) and a mixture of such experts (Shazeer et al. 2017)
// with softmax or sigmoid routing, optionally beside an always-on shared MLP (Jamba, Granite,
// Nemotron-H).
#pragma once

#include <string>
#include <vector>

#include "models/config.h"
#include "models/weights.h"

namespace hybridlm {

struct MlpWeights {
  Matrix gate, up, down;  // (F, H), (F, H) or fused (2F, H), (H, F); gate empty when ungated or fused
  std::vector<float> gate_bias, up_bias, down_bias;
};

struct FfnWeights {
  MlpWeights mlp;                   // FfnKind::Mlp
  Matrix router;                    // (E, H), FfnKind::Moe
  std::vector<float> correction;    // (E) SigmoidGrouped choice bias, or empty
  std::vector<MlpWeights> experts;  // E
  MlpWeights shared;                // when spec.shared.d_ff > 0
  std::vector<float> shared_gate;   // (H) when spec.shared_gate is named
};

// Per-token routing buffers (reused: no allocation per step once warm).
struct RouteScratch {
  std::vector<double> key, p, group_score;
  std::vector<int> top, keep_groups;
};

struct FfnScratch {
  std::vector<float> a, b, g;     // (rows, F) / (rows, 2F)
  std::vector<float> logits;      // (T, E)
  std::vector<int> choice;        // (T, top_k) expert ids
  std::vector<float> weight;      // (T, top_k)
  std::vector<int> rows;          // (token, slot) pairs routed to one expert
  std::vector<float> xe, ye, extra;  // gathered inputs, expert outputs, the shared MLP's output
  RouteScratch route;
};

FfnWeights load_ffn(const TensorSource& r, const std::string& prefix, const FfnSpec& s, int d_model);

// out: (T, H) = ffn(x: (T, H)).
void ffn_forward(const KernelContext& ctx, const FfnSpec& s, const FfnWeights& w, const float* x, int T,
                 FfnScratch& scratch, float* out);

// The experts (ids) and weights one token's router logits select. Exposed for tests.
void route_token(const FfnSpec& s, const float* logits, const float* correction, int* choice, float* weight,
                 RouteScratch& scratch);

}  // namespace hybridlm
