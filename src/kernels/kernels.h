// The op signatures shared by src/kernels/ref (scalar, obviously correct: the oracle) and
// src/kernels/cpu (SIMD + threads). Both namespaces declare exactly these functions; the ref
// versions ignore ctx.pool. The model calls them through a KernelTable (ctx.ops) chosen at start,
// so a whole forward runs on either set (and later on another backend) without changing a block.
// Layout convention: token-major rows, shapes in PyTorch order in comments.
// Every pointer argument named `ld_*` is a row stride in elements.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "base/error.h"
#include "tensor/dtype.h"
#include "tensor/quant.h"

namespace hybridlm {

class ThreadPool;
struct KernelTable;
class KernelScratch;

struct KernelContext {
  ThreadPool* pool = nullptr;  // nullptr = run on the calling thread
  const KernelTable* ops = nullptr;  // the kernels a model calls (ref_kernels() or cpu_kernels())
  KernelScratch* scratch = nullptr;  // per-thread working memory (kernels/scratch.h); null: allocate
};

// The largest shapes a model hands the kernels, at the engine's tokens per step: what bounds the
// kernels' per-thread scratch (KernelTable::scratch_floats).
struct KernelLimits {
  int tokens = 0;                         // rows of one call (tokens of a step)
  int matmul_cols = 0;                    // the widest matmul input (a weight's cols)
  int conv_channels = 0, conv_width = 0;  // causal conv: channels C, taps K
  int d_state = 0;                        // SSM state width N (Mamba-1 and Mamba-2)
  int head_dim = 0, n_groups = 0, ssd_chunk = 0;  // Mamba-2 SSD
  int ssd_chunk_min = 0;  // the shortest SSD chunk (0: ssd_chunk), which has the most checkpoints
  int gdn_k_dim = 0, gdn_v_dim = 0, gdn_chunk = 0;  // gated delta rule: head dims d_k, d_v, chunk
  // Training: matmul_backward's transposed copies, and its products, whose "tokens" are a
  // weight's rows and whose "weight" is (cols, tokens): the tallest weight bounds them.
  bool backward = false;
  int matmul_rows = 0;
};
// Floats of scratch per thread: thread 0 (the caller of parallel_for) and each worker.
struct ScratchNeed {
  size_t caller = 0, worker = 0;
};
// The larger of two needs (kernels that never run at once share the memory).
inline ScratchNeed most(ScratchNeed a, ScratchNeed b) {
  return {std::max(a.caller, b.caller), std::max(a.worker, b.worker)};
}

// A weight matrix W: (rows, cols) row-major (W is PyTorch's Linear.weight: (out, in)) in f32, bf16,
// q8_0 or q4_0. q8_0 (dtype I8, see tensor/quant.h): `data` holds the codes (biased: uint8 q + 128)
// and `scales` one f32 per 32 codes, both in the 16-row panel layout of quantize_q8_0_matrix. q4_0
// (dtype U8): `data` holds the packed 4-bit codes (c in [0, 15], value c - 8) and `scales` as
// q8_0's, in the layout of quantize_q4_0_matrix. A q8_0 or q4_0 matmul quantizes each activation
// row to q8_0 and sums integer block products (as llama.cpp's q8_0 x q8_0 and q4_0 x q8_0 dots):
// y = sum over blocks of (sum_i qw_i qx_i) * dw * dx, qw the weight's signed code.
// f32 and bf16 weights come row-major (as mapped from the checkpoint) or, when copied at load, in
// lane panels (`panels`), the order in which the AVX-512 GEMM tiles read them: rows in panels of
// 32 (padded with zero rows); inside a panel, the 32 rows' values of one column are contiguous,
// columns ordered by lane group g = (k % 16) / 4, then chunk j = k / 16, then lane k % 4: element
// (r, k) at panel_index(r, k, cols), columns padded with zeros to a multiple of 16. A register
// tile loads 32 rows' weights of one column as two vectors with no packing per call, and a decode
// pass over the 4 (or 2) lane classes of a group reads the panel front to back.
struct WeightView {
  DType dtype = DType::F32;
  const void* data = nullptr;
  int rows = 0, cols = 0;
  const float* scales = nullptr;  // q8_0 and q4_0 only
  bool panels = false;            // f32/bf16: the lane-panel layout (q8_0 and q4_0 have their own panels)
};

constexpr int kPanelRows = 32, kPanelLanes = 16, kPanelGroup = 4;
inline int panel_chunks(int cols) { return (cols + kPanelLanes - 1) / kPanelLanes; }
inline size_t panel_count(int rows, int cols) {
  return static_cast<size_t>((rows + kPanelRows - 1) / kPanelRows) * kPanelRows * kPanelLanes * panel_chunks(cols);
}
// Offset inside a panel of the 32 values of lane class l (0..15), chunk j.
inline size_t panel_lane_offset(int l, int j, int chunks) {
  return ((static_cast<size_t>(l / kPanelGroup) * chunks + j) * kPanelGroup + l % kPanelGroup) * kPanelRows;
}
inline size_t panel_index(int r, int k, int cols) {
  const int chunks = panel_chunks(cols);
  return static_cast<size_t>(r / kPanelRows) * kPanelRows * kPanelLanes * chunks +
         panel_lane_offset(k % kPanelLanes, k / kPanelLanes, chunks) + static_cast<size_t>(r % kPanelRows);
}
// fn(k, panel_index(r, k, cols)) for k = 0, 1, ..., cols - 1: a whole row (loading, the embedding
// lookup) without panel_index's divisions per element.
template <class Fn>
inline void for_panel_row(int r, int cols, Fn&& fn) {
  const int chunks = panel_chunks(cols);
  const size_t base = static_cast<size_t>(r / kPanelRows) * kPanelRows * kPanelLanes * chunks + r % kPanelRows;
  for (int j = 0, k = 0; j < chunks; ++j)
    for (int l = 0; l < kPanelLanes && k < cols; ++l, ++k) fn(k, base + panel_lane_offset(l, j, chunks));
}

// Rows [r0, r0 + n) of an f32 or bf16 W as a matrix of their own (r0 a whole number of
// kPanelRows, so a panel layout starts at a panel): a matmul of one token over it gives y[r0 ..
// r0 + n) of the matmul over W, bitwise (a row's dot product depends on K and the SIMD path only).
// False for q8_0 / q4_0 weights, an r0 that is not a multiple of kPanelRows (in either layout), or
// rows outside W.
inline bool weight_rows(const WeightView& W, int r0, int n, WeightView& out) {
  if ((W.dtype != DType::F32 && W.dtype != DType::BF16) || r0 % kPanelRows != 0 || r0 < 0 || n < 0 ||
      r0 + n > W.rows)
    return false;
  const size_t first = W.panels ? static_cast<size_t>(r0) * kPanelLanes * panel_chunks(W.cols)
                                : static_cast<size_t>(r0) * W.cols;
  out = W;
  out.data = static_cast<const uint8_t*>(W.data) + first * dtype_size(W.dtype);
  out.rows = n;
  return true;
}

// Per-layer Mamba-2 dims used by the SSD kernels.
struct SsdDims {
  int n_heads = 0;   // nh
  int head_dim = 0;  // P
  int n_groups = 0;  // G; head h reads group h / (nh / G)
  int d_state = 0;   // N
};

// One Mamba-2 layer's constants for its fused decode step (mamba2_step). The conv runs over
// conv_dim = I + 2 G N channels (x, then B, then C), I = n_heads * head_dim.
struct Mamba2StepParams {
  SsdDims dims;
  const float* conv_w = nullptr;   // (conv_dim, K)
  const float* conv_b = nullptr;   // (conv_dim) or null
  int d_conv = 0;                  // K
  const float* dt_bias = nullptr;  // (nh)
  float dt_min = 0, dt_max = 0;    // dt's clamp (time_step_limit)
  const float* A = nullptr;        // (nh) = -exp(A_log)
  const float* D = nullptr;        // (nh)
  const float* norm_w = nullptr;   // (I): the gated RMSNorm's weight
  int norm_group = 0;              // channels per norm group (I / G, or I ungrouped)
  float norm_eps = 0;
};

// Per-layer gated DeltaNet dims used by the gated delta rule kernels.
struct GdnDims {
  int n_k_heads = 0;  // nk (query and key heads)
  int n_v_heads = 0;  // nv, a multiple of nk; value head h reads key head h / (nv / nk)
  int k_dim = 0;      // dk
  int v_dim = 0;      // dv
};

// One attention layer's view of one sequence's paged KV cache. Token j of the sequence lives in
// page pages[j / block_size] at row j % block_size; the head_dim elements of its KV head h start
// at element pages[j / block_size] * page_stride + (j % block_size) * token_stride + h *
// head_stride of K (and of V). Training's one-page views are token-major (set_token_major: each
// token's n_kv_heads x head_dim row together); the cache gives each KV head its own region of the
// pool (token_stride head_dim, head_stride a whole region), so a head's keys are one run of
// memory per page, and one long run over consecutive pages, which decode at depth reads faster
// than a head's piece of every token's row. The elements are `dtype`: F32 (float), or
// BF16 / F16 (uint16_t bit patterns), rounded to nearest even when a row is stored and widened to
// f32 by whatever reads them.
struct PagedKv {
  void* k = nullptr;  // element 0 of K (page 0, head 0) of this layer
  void* v = nullptr;  // element 0 of V
  const int32_t* pages = nullptr;
  int block_size = 0, n_kv_heads = 0, head_dim = 0;
  size_t page_stride = 0;  // in elements, as the two below
  DType dtype = DType::F32;
  size_t token_stride = 0, head_stride = 0;
  size_t row_elems() const { return static_cast<size_t>(n_kv_heads) * head_dim; }
  void set_token_major() {
    token_stride = row_elems();
    head_stride = static_cast<size_t>(head_dim);
  }
  // Where the head_dim elements of KV head `head` of `token` start.
  size_t offset(int token, int head) const {
    return static_cast<size_t>(pages[token / block_size]) * page_stride +
           static_cast<size_t>(token % block_size) * token_stride + static_cast<size_t>(head) * head_stride;
  }
  // Stores one token's K and V (row_elems() floats each, head after head), rounded to dtype; F32
  // copies them.
  void store(int token, const float* k_src, const float* v_src) const {
    store_row(k, token, k_src);
    store_row(v, token, v_src);
  }
  // One token's K or V widened to f32 (exact): row_elems() floats, head after head.
  void load_k(int token, float* out) const { load_row(k, token, out); }
  void load_v(int token, float* out) const { load_row(v, token, out); }

 private:
  void store_row(void* base, int token, const float* src) const {
    check(token_stride > 0 && head_stride > 0, "KV layout unset: PagedKv without token and head strides");
    const size_t n = static_cast<size_t>(head_dim);
    for (int h = 0; h < n_kv_heads; ++h, src += n) {
      const size_t off = offset(token, h);
      if (dtype == DType::F32) {
        std::copy_n(src, n, static_cast<float*>(base) + off);
        continue;
      }
      uint16_t* dst = static_cast<uint16_t*>(base) + off;
      if (dtype == DType::BF16)
        for (size_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
      else
        for (size_t i = 0; i < n; ++i) dst[i] = f32_to_f16(src[i]);
    }
  }
  void load_row(const void* base, int token, float* out) const {
    check(token_stride > 0 && head_stride > 0, "KV layout unset: PagedKv without token and head strides");
    const size_t n = static_cast<size_t>(head_dim);
    for (int h = 0; h < n_kv_heads; ++h, out += n) {
      const size_t off = offset(token, h);
      if (dtype == DType::F32) {
        std::copy_n(static_cast<const float*>(base) + off, n, out);
        continue;
      }
      const uint16_t* src = static_cast<const uint16_t*>(base) + off;
      if (dtype == DType::BF16)
        for (size_t i = 0; i < n; ++i) out[i] = bf16_to_f32(src[i]);
      else
        for (size_t i = 0; i < n; ++i) out[i] = f16_to_f32(src[i]);
    }
  }
};

// Feed-forward activations. Gelu is the exact (erf) form; Relu2 is relu(x)^2 (Nemotron-H, Primer).
enum class Activation { Silu, Gelu, Relu2 };

}  // namespace hybridlm

namespace hybridlm::ref {
#include "kernels/ops.inc"
// Scalar helpers shared with tests.
float softplus(float x);
float silu(float x);
}  // namespace hybridlm::ref

namespace hybridlm::cpu {
#include "kernels/ops.inc"
// Which SIMD path runs: "avx512", "avx2" or "portable": the best the CPU has, or the one named by
// the environment variable HYBRIDLM_CPU_PATH (never one the CPU lacks; tests force each in turn).
const char* active_path();
}  // namespace hybridlm::cpu

namespace hybridlm {

// One implementation of every op in ops.inc, as function pointers. The two state storages of
// ssd_step, mamba2_step and mamba1_scan (overloads in ops.inc) are two entries here, the bf16 one suffixed.
struct KernelTable {
  const char* name;  // "ref", "cpu"
  ScratchNeed (*scratch_floats)(const KernelLimits&);
  decltype(&ref::matmul) matmul;
  decltype(&ref::quantize_q8_0_rows) quantize_q8_0_rows;
  decltype(&ref::rmsnorm) rmsnorm;
  decltype(&ref::gated_rmsnorm) gated_rmsnorm;
  decltype(&ref::conv1d_causal) conv1d_causal;
  void (*mamba1_scan)(const KernelContext&, const float*, int, const float*, const float*, const float*,
                      const float*, int, const float*, const float*, int, float*, int, int, int, float*);
  void (*mamba1_scan_bf16)(const KernelContext&, const float*, int, const float*, const float*, const float*,
                           const float*, int, const float*, const float*, int, uint16_t*, int, int, int, float*);
  decltype(&ref::ssd_scan) ssd_scan;
  void (*ssd_step)(const KernelContext&, const float*, const float*, const float*, const float*, const float*,
                   const float*, const SsdDims&, float*, float*);
  void (*ssd_step_bf16)(const KernelContext&, const float*, const float*, const float*, const float*,
                        const float*, const float*, const SsdDims&, uint16_t*, float*);
  void (*mamba2_step)(const KernelContext&, const Mamba2StepParams&, const float*, float*, float*, float*, float*,
                      float*, float*);
  void (*mamba2_step_bf16)(const KernelContext&, const Mamba2StepParams&, const float*, float*, uint16_t*, float*,
                           float*, float*, float*);
  decltype(&ref::ssd_scan_discrete) ssd_scan_discrete;
  decltype(&ref::ssd_step_discrete) ssd_step_discrete;
  decltype(&ref::gated_delta_scan) gated_delta_scan;
  decltype(&ref::gated_delta_step) gated_delta_step;
  void (*softplus)(const KernelContext&, float*, size_t);
  decltype(&ref::embedding) embedding;
  decltype(&ref::rope) rope;
  decltype(&ref::attention) attention;
  decltype(&ref::activation) activation;
  decltype(&ref::matmul_train) matmul_train;
  decltype(&ref::matmul_backward) matmul_backward;
  decltype(&ref::rmsnorm_backward) rmsnorm_backward;
  decltype(&ref::embedding_backward) embedding_backward;
  decltype(&ref::cross_entropy) cross_entropy;
  decltype(&ref::activation_backward) activation_backward;
  decltype(&ref::conv1d_causal_backward) conv1d_causal_backward;
  decltype(&ref::gated_rmsnorm_backward) gated_rmsnorm_backward;
  decltype(&ref::rope_backward) rope_backward;
  decltype(&ref::attention_backward) attention_backward;
  decltype(&ref::mamba1_scan_backward) mamba1_scan_backward;
  decltype(&ref::ssd_scan_backward) ssd_scan_backward;
  decltype(&ref::ssd_scan_discrete_backward) ssd_scan_discrete_backward;
};

// The scalar oracle (src/kernels/ref) and the optimised CPU kernels (src/kernels/cpu, whose SIMD
// path is chosen inside each op: cpu::active_path()).
const KernelTable& ref_kernels();
const KernelTable& cpu_kernels();
// "ref" or "cpu"; throws Error naming the value otherwise.
const KernelTable& kernels_by_name(const std::string& name);

}  // namespace hybridlm
