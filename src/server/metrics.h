// What the server counts, in Prometheus' text exposition format (GET /metrics): requests by
// HTTP status, prompt and generated tokens, queue depth, slots and KV pages in use, prefix-cache
// hits and reused tokens, and histograms of time to first token and inter-token latency.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace hybridlm {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double v);
  // "name_bucket{le=...} n" lines (cumulative), name_sum and name_count.
  void write(std::string& out, const std::string& name, const std::string& help) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // one per bound, plus +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
  mutable std::mutex mu_;
};

class Metrics {
 public:
  Metrics();
  void request_done(int http_status);
  void add_prompt_tokens(int64_t n, int64_t cached);
  void add_generated_tokens(int64_t n);
  void prefix_hit(int64_t tokens_reused);
  void set_gauges(int queue_depth, int slots_in_use, int slots_total, int kv_pages_in_use, int kv_pages_total,
                  size_t prefix_cache_bytes, size_t prefix_cache_entries);
  Histogram ttft{{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}};
  Histogram itl{{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}};
  std::string prometheus() const;

  // For tests and the load generator: the counter values now.
  int64_t prefix_hits() const;
  int64_t prefix_tokens_reused() const;

 private:
  mutable std::mutex mu_;
  std::map<int, int64_t> by_status_;
  int64_t prompt_tokens_ = 0, cached_tokens_ = 0, generated_tokens_ = 0, prefix_hits_ = 0, prefix_reused_ = 0;
  int queue_depth_ = 0, slots_in_use_ = 0, slots_total_ = 0, kv_in_use_ = 0, kv_total_ = 0;
  size_t prefix_bytes_ = 0, prefix_entries_ = 0;
};

}  // namespace hybridlm
