// The table of model families. Each family lives in one file of src/models/arch/ that owns its
// config keys (with Hugging Face defaults), its weight names and its quirks.
#pragma once

#include <string>
#include <vector>

#include "models/arch/json_keys.h"
#include "models/config.h"

namespace hybridlm {

struct Family {
  const char* model_type;                  // config.json "model_type"
  std::vector<const char*> architectures;  // config.json "architectures"[0]
  HybridConfig (*parse)(const JsonKeys& keys, NormGrouping mamba2_norm);
};

const std::vector<Family>& families();

// Adapters (one file each).
HybridConfig parse_mamba(const JsonKeys& keys, NormGrouping);
HybridConfig parse_falcon_mamba(const JsonKeys& keys, NormGrouping);
HybridConfig parse_mamba2(const JsonKeys& keys, NormGrouping mamba2_norm);

}  // namespace hybridlm
