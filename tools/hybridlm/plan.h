// `hybridlm plan`: memory planning from a config alone: weights, per-sequence state, KV per
// token, and how many sequences of a given context fit in a given memory.
#pragma once

#include <string>

namespace hybridlm {

// The sizing flags default to what the runtime uses (ModelFlags: add_plan copies them): a plan
// with the same flags as `generate` sizes what that run allocates.
struct PlanOptions {
  std::string model_dir;    // -m DIR (reads DIR/config.json, and the safetensors headers for --dtype auto)
  std::string config_file;  // or --config FILE (--dtype auto reads its torch_dtype)
  std::string dtype;        // weights: auto, f32, bf16, q8_0, q4_0 (resolve_weight_dtype)
  std::string state_dtype;  // SSM/conv state: f32, bf16, f16
  std::string kv_dtype;     // attention KV cache: f32, bf16, f16
  std::string memory = "16GiB";
  long long context = 0;
  bool json = false;
};

int run_plan(const PlanOptions& opt);
// "16GiB", "512MiB", "1.5GB", "2000000000" -> bytes; throws Error naming the flag.
double parse_memory_size(const std::string& s);

}  // namespace hybridlm
