// What a block needs to know about one run of a varlen batch: its tokens' rows and the cache of
// the sequence it continues.
#pragma once

#include <algorithm>
#include <span>

#include "base/thread_pool.h"
#include "kernels/kernels.h"

namespace hybridlm {

struct SeqRun {
  int start = 0;        // first row of this run in the batch's (T, ...) activations
  int len = 0;          // number of tokens
  int pos0 = 0;         // tokens the sequence held before this run (position of its first token)
  float* conv_state = nullptr;  // (K-1, conv channels) of this sequence for this layer
  float* ssm_state = nullptr;   // the layer's SSM state of this sequence (f32), null when
  // ssm_state_bf16 is set: a decode step with bf16 storage, the stored state itself, updated in place.
  uint16_t* ssm_state_bf16 = nullptr;
  PagedKv kv;                   // attention layers: the sequence's KV pages, room made for len more
};

// fn(kernel_context, run) for every run. A batch of single-token runs (sequences decoding
// together) is split over the pool by sequence, each kernel call then on one thread: one parallel
// call per layer instead of one per sequence. The kernels split channels or heads, which never
// interact, so the results are the same either way.
template <class Fn>
void for_each_run(const KernelContext& ctx, std::span<const SeqRun> runs, Fn&& fn) {
  // (Only with at least one sequence per thread: fewer would leave threads idle.)
  const bool by_sequence = ctx.pool && ctx.pool->size() > 1 && runs.size() >= static_cast<size_t>(ctx.pool->size()) &&
                           std::all_of(runs.begin(), runs.end(), [](const SeqRun& r) { return r.len == 1; });
  if (!by_sequence) {
    for (const SeqRun& r : runs) fn(ctx, r);
    return;
  }
  // The same kernels and scratch, on the calling thread: each thread is then a kernel's caller
  // (thread 0's share of the scratch, for one token: Model::reserve_kernels).
  const KernelContext one{nullptr, ctx.ops, ctx.scratch};
  ctx.pool->parallel_for(runs.size(), [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) fn(one, runs[i]);
  });
}

}  // namespace hybridlm
