// Sizes that follow from a config alone (no weights loaded): parameter count, weight bytes, the
// per-sequence recurrent state and the KV bytes per token: what `hybridlm plan` reports and what
// admission control will use.
#pragma once

#include <cstddef>
#include <vector>

#include "cache/state_pool.h"
#include "models/config.h"

namespace hybridlm {

// One LayerStateSpec per layer (conv state + SSM state element counts).
std::vector<LayerStateSpec> state_specs(const HybridConfig& c);

// Parameters implied by the config, counted tensor by tensor as the loader reads them.
size_t param_count(const HybridConfig& c);
// Of which: the parameters of the large matrices (which --dtype stores), the rest being f32.
size_t matrix_param_count(const HybridConfig& c);

// KV-cache bytes per token per sequence, for attention layers (none yet: 0).
size_t kv_bytes_per_token(const HybridConfig& c, size_t kv_dtype_bytes);

}  // namespace hybridlm
