// `hybridlm perplexity`: the perplexity of a text file, in windows of a fixed length.
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

}  // namespace

Subcommand add_perplexity(CLI::App& parent) {
  struct Flags {
    ModelFlags model;
    std::string file;
    int ctx = 512;
  };
  auto f = std::make_shared<Flags>();
  CLI::App* ppl = parent.add_subcommand("perplexity", "perplexity of a text file");
  f->model.add(ppl);
  ppl->add_option("-f,--file", f->file, "text file")->required();
  ppl->add_option("--ctx", f->ctx, "window length in tokens (non-overlapping, fresh state each)")->capture_default_str();
  return {ppl, [f] { return cmd_perplexity(f->model, f->file, f->ctx); }};
}

}  // namespace hybridlm
