// `hybridlm generate`: text from a prompt, streamed to stdout (sampling, greedy or beam search).
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>

#include "base/error.h"
#include "runtime/batch.h"
#include "tools/hybridlm/cli.h"
#include "tools/hybridlm/format.h"

namespace hybridlm {
namespace {

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

}  // namespace

Subcommand add_generate(CLI::App& parent) {
  struct Flags {
    ModelFlags model;
    std::string prompt;
    std::vector<std::string> stops;
    GenerateOptions gopt;
    int num_beams = 1;
    bool no_eos = false;
  };
  auto f = std::make_shared<Flags>();
  CLI::App* gen = parent.add_subcommand("generate", "generate text from a prompt, streamed to stdout");
  f->model.add(gen);
  GenerateOptions& gopt = f->gopt;
  gen->add_option("-p,--prompt", f->prompt, "prompt text")->required();
  gen->add_option("-n,--n-predict", gopt.max_new_tokens, "tokens to generate")->capture_default_str();
  gen->add_option("--temperature", gopt.sampling.temperature, "sampling temperature (0 = greedy)")->capture_default_str();
  gen->add_option("--top-k", gopt.sampling.top_k, "top-k (0 = off)")->capture_default_str();
  gen->add_option("--top-p", gopt.sampling.top_p, "top-p (1 = off)")->capture_default_str();
  gen->add_option("--min-p", gopt.sampling.min_p, "min-p (0 = off)")->capture_default_str();
  gen->add_option("--repeat-penalty", gopt.sampling.repetition_penalty, "repetition penalty (1 = off)")->capture_default_str();
  gen->add_option("--seed", gopt.sampling.seed, "random seed")->capture_default_str();
  gen->add_option("--stop", f->stops, "stop string (repeatable)");
  gen->add_flag("--ignore-eos", f->no_eos, "do not stop at the end-of-sequence token");
  gen->add_option("--num-beams", f->num_beams, "beam search with this many beams (1 = sample / greedy)")
      ->capture_default_str();
  return {gen, [f] {
            f->gopt.stop_strings = f->stops;
            f->gopt.stop_at_eos = !f->no_eos;
            return cmd_generate(f->model, f->prompt, f->gopt, f->num_beams);
          }};
}

}  // namespace hybridlm
