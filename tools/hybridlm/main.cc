// hybridlm: one binary, one subcommand per job. Exit codes: 0 success, 1 a user error (one line on
// stderr naming the file, tensor, key or value at fault), 2 a usage error.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "base/error.h"
#include "io/npy.h"
#include "io/tokenizer.h"
#include "runtime/batch.h"
#include "runtime/engine.h"
#include "tools/hybridlm/bench.h"
#include "tools/hybridlm/format.h"
#include "tools/hybridlm/plan.h"

namespace hybridlm {
namespace {

std::vector<int32_t> parse_ids(const std::string& s, const char* flag) {
  std::vector<int32_t> ids;
  size_t at = 0;
  while (at <= s.size()) {
    const size_t comma = std::min(s.find(',', at), s.size());
    std::string item = s.substr(at, comma - at);
    const size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
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

// Options every model-loading subcommand shares.
struct ModelFlags {
  std::string dir;
  std::string dtype = "f32";
  std::string mamba2_norm = "grouped";
  int threads = 0;
  int ctx_size = 4096;
  std::string state_dtype = "f32";
  std::string kernels = "cpu";
  std::string kv_dtype = cache_dtype_name(EngineOptions{}.kv_dtype);  // bf16
  bool no_mmap = false, mlock = false;

  void add(CLI::App* app, bool with_threads = true) {
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
  EngineOptions options() const {
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
};

// --mlock that the OS refused is a warning, as in llama.cpp: the run still works, just unlocked.
void report_mlock(const Engine& e) {
  if (!e.mlock_error().empty())
    std::fprintf(stderr, "warning: --mlock failed (%s): weights may be paged out (raise RLIMIT_MEMLOCK, ulimit -l)\n",
                 e.mlock_error().c_str());
}

// The cache storage a run actually used (after defaults), one line on stderr: "cache: state bf16,
// 1.2 MiB per sequence; KV bf16, 4 KiB per token".
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

// Logits of every position are (tokens x vocab) floats; refuse sizes that cannot be held.
constexpr double kMaxLogitBytes = 4.0 * (1ull << 30);
void check_logits_fit(size_t tokens, int vocab, const std::string& what) {
  const double bytes = static_cast<double>(tokens) * vocab * sizeof(float);
  check(bytes <= kMaxLogitBytes, what, ": ", tokens, " tokens x ", vocab, " vocab = ", format_bytes(bytes),
      " of logits, over the ", format_bytes(kMaxLogitBytes), " limit; use fewer tokens");
}


// ---- generate -----------------------------------------------------------------------------------
int cmd_generate(const ModelFlags& mf, const std::string& prompt, const GenerateOptions& gopt_in, int num_beams) {
  // Flags and the tokenizer first: a bad value should not wait for the weights to load.
  GenerateOptions gopt = gopt_in;
  check(gopt.max_new_tokens >= 0, "-n/--n-predict must be >= 0");
  validate(gopt.sampling);
  check(num_beams >= 1 && num_beams <= 256, "--num-beams ", num_beams, ": must be in [1, 256]");
  check(num_beams == 1 || gopt.stop_strings.empty(), "--stop is not supported with --num-beams > 1");
  Tokenizer tok = load_tokenizer(mf.dir);
  EngineOptions eo = mf.options();
  eo.max_sequences = num_beams;
  Engine engine(mf.dir, eo);
  report_mlock(engine);
  gopt.eos_id = tok.eos_id() ? tok.eos_id() : engine.model().config().eos_token_id;
  std::vector<int32_t> ids = tok.encode(prompt);
  check(!ids.empty(), "the prompt is empty after tokenization");
  engine.model().check_tokens(ids);
  if (engine.cache().has_kv())
    check(static_cast<int64_t>(ids.size()) + gopt.max_new_tokens <= mf.ctx_size,
          "the prompt (", ids.size(), " tokens) plus -n ", gopt.max_new_tokens, " exceeds --ctx-size ", mf.ctx_size);
  if (num_beams > 1) {  // deterministic: the sampling flags do not apply
    BeamOptions bo;
    bo.num_beams = num_beams;
    bo.max_new_tokens = std::max(1, gopt.max_new_tokens);
    if (gopt.stop_at_eos) bo.eos_id = gopt.eos_id;
    bo.decodable = static_cast<int32_t>(std::min<int64_t>(tok.vocab_size(), engine.vocab_size()));
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<BeamHypothesis> hyps = beam_search(engine, ids, bo);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::vector<int32_t> best = hyps.front().tokens;
    if (bo.eos_id && !best.empty() && best.back() == *bo.eos_id) best.pop_back();
    std::cout << prompt << tok.decode(best) << std::endl;
    std::fprintf(stderr, "beam search: %d beams, %zu tokens in %.3f s, best logprob %.4f (score %.4f)\n", num_beams,
                 hyps.front().tokens.size(), secs, hyps.front().logprob, hyps.front().score);
    report_cache(engine);
    return 0;
  }
  std::cout << prompt << std::flush;
  GenerateResult r = generate(engine, tok, ids, gopt, [](const std::string& s) { std::cout << s << std::flush; });
  std::cout << std::endl;
  const double gen_tps = r.tokens.size() > 1 ? (r.tokens.size() - 1) / r.generate_seconds : 0.0;
  std::fprintf(stderr, "prompt eval: %d tokens in %.3f s (%.1f tokens/s)\n", r.prompt_tokens, r.prompt_seconds,
               r.prompt_tokens / std::max(r.prompt_seconds, 1e-9));
  std::fprintf(stderr, "generation: %zu tokens in %.3f s (%.1f tokens/s), stop: %s\n", r.tokens.size(),
               r.generate_seconds, gen_tps, r.stop_reason.c_str());
  report_cache(engine);
  std::fprintf(stderr, "peak RSS: %s\n", format_bytes(peak_rss_bytes()).c_str());
  return 0;
}

// ---- score --------------------------------------------------------------------------------------
int cmd_score(const ModelFlags& mf, const std::string& prompt, const std::string& ids_str, const std::string& out) {
  check(prompt.empty() != ids_str.empty(), "give exactly one of -p/--prompt or --ids");
  std::vector<int32_t> ids = ids_str.empty() ? load_tokenizer(mf.dir).encode(prompt) : parse_ids(ids_str, "--ids");
  check(!ids.empty(), "the prompt is empty after tokenization");
  EngineOptions o = mf.options();
  o.context = std::max<int>(o.context, static_cast<int>(std::min<size_t>(ids.size(), 1 << 24)));
  Engine engine(mf.dir, o);
  report_mlock(engine);
  engine.model().check_tokens(ids);
  check_logits_fit(ids.size(), engine.vocab_size(), "score");
  const int slot = engine.new_sequence();
  std::vector<float> logits = engine.prefill(slot, ids, true);
  write_npy_f32(out, logits.data(), {static_cast<int64_t>(ids.size()), engine.vocab_size()});
  std::fprintf(stderr, "wrote logits (%zu, %d) to %s\n", ids.size(), engine.vocab_size(), out.c_str());
  report_cache(engine);
  return 0;
}

// ---- perplexity ---------------------------------------------------------------------------------
int cmd_perplexity(const ModelFlags& mf, const std::string& file, int ctx) {
  check(ctx >= 2, "--ctx must be >= 2");
  std::ifstream in(file, std::ios::binary);
  check(static_cast<bool>(in), file, ": cannot open");
  std::error_code ec;
  const auto fsize = std::filesystem::file_size(file, ec);
  check(!ec && fsize <= (256u << 20), file, ": ", (ec ? ec.message() : format_bytes(static_cast<double>(fsize)) +
                                                                   ", over the 256 MiB limit for one perplexity run"));
  std::stringstream text;
  text << in.rdbuf();
  Tokenizer tok = load_tokenizer(mf.dir);
  EngineOptions o = mf.options();
  o.context = ctx;
  Engine engine(mf.dir, o);
  report_mlock(engine);
  std::vector<int32_t> ids = tok.encode(text.str(), false);
  check(ids.size() >= 2, file, ": needs at least 2 tokens, has ", ids.size());
  engine.model().check_tokens(ids);
  check_logits_fit(std::min<size_t>(ctx, ids.size()), engine.vocab_size(), "--ctx");
  double nll = 0;
  size_t count = 0;
  auto t0 = std::chrono::steady_clock::now();
  const int V = engine.vocab_size();
  // Non-overlapping windows of ctx tokens, each from a fresh state; score tokens 1..n-1 of each.
  for (size_t b = 0; b + 1 < ids.size(); b += static_cast<size_t>(ctx)) {
    const size_t n = std::min<size_t>(ctx, ids.size() - b);
    if (n < 2) break;
    const int slot = engine.new_sequence();
    std::vector<float> logits = engine.prefill(slot, std::span(ids).subspan(b, n), true);
    engine.free_sequence(slot);
    for (size_t i = 0; i + 1 < n; ++i) {
      const float* l = logits.data() + i * V;
      const float mx = *std::max_element(l, l + V);
      double s = 0;
      for (int v = 0; v < V; ++v) s += std::exp(static_cast<double>(l[v]) - mx);
      nll += std::log(s) + mx - l[ids[b + i + 1]];
      ++count;
    }
    std::fprintf(stderr, "\r[%zu/%zu tokens] running perplexity %.4f", b + n, ids.size(), std::exp(nll / count));
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "\n%zu tokens scored in %.2f s (%.1f tokens/s)\n", count, secs, count / secs);
  report_cache(engine);
  std::printf("perplexity: %.4f over %zu tokens (ctx %d)\n", std::exp(nll / count), count, ctx);
  return 0;
}

// ---- tokenize -----------------------------------------------------------------------------------
int cmd_tokenize(const std::string& dir, const std::string& prompt, const std::string& decode_ids, bool no_special) {
  check(prompt.empty() != decode_ids.empty(), "give exactly one of -p/--prompt or --decode");
  Tokenizer tok = load_tokenizer(dir);
  if (!decode_ids.empty()) {
    std::vector<int32_t> ids = parse_ids(decode_ids, "--decode");
    std::cout << tok.decode(ids) << std::endl;
    return 0;
  }
  std::vector<int32_t> ids = tok.encode(prompt, !no_special);
  std::cout << "[";
  for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? ", " : "") << ids[i];
  std::cout << "]" << std::endl;
  return 0;
}

// ---- inspect ------------------------------------------------------------------------------------
int cmd_inspect(const ModelFlags& mf) {
  EngineOptions o = mf.options();
  o.threads = 1;
  Engine engine(mf.dir, o);
  report_mlock(engine);
  const Model& m = engine.model();
  const HybridConfig& c = m.config();
  // At the dtypes the cache holds.
  const HybridCache& cache = engine.cache();
  const CacheFootprint fp = cache_footprint(cache.layers(), cache.state_dtype(), cache.kv_dtype());
  const size_t kv = fp.kv_per_token;
  std::printf("model:          %s\n", mf.dir.c_str());
  std::printf("family:         %s (%s)\n", c.family.c_str(), c.architecture.empty() ? "-" : c.architecture.c_str());
  std::printf("layers:         %d\n", c.n_layers());
  std::printf("layer pattern:  %s\n", c.layer_pattern().c_str());
  std::printf("hidden size:    %d\n", c.d_model);
  std::printf("vocab size:     %d\n", c.vocab_size);
  std::printf("tied embedding: %s\n", c.tie_embeddings ? "yes" : "no");
  std::printf("parameters:     %zu (%.1f M)\n", m.param_count(), m.param_count() / 1e6);
  std::printf("weight bytes:   %zu (%s, %s in memory; %s used in place from the mapped files)\n", m.weight_bytes(),
              format_bytes(m.weight_bytes()).c_str(), mf.dtype.c_str(), format_bytes(m.mapped_bytes()).c_str());
  std::printf("state / seq:    %zu bytes (%s): conv %s + ssm %s, %s (--state-dtype)\n", fp.state_per_sequence(),
              format_bytes(static_cast<double>(fp.state_per_sequence())).c_str(),
              format_bytes(static_cast<double>(fp.conv_per_sequence)).c_str(),
              format_bytes(static_cast<double>(fp.ssm_per_sequence)).c_str(), cache_dtype_name(cache.state_dtype()));
  if (kv > 0)
    std::printf("kv / token:     %zu bytes (%s), %s (--kv-dtype)\n", kv, format_bytes(static_cast<double>(kv)).c_str(),
                cache_dtype_name(cache.kv_dtype()));
  else
    std::printf("kv / token:     0 bytes (no attention layers)\n");
  std::printf("kernels:        %s (cpu path %s)\n", engine.kernels().name, cpu::active_path());
  return 0;
}

}  // namespace
}  // namespace hybridlm

int main(int argc, char** argv) {
  using namespace hybridlm;
  CLI::App app{"hybridlm: run hybrid state-space / attention language models on CPU"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "hybridlm 0.1.0");

  ModelFlags gen_m, score_m, ppl_m, insp_m, bench_m;
  BenchOptions bopt;
  std::string gen_prompt, score_prompt, score_ids, score_out, ppl_file, tok_dir, tok_prompt, tok_decode;
  std::vector<std::string> stops;
  GenerateOptions gopt;
  int ppl_ctx = 512, num_beams = 1;
  bool no_eos = false, tok_no_special = false;

  CLI::App* gen = app.add_subcommand("generate", "generate text from a prompt, streamed to stdout");
  gen_m.add(gen);
  gen->add_option("-p,--prompt", gen_prompt, "prompt text")->required();
  gen->add_option("-n,--n-predict", gopt.max_new_tokens, "tokens to generate")->capture_default_str();
  gen->add_option("--temperature", gopt.sampling.temperature, "sampling temperature (0 = greedy)")->capture_default_str();
  gen->add_option("--top-k", gopt.sampling.top_k, "top-k (0 = off)")->capture_default_str();
  gen->add_option("--top-p", gopt.sampling.top_p, "top-p (1 = off)")->capture_default_str();
  gen->add_option("--min-p", gopt.sampling.min_p, "min-p (0 = off)")->capture_default_str();
  gen->add_option("--repeat-penalty", gopt.sampling.repetition_penalty, "repetition penalty (1 = off)")->capture_default_str();
  gen->add_option("--seed", gopt.sampling.seed, "random seed")->capture_default_str();
  gen->add_option("--stop", stops, "stop string (repeatable)");
  gen->add_flag("--ignore-eos", no_eos, "do not stop at the end-of-sequence token");
  gen->add_option("--num-beams", num_beams, "beam search with this many beams (1 = sample / greedy)")
      ->capture_default_str();

  CLI::App* score = app.add_subcommand("score", "write the logits of every position as a .npy file");
  score_m.add(score);
  score->add_option("-p,--prompt", score_prompt, "text to score");
  score->add_option("--ids", score_ids, "token ids to score, comma-separated");
  score->add_option("--logits-out", score_out, "output .npy file: float32 (tokens, vocab)")->required();

  CLI::App* ppl = app.add_subcommand("perplexity", "perplexity of a text file");
  ppl_m.add(ppl);
  ppl->add_option("-f,--file", ppl_file, "text file")->required();
  ppl->add_option("--ctx", ppl_ctx, "window length in tokens (non-overlapping, fresh state each)")->capture_default_str();

  CLI::App* tk = app.add_subcommand("tokenize", "text to token ids (JSON array), or ids to text with --decode");
  tk->add_option("-m,--model", tok_dir, "model directory (or any directory with tokenizer.json)")->required();
  tk->add_option("-p,--prompt", tok_prompt, "text to encode");
  tk->add_option("--decode", tok_decode, "comma-separated ids to decode");
  tk->add_flag("--no-special", tok_no_special, "do not add BOS/EOS from the post-processor");

  CLI::App* insp = app.add_subcommand("inspect", "print family, layer pattern, sizes and per-sequence state");
  insp_m.add(insp, false);

  CLI::App* bench = app.add_subcommand("bench", "prompt (pp) and generation (tg) tokens/s, llama-bench style");
  bench_m.no_mmap = true;  // benchmarks read weights into memory (the VM's reclaim daemon pages out mappings)
  bench_m.add(bench);
  bench->add_option("-p,--n-prompt", bopt.prompt_tokens, "prompt tokens per pp test")->capture_default_str();
  bench->add_option("-n,--n-gen", bopt.gen_tokens, "decode steps per tg test")->capture_default_str();
  bench->add_option("-r,--repetitions", bopt.reps, "repetitions (after one warm-up)")->capture_default_str();
  bench->add_option("--batch", bopt.batch, "sequences decoding together in tg")->capture_default_str();
  bench->add_flag("--json", bopt.json, "print a JSON array, one object per test");
  bench->add_option("--seed", bopt.seed, "seed of the random token ids")->capture_default_str();
  bool bench_mmap = false;
  bench->add_flag("--mmap", bench_mmap, "map the weight files instead of reading them into memory");

  PlanOptions popt;
  popt.kv_dtype = cache_dtype_name(EngineOptions{}.kv_dtype);  // plans default to what a run would use
  CLI::App* plan = app.add_subcommand("plan", "memory plan from a config: weights, state per sequence, KV per token, max sequences");
  plan->add_option("-m,--model", popt.model_dir, "model directory (reads config.json)");
  plan->add_option("--config", popt.config_file, "a config.json file");
  plan->add_option("--dtype", popt.dtype, "weights in memory: f32, bf16, f16, q8_0")->capture_default_str();
  plan->add_option("--state-dtype", popt.state_dtype, "recurrent state: f32, bf16, f16")->capture_default_str();
  plan->add_option("--kv-dtype", popt.kv_dtype, "attention KV cache: f32, bf16, f16")->capture_default_str();
  plan->add_option("--memory", popt.memory, "memory to plan for, e.g. 16GiB, 24GB")->capture_default_str();
  plan->add_option("--context", popt.context, "tokens per sequence (KV grows with it; SSM state does not)")
      ->capture_default_str();
  plan->add_flag("--json", popt.json, "print one JSON object");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  try {
    if (*gen) {
      gopt.stop_strings = stops;
      gopt.stop_at_eos = !no_eos;
      return cmd_generate(gen_m, gen_prompt, gopt, num_beams);
    }
    if (*score) return cmd_score(score_m, score_prompt, score_ids, score_out);
    if (*ppl) return cmd_perplexity(ppl_m, ppl_file, ppl_ctx);
    if (*tk) return cmd_tokenize(tok_dir, tok_prompt, tok_decode, tok_no_special);
    if (*insp) return cmd_inspect(insp_m);
    if (*plan) return run_plan(popt);
    if (*bench) {
      if (bench_mmap) bench_m.no_mmap = false;
      bopt.model_dir = bench_m.dir;
      bopt.engine = bench_m.options();
      return run_bench(bopt);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {  // filesystem, system errors: still one line, never an abort
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 2;
}
