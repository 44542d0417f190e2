// The shared transformer block of Zamba (Zyphra, Glorioso et al. 2024) and Zamba2: on
// s = concat(h, emb) (2H), attention (Zamba2: with per-invocation LoRA on q/k/v) and o_proj back to
// H, then RMSNorm and a gated MLP (Zamba2: fused gate_up with a LoRA; Zamba: gate_proj, up_proj);
// no residual inside. The hybrid layer adds linear(block output) to h before its Mamba reads it.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "models/blocks/attention.h"
#include "models/blocks/ffn.h"
#include "models/config.h"
#include "models/weights.h"

namespace hybridlm {

struct SharedBlockWeights {
  std::string prefix;              // where the checkpoint stores this block
  std::vector<float> in_norm;      // (2H)
  std::vector<float> pre_ff_norm;  // (H)
  AttentionWeights attn;
  Matrix gate_up, down;            // (2F, H), (H, F); gate_up empty when the MLP is not fused
  Matrix gate, up;                 // (F, H) each when not fused (Zamba)
};

// What one hybrid layer adds to its shared block: LoRA adapters and its output linear.
struct Zamba2LayerWeights {
  AttentionLora lora;
  Matrix gu_down, gu_up;  // gate_up LoRA: (r, H), (2F, r); empty without MLP adapters
  Matrix linear;          // (H, H)
};


SharedBlockWeights load_shared_block(const TensorSource& r, const std::string& prefix, const SharedTransformerSpec& s,
                                     int d_model);
Zamba2LayerWeights load_zamba2_layer(const TensorSource& r, const std::string& block_prefix,
                                     const std::string& layer_prefix, const SharedTransformerSpec& s, int adapter,
                                     int d_model);

// Scratch floats zamba2_shared_forward takes for T tokens (its attention's included).
size_t zamba2_scratch_floats(const SharedTransformerSpec& s, int d_model, int T);
// t: (T, H) = linear(shared_block(h, emb)), writing the layer's K/V into the runs' caches.
void zamba2_shared_forward(const KernelContext& ctx, const SharedTransformerSpec& s, const SharedBlockWeights& b,
                           const Zamba2LayerWeights& l, const float* h, const float* emb, int T, int d_model,
                           std::span<const SeqRun> runs, FloatArena& arena, float* t);

}  // namespace hybridlm
