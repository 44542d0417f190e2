// Causal attention over the paged KV cache on AVX-512 (attention_avx512.cc), and its backward
// for training (attention_backward_avx512.cc).
#pragma once

#include "kernels/kernels.h"

namespace hybridlm::cpu {

// cpu::attention's contract (f32, bf16 or f16 pages). Returns false, having done nothing, unless
// head_dim is a multiple of 32 and at most 256.
bool attention_avx512(const KernelContext& ctx, const float* q, int ld_q, const PagedKv& kv, int pos0, int T,
                      int n_heads, float scale, float* out);

// Over bf16 pages the scores are bf16 dot products of the rounded query (vdpbf16ps) where the CPU
// has AVX512-BF16, else f32 multiply-adds of the same rounded query and keys. Tests turn the dot
// products off (false) to check the other path on a CPU that has them; on by default.
void attention_avx512_bf16_dot(bool on);

// cpu::attention_backward's contract. Returns false, having done nothing, unless head_dim is a
// multiple of 16 and at most 1024.
bool attention_backward_avx512(const KernelContext& ctx, const float* q, int ld_q, const float* k, const float* v,
                               int T, int n_heads, int n_kv_heads, int head_dim, float scale, const float* dout,
                               float* dq, float* dk, float* dv);

}  // namespace hybridlm::cpu
