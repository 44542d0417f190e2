// What a block needs to know about one run of a varlen batch: its tokens' rows and the cache of
// the sequence it continues.
#pragma once

#include "kernels/kernels.h"

namespace hybridlm {

struct SeqRun {
  int start = 0;        // first row of this run in the batch's (T, ...) activations
  int len = 0;          // number of tokens
  int pos0 = 0;         // tokens the sequence held before this run (position of its first token)
  float* conv_state = nullptr;  // (K-1, conv channels) of this sequence for this layer
  float* ssm_state = nullptr;   // the layer's SSM state of this sequence
  PagedKv kv;                   // attention layers: the sequence's KV pages, room made for len more
};

}  // namespace hybridlm
