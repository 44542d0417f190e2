// The serving scheduler on the random-weight fixtures (a pure Mamba-2 and hybrids with attention):
// requests that run together, queue, share a prefix or fork give exactly the tokens they give
// alone and cold; the queue refuses past its bound; a cancelled or starved request ends cleanly.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <random>
#include <thread>

#include "base/error.h"
#include "server/scheduler.h"

namespace hybridlm {
namespace {

using namespace std::chrono_literals;

std::filesystem::path fixture(const char* name) {
  const char* d = std::getenv("HYBRIDLM_TEST_MODELS");
  if (!d) throw std::runtime_error("HYBRIDLM_TEST_MODELS is not set (run through ctest)");
  return std::filesystem::path(d) / name;
}

const Tokenizer& neox() {
  static const Tokenizer tok = [] {
    const char* d = std::getenv("HYBRIDLM_TEST_DATA");
    if (!d) throw std::runtime_error("HYBRIDLM_TEST_DATA is not set (run through ctest)");
    return Tokenizer::load(std::filesystem::path(d) / "tokenizers" / "gpt-neox-20b");
  }();
  return tok;
}

std::vector<int32_t> random_ids(int n, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> ids(n);
  for (auto& v : ids) v = static_cast<int32_t>(rng() % vocab);
  return ids;
}

struct Result {
  std::vector<std::vector<int32_t>> tokens;  // per choice
  std::vector<std::string> text, finish;
  Usage usage;
  std::string failed;
};

// Collects a request's events until Done or Failed (bounded: 60 s).
Result collect(GenHandle& h, int n) {
  Result r;
  r.tokens.resize(n);
  r.text.resize(n);
  r.finish.resize(n);
  const auto until = std::chrono::steady_clock::now() + 60s;
  for (;;) {
    if (std::chrono::steady_clock::now() > until) throw std::runtime_error("request did not finish in 60 s");
    for (GenEvent& e : h.wait(200ms)) {
      switch (e.kind) {
        case GenEvent::Text:
          r.text[e.choice] += e.text;
          for (const TokenLogprob& lp : e.logprobs) r.tokens[e.choice].push_back(lp.id);
          break;
        case GenEvent::Finish: r.finish[e.choice] = e.finish_reason; break;
        case GenEvent::Failed: r.failed = e.message; return r;
        case GenEvent::Prompt: break;  // prompt_logprobs: not asked here
        case GenEvent::Done: r.usage = h.usage(); return r;
      }
    }
  }
}

GenRequest request(std::vector<int32_t> prompt, uint64_t seed, int max_tokens) {
  GenRequest g;
  g.prompt = std::move(prompt);
  g.max_tokens = max_tokens;
  g.sampling.seed = seed;
  g.sampling.temperature = 0.9f;
  g.sampling.min_p = 0;
  g.stop_at_eos = false;
  g.top_logprobs = 0;  // the chosen ids come back with the text
  return g;
}

EngineOptions engine_options(int slots) {
  EngineOptions o;
  o.threads = 2;
  o.max_sequences = slots;
  o.context = 1024;
  o.kv_dtype = DType::F32;
  return o;
}

class Scheduling : public ::testing::TestWithParam<const char*> {};

// 16 requests at once, 4 slots, small steps (prompts are prefilled in chunks beside decodes):
// each gets exactly the tokens it gets alone.
TEST_P(Scheduling, ConcurrentRequestsEqualEachAlone) {
  Engine e(fixture(GetParam()), engine_options(4));
  Metrics m;
  SchedulerOptions so;
  so.step_tokens = 24;
  so.prefix_cache_bytes = 0;
  so.context = 1024;
  const int V = std::min(e.vocab_size(), neox().vocab_size());
  std::vector<GenRequest> reqs;
  for (int i = 0; i < 16; ++i) reqs.push_back(request(random_ids(3 + 19 * i, V, 100 + i), 7 + i, 6 + i % 5));
  std::vector<Result> alone;
  {
    Scheduler s(e, neox(), so, m);
    for (const GenRequest& g : reqs) {
      auto h = s.submit(g);
      ASSERT_TRUE(h);
      alone.push_back(collect(*h, 1));
      ASSERT_EQ(alone.back().failed, "");
    }
  }
  std::vector<std::shared_ptr<GenHandle>> hs;
  so.max_queue = 16;
  Scheduler big(e, neox(), so, m);
  for (const GenRequest& g : reqs) {
    hs.push_back(big.submit(g));
    ASSERT_TRUE(hs.back());
  }
  for (size_t i = 0; i < reqs.size(); ++i) {
    Result r = collect(*hs[i], 1);
    ASSERT_EQ(r.failed, "") << i;
    EXPECT_EQ(r.tokens[0], alone[i].tokens[0]) << "request " << i;
    EXPECT_EQ(r.text[0], alone[i].text[0]) << "request " << i;
    EXPECT_EQ(r.finish[0], "length");
    EXPECT_EQ(static_cast<int>(r.tokens[0].size()), reqs[i].max_tokens);
    EXPECT_EQ(r.usage.prompt_tokens, static_cast<int>(reqs[i].prompt.size()));
    EXPECT_EQ(r.usage.completion_tokens, reqs[i].max_tokens);
  }
}

// A prompt sharing a prefix with an earlier one restores the snapshot at the last snapshot point
// inside the shared part and prefills the rest, keeping a snapshot where it branches off, which a
// third prompt on the same branch restores whole; a next turn (prompt + answer + more) restores the
// whole earlier conversation. Both give exactly the tokens of a cold run.
TEST_P(Scheduling, PrefixReuseGivesTheColdTokens) {
  Engine e(fixture(GetParam()), engine_options(2));
  Metrics m;
  SchedulerOptions cold_opt;
  cold_opt.step_tokens = 64;
  cold_opt.prefix_cache_bytes = 0;
  SchedulerOptions warm_opt = cold_opt;
  warm_opt.prefix_cache_bytes = 64u << 20;
  warm_opt.snapshot_interval = 32;
  const int V = std::min(e.vocab_size(), neox().vocab_size());
  const std::vector<int32_t> shared = random_ids(150, V, 5);
  std::vector<int32_t> p1 = shared, p2 = shared;
  const std::vector<int32_t> t1 = random_ids(30, V, 6), t2 = random_ids(41, V, 7);
  p1.insert(p1.end(), t1.begin(), t1.end());
  p2.insert(p2.end(), t2.begin(), t2.end());

  Scheduler warm(e, neox(), warm_opt, m);
  auto h1 = warm.submit(request(p1, 1, 8));
  const Result r1 = collect(*h1, 1);
  ASSERT_EQ(r1.failed, "");
  EXPECT_EQ(r1.usage.cached_tokens, 0);
  auto h2 = warm.submit(request(p2, 2, 8));
  const Result r2 = collect(*h2, 1);
  ASSERT_EQ(r2.failed, "");
  EXPECT_EQ(r2.usage.cached_tokens, 128);  // the last multiple of 32 within the 150 shared tokens
  // p2 branched off p1 after the 150 shared tokens: its prefill kept a snapshot there, so a third
  // prompt on that branch restores all of them.
  std::vector<int32_t> p4 = shared;
  const std::vector<int32_t> t4 = random_ids(9, V, 9);
  p4.insert(p4.end(), t4.begin(), t4.end());
  auto h4 = warm.submit(request(p4, 4, 8));
  const Result r4 = collect(*h4, 1);
  ASSERT_EQ(r4.failed, "");
  EXPECT_EQ(r4.usage.cached_tokens, 150);
  // The next turn: p1, its answer, and a new message.
  std::vector<int32_t> p3 = p1;
  p3.insert(p3.end(), r1.tokens[0].begin(), r1.tokens[0].end());
  const std::vector<int32_t> t3 = random_ids(12, V, 8);
  p3.insert(p3.end(), t3.begin(), t3.end());
  auto h3 = warm.submit(request(p3, 3, 8));
  const Result r3 = collect(*h3, 1);
  ASSERT_EQ(r3.failed, "");
  // The sequence held the prompt and every generated token but the last (never fed).
  EXPECT_EQ(r3.usage.cached_tokens, static_cast<int>(p1.size() + r1.tokens[0].size()) - 1);
  EXPECT_EQ(m.prefix_hits(), 3);

  Scheduler cold(e, neox(), cold_opt, m);
  for (auto [prompt, seed, warm_result] : {std::tuple{&p2, 2, &r2}, std::tuple{&p3, 3, &r3}, std::tuple{&p4, 4, &r4}}) {
    auto h = cold.submit(request(*prompt, static_cast<uint64_t>(seed), 8));
    const Result r = collect(*h, 1);
    EXPECT_EQ(r.usage.cached_tokens, 0);
    EXPECT_EQ(r.tokens[0], warm_result->tokens[0]) << "seed " << seed;
  }
}

// n choices fork the state after one prefill; choice i samples as a lone request with seed + i.
TEST_P(Scheduling, ForkedChoicesEqualSeparateRequests) {
  Engine e(fixture(GetParam()), engine_options(4));
  Metrics m;
  SchedulerOptions so;
  so.prefix_cache_bytes = 0;
  const int V = std::min(e.vocab_size(), neox().vocab_size());
  Scheduler s(e, neox(), so, m);
  GenRequest g = request(random_ids(37, V, 9), 40, 10);
  g.n = 3;
  const Result all = collect(*s.submit(g), 3);
  ASSERT_EQ(all.failed, "");
  EXPECT_EQ(all.usage.completion_tokens, 30);
  for (int i = 0; i < 3; ++i) {
    GenRequest one = g;
    one.n = 1;
    one.sampling.seed = 40 + i;
    const Result r = collect(*s.submit(one), 1);
    EXPECT_EQ(all.tokens[i], r.tokens[0]) << "choice " << i;
  }
  EXPECT_NE(all.tokens[0], all.tokens[1]);  // different seeds: different samples (random weights)
}

INSTANTIATE_TEST_SUITE_P(Models, Scheduling, ::testing::Values("mamba2_g2", "hybridlm", "jamba"));

// With 1 slot and max_queue 1: one runs, one waits, the next is refused; a cancelled request
// frees its slot for the one waiting.
TEST(SchedulerQueue, BoundedQueueAndCancel) {
  Engine e(fixture("hybridlm"), engine_options(1));
  Metrics m;
  SchedulerOptions so;
  so.max_queue = 1;
  so.context = 1024;
  Scheduler s(e, neox(), so, m);
  const int V = std::min(e.vocab_size(), neox().vocab_size());
  auto a = s.submit(request(random_ids(10, V, 1), 1, 900));
  ASSERT_TRUE(a);
  // Wait until a runs (its first text), so that the queue holds only what follows.
  bool running = false;
  for (int i = 0; i < 100 && !running; ++i)
    for (const GenEvent& ev : a->wait(100ms)) running |= ev.kind == GenEvent::Text;
  ASSERT_TRUE(running);
  auto b = s.submit(request(random_ids(10, V, 2), 2, 5));
  ASSERT_TRUE(b);
  EXPECT_FALSE(s.submit(request(random_ids(10, V, 3), 3, 5)));  // the queue is full
  a->cancel();
  const Result rb = collect(*b, 1);
  EXPECT_EQ(rb.failed, "");
  EXPECT_EQ(rb.tokens[0].size(), 5u);
}

// A request that can never run is refused at submit; one that outgrows the KV pages ends as
// "length", and the server goes on.
TEST(SchedulerLimits, RefusalsAndKvExhaustion) {
  EngineOptions o = engine_options(2);
  o.kv_pages = 6;  // 96 tokens of KV at block 16
  Engine e(fixture("hybridlm"), o);
  Metrics m;
  SchedulerOptions so;
  so.context = 1024;
  so.prefix_cache_bytes = 0;
  Scheduler s(e, neox(), so, m);
  const int V = std::min(e.vocab_size(), neox().vocab_size());
  EXPECT_THROW(s.submit(request({}, 1, 5)), Error);
  EXPECT_THROW(s.submit(request(random_ids(1000, V, 1), 1, 100)), Error);  // over the context
  GenRequest n_big = request(random_ids(5, V, 1), 1, 5);
  n_big.n = 3;
  EXPECT_THROW(s.submit(n_big), Error);  // more choices than slots
  EXPECT_THROW(s.submit(request({V + 100000}, 1, 5)), Error);
  const Result r = collect(*s.submit(request(random_ids(40, V, 4), 4, 200)), 1);
  EXPECT_EQ(r.failed, "");
  EXPECT_EQ(r.finish[0], "length");
  EXPECT_EQ(r.tokens[0].size(), 96u - 40u + 1u);  // the KV pages hold 96 tokens; the last is sampled, never fed
  const Result again = collect(*s.submit(request(random_ids(8, V, 5), 5, 4)), 1);
  EXPECT_EQ(again.tokens[0].size(), 4u);
}

}  // namespace
}  // namespace hybridlm
