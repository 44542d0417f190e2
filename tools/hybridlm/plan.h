// `hybridlm plan`: memory planning from a config alone: weights, per-sequence state, KV per
// token, and how many sequences of a given context fit in a given memory.
#pragma once

#include <string>

namespace hybridlm {

struct PlanOptions {
  std::string model_dir;    // -m DIR (reads DIR/config.json)
  std::string config_file;  // or --config FILE
  std::string dtype = "bf16";        // weights: f32, bf16, f16
  std::string state_dtype = "f32";   // SSM/conv state: f32, bf16, f16
  std::string kv_dtype = "bf16";     // attention KV cache: f32, bf16, f16 (the runtime's default)
  std::string memory = "16GiB";
  long long context = 4096;
  bool json = false;
};

int run_plan(const PlanOptions& opt);
// "16GiB", "512MiB", "1.5GB", "2000000000" -> bytes; throws Error naming the flag.
double parse_memory_size(const std::string& s);

}  // namespace hybridlm
