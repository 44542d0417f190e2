#include "runtime/batch.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "base/error.h"

namespace hybridlm {

namespace {

// The engine sequences a call works on, freed when it returns or throws.
struct Sequences {
  explicit Sequences(Engine& e) : engine(e) {}
  ~Sequences() {
    for (int q : ids) engine.free_sequence(q);
  }
  Sequences(const Sequences&) = delete;
  Sequences& operator=(const Sequences&) = delete;
  void add() { ids.push_back(engine.new_sequence()); }
  Engine& engine;
  std::vector<int> ids;
};

}  // namespace

std::vector<std::vector<int32_t>> strip_left_padding(const std::vector<std::vector<int32_t>>& ids,
                                                     const std::vector<std::vector<int>>& mask) {
  check(ids.size() == mask.size(), "padded batch: ", ids.size(), " rows of ids but ", mask.size(),
      " rows of attention mask");
  std::vector<std::vector<int32_t>> out;
  for (size_t b = 0; b < ids.size(); ++b) {
    const std::string row = "padded batch row " + std::to_string(b);
    check(ids[b].size() == mask[b].size(), row, ": ids and attention mask differ in length");
    size_t first = 0;
    while (first < mask[b].size() && mask[b][first] == 0) ++first;
    check(first < mask[b].size(), row, ": the attention mask has no token");
    for (size_t t = first; t < mask[b].size(); ++t)
      check(mask[b][t] == 1, row, ": attention mask must be 0...0 1...1 (left padding), found ", mask[b][t],
          " at position ", t);
    out.emplace_back(ids[b].begin() + static_cast<std::ptrdiff_t>(first), ids[b].end());
  }
  return out;
}

std::vector<std::vector<int32_t>> generate_batch(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                                                 const BatchGenerateOptions& opt) {
  check(opt.max_new_tokens >= 0, "max new tokens must be >= 0");
  validate(opt.sampling);
  const size_t B = prompts.size();
  std::vector<std::vector<int32_t>> out(B);
  if (B == 0 || opt.max_new_tokens == 0) return out;
  for (const auto& p : prompts) {
    check(!p.empty(), "batch generation: an empty prompt");
    engine.model().check_tokens(p);
  }
  Sequences held(engine);
  for (size_t b = 0; b < B; ++b) held.add();
  const std::vector<int>& seqs = held.ids;
  std::vector<Sampler> samplers;
  std::vector<std::vector<int32_t>> history;
  for (size_t b = 0; b < B; ++b) {
    SamplingParams p = opt.sampling;
    p.seed += b;
    samplers.emplace_back(p);
    history.push_back(prompts[b]);
  }
  // Step 0: every prompt in one varlen step; logits of each prompt's last token.
  std::vector<int32_t> toks;
  std::vector<BatchRun> runs;
  std::vector<int> rows;
  for (size_t b = 0; b < B; ++b) {
    toks.insert(toks.end(), prompts[b].begin(), prompts[b].end());
    runs.push_back({seqs[b], static_cast<int>(prompts[b].size())});
    rows.push_back(static_cast<int>(toks.size()) - 1);
  }
  const int V = engine.vocab_size();
  std::vector<size_t> live(B);
  std::iota(live.begin(), live.end(), 0);
  std::vector<float> logits;
  for (int step = 0;; ++step) {
    std::span<const float> l = engine.step(toks, runs, rows);
    logits.assign(l.begin(), l.end());
    std::vector<size_t> next_live;
    toks.clear();
    runs.clear();
    rows.clear();
    for (size_t i = 0; i < live.size(); ++i) {
      const size_t b = live[i];
      const int32_t tok = samplers[b].sample(std::span(logits).subspan(i * V, V), history[b]);
      out[b].push_back(tok);
      history[b].push_back(tok);
      const bool done = (opt.eos_id && tok == *opt.eos_id) || static_cast<int>(out[b].size()) == opt.max_new_tokens;
      if (done) continue;
      next_live.push_back(b);
      rows.push_back(static_cast<int>(toks.size()));
      toks.push_back(tok);
      runs.push_back({seqs[b], 1});
    }
    live.swap(next_live);
    if (live.empty()) break;
  }
  return out;
}

namespace {

// log_softmax of one row of logits, in double.
void log_softmax(std::span<const float> l, std::vector<double>& out) {
  const float mx = *std::max_element(l.begin(), l.end());
  double sum = 0;
  for (float v : l) sum += std::exp(static_cast<double>(v) - mx);
  const double lse = std::log(sum) + mx;
  out.resize(l.size());
  for (size_t i = 0; i < l.size(); ++i) out[i] = static_cast<double>(l[i]) - lse;
}

struct Candidate {
  double logprob;
  int beam;
  int32_t token;
};

}  // namespace

std::vector<BeamHypothesis> beam_search(Engine& engine, std::span<const int32_t> prompt, const BeamOptions& opt,
                                        const std::function<void(int32_t)>& on_settled) {
  const int B = opt.num_beams;
  check(B >= 1 && B <= 256, "--num-beams ", B, ": must be in [1, 256]");
  check(opt.max_new_tokens >= 0, "beam search needs max new tokens >= 0");
  check(std::isfinite(opt.length_penalty), "--length-penalty must be a finite number, got ", opt.length_penalty);
  check(!prompt.empty(), "beam search: empty prompt");
  if (opt.max_new_tokens == 0) return {BeamHypothesis{}};
  // Candidates (and the softmax) cover the decodable ids only, as generate() masks the rest.
  const int Vm = engine.vocab_size();
  const int V = opt.decodable > 0 ? std::min(opt.decodable, Vm) : Vm;
  auto score_of = [&](double logprob, size_t len) {
    return logprob / std::pow(static_cast<double>(len), static_cast<double>(opt.length_penalty));
  };
  Sequences held(engine);
  for (int b = 0; b < B; ++b) held.add();
  std::vector<int>& seqs = held.ids;

  struct Beam {
    std::vector<int32_t> tokens;
    double logprob = 0;
  };
  std::vector<Beam> beams(1);  // before the first token every beam is the prompt: expand one
  std::vector<BeamHypothesis> finished;
  std::vector<std::vector<double>> logp(1);
  log_softmax(std::span<const float>(engine.prefill(seqs[0], prompt, false)).first(V), logp[0]);
  // The first `settled` tokens of the best hypothesis have gone to on_settled. settle() passes
  // on the tokens of `tokens` past them, up to `upto` and never an eos.
  size_t settled = 0;
  auto settle = [&](const std::vector<int32_t>& tokens, size_t upto) {
    for (; settled < upto; ++settled) {
      if (opt.eos_id && tokens[settled] == *opt.eos_id) return;
      if (on_settled) on_settled(tokens[settled]);
    }
  };
  std::vector<Candidate> cand;
  std::vector<int32_t> toks;
  std::vector<BatchRun> runs;
  std::vector<int> rows;
  for (int step = 0; step < opt.max_new_tokens; ++step) {
    // Every (beam, token) continuation, best first; ties broken by beam then token id.
    cand.clear();
    for (size_t b = 0; b < beams.size(); ++b)
      for (int v = 0; v < V; ++v) cand.push_back({beams[b].logprob + logp[b][v], static_cast<int>(b), v});
    const size_t keep = std::min(cand.size(), static_cast<size_t>(2 * B));
    std::partial_sort(cand.begin(), cand.begin() + static_cast<std::ptrdiff_t>(keep), cand.end(),
                      [](const Candidate& a, const Candidate& b) {
                        if (a.logprob != b.logprob) return a.logprob > b.logprob;
                        return a.beam != b.beam ? a.beam < b.beam : a.token < b.token;
                      });
    std::vector<Beam> next;
    std::vector<int> src;
    for (size_t i = 0; i < keep && static_cast<int>(next.size()) < B; ++i) {
      const Candidate& c = cand[i];
      std::vector<int32_t> t = beams[c.beam].tokens;
      t.push_back(c.token);
      if (opt.eos_id && c.token == *opt.eos_id) {
        // Only an eos ranked among the first num_beams candidates ends a hypothesis.
        if (static_cast<int>(i) < B && static_cast<int>(finished.size()) < B)
          finished.push_back({t, c.logprob, score_of(c.logprob, t.size())});
        continue;
      }
      next.push_back({std::move(t), c.logprob});
      src.push_back(c.beam);
    }
    if (static_cast<int>(finished.size()) >= B || next.empty() || step + 1 == opt.max_new_tokens) {
      beams = std::move(next);
      break;
    }
    if (on_settled) {  // the longest prefix every live beam and finished hypothesis shares
      size_t common = next[0].tokens.size();
      auto shrink = [&](const std::vector<int32_t>& t) {
        const auto end = t.begin() + static_cast<std::ptrdiff_t>(std::min(common, t.size()));
        common = static_cast<size_t>(std::mismatch(t.begin(), end, next[0].tokens.begin()).first - t.begin());
      };
      for (const Beam& b : next) shrink(b.tokens);
      for (const BeamHypothesis& h : finished) shrink(h.tokens);
      settle(next[0].tokens, common);
    }
    // Live beam i always sits in seqs[i]. Beam i continues the sequence of its parent src[i]:
    // gather the caches (a parent's state and KV pages copied or shared into its children), then
    // decode one token each. Slots past the live beams keep whatever they held (unused).
    const size_t m = std::max(next.size(), beams.size());
    std::vector<int> gather(m);
    for (size_t i = 0; i < m; ++i) gather[i] = i < src.size() ? src[i] : static_cast<int>(i);
    engine.cache().reorder(std::span(seqs).first(m), gather);
    toks.clear();
    runs.clear();
    rows.clear();
    for (size_t i = 0; i < next.size(); ++i) {
      toks.push_back(next[i].tokens.back());
      runs.push_back({seqs[i], 1});
      rows.push_back(static_cast<int>(i));
    }
    std::span<const float> l = engine.step(toks, runs, rows);
    logp.resize(next.size());
    for (size_t i = 0; i < next.size(); ++i) log_softmax(l.subspan(i * Vm, V), logp[i]);
    beams = std::move(next);
  }
  for (Beam& b : beams) finished.push_back({b.tokens, b.logprob, score_of(b.logprob, b.tokens.size())});
  std::stable_sort(finished.begin(), finished.end(),
                   [](const BeamHypothesis& a, const BeamHypothesis& b) { return a.score > b.score; });
  if (static_cast<int>(finished.size()) > B) finished.resize(B);
  if (!finished.empty()) settle(finished.front().tokens, finished.front().tokens.size());
  return finished;
}

}  // namespace hybridlm
