// What a block needs to know about one run of a varlen batch: its tokens' rows and the state of
// the sequence it continues.
#pragma once

namespace hybridlm {

struct SeqRun {
  int start = 0;        // first row of this run in the batch's (T, ...) activations
  int len = 0;          // number of tokens
  float* conv_state = nullptr;  // (K-1, conv channels) of this sequence for this layer
  float* ssm_state = nullptr;   // the layer's SSM state of this sequence
};

}  // namespace hybridlm
