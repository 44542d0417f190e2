#include "runtime/engine.h"

#include <algorithm>
#include <thread>

#include "base/error.h"

namespace hybridlm {

static int default_threads(int n) {
  if (n > 0) return n;
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

Engine::Engine(const std::filesystem::path& dir, const EngineOptions& opt)
    : model_(Model::load(dir, opt.load)), pool_(default_threads(opt.threads)) {
  ctx_.pool = &pool_;
  check(opt.max_sequences > 0, "max sequences must be > 0");
  states_ = std::make_unique<StatePool>(model_.state_specs(), opt.max_sequences);
}

std::span<const float> Engine::step(std::span<const int32_t> tokens, std::span<const BatchRun> runs,
                                    std::span<const int> logit_rows) {
  logits_.resize(logit_rows.size() * static_cast<size_t>(vocab_size()));
  model_.forward(ctx_, tokens, runs, *states_, logit_rows, logits_.data(), scratch_);
  return logits_;
}

std::vector<float> Engine::prefill(int slot, std::span<const int32_t> tokens, bool all_logits, int chunk) {
  check(!tokens.empty(), "empty prompt: nothing to evaluate");
  std::vector<float> out;
  std::vector<int> rows;
  for (size_t b = 0; b < tokens.size(); b += static_cast<size_t>(chunk)) {
    const int n = static_cast<int>(std::min<size_t>(chunk, tokens.size() - b));
    const BatchRun run{slot, n};
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
  for (const std::string& s : stops_) {
    const size_t at = held_.find(s);
    if (!s.empty() && at != std::string::npos) {
      stopped_ = true;
      std::string out = held_.substr(0, at);
      held_.clear();
      return out;
    }
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
  for (int i = 0; i < opt.max_new_tokens; ++i) {
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
