#include "runtime/engine.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <algorithm>
#include <cmath>
#include <limits>
#include <thread>

#include "base/error.h"

namespace hybridlm {

const char* cache_dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
    default: return "?";
  }
}

DType parse_cache_dtype(const std::string& flag, const std::string& value) {
  for (DType t : {DType::F32, DType::BF16, DType::F16})
    if (value == cache_dtype_name(t)) return t;
  throw Error(flag + " " + value + ": use f32, bf16 or f16");
}

static int default_threads(int n) {
  if (n > 0) return n;
  return available_cores();
}

Engine::Engine(const std::filesystem::path& dir, const EngineOptions& opt)
    : model_(Model::load(dir, opt.load)), pool_(default_threads(opt.threads)) {
  ctx_.pool = &pool_;
  ctx_.ops = opt.kernels ? opt.kernels : &cpu_kernels();
  check(opt.max_sequences > 0, "max sequences must be > 0");
  check(opt.context > 0, "context must be > 0");
  check(opt.block_size > 0, "KV block size must be > 0");
  // The cache is sized by the config, not by the file: refuse one the machine cannot hold before
  // allocating it.
  const std::vector<LayerCacheSpec> specs = model_.cache_specs();
  const CacheFootprint fp = cache_footprint(specs, opt.state_dtype, opt.kv_dtype);
  const double slot_bytes = static_cast<double>(fp.state_per_sequence());
  const double kv_token_bytes = static_cast<double>(fp.kv_per_token);
  const double pages = opt.kv_pages > 0 ? opt.kv_pages
                                        : std::ceil(static_cast<double>(opt.context) / opt.block_size) * opt.max_sequences;
  const double state_need = slot_bytes * opt.max_sequences;
  const double kv_need = kv_token_bytes > 0 ? pages * opt.block_size * kv_token_bytes : 0;
  const double have = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  auto mib = [](double b) { return std::to_string(static_cast<long long>(b / (1 << 20))); };
  check(have <= 0 || state_need + kv_need <= have,
        "the cache of ", opt.max_sequences, " sequence(s) needs ", mib(state_need), " MiB of recurrent state + ",
        mib(kv_need), " MiB of KV at ", cache_dtype_name(opt.kv_dtype), ", more than this machine's ", mib(have),
        " MiB (lower the sequences or the context, or check the sizes in config.json)");
  CacheOptions co;
  co.max_sequences = opt.max_sequences;
  co.block_size = opt.block_size;
  co.kv_pages = opt.kv_pages;
  co.context = opt.context;
  co.state_dtype = opt.state_dtype;
  co.kv_dtype = opt.kv_dtype;
  cache_ = std::make_unique<HybridCache>(specs, co);
  // The step's activations and arena for the engine's limits: a prefill chunk (prefill()'s 512
  // tokens) or every sequence decoding at once. A larger step grows them once.
  model_.reserve(scratch_, ctx_, std::max(kPrefillChunk, opt.max_sequences), opt.max_sequences);
  if (opt.mlock && mlockall(MCL_CURRENT) != 0) mlock_error_ = std::strerror(errno);
  info_ = opt.info;
  if (opt.on_ready)
    opt.on_ready(*this, std::chrono::duration<double>(std::chrono::steady_clock::now() - created_).count());
}

std::span<const float> Engine::step(std::span<const int32_t> tokens, std::span<const BatchRun> runs,
                                    std::span<const int> logit_rows) {
  logits_.resize(logit_rows.size() * static_cast<size_t>(vocab_size()));
  model_.forward(ctx_, tokens, runs, *cache_, logit_rows, logits_.data(), scratch_);
  return logits_;
}

std::vector<float> Engine::prefill(int seq, std::span<const int32_t> tokens, bool all_logits, int chunk) {
  check(!tokens.empty(), "empty prompt: nothing to evaluate");
  check(chunk > 0, "prefill chunk must be > 0");
  // Validate the whole prompt before the first chunk runs, so a bad id late in a long prompt
  // cannot leave the sequence half-advanced.
  check(cache_->is_live(seq), "sequence ", seq, " is not in the cache");
  model_.check_tokens(tokens);
  // And check that the whole prompt fits: a prompt longer than the KV cache can hold fails here,
  // not after half of it has been absorbed.
  if (const int64_t need = cache_->pages_needed(seq, static_cast<int64_t>(tokens.size())); need > cache_->free_pages())
    throw Error("prompt of " + std::to_string(tokens.size()) + " tokens does not fit the KV cache: it needs " +
                std::to_string(need * cache_->block_size()) + " more token slots, " +
                std::to_string(static_cast<int64_t>(cache_->free_pages()) * cache_->block_size()) +
                " are free (raise --ctx-size)");
  std::vector<float> out;
  std::vector<int> rows;
  for (size_t b = 0; b < tokens.size(); b += static_cast<size_t>(chunk)) {
    const int n = static_cast<int>(std::min<size_t>(chunk, tokens.size() - b));
    const BatchRun run{seq, n};
    rows.clear();
    const bool last_chunk = b + static_cast<size_t>(n) == tokens.size();
    if (all_logits)
      for (int i = 0; i < n; ++i) rows.push_back(i);
    else if (last_chunk)
      rows.push_back(n - 1);
    std::span<const float> l = step(tokens.subspan(b, n), std::span(&run, 1), rows);
    out.insert(out.end(), l.begin(), l.end());
  }
  return out;
}

std::string StopMatcher::push(const std::string& text) {
  if (stopped_) return {};
  held_ += text;
  // The earliest occurrence of any stop string wins (one token can complete several).
  size_t first = std::string::npos;
  for (const std::string& s : stops_)
    if (!s.empty()) first = std::min(first, held_.find(s));
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // Keep the longest tail of held_ that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const std::string& s : stops_)
    for (size_t k = std::min(s.size() - (s.empty() ? 0 : 1), held_.size()); k > keep; --k)
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
        keep = k;
        break;
      }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopMatcher::flush() {
  std::string out;
  if (!stopped_) out.swap(held_);
  return out;
}

GenerateResult generate(Engine& engine, const Tokenizer& tok, std::span<const int32_t> prompt,
                        const GenerateOptions& opt, const std::function<void(const std::string&)>& on_text) {
  using clock = std::chrono::steady_clock;
  GenerateResult res;
  res.prompt_tokens = static_cast<int>(prompt.size());
  Sampler sampler(opt.sampling);
  StreamDecoder stream(tok);
  StopMatcher stops(opt.stop_strings);
  std::vector<int32_t> history(prompt.begin(), prompt.end());

  const int slot = engine.new_sequence();
  struct Release {
    Engine& e;
    int s;
    ~Release() { e.free_sequence(s); }
  } release{engine, slot};

  auto emit = [&](const std::string& piece) {
    std::string out = stops.push(piece);
    res.text += out;
    if (!out.empty()) on_text(out);
  };
  auto t0 = clock::now();
  std::vector<float> logits = engine.prefill(slot, prompt, false);
  auto t1 = clock::now();
  res.prompt_seconds = std::chrono::duration<double>(t1 - t0).count();
  res.stop_reason = "length";
  // Checkpoints pad the embedding past the tokenizer (mamba-*-hf: 50280 rows, 50277 tokens);
  // ids the tokenizer cannot decode are never sampled.
  const size_t decodable = std::min<size_t>(logits.size(), static_cast<size_t>(tok.vocab_size()));
  for (int i = 0; i < opt.max_new_tokens; ++i) {
    std::fill(logits.begin() + decodable, logits.end(), -std::numeric_limits<float>::infinity());
    const int32_t next = sampler.sample(logits, history);
    res.tokens.push_back(next);
    history.push_back(next);
    if (opt.stop_at_eos && opt.eos_id && next == *opt.eos_id) {
      res.stop_reason = "eos";
      break;
    }
    emit(stream.push(next));
    if (stops.stopped()) {
      res.stop_reason = "stop";
      break;
    }
    if (i + 1 == opt.max_new_tokens) break;
    const BatchRun run{slot, 1};
    const int row = 0;
    std::span<const float> l = engine.step(std::span(&next, 1), std::span(&run, 1), std::span(&row, 1));
    logits.assign(l.begin(), l.end());  // the sampler edits its copy; capacity is reused
  }
  if (!stops.stopped()) {
    emit(stream.flush());
    std::string rest = stops.flush();
    res.text += rest;
    if (!rest.empty()) on_text(rest);
  }
  res.generate_seconds = std::chrono::duration<double>(clock::now() - t1).count();
  return res;
}

}  // namespace hybridlm
