// `hybridlm bench`: llama-bench-style prompt (pp) and generation (tg) throughput, with the
// machine's read bandwidth and FMA peak measured in the same run as the baselines.
#pragma once

#include <string>

#include "runtime/engine.h"

namespace hybridlm {

struct BenchOptions {
  std::string model_dir;
  EngineOptions engine;  // max_sequences is set from batch
  int prompt_tokens = 512;
  int gen_tokens = 128;
  int reps = 3;
  int batch = 1;
  bool json = false;
  uint64_t seed = 1;
};

int run_bench(const BenchOptions& opt);

}  // namespace hybridlm
