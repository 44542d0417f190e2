// `hybridlm score`: the log-probability of every token of a text given the ones before it, as JSON
// lines on stdout (one per token, then the total), and optionally the logits of every position
// as a .npy file (--logits-out).
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>

#include "base/error.h"
#include "io/npy.h"
#include "tools/hybridlm/cli.h"
#include "tools/hybridlm/format.h"

namespace hybridlm {
namespace {

struct ScoreFlags {
  ModelFlags model;
  std::string prompt, ids, out;
  const CLI::Option* ids_flag = nullptr;  // given (even empty): score ids, not a prompt
};

int cmd_score(const ScoreFlags& f) {
  const ModelFlags& mf = f.model;
  // -p needs the tokenizer; with --ids it only adds each token's text to the lines, where it exists.
  const bool by_ids = f.ids_flag->count() > 0;
  std::optional<Tokenizer> tok;
  if (!by_ids || has_tokenizer(mf.dir))
    tok.emplace(load_tokenizer(mf.dir));
  const std::vector<int32_t> ids = by_ids ? parse_ids(f.ids, "--ids") : tok->encode(f.prompt);
  check(!ids.empty(), by_ids ? "--ids: no token ids" : "the prompt is empty after tokenization");
  EngineOptions o = mf.options();
  o.context = std::max<int>(o.context, static_cast<int>(std::min<size_t>(ids.size(), 1 << 24)));
  Engine engine(mf.dir, o);
  report_mlock(engine);
  engine.model().check_tokens(ids);
  const int V = engine.vocab_size();
  if (!f.out.empty()) check_logits_fit(ids.size(), V, "score --logits-out");
  std::vector<float> all;  // every position's logits, for --logits-out
  const int slot = engine.new_sequence();
  double total = 0;
  // Chunks of the prefill: only --logits-out keeps more than one chunk's logits.
  for (size_t b = 0; b < ids.size(); b += Engine::kPrefillChunk) {
    const size_t n = std::min<size_t>(Engine::kPrefillChunk, ids.size() - b);
    const std::vector<float> logits = engine.prefill(slot, std::span(ids).subspan(b, n), true);
    if (!f.out.empty()) all.insert(all.end(), logits.begin(), logits.end());
    for (size_t i = 0; i < n && b + i + 1 < ids.size(); ++i) {
      const int32_t next = ids[b + i + 1];
      const double lp = token_logprob(logits.data() + i * V, V, next);
      total += lp;
      nlohmann::json line = {{"position", b + i + 1}, {"id", next}};
      if (tok && next < tok->vocab_size()) line["token"] = tok->decode(std::span(&next, 1));
      line["logprob"] = lp;
      std::cout << line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
    }
  }
  const size_t scored = ids.size() - 1;
  nlohmann::json sum = {{"tokens", ids.size()}, {"scored", scored}, {"logprob", total}};
  if (scored > 0) sum["perplexity"] = std::exp(-total / static_cast<double>(scored));
  std::cout << sum.dump() << std::endl;
  if (!f.out.empty()) {
    write_npy_f32(f.out, all.data(), {static_cast<int64_t>(ids.size()), V});
    engine.info(strprintf("wrote logits (%zu, %d) to %s", ids.size(), V, f.out.c_str()));
  }
  report_cache(engine);
  return 0;
}

}  // namespace

Subcommand add_score(CLI::App& parent) {
  auto f = std::make_shared<ScoreFlags>();
  CLI::App* score = parent.add_subcommand(
      "score", "log-probability of every token given the ones before (JSON lines), and optionally all logits (.npy)");
  f->model.add(score);
  CLI::Option_group* text = score->add_option_group("text", "what to score: one of");
  text->add_option("-p,--prompt", f->prompt, "text to score (tokenized with the model's tokenizer)");
  f->ids_flag = text->add_option("--ids", f->ids, "token ids to score: 1,2,3 or [1, 2, 3] (as tokenize prints them)");
  text->require_option(1);
  score->add_option("--logits-out", f->out, "also write every position's logits: a float32 (tokens, vocab) .npy file");
  return {score, [f] { return cmd_score(*f); }};
}

}  // namespace hybridlm
