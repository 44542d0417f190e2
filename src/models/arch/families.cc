#include "models/arch/families.h"

namespace hybridlm {

const std::vector<Family>& families() {
  static const std::vector<Family> table = {
      {"mamba", {"MambaForCausalLM"}, parse_mamba},
      {"falcon_mamba", {"FalconMambaForCausalLM"}, parse_falcon_mamba},
      {"mamba2", {"Mamba2ForCausalLM"}, parse_mamba2},
  };
  return table;
}

}  // namespace hybridlm
