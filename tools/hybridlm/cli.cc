#include "tools/hybridlm/cli.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "base/error.h"
#include "tools/hybridlm/format.h"

namespace hybridlm {

std::vector<int32_t> parse_ids(const std::string& text, const char* flag) {
  std::vector<int32_t> ids;
  std::string s = text;
  const size_t first = s.find_first_not_of(" \t\n"), last = s.find_last_not_of(" \t\n");
  if (first != std::string::npos && s[first] == '[' && s[last] == ']') {  // a JSON array
    s = s.substr(first + 1, last - first - 1);
    if (s.find_first_not_of(" \t\n") == std::string::npos) return ids;
  }
  size_t at = 0;
  while (at <= s.size()) {
    const size_t comma = std::min(s.find(',', at), s.size());
    std::string item = s.substr(at, comma - at);
    const size_t b = item.find_first_not_of(" \t\n"), e = item.find_last_not_of(" \t\n");
    item = b == std::string::npos ? "" : item.substr(b, e - b + 1);
    bool ok = !item.empty() && item.size() <= 10 &&
              item.find_first_not_of("0123456789") == std::string::npos;
    const long long v = ok ? std::stoll(item) : -1;
    ok = ok && v <= INT32_MAX;
    if (!ok)
      throw Error(std::string(flag) + ": '" + item + "' is not a token id (expected comma-separated integers >= 0)");
    ids.push_back(static_cast<int32_t>(v));
    at = comma + 1;
  }
  return ids;
}

void ModelFlags::add(CLI::App* app, bool with_threads) {
  app->add_option("-m,--model", dir, "model directory (config.json, *.safetensors, tokenizer.json)")->required();
  app->add_option("--dtype", dtype, "weights in memory: f32, bf16 or q8_0 (int8 blocks of 32, converted at load)")->capture_default_str();
  app->add_option("--mamba2-norm", mamba2_norm,
                  "Mamba-2 gated norm: grouped (mamba_ssm, llama.cpp) or full (transformers torch path)")
      ->capture_default_str();
  if (with_threads) app->add_option("-t,--threads", threads, "threads (0 = all cores)");
  app->add_flag("--no-mmap", no_mmap, "read weights into memory instead of mapping the files");
  app->add_flag("--mlock", mlock, "lock the weights in RAM (no paging out; may need a higher RLIMIT_MEMLOCK)");
  app->add_option("-c,--ctx-size", ctx_size, "tokens per sequence the KV cache holds (attention layers only)")
      ->capture_default_str();
  app->add_option("--state-dtype", state_dtype, "recurrent state storage: f32, bf16 or f16 (half the memory)")
      ->capture_default_str();
  app->add_option("--kv-dtype", kv_dtype,
                  "attention KV cache storage: f32, bf16 or f16 (bf16/f16: half the memory; f32: exact)")
      ->capture_default_str();
  app->add_option("--kernels", kernels, "cpu (optimised) or ref (the scalar reference kernels, slow: for checking)")
      ->capture_default_str();
}
EngineOptions ModelFlags::options() const {
  EngineOptions o;
  o.load.dtype = parse_weight_dtype(dtype);
  check(mamba2_norm == "grouped" || mamba2_norm == "full", "--mamba2-norm ", mamba2_norm, ": use grouped or full");
  o.load.mamba2_norm = mamba2_norm == "full" ? NormGrouping::Full : NormGrouping::Grouped;
  o.load.use_mmap = !no_mmap;
  o.mlock = mlock;
  check(threads >= 0 && threads <= 1024, "--threads ", threads, ": must be in [0, 1024]");
  o.threads = threads;
  o.max_sequences = 1;
  check(ctx_size > 0 && ctx_size <= (1 << 24), "--ctx-size ", ctx_size, ": must be in [1, 2^24]");
  o.context = ctx_size;
  o.state_dtype = parse_cache_dtype("--state-dtype", state_dtype);
  o.kv_dtype = parse_cache_dtype("--kv-dtype", kv_dtype);
  try {
    o.kernels = &kernels_by_name(kernels);
  } catch (const Error& e) {
    throw Error(std::string("--") + e.what());
  }
  return o;
}

void report_mlock(const Engine& e) {
  if (!e.mlock_error().empty())
    std::fprintf(stderr, "warning: --mlock failed (%s): weights may be paged out (raise RLIMIT_MEMLOCK, ulimit -l)\n",
                 e.mlock_error().c_str());
}

void report_cache(Engine& e) {
  const HybridCache& c = e.cache();
  std::string line;
  if (c.has_state())
    line = std::string("state ") + cache_dtype_name(c.state_dtype()) + ", " +
           format_bytes(static_cast<double>(c.state_bytes_per_sequence())) + " per sequence";
  if (c.has_kv())
    line += std::string(line.empty() ? "" : "; ") + "KV " + cache_dtype_name(c.kv_dtype()) + ", " +
            format_bytes(static_cast<double>(c.kv_bytes_per_token())) + " per token";
  std::fprintf(stderr, "cache: %s\n", line.empty() ? "none" : line.c_str());
}

Tokenizer load_tokenizer(const std::string& dir) {
  const std::filesystem::path p = std::filesystem::path(dir) / "tokenizer.json";
  check(std::filesystem::exists(p), p.string(), ": not found (this command needs the model's tokenizer)");
  return Tokenizer::load(dir);
}

double token_logprob(const float* logits, int vocab, int32_t id) {
  const float mx = *std::max_element(logits, logits + vocab);
  double sum = 0;
  for (int v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(logits[v]) - mx);
  return static_cast<double>(logits[id]) - mx - std::log(sum);
}

namespace {
constexpr double kMaxLogitBytes = 4.0 * (1ull << 30);
}  // namespace

void check_logits_fit(size_t tokens, int vocab, const std::string& what) {
  const double bytes = static_cast<double>(tokens) * vocab * sizeof(float);
  check(bytes <= kMaxLogitBytes, what, ": ", tokens, " tokens x ", vocab, " vocab = ", format_bytes(bytes),
      " of logits, over the ", format_bytes(kMaxLogitBytes), " limit; use fewer tokens");
}

}  // namespace hybridlm
