#include "server/metrics.h"

#include <cinttypes>
#include <cstdio>

namespace hybridlm {
namespace {

void line(std::string& out, const char* fmt, auto... args) {
  char buf[256];
  std::snprintf(buf, sizeof buf, fmt, args...);
  out += buf;
}

void header(std::string& out, const char* name, const char* type, const char* help) {
  line(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1) {}

void Histogram::observe(double v) {
  std::lock_guard lock(mu_);
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::write(std::string& out, const std::string& name, const std::string& help) const {
  std::lock_guard lock(mu_);
  header(out, name.c_str(), "histogram", help.c_str());
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    line(out, "%s_bucket{le=\"%g\"} %" PRIu64 "\n", name.c_str(), bounds_[i], cum);
  }
  cum += counts_.back();
  line(out, "%s_bucket{le=\"+Inf\"} %" PRIu64 "\n", name.c_str(), cum);
  line(out, "%s_sum %.6f\n%s_count %" PRIu64 "\n", name.c_str(), sum_, name.c_str(), count_);
}

Metrics::Metrics() = default;

void Metrics::request_done(int http_status) {
  std::lock_guard lock(mu_);
  ++by_status_[http_status];
}

void Metrics::add_prompt_tokens(int64_t n, int64_t cached) {
  std::lock_guard lock(mu_);
  prompt_tokens_ += n;
  cached_tokens_ += cached;
}

void Metrics::add_generated_tokens(int64_t n) {
  std::lock_guard lock(mu_);
  generated_tokens_ += n;
}

void Metrics::prefix_hit(int64_t tokens_reused) {
  std::lock_guard lock(mu_);
  ++prefix_hits_;
  prefix_reused_ += tokens_reused;
}

void Metrics::set_gauges(int queue_depth, int slots_in_use, int slots_total, int kv_pages_in_use, int kv_pages_total,
                         size_t prefix_cache_bytes, size_t prefix_cache_entries) {
  std::lock_guard lock(mu_);
  queue_depth_ = queue_depth;
  slots_in_use_ = slots_in_use;
  slots_total_ = slots_total;
  kv_in_use_ = kv_pages_in_use;
  kv_total_ = kv_pages_total;
  prefix_bytes_ = prefix_cache_bytes;
  prefix_entries_ = prefix_cache_entries;
}

int64_t Metrics::prefix_hits() const {
  std::lock_guard lock(mu_);
  return prefix_hits_;
}

int64_t Metrics::prefix_tokens_reused() const {
  std::lock_guard lock(mu_);
  return prefix_reused_;
}

std::string Metrics::prometheus() const {
  std::string out;
  {
    std::lock_guard lock(mu_);
    header(out, "hybridlm_requests_total", "counter", "HTTP requests answered, by status code");
    for (const auto& [status, n] : by_status_)
      line(out, "hybridlm_requests_total{status=\"%d\"} %" PRId64 "\n", status, n);
    struct Scalar {
      const char *name, *type, *help;
      double value;
    };
    const Scalar scalars[] = {
        {"hybridlm_prompt_tokens_total", "counter", "prompt tokens of admitted requests (cached ones included)",
         static_cast<double>(prompt_tokens_)},
        {"hybridlm_generated_tokens_total", "counter", "tokens generated", static_cast<double>(generated_tokens_)},
        {"hybridlm_prefix_cache_hits_total", "counter", "requests that restored a cached prefix",
         static_cast<double>(prefix_hits_)},
        {"hybridlm_prefix_cache_reused_tokens_total", "counter", "prompt tokens restored instead of computed",
         static_cast<double>(prefix_reused_)},
        {"hybridlm_queue_depth", "gauge", "requests waiting for a slot", static_cast<double>(queue_depth_)},
        {"hybridlm_slots_in_use", "gauge", "state slots held by running requests", static_cast<double>(slots_in_use_)},
        {"hybridlm_slots_total", "gauge", "state slots", static_cast<double>(slots_total_)},
        {"hybridlm_kv_pages_in_use", "gauge", "KV cache pages in use (running sequences and cached prefixes)",
         static_cast<double>(kv_in_use_)},
        {"hybridlm_kv_pages_total", "gauge", "KV cache pages", static_cast<double>(kv_total_)},
        {"hybridlm_prefix_cache_bytes", "gauge", "bytes held by cached prefixes", static_cast<double>(prefix_bytes_)},
        {"hybridlm_prefix_cache_entries", "gauge", "cached prefixes", static_cast<double>(prefix_entries_)},
    };
    for (const Scalar& m : scalars) {
      header(out, m.name, m.type, m.help);
      line(out, "%s %.0f\n", m.name, m.value);
    }
  }
  ttft.write(out, "hybridlm_time_to_first_token_seconds", "time from admission request to the first generated token");
  itl.write(out, "hybridlm_inter_token_latency_seconds", "time between two generated tokens of one choice");
  return out;
}

}  // namespace hybridlm
