// Where a forward's time goes, by kernel op (`hybridlm bench --profile`): a KernelTable whose every
// op times the call it forwards to another table (cpu_kernels(), or ref_kernels()). An op is
// timed on the thread that runs the forward, outermost calls only; ops that a parallel region's
// worker threads call through the table (Mamba-1's fused decode region) are not timed there, and
// the time the calling thread waits in such a region outside any op is nobody's (the caller's
// "other": its wall time less the ops').
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/kernels.h"

namespace hybridlm {

// The profiling table, forwarding to `inner`. One inner table at a time: a later call retargets
// the one table every caller holds.
const KernelTable& profiling_kernels(const KernelTable& inner);

// Seconds and calls per op since the last reset, ops never called left out, in KernelTable order.
struct OpTime {
  std::string op;
  double seconds = 0;
  int64_t calls = 0;
};
void reset_kernel_profile();
std::vector<OpTime> kernel_profile();

}  // namespace hybridlm
