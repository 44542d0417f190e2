// `hybridlm perplexity`: the perplexity of a text file, in windows of -c tokens, each from a fresh
// state. With --stride S < -c the windows overlap (they start every S tokens) and each window
// scores only the tokens no earlier window scored, all of them with up to -c tokens of context,
// as transformers' strided perplexity does.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "base/error.h"
#include "tools/hybridlm/cli.h"
#include "tools/hybridlm/format.h"

namespace hybridlm {
namespace {

struct PerplexityFlags {
  ModelFlags model;
  std::string file;
  int old_ctx = 0;  // --ctx, the deprecated spelling of -c/--ctx-size
  const CLI::Option* old_ctx_flag = nullptr;
  int stride = 0;   // 0: the window length (no overlap)
  int chunks = -1;  // windows at most; -1: all
};

// One window: tokens [begin, end) from a fresh state, scoring the targets [first, end) (each
// predicted from the logits of the token before it).
struct Window {
  size_t begin, end, first;
};

std::vector<Window> plan_windows(size_t n_tokens, size_t ctx, size_t stride, int chunks) {
  std::vector<Window> w;
  size_t scored_to = 1;  // token 0 has no context: never a target
  for (size_t b = 0; b + 1 < n_tokens && (chunks < 0 || w.size() < static_cast<size_t>(chunks)); b += stride) {
    const size_t e = std::min(b + ctx, n_tokens);
    const size_t first = std::max(scored_to, b + 1);
    if (first < e) w.push_back({b, e, first});
    scored_to = e;
    if (e == n_tokens) break;
  }
  return w;
}

int cmd_perplexity(PerplexityFlags f) {
  ModelFlags& mf = f.model;
  if (f.old_ctx_flag->count() > 0) {
    std::fprintf(stderr, "warning: --ctx is deprecated; use -c/--ctx-size (the same window length)\n");
    mf.ctx_size = f.old_ctx;
  }
  const int ctx = mf.ctx_size;
  check(ctx >= 2, "-c/--ctx-size ", ctx, ": must be >= 2 (a window scores its tokens after the first)");
  const int stride = f.stride == 0 ? ctx : f.stride;
  check(stride >= 1 && stride <= ctx, "--stride ", f.stride, ": must be in [1, -c/--ctx-size ", ctx, "]");
  check(f.chunks == -1 || f.chunks >= 1, "--chunks ", f.chunks, ": must be >= 1 (or -1: all)");
  const std::string text = read_text_file(f.file, 256u << 20, "one perplexity run");
  Tokenizer tok = load_tokenizer(mf.dir);
  EngineOptions o = mf.options();
  Engine engine(mf.dir, o);
  report_mlock(engine);
  std::vector<int32_t> ids = tok.encode(text, false);
  check(ids.size() >= 2, f.file, ": needs at least 2 tokens, has ", ids.size());
  engine.model().check_tokens(ids);
  check_logits_fit(std::min<size_t>(ctx, ids.size()), engine.vocab_size(), "-c/--ctx-size");
  const std::vector<Window> windows = plan_windows(ids.size(), ctx, stride, f.chunks);
  size_t targets = 0;
  for (const Window& w : windows) targets += w.end - w.first;
  const bool tty = isatty(STDERR_FILENO) != 0;
  double nll = 0;
  size_t count = 0;
  const auto t0 = std::chrono::steady_clock::now();
  const int V = engine.vocab_size();
  for (size_t wi = 0; wi < windows.size(); ++wi) {
    const Window& w = windows[wi];
    const int slot = engine.new_sequence();
    std::vector<float> logits = engine.prefill(slot, std::span(ids).subspan(w.begin, w.end - w.begin), true);
    engine.free_sequence(slot);
    for (size_t t = w.first; t < w.end; ++t) {
      nll -= token_logprob(logits.data() + (t - 1 - w.begin) * V, V, ids[t]);
      ++count;
    }
    // The same count as the summary: tokens scored so far of those that will be.
    // On a terminal, one line rewritten per window; elsewhere only the last state.
    if (!mf.quiet && tty)
      std::fprintf(stderr, "\r[%zu/%zu tokens, %zu/%zu windows] running perplexity %.4f", count, targets, wi + 1,
                   windows.size(), std::exp(nll / count));
  }
  if (!mf.quiet && tty) std::fputc('\n', stderr);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  engine.info(strprintf("%zu tokens scored in %.2f s (%.1f tokens/s), %zu windows", count, secs, count / secs,
                        windows.size()));
  report_cache(engine);
  std::printf("perplexity: %.4f over %zu tokens (ctx %d, stride %d, %zu windows)\n", std::exp(nll / count), count, ctx,
              stride, windows.size());
  return 0;
}

}  // namespace

Subcommand add_perplexity(CLI::App& parent) {
  auto f = std::make_shared<PerplexityFlags>();
  CLI::App* ppl = parent.add_subcommand("perplexity", "perplexity of a text file");
  f->model.ctx_size = 512;  // the window length (-c/--ctx-size), as llama.cpp's perplexity
  f->model.add(ppl);
  ppl->add_option("-f,--file", f->file, "text file (UTF-8)")->required();
  f->old_ctx_flag = ppl->add_option("--ctx", f->old_ctx, "deprecated: use -c/--ctx-size");
  ppl->add_option("--stride", f->stride,
                  "start a window every this many tokens (default: -c, no overlap; smaller: overlapping windows, "
                  "each scoring only new tokens)");
  ppl->add_option("--chunks", f->chunks, "score at most this many windows (-1 = all)")->capture_default_str();
  return {ppl, [f] { return cmd_perplexity(*f); }};
}

}  // namespace hybridlm
