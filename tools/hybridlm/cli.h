// What the hybridlm subcommands share: the model-loading flags, the one-line reports on stderr,
// and the registration of a subcommand (its flags and the function that runs it once parsed).
// Exit codes: 0 success, 1 a user error (one line on stderr naming the file, tensor, key or value
// at fault), 2 a usage error.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "io/tokenizer.h"
#include "runtime/engine.h"

namespace hybridlm {

// A registered subcommand: its CLI11 app, and what runs when the command line chose it.
struct Subcommand {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

// One per file of tools/hybridlm: each adds its subcommand and flags to `parent`.
Subcommand add_generate(CLI::App& parent);
Subcommand add_score(CLI::App& parent);
Subcommand add_perplexity(CLI::App& parent);
Subcommand add_tokenize(CLI::App& parent);
Subcommand add_inspect(CLI::App& parent);
Subcommand add_bench(CLI::App& parent);
Subcommand add_plan(CLI::App& parent);
Subcommand add_train_tokenizer(CLI::App& parent);
Subcommand add_prepare_data(CLI::App& parent);
Subcommand add_grad(CLI::App& parent);
Subcommand add_train(CLI::App& parent);
Subcommand add_serve(CLI::App& parent);
Subcommand add_chat(CLI::App& parent);

// "1, 2,3" or "[1, 2, 3]" (as tokenize prints them) -> {1, 2, 3}; "[]" -> {}; an item that is not
// an integer in [0, 2^31) is an Error naming `flag`.
std::vector<int32_t> parse_ids(const std::string& s, const char* flag);

// Options every model-loading subcommand shares. Their defaults are the runtime's (EngineOptions),
// and `plan` takes the same defaults (plan.cc).
struct ModelFlags {
  std::string dir;  // -m: the model directory (a file given inside one is read as its directory)
  std::string dtype = "auto";  // resolve_weight_dtype (models/plan.h)
  std::string mamba2_norm = "grouped";
  int threads = 0;
  int ctx_size = 4096;
  std::string state_dtype = cache_dtype_name(EngineOptions{}.state_dtype);  // f32
  std::string kernels = "cpu";
  std::string kv_dtype = cache_dtype_name(EngineOptions{}.kv_dtype);  // bf16
  bool no_mmap = false, mlock = false;
  // --quiet: no load summary, progress or cache lines (errors and warnings still print);
  // --verbose: also a line per checkpoint tensor and progress however fast the load.
  bool quiet = false, verbose = false;

  // default_model: -m may be left out, for the shipped model (default_model_dir()).
  void add(CLI::App* app, bool with_threads = true, bool default_model = false);
  // The flags as EngineOptions, checked (the model path first, then every value); --dtype auto
  // resolved from the checkpoint's headers. Warns on stderr of --threads above the CPUs there
  // are. The options report loading on stderr as --quiet / --verbose say.
  EngineOptions options() const;
};

// The model `generate` runs without -m: $HYBRIDLM_DEFAULT_MODEL, else the repository's
// models/default (trained by this engine: scripts/train_default_model.sh).
std::string default_model_dir();

// A checkpoint dtype in the CLI's spelling: "BF16" (safetensors) -> "bf16".
std::string lower_dtype(DType t);
// -m's value: a file inside a model directory (DIR/model.safetensors, DIR/config.json) stands for
// DIR; anything else is kept as given.
std::string model_dir_of(std::string path);
// The model's name: its directory's last component ("/data/mamba2-130m/" -> "mamba2-130m").
std::string model_name(const std::string& dir);
// -m's path, or an Error naming it when it does not exist (before anything reads the model).
void check_model_path(const std::string& dir);

// --mlock that the OS refused is a warning, as in llama.cpp: the run still works, just unlocked.
void report_mlock(const Engine& e);
// The cache storage a run actually used (after defaults), one line through Engine::info (stderr
// unless --quiet): "cache: state bf16, 1.2 MiB per sequence; KV bf16, 4 KiB per token".
void report_cache(Engine& e);
// DIR/tokenizer.json, else DIR/tokenizer.model (SentencePiece), or an Error saying the command
// needs it (check_model_path first).
Tokenizer load_tokenizer(const std::string& dir);
bool has_tokenizer(const std::string& dir);  // DIR holds tokenizer.json or tokenizer.model
// log softmax(logits)[id] over a row of `vocab` logits, in double.
double token_logprob(const float* logits, int vocab, int32_t id);

// A text file, or an Error naming it: missing, a directory, over `max_bytes` ("over the 256 MiB
// limit for <purpose>"), or binary (a NUL byte, invalid UTF-8).
std::string read_text_file(const std::string& file, uint64_t max_bytes, const char* purpose);

// Logits of every position are (tokens x vocab) floats; refuse sizes that cannot be held.
void check_logits_fit(size_t tokens, int vocab, const std::string& what);

}  // namespace hybridlm
