// Causal self-attention (Vaswani et al. 2017) with grouped KV heads (Ainslie et al. 2023, GQA),
// optional RoPE on the first rope_dim dims of each head (Su et al. 2021, rotate-half form),
// optional per-head RMSNorm of q and k, over the sequence's paged KV cache.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "models/blocks/mixer.h"
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


AttentionWeights load_attention(const TensorSource& r, const std::string& prefix, const AttentionSpec& s,
                                int d_model);

// Scratch floats attention_forward takes for T tokens of in_dim inputs (with LoRA adapters of
// rank lora_rank: Zamba2's shared blocks).
size_t attention_scratch_floats(const AttentionSpec& s, int in_dim, int T, int lora_rank = 0);
// out: (T, H) = attention(u: (T, in_dim)). Writes this run's K and V into the cache at positions
// [pos0, pos0 + len) of each run's sequence. Scratch from `arena`.
void attention_forward(const KernelContext& ctx, const AttentionSpec& s, const AttentionWeights& w, const float* u,
                       int T, std::span<const SeqRun> runs, FloatArena& arena, float* out,
                       const AttentionLora* lora = nullptr);

}  // namespace hybridlm
