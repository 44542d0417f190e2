// PLACEHOLDER while the scan backward kernels are written on a branch: throws. Deleted when they land.
#include "base/error.h"
#include "kernels/kernels.h"

namespace hybridlm::cpu {

void mamba1_scan_backward(const KernelContext&, const float*, int, const float*, const float*, const float*,
                          const float*, int, const float*, const float*, int, const float*, int, int, int,
                          const float*, float*, int, float*, float*, float*, float*, int, float*, float*, int,
                          float*) {
  throw Error("mamba1_scan_backward is not implemented yet");
}

void ssd_scan_backward(const KernelContext&, const float*, int, const float*, const float*, const float*,
                       const float*, int, const float*, const SsdDims&, int, const float*, int, const float*,
                       float*, int, float*, float*, float*, float*, int, float*, float*) {
  throw Error("ssd_scan_backward is not implemented yet");
}

}  // namespace hybridlm::cpu
