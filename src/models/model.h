// A loaded model: config + weights, and the forward pass over a varlen batch
// (ARCHITECTURE.md section 5). The model never owns sequence state: it reads and writes the
// HybridCache that the runtime hands it.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "cache/hybrid_cache.h"
#include "kernels/scratch.h"
#include "models/blocks/ffn.h"
#include "models/blocks/zamba2.h"
#include "models/blocks/mixer.h"
#include "models/config.h"
#include "models/weights.h"

namespace hybridlm {

struct LoadOptions {
  // Weights in memory; nullopt: --dtype auto, auto_weight_dtype of the checkpoint's own dtype
  // (checkpoint_weight_dtype).
  std::optional<WeightDType> dtype = WeightDType::F32;
  NormGrouping mamba2_norm = NormGrouping::Grouped;
  // Map the safetensors files; matrices already in the requested dtype are then used in place
  // (no copy). false reads the files into memory and converts every weight.
  bool use_mmap = true;
  // Hears of every tensor once read (progress, --verbose); may be empty.
  TensorLoadedFn on_tensor;
};

struct LayerWeights {
  std::vector<float> norm;       // (H) pre-mixer RMSNorm
  std::unique_ptr<Mixer> mixer;  // null: a feed-forward-only layer
  std::vector<float> ffn_norm;   // (H) pre-feed-forward RMSNorm
  FfnWeights ffn;
  Zamba2LayerWeights zamba;  // hybrid layers of Zamba2
};

// Per-forward scratch: the activations and the mixers' arena (Model::reserve sizes them for a
// number of tokens; a larger step grows them once). No allocation in a step within that size.
struct ForwardScratch {
  std::vector<float> h, xn, mix, mix2, rows, emb;
  HugeVector<float> arena;  // the mixers' and Zamba2 shared blocks' scratch (FloatArena)
  KernelScratch kernels;     // the kernels' per-thread scratch (kernels/scratch.h)
  int kernel_tokens = 0, kernel_threads = 0;  // what `kernels` is sized for
  FfnScratch ffn;
  std::vector<SeqRun> runs;
};

class Model {
 public:
  static Model load(const std::filesystem::path& dir, const LoadOptions& opt = {});

  const HybridConfig& config() const { return cfg_; }
  std::vector<LayerCacheSpec> cache_specs() const;
  size_t param_count() const { return params_; }
  // Bytes of every tensor as held in memory (copied or mapped), counted as it was loaded.
  size_t weight_bytes() const { return weight_bytes_; }
  size_t mapped_bytes() const { return mapped_bytes_; }
  // The dtype the big matrices are held in, and the checkpoint's own (checkpoint_weight_dtype).
  WeightDType weight_dtype() const { return dtype_; }
  DType stored_dtype() const { return stored_dtype_; }
  // Every tensor a model of this config declares (names, shapes, kinds), from the same loaders
  // that read a checkpoint: parameter counts and `plan` read this.
  static std::vector<TensorEntry> tensors(const HybridConfig& c);

  // Sizes `scratch` for steps of up to T tokens and `seqs` sequences on ctx's kernels and threads.
  void reserve(ForwardScratch& scratch, const KernelContext& ctx, int T, int seqs) const;
  // The largest shapes a step of T tokens hands the kernels (what sizes their scratch).
  KernelLimits kernel_limits(int T) const;

  // Throws Error naming the first id outside [0, vocab_size).
  void check_tokens(std::span<const int32_t> tokens) const;

  // tokens: the runs' tokens concatenated, in run order. logit_rows: rows (indices into tokens)
  // whose logits are wanted, ascending or not; logits: (logit_rows.size(), vocab).
  // Validates everything before touching the cache: a bad token id, a dead sequence or a full KV
  // cache throws Error and leaves every sequence as it was. On success each run's sequence has
  // grown by its tokens.
  void forward(const KernelContext& ctx, std::span<const int32_t> tokens, std::span<const BatchRun> runs,
               HybridCache& cache, std::span<const int> logit_rows, float* logits, ForwardScratch& scratch) const;

 private:
  // The embedding and every layer: h (T, H) in scratch. May write recurrent state and KV rows.
  void forward_layers(const KernelContext& ctx, std::span<const int32_t> tokens, std::span<const BatchRun> runs,
                      HybridCache& cache, ForwardScratch& scratch) const;
  // Every tensor, in one pass of the blocks' loaders over `r` (a checkpoint or a catalog).
  void load_weights(const TensorSource& r);
  // Floats of arena a step of T tokens takes (the largest layer's mixer or shared block).
  size_t scratch_floats(int T) const;
  // The kernels' scratch sized for steps of T tokens (grows only).
  void reserve_kernels(ForwardScratch& scratch, const KernelContext& ctx, int T) const;
  HybridConfig cfg_;
  Matrix embedding_;
  Matrix lm_head_;  // empty when tied
  std::vector<float> norm_f_;
  std::vector<LayerWeights> layers_;
  std::vector<SharedBlockWeights> shared_;  // Zamba2's shared transformer blocks
  int matmul_cols_ = 0;  // the widest matrix (a matmul's input width)
  size_t params_ = 0, weight_bytes_ = 0, mapped_bytes_ = 0;
  WeightDType dtype_ = WeightDType::F32;
  DType stored_dtype_ = DType::F32;
  std::shared_ptr<const Checkpoint> checkpoint_;  // kept while matrices point into its mapping
};

}  // namespace hybridlm
