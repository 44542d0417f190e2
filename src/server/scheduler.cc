#include "server/scheduler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "base/error.h"

namespace hybridlm {

using Clock = std::chrono::steady_clock;

// ---- GenHandle ----

void GenHandle::push(GenEvent e) {
  {
    std::lock_guard lock(mu_);
    events_.push_back(std::move(e));
  }
  cv_.notify_all();
}

std::vector<GenEvent> GenHandle::wait(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return !events_.empty(); });
  std::vector<GenEvent> out(std::make_move_iterator(events_.begin()), std::make_move_iterator(events_.end()));
  events_.clear();
  return out;
}

Usage GenHandle::usage() const {
  std::lock_guard lock(mu_);
  return usage_;
}

// ---- the scheduler's records ----

struct Scheduler::Choice {
  Choice(int i, const GenRequest& r, const Tokenizer& tok)
      : index(i),
        sampler([&] {
          SamplingParams p = r.sampling;
          p.seed += static_cast<uint64_t>(i);
          return p;
        }()),
        stream(tok),
        stops(r.stop),
        history(r.prompt) {}
  int index;
  int seq = -1;
  Sampler sampler;
  StreamDecoder stream;
  StopMatcher stops;
  std::vector<int32_t> history;  // prompt and generated tokens
  int generated = 0;
  int32_t pending = -1;  // sampled, fed by the next step
  bool done = false;
  Clock::time_point last_token;
  std::vector<TokenLogprob> held_logprobs;  // tokens whose text the stop matcher still holds
  std::vector<float> logits;
  std::vector<double> logsm;   // log-softmax of the logits (logprobs requested), reused each token
  std::vector<int32_t> order;  // ids, partially sorted by logsm
};

struct Scheduler::Active {
  GenRequest req;
  std::shared_ptr<GenHandle> handle;
  Clock::time_point submitted = Clock::now();
  int seq = -1;  // the prompt's sequence (choice 0's after the fork)
  int pos = 0;   // prompt tokens in the cache
  bool prefilled = false, finished = false;
  int cached = 0;
  std::vector<TokenLogprob> prompt_lps;  // prompt_logprobs: the prompt's tokens so far
  int branch = 0;  // where the prompt leaves text a kept snapshot holds: a snapshot point (0: none)
  int64_t reserved_pages = 0;  // KV pages promised to the rest of its prompt (and the forks' first pages)
  std::vector<std::unique_ptr<Choice>> choices;
};

// ---- Scheduler ----

Scheduler::Scheduler(Engine& engine, const Tokenizer& tok, const SchedulerOptions& opt, Metrics& metrics)
    : engine_(engine),
      tok_(tok),
      opt_(opt),
      metrics_(metrics),
      slots_(engine.cache().max_sequences()),
      // Checkpoints pad the embedding past the tokenizer; ids it cannot decode are never sampled.
      decodable_(std::min<int32_t>(engine.vocab_size(), tok.vocab_size())),
      prefix_(engine.cache(), opt.prefix_cache_bytes) {
  // The end of a turn: the tokenizer's EOS, the config's, and any the caller adds (a chat
  // template's end-of-turn token, generation_config.json's list).
  for (std::optional<int32_t> id : {tok.eos_id(), engine.model().config().eos_token_id})
    if (id) stop_ids_.push_back(*id);
  stop_ids_.insert(stop_ids_.end(), opt.stop_ids.begin(), opt.stop_ids.end());
  check(opt_.step_tokens >= 1, "step tokens must be >= 1, got ", opt_.step_tokens);
  check(opt_.snapshot_interval >= 0, "--snapshot-interval must be >= 0, got ", opt_.snapshot_interval);
  check(opt_.max_queue >= 0, "--max-queue must be >= 0, got ", opt_.max_queue);
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() { shutdown(); }

void Scheduler::validate(const GenRequest& r) const {
  check(!r.prompt.empty(), "the prompt is empty");
  check(r.n >= 1 && r.n <= slots_, "n must be in [1, ", slots_, "] (the server's --slots), got ", r.n);
  check(r.max_tokens >= 0, "max_tokens must be >= 0, got ", r.max_tokens);
  const int64_t total = static_cast<int64_t>(r.prompt.size()) + r.max_tokens;
  check(static_cast<int64_t>(r.prompt.size()) < opt_.context, "the prompt (", r.prompt.size(),
        " tokens) does not fit the context of ", opt_.context, " tokens");
  check(total <= opt_.context, "the prompt (", r.prompt.size(), " tokens) plus max_tokens ", r.max_tokens,
        " exceeds the context of ", opt_.context, " tokens");
  check(r.top_logprobs <= 20, "top_logprobs must be in [0, 20], got ", r.top_logprobs);
  hybridlm::validate(r.sampling);
  engine_.model().check_tokens(r.prompt);
}

std::shared_ptr<GenHandle> Scheduler::submit(GenRequest req) {
  validate(req);
  auto a = std::make_unique<Active>();
  a->req = std::move(req);
  a->handle = std::make_shared<GenHandle>();
  auto handle = a->handle;
  {
    std::lock_guard lock(mu_);
    if (stop_) return nullptr;
    // max_queue may wait beyond those that free slots will take at the next admission.
    const int free_slots = std::max(0, slots_ - slots_held_.load());
    if (queue_.size() >= static_cast<size_t>(opt_.max_queue + free_slots)) return nullptr;
    queue_.push_back(std::move(a));
    ++submitted_;
  }
  cv_.notify_all();
  return handle;
}

// Starts `a` when a slot for each of its choices and the KV pages of its prompt (beyond a cached
// prefix) are free, pages already promised to other prompts aside; cached prefixes are dropped to
// make room. false leaves it queued. The pages are reserved until its prompt is in, so that
// admitted prompts always finish their prefill (no two half-done prompts wait on each other).
bool Scheduler::admit(std::unique_ptr<Active>& a) {
  HybridCache& cache = engine_.cache();
  const GenRequest& r = a->req;
  if (slots_held_ + r.n > slots_) return false;
  if (cache.has_kv()) {
    // A first estimate, before copying any state: the pages beyond what a cached prefix would
    // share whole, one more for its partial last page, and one per choice.
    const int64_t b = cache.block_size(), plen = static_cast<int64_t>(r.prompt.size());
    const int64_t match = r.prompt_logprobs ? 0 : prefix_.longest(r.prompt, static_cast<int>(plen) - 1);
    const int64_t estimate = (plen + b - 1) / b - match / b + 1 + r.n + 1;  // + 1: a branch snapshot's page
    while (estimate > cache.free_pages() - reserved_pages_ && prefix_.evict_one()) {
    }
    if (estimate > cache.free_pages() - reserved_pages_) return false;
  }
  a->seq = engine_.new_sequence();
  // Never the whole prompt: its last position must run to give the first token's logits. Nothing
  // when every position's logits are wanted.
  a->pos = r.prompt_logprobs ? 0 : prefix_.restore_longest(a->seq, r.prompt, static_cast<int>(r.prompt.size()) - 1);
  if (r.prompt_logprobs) a->prompt_lps.push_back({r.prompt[0], 0.0, {}, false});
  // A prompt that follows kept text past the restored point and then branches off: its prefill
  // stops and keeps a snapshot where it branches, so that later prompts on this branch (the same
  // system prompt or document, another question) restore all of the shared text.
  a->branch = 0;
  if (const int shared = prefix_.shared_length(r.prompt, static_cast<int>(r.prompt.size()) - 1); shared > a->pos)
    a->branch = shared;
  if (cache.has_kv()) {
    // The rest of the prompt, and a first page of its own for each choice (the last page is shared
    // with the forks and the prompt's snapshot); a branch snapshot inside a page shares that page
    // too, and the next chunk's first write copies it: one page more.
    const int64_t need = cache.pages_needed(a->seq, static_cast<int64_t>(r.prompt.size()) - a->pos) + r.n +
                         (a->branch > 0 && a->branch % cache.block_size() != 0 ? 1 : 0);
    while (need > cache.free_pages() - reserved_pages_ && prefix_.evict_one()) {
    }
    if (need > cache.free_pages() - reserved_pages_) {
      engine_.free_sequence(a->seq);
      a->seq = -1;
      a->pos = 0;
      return false;
    }
    a->reserved_pages = need;
    reserved_pages_ += need;
  }
  slots_held_ += r.n;
  a->cached = a->pos;
  if (a->cached > 0) metrics_.prefix_hit(a->cached);
  metrics_.add_prompt_tokens(static_cast<int64_t>(r.prompt.size()), a->cached);
  {
    std::lock_guard lock(a->handle->mu_);
    a->handle->usage_.prompt_tokens = static_cast<int>(r.prompt.size());
    a->handle->usage_.cached_tokens = a->cached;
  }
  for (int i = 0; i < r.n; ++i) a->choices.push_back(std::make_unique<Choice>(i, r, tok_));
  return true;
}

void Scheduler::unreserve(Active& a) {
  reserved_pages_ -= a.reserved_pages;
  a.reserved_pages = 0;
}

void Scheduler::release(Active& a) {
  for (auto& c : a.choices)
    if (c->seq >= 0) {
      engine_.free_sequence(c->seq);
      if (c->seq == a.seq) a.seq = -1;
      c->seq = -1;
    }
  if (a.seq >= 0) engine_.free_sequence(a.seq);
  a.seq = -1;
  unreserve(a);
  slots_held_ -= a.req.n;
  a.finished = true;
}

void Scheduler::fail_active(Active& a, const std::string& why, int status) {
  if (a.finished) return;
  try {
    release(a);
  } catch (const std::exception&) {
  }
  a.finished = true;
  GenEvent e{GenEvent::Failed, 0, {}, {}, {}, why};
  e.status = status;
  a.handle->push(std::move(e));
}

void Scheduler::finish_choice(Active& a, Choice& c, const char* reason) {
  if (c.done) return;
  c.done = true;
  std::string text;
  if (!c.stops.stopped()) {
    text = c.stops.push(c.stream.flush());
    text += c.stops.flush();
  } else {
    c.held_logprobs.clear();  // the tokens of the stop string: their text is not returned either
  }
  if (!text.empty() || !c.held_logprobs.empty())
    a.handle->push({GenEvent::Text, c.index, std::move(text), std::move(c.held_logprobs), {}, {}});
  a.handle->push({GenEvent::Finish, c.index, {}, {}, reason, {}});
  if (c.seq >= 0) {
    // What the sequence holds (prompt and generated tokens but the last, never fed) is the prefix
    // the next turn of a conversation starts with.
    const int held = engine_.cache().seq_length(c.seq);
    if (c.index == 0 && held > 0 && held <= static_cast<int>(c.history.size()))
      keep_prefix(c.seq, std::span(c.history).first(static_cast<size_t>(held)));
    engine_.free_sequence(c.seq);
    if (c.seq == a.seq) a.seq = -1;
    c.seq = -1;
  }
  if (std::all_of(a.choices.begin(), a.choices.end(), [](const auto& x) { return x->done; })) {
    unreserve(a);
    slots_held_ -= a.req.n;
    a.finished = true;
    a.handle->push({GenEvent::Done, 0, {}, {}, {}, {}});
  }
}

namespace {
// logsm = log-softmax of the logits (in double) and the k most likely ids into `top` (ties: the
// lower id first); `order` is working memory.
void log_softmax_top(std::span<const float> logits, int k, std::vector<double>& logsm, std::vector<int32_t>& order,
                     std::vector<std::pair<int32_t, double>>& top) {
  const float mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - mx);
  const double lse = mx + std::log(sum);
  logsm.resize(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) logsm[i] = logits[i] - lse;
  order.resize(logits.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
  const size_t n = std::min<size_t>(static_cast<size_t>(std::max(k, 0)), order.size());
  std::partial_sort(order.begin(), order.begin() + n, order.end(),
                    [&](int32_t x, int32_t y) { return logsm[x] > logsm[y] || (logsm[x] == logsm[y] && x < y); });
  for (size_t i = 0; i < n; ++i) top.push_back({order[i], logsm[order[i]]});
}
}  // namespace

// The log-probability of prompt token `pos` + 1 from the logits at `pos` (prompt_logprobs).
void Scheduler::score_prompt_token(Active& a, int pos, std::span<float> logits) {
  std::fill(logits.begin() + decodable_, logits.end(), -std::numeric_limits<float>::infinity());
  TokenLogprob lp;
  lp.id = a.req.prompt[static_cast<size_t>(pos) + 1];
  std::vector<double> logsm;
  std::vector<int32_t> order;
  log_softmax_top(logits, a.req.top_logprobs, logsm, order, lp.top);
  lp.logprob = logsm[static_cast<size_t>(lp.id)];
  a.prompt_lps.push_back(std::move(lp));
}

// Samples the next token of choice c from its logits, reports it, and ends the choice on eos, a
// stop string, max_tokens or the context.
void Scheduler::emit_token(Active& a, Choice& c, std::span<float> logits) {
  const GenRequest& r = a.req;
  std::fill(logits.begin() + decodable_, logits.end(), -std::numeric_limits<float>::infinity());
  TokenLogprob lp;
  std::vector<double>& logsm = c.logsm;
  // The model's distribution, before penalties and temperature.
  if (r.top_logprobs >= 0) log_softmax_top(logits, r.top_logprobs, logsm, c.order, lp.top);
  const int32_t next = c.sampler.sample(logits, c.history);
  const auto now = Clock::now();
  if (c.generated == 0)
    metrics_.ttft.observe(std::chrono::duration<double>(now - a.submitted).count());
  else
    metrics_.itl.observe(std::chrono::duration<double>(now - c.last_token).count());
  c.last_token = now;
  c.history.push_back(next);
  ++c.generated;
  metrics_.add_generated_tokens(1);
  {
    std::lock_guard lock(a.handle->mu_);
    ++a.handle->usage_.completion_tokens;
  }
  if (r.stop_at_eos && std::find(stop_ids_.begin(), stop_ids_.end(), next) != stop_ids_.end())
    return finish_choice(a, c, "stop");
  if (r.top_logprobs >= 0) {
    lp.id = next;
    lp.logprob = logsm[static_cast<size_t>(next)];
    c.held_logprobs.push_back(std::move(lp));
  }
  std::string text = c.stops.push(c.stream.push(next));
  if (!text.empty()) {
    a.handle->push({GenEvent::Text, c.index, std::move(text), std::move(c.held_logprobs), {}, {}});
    c.held_logprobs.clear();
  }
  if (c.stops.stopped()) return finish_choice(a, c, "stop");
  if (c.generated >= r.max_tokens || static_cast<int>(c.history.size()) >= opt_.context || Clock::now() >= r.deadline)
    return finish_choice(a, c, "length");
  c.pending = next;
}

bool Scheduler::step_once() {
  HybridCache& cache = engine_.cache();
  step_tokens_.clear();
  step_runs_.clear();
  step_rows_.clear();
  struct RowOwner {
    Active* a;
    Choice* c;            // null: the last prompt token of a (its first logits), or
    int prompt_pos = -1;  // >= 0: the prompt position whose logits score the next prompt token
  };
  std::vector<RowOwner> owners;
  struct PrefillRun {
    Active* a;
    int len;
  };
  std::vector<PrefillRun> prefills;
  int budget = opt_.step_tokens;
  int64_t taken = 0;  // unreserved pages this step's decode tokens take
  // 1. One decode token of every running choice (they never wait behind a prompt), from the pages
  // no admitted prompt holds.
  for (auto& a : running_) {
    if (a->finished || !a->prefilled) continue;
    for (auto& c : a->choices) {
      if (c->done) continue;
      if (cache.has_kv()) {
        const int64_t need = cache.pages_needed(c->seq, 1);
        // Cached prefixes hold pages: drop them (least recently used first) before a choice ends.
        while (need > cache.free_pages() - reserved_pages_ - taken && prefix_.evict_one()) {
        }
        if (need > cache.free_pages() - reserved_pages_ - taken) {
          finish_choice(*a, *c, "length");  // the KV cache is full: this choice ends here
          continue;
        }
        taken += need;
      }
      step_runs_.push_back({c->seq, 1});
      step_rows_.push_back(static_cast<int>(step_tokens_.size()));
      step_tokens_.push_back(c->pending);
      owners.push_back({a.get(), c.get()});
      --budget;
    }
  }
  // 2. Prefill chunks of admitted prompts, oldest first, within what is left of the budget (their
  // pages were reserved at admission); a chunk ends at the next snapshot point so that the state
  // there can be kept.
  for (auto& a : running_) {
    if (a->finished || a->prefilled || budget <= 0) continue;
    const int plen = static_cast<int>(a->req.prompt.size());
    int len = std::min(plen - a->pos, budget);
    if (opt_.snapshot_interval > 0) {
      const int next = (a->pos / opt_.snapshot_interval + 1) * opt_.snapshot_interval;
      if (next < plen) len = std::min(len, next - a->pos);
    }
    if (a->branch > a->pos) len = std::min(len, a->branch - a->pos);
    if (cache.has_kv()) {
      const int64_t need = std::min(cache.pages_needed(a->seq, len), a->reserved_pages);
      a->reserved_pages -= need;
      reserved_pages_ -= need;
    }
    step_runs_.push_back({a->seq, len});
    if (a->req.prompt_logprobs)
      for (int p = a->pos; p < a->pos + len && p + 1 < plen; ++p) {
        step_rows_.push_back(static_cast<int>(step_tokens_.size()) + p - a->pos);
        owners.push_back({a.get(), nullptr, p});
      }
    step_tokens_.insert(step_tokens_.end(), a->req.prompt.begin() + a->pos, a->req.prompt.begin() + a->pos + len);
    if (a->pos + len == plen) {
      step_rows_.push_back(static_cast<int>(step_tokens_.size()) - 1);
      owners.push_back({a.get(), nullptr});
    }
    prefills.push_back({a.get(), len});
    budget -= len;
  }
  if (step_runs_.empty()) return false;
  std::span<const float> logits;
  try {
    logits = engine_.step(step_tokens_, step_runs_, step_rows_);
  } catch (const std::exception& e) {
    // The step's sequences may be part-advanced (the cache marked them failed): end their requests.
    for (const RowOwner& o : owners) fail_active(*o.a, std::string("generation failed: ") + e.what());
    for (const PrefillRun& p : prefills) fail_active(*p.a, std::string("generation failed: ") + e.what());
    return true;
  }
  const size_t vocab = static_cast<size_t>(engine_.vocab_size());
  for (const PrefillRun& p : prefills) {
    Active& a = *p.a;
    a.pos += p.len;
    if (a.pos < static_cast<int>(a.req.prompt.size()) &&
        ((opt_.snapshot_interval > 0 && a.pos % opt_.snapshot_interval == 0) || a.pos == a.branch))
      keep_prefix(a.seq, std::span(a.req.prompt).first(static_cast<size_t>(a.pos)));
  }
  for (size_t i = 0; i < owners.size(); ++i) {
    Active& a = *owners[i].a;
    if (a.finished) continue;
    std::span<const float> row = logits.subspan(i * vocab, vocab);
    // One request's trouble (an id its tokenizer cannot decode, no memory) ends that request only.
    try {
      if (owners[i].c) {
        Choice& c = *owners[i].c;
        if (c.done) continue;
        c.logits.assign(row.begin(), row.end());
        emit_token(a, c, c.logits);
        continue;
      }
      if (owners[i].prompt_pos >= 0) {
        std::vector<float> l(row.begin(), row.end());
        score_prompt_token(a, owners[i].prompt_pos, l);
        continue;
      }
      // The prompt is in: kept for the next turn of a conversation (whose prompt starts with this
      // one even when the answer re-tokenizes differently); every choice gets its sequence (forks
      // share the KV pages) before any of them samples, since a choice that ends at once frees its own.
      a.prefilled = true;
      unreserve(a);
      if (a.req.prompt_logprobs) {
        GenEvent e;
        e.kind = GenEvent::Prompt;
        e.logprobs = std::move(a.prompt_lps);
        a.handle->push(std::move(e));
      }
      keep_prefix(a.seq, a.req.prompt);
      for (auto& c : a.choices) c->seq = c->index == 0 ? a.seq : cache.fork(a.seq);
      for (auto& c : a.choices) {
        if (a.req.max_tokens == 0) {
          finish_choice(a, *c, "length");
          continue;
        }
        c->logits.assign(row.begin(), row.end());
        emit_token(a, *c, c->logits);
      }
    } catch (const std::exception& e) {
      fail_active(a, std::string("generation failed: ") + e.what());
    }
  }
  return true;
}

// A snapshot for prefix reuse; one that cannot be kept (no memory) is only a missed reuse.
void Scheduler::keep_prefix(int seq, std::span<const int32_t> tokens) {
  try {
    prefix_.insert(seq, tokens);
  } catch (const std::exception&) {
  }
}

void Scheduler::loop() {
  bool idle = true;  // the last step ran nothing: wait for a change instead of spinning
  for (;;) {
    {
      std::unique_lock lock(mu_);
      // Nothing ran last time (or nothing runs): wait for a new request, or a while (deadlines,
      // cancellations and pages freed by other means are checked each round).
      if (running_.empty() || idle) {
        const uint64_t seen = submitted_;
        cv_.wait_for(lock, std::chrono::milliseconds(running_.empty() ? 100 : 10),
                     [&] { return stop_ || submitted_ != seen; });
      }
      if (stop_) return;
      // Requests that gave up or timed out while queued leave without running.
      const auto now = Clock::now();
      for (auto it = queue_.begin(); it != queue_.end();) {
        Active& a = **it;
        if (a.handle->cancelled()) {
          it = queue_.erase(it);
        } else if (now >= a.req.deadline) {
          GenEvent e{GenEvent::Failed, 0, {}, {}, {}, "the request timed out waiting for a free slot"};
          e.status = 503;
          a.handle->push(std::move(e));
          it = queue_.erase(it);
        } else {
          ++it;
        }
      }
      // Admission in arrival order: the first that does not fit waits, and so do those behind it.
      while (!queue_.empty()) {
        bool ok = false;
        try {
          ok = admit(queue_.front());
        } catch (const std::exception& e) {
          queue_.front()->handle->push({GenEvent::Failed, 0, {}, {}, {}, e.what()});
          queue_.pop_front();
          continue;
        }
        if (!ok) break;
        running_.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      metrics_.set_gauges(static_cast<int>(queue_.size()), slots_held_, slots_,
                          engine_.cache().total_pages() - engine_.cache().free_pages(), engine_.cache().total_pages(),
                          prefix_.bytes(), prefix_.entries());
    }
    // A client that went away frees its slot before the next step; a request past its deadline
    // ends: still in its prompt, with an error; generating, as "length".
    const auto now = Clock::now();
    for (auto& a : running_) {
      if (a->finished) continue;
      try {
        if (a->handle->cancelled()) {
          release(*a);
          a->handle->push({GenEvent::Done, 0, {}, {}, {}, {}});
        } else if (now >= a->req.deadline) {
          if (!a->prefilled) {
            fail_active(*a, "the request timed out before its prompt was processed", 503);
          } else {
            for (auto& c : a->choices) finish_choice(*a, *c, "length");
          }
        }
      } catch (const std::exception& e) {
        fail_active(*a, e.what());
      }
    }
    idle = !step_once();
    std::erase_if(running_, [](const auto& a) { return a->finished; });
  }
}

void Scheduler::shutdown() {
  {
    std::lock_guard lock(mu_);
    if (stop_ && !thread_.joinable()) return;
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard lock(mu_);
  for (auto& a : queue_) a->handle->push({GenEvent::Failed, 0, {}, {}, {}, "the server is shutting down"});
  queue_.clear();
  for (auto& a : running_)
    if (!a->finished) fail_active(*a, "the server is shutting down", 503);
  running_.clear();
}

}  // namespace hybridlm
