// The CPU kernel table, and the choice between it and the reference by name.
#include "base/error.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/kernels.h"

namespace hybridlm {
namespace cpu {

ScratchNeed scratch_floats(const KernelLimits& limits) {
  return most(most(most(matmul_scratch(limits), ssm_scratch(limits)), scan_backward_scratch(limits)),
              gdn_scratch(limits));
}

#include "kernels/table.inc"
}  // namespace cpu

const KernelTable& cpu_kernels() {
  static const KernelTable table = cpu::kernel_table("cpu");
  return table;
}

const KernelTable& kernels_by_name(const std::string& name) {
  if (name == "cpu") return cpu_kernels();
  if (name == "ref") return ref_kernels();
  throw_error("kernels '", name, "': use cpu (optimised, the default) or ref (the scalar reference)");
}

}  // namespace hybridlm
