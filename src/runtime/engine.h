// The runtime: a loaded model, a thread pool, the per-sequence state slots and the forward
// scratch, with the operations generation is built from (ARCHITECTURE.md sections 4-5).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/thread_pool.h"
#include "cache/hybrid_cache.h"
#include "io/tokenizer.h"
#include "models/model.h"
#include "runtime/sampler.h"

namespace hybridlm {

class Engine;

struct EngineOptions {
  LoadOptions load;
  int threads = 0;        // 0 = hardware concurrency
  int max_sequences = 8;  // state slots
  int context = 4096;     // tokens per sequence the KV cache is sized for (attention models)
  int block_size = 16;    // tokens per KV page
  int kv_pages = 0;       // 0 = max_sequences x context / block_size
  DType state_dtype = DType::F32;  // recurrent state storage: F32, BF16 or F16
  // KV cache storage of attention layers: F32, BF16 or F16. BF16 by default, as llama.cpp and vLLM
  // default to 16-bit KV: half the memory and traffic of f32 for ~2^-9 relative rounding per
  // stored value (docs/numerics.md); F32 reproduces the exact computation. Unused without
  // attention layers.
  DType kv_dtype = DType::BF16;
  bool mlock = false;  // lock the loaded weights (and everything else mapped now) in RAM
  // The kernels every forward calls: cpu_kernels() (the default) or ref_kernels(), the scalar
  // oracle, to run a whole model on the reference (slow; for checking, kernels_by_name).
  const KernelTable* kernels = nullptr;  // nullptr = cpu_kernels()
  // Reports for a person (the CLI sets them from --quiet / --verbose, tools/hybridlm/cli.cc);
  // empty: silent. Errors are thrown, never reported here. on_ready: once the engine is built,
  // with the seconds loading and allocating took; info: informational lines (the cache a run used).
  std::function<void(const Engine&, double seconds)> on_ready;
  std::function<void(const std::string&)> info;
};

// The spelling of cache dtypes on the command line (--state-dtype, --kv-dtype): "f32", "bf16",
// "f16"; parse_cache_dtype throws an Error naming the flag for anything else.
const char* cache_dtype_name(DType t);
DType parse_cache_dtype(const std::string& flag, const std::string& value);

class Engine {
 public:
  Engine(const std::filesystem::path& dir, const EngineOptions& opt);

  const Model& model() const { return model_; }
  HybridCache& cache() { return *cache_; }
  const HybridCache& cache() const { return *cache_; }
  int vocab_size() const { return model_.config().vocab_size; }
  int threads() const { return pool_.size(); }
  // Parallel regions the engine's thread pool has run so far (ThreadPool::regions).
  uint64_t parallel_regions() const { return pool_.regions(); }
  const KernelTable& kernels() const { return *ctx_.ops; }
  // With EngineOptions::mlock: whether locking succeeded ("" if so, else the reason).
  const std::string& mlock_error() const { return mlock_error_; }
  // An informational line through EngineOptions::info (dropped without one).
  void info(const std::string& line) const {
    if (info_) info_(line);
  }

  int new_sequence() { return cache_->add(); }
  void free_sequence(int seq) { cache_->remove(seq); }

  // One varlen forward step: runs[i] continues sequence runs[i].seq with runs[i].len tokens taken in
  // order from `tokens`. Returns logits (rows, vocab) for the requested rows: a view of the
  // engine's buffer, valid until the next step (no allocation per step once warm).
  std::span<const float> step(std::span<const int32_t> tokens, std::span<const BatchRun> runs,
                          std::span<const int> logit_rows);
  // Feeds `tokens` to one sequence in chunks of at most `chunk` tokens; returns the logits of
  // every position when all_logits, else of the last position only.
  static constexpr int kPrefillChunk = 512;
  std::vector<float> prefill(int seq, std::span<const int32_t> tokens, bool all_logits, int chunk = kPrefillChunk);

 private:
  std::chrono::steady_clock::time_point created_ = std::chrono::steady_clock::now();  // before the load
  Model model_;
  ThreadPool pool_;
  KernelContext ctx_;
  std::unique_ptr<HybridCache> cache_;
  ForwardScratch scratch_;
  std::vector<float> logits_;
  std::string mlock_error_;
  std::function<void(const std::string&)> info_;
};

struct GenerateOptions {
  int max_new_tokens = 128;
  SamplingParams sampling;
  std::vector<std::string> stop_strings;
  bool stop_at_eos = true;
  std::optional<int32_t> eos_id;
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids
  std::string text;             // generated text (cut before a stop string)
  std::string stop_reason;      // "eos", "length", "stop"
  int prompt_tokens = 0;
  double prompt_seconds = 0, generate_seconds = 0;
};

// Prefill `prompt` in a fresh sequence, then sample up to max_new_tokens. on_text receives the text
// as it becomes final: complete UTF-8 characters only, never a part of a stop string.
GenerateResult generate(Engine& engine, const Tokenizer& tok, std::span<const int32_t> prompt,
                        const GenerateOptions& opt, const std::function<void(const std::string&)>& on_text);

// Holds back text that may still turn into a stop string. push() returns what is safe to print;
// stopped() tells that a stop string was seen (the text before it has been returned).
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  std::string push(const std::string& text);
  std::string flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace hybridlm
