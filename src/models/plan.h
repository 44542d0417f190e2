// Sizes that follow from a config alone (no weights loaded): parameter count, weight bytes, the
// per-sequence recurrent state and the KV bytes per token: what `hybridlm plan` reports and what
// admission control will use.
#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "cache/hybrid_cache.h"
#include "models/config.h"
#include "models/weights.h"

namespace hybridlm {

// One LayerCacheSpec per layer (its mixer's cache_spec(), plus Zamba2's shared-block KV): bytes
// at storage dtypes from cache_footprint (cache/hybrid_cache.h).
std::vector<LayerCacheSpec> cache_specs(const HybridConfig& c);

// Parameters implied by the config: the tensors the loaders declare (Model::tensors).
size_t param_count(const HybridConfig& c);
// Of which: the parameters of the large matrices (which --dtype stores), the rest being f32.
size_t matrix_param_count(const HybridConfig& c);
// Bytes the weights take in memory when copied at `dtype` (Model::weight_bytes() of a model loaded
// with --no-mmap; mapped matrices take rows x cols x dtype bytes instead of their panel padding).
size_t weight_bytes(const HybridConfig& c, WeightDType dtype);

// What one decode step of `batch` sequences reads of the weights at `dtype`, against all of them:
// every matrix once, except the experts of a mixture (only those the step's tokens are routed to:
// E (1 - (1 - k/E)^batch) of E experts when each token picks k uniformly, as random weights route)
// and an untied embedding (one row per token; a tied one is read whole as the head).
// Of what is read, the matrices the step multiplies by (`matmul_bytes`: all but an untied
// embedding and the vectors), and the multiply-adds per token through them (`matmul_macs`: each
// matrix's rows x cols once, the experts at k / E of theirs, as each token takes k of them).
struct WeightReads {
  double all = 0, read = 0;
  double matmul_bytes = 0, matmul_macs = 0;
};
WeightReads decode_weight_reads(const HybridConfig& c, WeightDType dtype, int batch);

// A model's own weight dtype, and where it was read.
struct StoredDType {
  DType dtype = DType::F32;
  std::string source;  // "safetensors headers", "config.json torch_dtype", ...
};
// From the safetensors headers in `dir` when it holds a checkpoint (checkpoint_weight_dtype),
// else from its config.json.
StoredDType stored_dtype(const std::filesystem::path& dir);
// From a config alone: its torch_dtype (f32 when absent, as transformers assumes).
StoredDType stored_dtype(const HybridConfig& c);
// --dtype as the CLI's loader (ModelFlags::options) and `plan` both resolve it: f32, bf16, q8_0, q4_0
// as given; auto: auto_weight_dtype of the model's own dtype, asking `stored` only then.
WeightDType resolve_weight_dtype(const std::string& flag, const std::function<StoredDType()>& stored);

}  // namespace hybridlm
