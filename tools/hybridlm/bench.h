// `hybridlm bench`: llama-bench-style prompt (pp) and generation (tg) throughput over sweeps of
// prompt sizes, generation lengths, thread counts and batch sizes, with the machine's read
// bandwidth and FMA peak measured in the same run as the baselines.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/engine.h"

namespace hybridlm {

// -o: a markdown table (llama-bench's default), CSV with a header row, a JSON array, or one JSON
// object per line.
enum class BenchOutput { Markdown, Csv, Json, Jsonl };

struct BenchOptions {
  std::string model_dir;
  EngineOptions engine;                 // threads, max_sequences and context are set from the sweeps
  std::vector<int> prompt_tokens{512};  // one pp test per size (none when the list is {0})
  std::vector<int> gen_tokens{128};     // one tg test per size and batch (none when {0})
  std::vector<int> threads{0};          // every test runs at each; 0 = all cores
  std::vector<int> batch{1};            // sequences decoding together in tg
  // Tokens of context every test starts from (llama-bench's -d): each depth's context is filled
  // once (random ids, not timed) and every repetition's sequences are forks of it.
  std::vector<int> depths{0};
  int reps = 3;
  BenchOutput output = BenchOutput::Markdown;
  bool probe = true;  // measure the machine's peaks (and report the rates as fractions of them)
  bool profile = false;  // time every kernel op and report each test's ms per step by op
  uint64_t seed = 1;
};

int run_bench(const BenchOptions& opt);

// "128, 512" -> {128, 512}; an empty item, or one that is not an integer in [lo, hi], is an Error
// naming `flag` and the item. A 0 among other sizes is dropped by run_bench (it means "no test").
std::vector<int> parse_int_list(const std::string& s, const char* flag, int lo, int hi);

// "md", "csv", "json", "jsonl"; anything else is an Error naming -o.
BenchOutput parse_bench_output(const std::string& s);

}  // namespace hybridlm
