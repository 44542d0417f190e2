// `hybridlm chat`: an interactive conversation in the terminal on the model's chat format (the
// server's: src/server/chat_format.h), streaming each answer. The sequence is kept between turns:
// when the new prompt extends what the sequence holds, only the new tokens are fed.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <limits>
#include <random>

#include "base/error.h"
#include "server/chat_format.h"
#include "tools/hybridlm/cli.h"
#include "tools/hybridlm/format.h"

namespace hybridlm {
namespace {

struct Flags {
  ModelFlags model;
  std::string system;
  int max_tokens = 256;
  SamplingParams sampling;
  int64_t seed = -1;
};

int cmd_chat(const Flags& f) {
  const ModelFlags& mf = f.model;
  check(f.max_tokens >= 1, "-n/--n-predict must be >= 1, got ", f.max_tokens);
  check(f.seed >= -1, "--seed must be >= 0, or -1 for a random seed, got ", f.seed);
  SamplingParams sp = f.sampling;
  validate(sp);
  sp.seed = f.seed >= 0 ? static_cast<uint64_t>(f.seed) : std::random_device{}();
  Tokenizer tok = load_tokenizer(mf.dir);
  const ChatFormat format = ChatFormat::load(mf.dir);
  EngineOptions eo = mf.options();
  eo.max_sequences = 1;
  // One context of KV pages, and two more: the kept snapshot of the last prompt shares its
  // partial last page, which the next token then copies.
  eo.kv_pages = (mf.ctx_size + eo.block_size - 1) / eo.block_size + 2;
  Engine engine(mf.dir, eo);
  report_mlock(engine);
  engine.info("chat: " + format.description() + "; an empty line or end of input ends the chat");
  const std::optional<int32_t> eos = tok.eos_id() ? tok.eos_id() : engine.model().config().eos_token_id;
  const size_t decodable = std::min<size_t>(engine.vocab_size(), tok.vocab_size());
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  if (!f.system.empty()) messages.push_back({{"role", "system"}, {"content", f.system}});
  Sampler sampler(sp);
  const int seq = engine.new_sequence();
  std::vector<int32_t> fed;  // what the sequence holds
  Snapshot last_prompt;      // the sequence after the last prompt (before its answer)
  const bool tty = isatty(fileno(stdin));
  std::string line;
  for (int turn = 1;; ++turn) {
    if (tty) std::fputs("> ", stdout), std::fflush(stdout);
    if (!std::getline(std::cin, line) || line.empty()) break;
    messages.push_back({{"role", "user"}, {"content", line}});
    const std::vector<int32_t> prompt = tok.encode(format.render(messages, nullptr), !format.adds_bos());
    check(static_cast<int64_t>(prompt.size()) + f.max_tokens <= mf.ctx_size, "the conversation (", prompt.size(),
          " tokens) plus -n ", f.max_tokens, " exceeds --ctx-size ", mf.ctx_size);
    // Keep what the sequence holds when the new prompt extends it (leaving a token to run), else
    // go back to the snapshot of the last prompt when the new one extends that, else start over.
    size_t keep = 0;
    while (keep < fed.size() && keep + 1 < prompt.size() && fed[keep] == prompt[keep]) ++keep;
    if (keep < fed.size()) {
      if (!last_prompt.empty() && keep >= static_cast<size_t>(last_prompt.length())) {
        engine.cache().restore(seq, last_prompt);
        keep = static_cast<size_t>(last_prompt.length());
      } else {
        last_prompt = Snapshot{};  // its pages go back before the new prompt takes any
        engine.cache().reset(seq);
        keep = 0;
      }
    }
    std::vector<float> logits = engine.prefill(seq, std::span(prompt).subspan(keep), false);
    fed = prompt;
    last_prompt = Snapshot{};
    last_prompt = engine.cache().snapshot(seq);
    StreamDecoder stream(tok);
    std::string answer;
    std::vector<int32_t> history = prompt;
    int generated = 0;
    for (int i = 0; i < f.max_tokens; ++i) {
      std::fill(logits.begin() + decodable, logits.end(), -std::numeric_limits<float>::infinity());
      const int32_t next = sampler.sample(logits, history);
      if (eos && next == *eos) break;
      history.push_back(next);
      ++generated;
      const std::string piece = stream.push(next);
      answer += piece;
      std::fputs(piece.c_str(), stdout);
      std::fflush(stdout);
      if (i + 1 == f.max_tokens) break;
      const BatchRun run{seq, 1};
      const int row = 0;
      std::span<const float> l = engine.step(std::span(&next, 1), std::span(&run, 1), std::span(&row, 1));
      logits.assign(l.begin(), l.end());
      fed.push_back(next);
    }
    const std::string rest = stream.flush();
    answer += rest;
    std::fputs((rest + "\n").c_str(), stdout);
    std::fflush(stdout);
    messages.push_back({{"role", "assistant"}, {"content", answer}});
    engine.info(
        strprintf("turn %d: %zu prompt tokens (%zu reused), %d generated", turn, prompt.size(), keep, generated));
  }
  return 0;
}

}  // namespace

Subcommand add_chat(CLI::App& parent) {
  auto f = std::make_shared<Flags>();
  CLI::App* app = parent.add_subcommand("chat", "an interactive chat on the model's chat format, streamed");
  f->model.add(app, true, true);
  app->add_option("--system", f->system, "a system message to start the conversation with");
  app->add_option("-n,--n-predict", f->max_tokens, "tokens per answer at most")->capture_default_str();
  app->add_option("--temperature,--temp", f->sampling.temperature, "sampling temperature (0 = greedy)")
      ->capture_default_str();
  app->add_option("--top-k", f->sampling.top_k, "top-k (0 = off)")->capture_default_str();
  app->add_option("--top-p", f->sampling.top_p, "top-p (1 = off)")->capture_default_str();
  app->add_option("--min-p", f->sampling.min_p, "min-p (0 = off)")->capture_default_str();
  app->add_option("--repeat-penalty", f->sampling.repetition_penalty, "repetition penalty (1 = off)")
      ->capture_default_str();
  app->add_option("--seed", f->seed, "random seed (-1 = a new one each run)")->capture_default_str();
  return {app, [f] { return cmd_chat(*f); }};
}

}  // namespace hybridlm
