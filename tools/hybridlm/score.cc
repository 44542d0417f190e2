// `hybridlm score`: the logits of every position of a prompt, as a .npy file.
#include <cstdio>
#include <memory>

#include "base/error.h"
#include "io/npy.h"
#include "tools/hybridlm/cli.h"

namespace hybridlm {
namespace {

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

}  // namespace

Subcommand add_score(CLI::App& parent) {
  struct Flags {
    ModelFlags model;
    std::string prompt, ids, out;
  };
  auto f = std::make_shared<Flags>();
  CLI::App* score = parent.add_subcommand("score", "write the logits of every position as a .npy file");
  f->model.add(score);
  score->add_option("-p,--prompt", f->prompt, "text to score");
  score->add_option("--ids", f->ids, "token ids to score, comma-separated");
  score->add_option("--logits-out", f->out, "output .npy file: float32 (tokens, vocab)")->required();
  return {score, [f] { return cmd_score(f->model, f->prompt, f->ids, f->out); }};
}

}  // namespace hybridlm
