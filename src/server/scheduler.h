// The serving loop (ARCHITECTURE.md section 7): continuous batching over the engine's varlen
// steps, admission by state slots and KV pages, a bounded waiting queue, and prefix reuse of whole
// sequence snapshots. It knows nothing of HTTP: a request is token ids and sampling parameters in,
// a stream of events out. One thread (the scheduler's) owns the engine and its cache.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/engine.h"
#include "server/metrics.h"
#include "server/prefix_cache.h"

namespace hybridlm {

struct GenRequest {
  std::vector<int32_t> prompt;  // ids, at least one
  int max_tokens = 16;          // tokens to generate per choice (0: none)
  SamplingParams sampling;      // choice i samples with seed sampling.seed + i
  std::vector<std::string> stop;
  bool stop_at_eos = true;
  int n = 1;              // choices: the prompt is computed once, then forked
  int top_logprobs = -1;  // -1: no logprobs; k >= 0: the chosen token's and the k most likely
  // Also each prompt token's log-probability given the tokens before it, with top_logprobs
  // alternatives (echo with logprobs): the whole prompt runs, no cached prefix is restored.
  bool prompt_logprobs = false;
  // Past this the request ends: queued, it is dropped; running, it finishes as "length".
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
};

struct TokenLogprob {
  int32_t id = 0;
  double logprob = 0;
  std::vector<std::pair<int32_t, double>> top;  // most likely first
  bool scored = true;  // false: a prompt's first token, which nothing before it predicts
};

// What a request hears, in order. Text events carry newly final text (complete UTF-8, never part
// of a stop string) of one choice; a Finish event ends a choice; Done comes once, last. With
// prompt_logprobs, one Prompt event (choice 0) carries the prompt's tokens before any Text.
struct GenEvent {
  enum Kind { Text, Finish, Done, Failed, Prompt } kind = Text;
  int choice = 0;
  std::string text;
  std::vector<TokenLogprob> logprobs;  // the tokens behind `text` (Text; with top_logprobs >= 0)
  std::string finish_reason;           // Finish: "stop" or "length"
  std::string message;                 // Failed: why (the request's tokens were not all served)
  int status = 500;                    // Failed: the HTTP status it stands for (503: timed out / shutting down)
};

struct Usage {
  int prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
};

// The HTTP thread's side of one request.
class GenHandle {
 public:
  // Waits up to `timeout` for events; returns what arrived (empty on timeout).
  std::vector<GenEvent> wait(std::chrono::milliseconds timeout);
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }
  Usage usage() const;

 private:
  friend class Scheduler;
  void push(GenEvent e);
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<GenEvent> events_;
  Usage usage_;
  std::atomic<bool> cancelled_{false};
};

struct SchedulerOptions {
  int step_tokens = 256;        // tokens per engine step: decode tokens first, then prefill chunks
  int max_queue = 64;           // waiting requests beyond the running ones; more are refused
  int context = 4096;           // prompt + generated tokens per sequence
  int snapshot_interval = 256;  // prefill snapshots every this many prompt tokens (0 = off)
  size_t prefix_cache_bytes = 64u << 20;
  // Tokens that end a choice besides the tokenizer's and the config's EOS (generation_config.json's
  // eos_token_id list, a chat template's end-of-turn token).
  std::vector<int32_t> stop_ids;
};

class Scheduler {
 public:
  Scheduler(Engine& engine, const Tokenizer& tok, const SchedulerOptions& opt, Metrics& metrics);
  ~Scheduler();  // shutdown()
  // Stops the loop; requests still queued or running end with Failed, and submit() refuses from
  // now on. Call it before stopping the HTTP threads that wait on requests.
  void shutdown();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request; nullptr when the queue is full (the caller answers 503). Throws Error for a
  // request that can never run (n above the slots, prompt + max_tokens over the context, an id
  // outside the vocabulary).
  std::shared_ptr<GenHandle> submit(GenRequest req);
  void validate(const GenRequest& req) const;
  const SchedulerOptions& options() const { return opt_; }
  int slots() const { return slots_; }

 private:
  struct Choice;
  struct Active;
  void loop();
  bool admit(std::unique_ptr<Active>& a);
  bool step_once();  // false: nothing could run
  void finish_choice(Active& a, Choice& c, const char* reason);
  void fail_active(Active& a, const std::string& why, int status = 500);
  void unreserve(Active& a);
  void keep_prefix(int seq, std::span<const int32_t> tokens);
  void emit_token(Active& a, Choice& c, std::span<float> logits);
  void score_prompt_token(Active& a, int pos, std::span<float> logits);
  void release(Active& a);

  Engine& engine_;
  const Tokenizer& tok_;
  SchedulerOptions opt_;
  Metrics& metrics_;
  int slots_;
  int32_t decodable_;
  std::vector<int32_t> stop_ids_;
  int64_t reserved_pages_ = 0;  // KV pages promised to admitted prompts (scheduler thread only)
  PrefixCache prefix_;

  std::mutex mu_;  // guards queue_ and stop_
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Active>> queue_;
  bool stop_ = false;
  uint64_t submitted_ = 0;          // requests queued so far (wakes an idle loop)
  std::atomic<int> slots_held_{0};  // slots of running requests (n each); written by the loop only

  // The scheduler thread's own.
  std::vector<std::unique_ptr<Active>> running_;
  std::vector<int32_t> step_tokens_;
  std::vector<BatchRun> step_runs_;
  std::vector<int> step_rows_;
  std::thread thread_;
};

}  // namespace hybridlm
