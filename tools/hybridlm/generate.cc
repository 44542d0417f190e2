// `hybridlm generate`: text from a prompt, streamed to stdout (sampling, greedy or beam search).
// Flags that mean the same as llama.cpp's llama-cli take its names (--temp, --repeat-last-n, -f,
// -e, --no-display-prompt, -n -1, --seed -1); beam search takes transformers' generate() names
// (--num-beams, --num-return-sequences, --length-penalty).
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <random>
#include <string_view>

#include "base/error.h"
#include "runtime/batch.h"
#include "tools/hybridlm/cli.h"
#include "tools/hybridlm/format.h"

namespace hybridlm {
namespace {

// Writes `s` to stdout at once (the text streams) and stops the run when the write failed (a full
// disk, `> /dev/full`): generation ends at the first lost piece instead of running on.
void write_out(std::string_view s) {
  std::cout << s << std::flush;
  if (!std::cout) throw_error("cannot write to standard output: ", std::strerror(errno));
}

// -f FILE: the prompt is the file's bytes ("-" = standard input) without one trailing newline,
// as llama.cpp reads it (a file saved by an editor ends with one; the prompt should not).
std::string read_prompt_file(const std::string& path) {
  std::string text;
  if (path == "-") {
    text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
    check(!std::cin.bad(), "-f -: cannot read standard input");
  } else {
    std::error_code ec;
    check(!std::filesystem::is_directory(path, ec), "-f ", path, ": is a directory");
    std::ifstream in(path, std::ios::binary);
    check(static_cast<bool>(in), "-f ", path, ": cannot open: ", std::strerror(errno));
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    check(!in.bad(), "-f ", path, ": cannot read");
  }
  if (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

// -e/--escape: \n \t \r \\ \" \' and \xHH become the bytes they name, as llama.cpp's
// string_process_escapes; any other backslash is kept as written.
std::string process_escapes(const std::string& s) {
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      out += s[i];
      continue;
    }
    const char c = s[i + 1];
    const char* plain = std::strchr("nrt\\\"'", c);
    if (c != '\0' && plain) {
      out += c == 'n' ? '\n' : c == 'r' ? '\r' : c == 't' ? '\t' : c;
      ++i;
    } else if (c == 'x' && i + 3 < s.size() && hex(s[i + 2]) >= 0 && hex(s[i + 3]) >= 0) {
      out += static_cast<char>(hex(s[i + 2]) * 16 + hex(s[i + 3]));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

struct Flags {
  ModelFlags model;
  std::string prompt, prompt_file;
  bool escape = false, no_display_prompt = false, no_eos = false;
  std::vector<std::string> stops;
  GenerateOptions gopt;
  int64_t seed = -1;
  int num_beams = 1, num_return_sequences = 1;
  float length_penalty = 1.0f;
  // The flags beam search has no use for: giving one with --num-beams > 1 is an error.
  std::vector<const CLI::Option*> sampling_flags;
  const CLI::Option *file_flag = nullptr, *num_return_flag = nullptr, *length_penalty_flag = nullptr;
};

int cmd_generate(const Flags& f) {
  // Flags and the tokenizer first: a bad value should not wait for the weights to load.
  const ModelFlags& mf = f.model;
  GenerateOptions gopt = f.gopt;
  const int num_beams = f.num_beams;
  check(gopt.max_new_tokens >= -1, "-n/--n-predict must be >= 0, or -1 (until end of sequence or --ctx-size), got ",
        gopt.max_new_tokens);
  check(f.seed >= -1, "--seed must be >= 0, or -1 for a random seed, got ", f.seed);
  validate(gopt.sampling);
  check(num_beams >= 1 && num_beams <= 256, "--num-beams ", num_beams, ": must be in [1, 256]");
  check(std::isfinite(f.length_penalty), "--length-penalty must be a finite number, got ", f.length_penalty);
  if (num_beams > 1) {  // deterministic: the sampling flags do not apply
    for (const CLI::Option* o : f.sampling_flags)
      check(o->count() == 0, o->get_name(), " is a sampling flag: beam search (--num-beams ", num_beams,
            ") does not sample");
    check(f.stops.empty(), "--stop is not supported with --num-beams > 1");
    check(f.num_return_sequences >= 1 && f.num_return_sequences <= num_beams, "--num-return-sequences ",
          f.num_return_sequences, ": must be in [1, --num-beams ", num_beams, "]");
  } else {
    check(f.num_return_flag->count() == 0, "--num-return-sequences needs beam search (--num-beams > 1)");
    check(f.length_penalty_flag->count() == 0, "--length-penalty needs beam search (--num-beams > 1)");
  }
  std::string prompt = f.file_flag->count() ? read_prompt_file(f.prompt_file) : f.prompt;
  gopt.stop_strings = f.stops;
  if (f.escape) {
    prompt = process_escapes(prompt);
    for (std::string& s : gopt.stop_strings) s = process_escapes(s);
  }
  gopt.stop_at_eos = !f.no_eos;
  // -1: a seed of its own each run, printed with the summary so that --seed reproduces the run.
  gopt.sampling.seed = f.seed >= 0 ? static_cast<uint64_t>(f.seed) : std::random_device{}();
  Tokenizer tok = load_tokenizer(mf.dir);
  EngineOptions eo = mf.options();
  eo.max_sequences = num_beams;
  std::vector<int32_t> ids = tok.encode(prompt);
  check(!ids.empty(), "the prompt is empty after tokenization");
  const int64_t prompt_len = static_cast<int64_t>(ids.size());
  if (gopt.max_new_tokens == -1) {  // until eos or prompt + output fill --ctx-size, on every model
    check(prompt_len < mf.ctx_size, "the prompt (", prompt_len, " tokens) fills --ctx-size ", mf.ctx_size,
          ": -n -1 leaves no room");
    gopt.max_new_tokens = static_cast<int>(mf.ctx_size - prompt_len);
  }
  Engine engine(mf.dir, eo);
  report_mlock(engine);
  gopt.eos_id = tok.eos_id() ? tok.eos_id() : engine.model().config().eos_token_id;
  engine.model().check_tokens(ids);
  if (engine.cache().has_kv())
    check(prompt_len + gopt.max_new_tokens <= mf.ctx_size, "the prompt (", prompt_len, " tokens) plus -n ",
          gopt.max_new_tokens, " exceeds --ctx-size ", mf.ctx_size);
  const std::string shown = f.no_display_prompt ? std::string() : prompt;
  if (num_beams > 1) {
    BeamOptions bo;
    bo.num_beams = num_beams;
    bo.max_new_tokens = gopt.max_new_tokens;
    bo.length_penalty = f.length_penalty;
    if (gopt.stop_at_eos) bo.eos_id = gopt.eos_id;
    bo.decodable = static_cast<int32_t>(std::min<int64_t>(tok.vocab_size(), engine.vocab_size()));
    // The best sequence streams: each token as soon as every beam agrees on it.
    write_out(shown);
    StreamDecoder stream(tok);
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<BeamHypothesis> hyps =
        beam_search(engine, ids, bo, [&](int32_t t) { write_out(stream.push(t)); });
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    write_out(stream.flush() + "\n");
    // The others, best first, each after a line "---".
    const size_t returned = std::min(hyps.size(), static_cast<size_t>(f.num_return_sequences));
    for (size_t i = 1; i < returned; ++i) {
      std::vector<int32_t> t = hyps[i].tokens;
      if (bo.eos_id && !t.empty() && t.back() == *bo.eos_id) t.pop_back();
      write_out("---\n" + shown + tok.decode(t) + "\n");
    }
    engine.info(strprintf("beam search: %d beams, %zu tokens in %.3f s, best logprob %.4f (score %.4f)", num_beams,
                 hyps.front().tokens.size(), secs, hyps.front().logprob, hyps.front().score));
    for (size_t i = 1; i < returned; ++i)
      engine.info(strprintf("sequence %zu: %zu tokens, logprob %.4f (score %.4f)", i + 1, hyps[i].tokens.size(),
                   hyps[i].logprob, hyps[i].score));
    report_cache(engine);
    return 0;
  }
  write_out(shown);
  GenerateResult r = generate(engine, tok, ids, gopt, write_out);
  write_out("\n");
  const double gen_tps = r.tokens.size() > 1 ? (r.tokens.size() - 1) / r.generate_seconds : 0.0;
  engine.info(strprintf("prompt eval: %d tokens in %.3f s (%.1f tokens/s)", r.prompt_tokens, r.prompt_seconds,
               r.prompt_tokens / std::max(r.prompt_seconds, 1e-9)));
  engine.info(strprintf("generation: %zu tokens in %.3f s (%.1f tokens/s), stop: %s", r.tokens.size(),
               r.generate_seconds, gen_tps, r.stop_reason.c_str()));
  engine.info(strprintf("seed: %llu", static_cast<unsigned long long>(gopt.sampling.seed)));
  report_cache(engine);
  engine.info(strprintf("peak RSS: %s", format_bytes(peak_rss_bytes()).c_str()));
  return 0;
}

}  // namespace

Subcommand add_generate(CLI::App& parent) {
  auto f = std::make_shared<Flags>();
  CLI::App* gen = parent.add_subcommand("generate", "generate text from a prompt, streamed to stdout");
  f->model.add(gen, true, true);
  SamplingParams& sp = f->gopt.sampling;
  CLI::Option_group* source = gen->add_option_group("prompt", "the prompt: one of");
  source->add_option("-p,--prompt", f->prompt, "prompt text");
  f->file_flag = source->add_option("-f,--file", f->prompt_file,
                                    "read the prompt from FILE (- = standard input; one trailing newline dropped)");
  source->require_option(1);
  gen->add_flag("-e,--escape", f->escape, "process escapes (\\n \\t \\r \\\\ \\\" \\' \\xHH) in the prompt and --stop");
  gen->add_flag("--no-display-prompt", f->no_display_prompt, "print only the generated text, not the prompt");
  gen->add_option("-n,--n-predict", f->gopt.max_new_tokens,
                  "tokens to generate; -1 = until end of sequence or until prompt + output fill --ctx-size")
      ->capture_default_str();
  f->sampling_flags = {
      gen->add_option("--temperature,--temp", sp.temperature, "sampling temperature (0 = greedy)")->capture_default_str(),
      gen->add_option("--top-k", sp.top_k, "top-k (0 = off)")->capture_default_str(),
      gen->add_option("--top-p", sp.top_p, "top-p (1 = off)")->capture_default_str(),
      gen->add_option("--min-p", sp.min_p, "min-p (0 = off)")->capture_default_str(),
      gen->add_option("--repeat-penalty", sp.repetition_penalty,
                      "repetition penalty, HF's: a seen token's logit l > 0 becomes l / r, else l * r (1 = off)")
          ->capture_default_str(),
      gen->add_option("--repeat-last-n", sp.repeat_last_n,
                      "the penalties look at the last N tokens, prompt included (0 = no penalty, -1 = all)")
          ->capture_default_str(),
      gen->add_option("--presence-penalty", sp.presence_penalty,
                      "subtract this from a seen token's logit, in [-2, 2] (0 = off)")
          ->capture_default_str(),
      gen->add_option("--frequency-penalty", sp.frequency_penalty,
                      "subtract this times its count from a seen token's logit, in [-2, 2] (0 = off)")
          ->capture_default_str(),
      gen->add_option("--seed", f->seed, "random seed (-1 = a new one each run, printed on stderr)")
          ->capture_default_str(),
  };
  gen->add_option("--stop", f->stops, "stop string (repeatable)");
  gen->add_flag("--ignore-eos", f->no_eos, "do not stop at the end-of-sequence token");
  gen->add_option("--num-beams", f->num_beams, "beam search with this many beams (1 = sample / greedy)")
      ->capture_default_str();
  f->num_return_flag =
      gen->add_option("--num-return-sequences", f->num_return_sequences,
                      "beam search: print this many of the best sequences, best first, separated by lines ---")
          ->capture_default_str();
  f->length_penalty_flag =
      gen->add_option("--length-penalty", f->length_penalty,
                      "beam search: rank by logprob / length^P (P > 0 favours longer sequences)")
          ->capture_default_str();
  return {gen, [f] { return cmd_generate(*f); }};
}

}  // namespace hybridlm
