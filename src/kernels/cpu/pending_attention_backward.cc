// PLACEHOLDER while these backward kernels are written on a branch: throws. Deleted when they land.
#include "base/error.h"
#include "kernels/kernels.h"

namespace hybridlm::cpu {

void gated_rmsnorm_backward(const KernelContext&, const float*, const float*, int, const float*, int, int, int,
                            float, const float*, float*, float*, int, float*) {
  throw Error("gated_rmsnorm_backward is not implemented yet");
}

void rope_backward(const KernelContext&, float*, int, int, int, int, int, int, float) {
  throw Error("rope_backward is not implemented yet");
}

void attention_backward(const KernelContext&, const float*, int, const float*, const float*, int, int, int, int,
                        float, const float*, float*, float*, float*) {
  throw Error("attention_backward is not implemented yet");
}

}  // namespace hybridlm::cpu
