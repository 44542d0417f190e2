// The training run of `hybridlm train --config train.yaml [--resume]` (docs/training.md): the model
// from the config (new, or `init: DIR`), the loop of optimizer steps over micro-batches, data
// parallel over MPI ranks, evaluation, metrics, the loss curve and atomic checkpoints.
#pragma once

#include <functional>
#include <string>

#include "train/train_config.h"

namespace hybridlm {

class Dist;

struct TrainRunOptions {
  bool resume = false;  // continue from the latest checkpoint under `out`
  bool quiet = false;   // no progress lines (errors still print)
  // Stop (as if killed) after this many optimizer steps of this process, without a final
  // checkpoint: the tests' way to interrupt a run at a known point. 0 = run to the end.
  int64_t stop_after = 0;
};

struct TrainRunResult {
  int64_t steps = 0;  // the step count reached
  double last_loss = 0;
  double last_val_loss = -1;  // < 0: no evaluation
};

// Runs (or resumes) the training `c` describes. Rank 0 writes the checkpoints, metrics.jsonl,
// loss_curve.svg and the progress lines (on stderr). Throws Error on bad input; nothing partial is
// left behind (checkpoints are written whole or not at all).
TrainRunResult run_training(TrainConfig c, const TrainRunOptions& opt, Dist& dist);

}  // namespace hybridlm
