// Causal self-attention (Vaswani et al. 2017) with grouped KV heads (Ainslie et al. 2023, GQA),
// optional RoPE on the first rope_dim dims of each head (Su et al. 2021, rotate-half form),
// optional per-head RMSNorm of q and k, over the sequence's paged KV cache.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "models/blocks/seq_run.h"
#include "models/config.h"
#include "models/weights.h"

namespace hybridlm {

struct AttentionWeights {
  Matrix q_proj, k_proj, v_proj;  // (nH*hd, H), (nKV*hd, H), (nKV*hd, H)
  Matrix o_proj;                  // (H, nH*hd)
  std::vector<float> q_bias, k_bias, v_bias, o_bias;
  std::vector<float> q_norm, k_norm;  // (hd) when qk_norm
};

// Low-rank adapters added to q, k, v: q += (u @ down^T) @ up^T (Zamba2's per-invocation LoRA).
// An empty pair means no adapter on that projection.
struct AttentionLora {
  Matrix q_down, q_up, k_down, k_up, v_down, v_up;
};

struct AttentionScratch {
  std::vector<float> u, q, k, v, y, lora_r, lora_out;
};

AttentionWeights load_attention(const TensorSource& r, const std::string& prefix, const AttentionSpec& s,
                                int d_model);

// out: (T, H) = attention(u: (T, H)). Writes this run's K and V into the cache at positions
// [pos0, pos0 + len) of each run's sequence.
void attention_forward(const KernelContext& ctx, const AttentionSpec& s, const AttentionWeights& w, const float* u,
                       int T, std::span<const SeqRun> runs, AttentionScratch& scratch, float* out,
                       const AttentionLora* lora = nullptr);

}  // namespace hybridlm
