// Sizes that follow from a config alone (no weights loaded): parameter count, weight bytes, the
// per-sequence recurrent state and the KV bytes per token: what `hybridlm plan` reports and what
// admission control will use.
#pragma once

#include <cstddef>
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


}  // namespace hybridlm
