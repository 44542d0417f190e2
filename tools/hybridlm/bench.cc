#include "tools/hybridlm/bench.h"

// The AVX-512 peaks below are measured on x86-64 only (elsewhere they read 0, as on x86 CPUs
// without AVX-512). GCC 12 reports its own intrinsics' _mm512_undefined_* placeholders as
// uninitialized (a known false positive of avx512fintrin.h), as in kernels/cpu/intrinsics.h.
#if defined(__x86_64__)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#endif

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/thread_pool.h"
#include "tools/hybridlm/cli.h"
#include "tools/hybridlm/format.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/profile.h"
#include "models/plan.h"
#include "runtime/sampler.h"

namespace hybridlm {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Stat {
  double mean = 0, sd = 0;
};
Stat stat_of(const std::vector<double>& v) {
  Stat s;
  for (double x : v) s.mean += x;
  s.mean /= static_cast<double>(v.size());
  for (double x : v) s.sd += (x - s.mean) * (x - s.mean);
  s.sd = v.size() > 1 ? std::sqrt(s.sd / static_cast<double>(v.size() - 1)) : 0.0;
  return s;
}

// The sum of n floats (n a multiple of 128) with 8 independent accumulators: enough loads in
// flight that one thread reads at the memory's pace, not at the add latency's (the portable loop
// of 16 lanes compiles to 4 chains of SSE adds, which held one thread to ~25 GB/s here).
#if defined(__x86_64__)
__attribute__((target("avx512f"))) float sum_avx512(const float* p, size_t n) {
  __m512 a[8];
  for (auto& v : a) v = _mm512_setzero_ps();
  for (size_t i = 0; i < n; i += 128)
    for (int k = 0; k < 8; ++k) a[k] = _mm512_add_ps(a[k], _mm512_loadu_ps(p + i + 16 * k));
  for (int k = 1; k < 8; ++k) a[0] = _mm512_add_ps(a[0], a[k]);
  return _mm512_reduce_add_ps(a[0]);
}
#endif
float sum_portable(const float* p, size_t n) {
  float acc[32] = {};
  for (size_t i = 0; i < n; i += 32)
    for (int l = 0; l < 32; ++l) acc[l] += p[i + l];
  float s = 0;
  for (float a : acc) s += a;
  return s;
}

// Read bandwidth with `threads` threads: each sums its part of a 1 GiB buffer (far beyond any
// cache), the part it wrote first (so its pages sit on that thread's memory node); the best of
// 5 repetitions, and their spread ((best - worst) / best), which says how busy the machine was.
struct Bandwidth {
  double best = 0, spread = 0;
};
Bandwidth read_bandwidth_gbs(ThreadPool& pool) {
  constexpr size_t kBlock = 128;  // floats per step of the sums
  const size_t n = (1u << 30) / sizeof(float), blocks = n / kBlock;
  std::unique_ptr<float[]> buf(new float[n]);
  pool.parallel_for(blocks, [&](size_t b, size_t e) {
    for (size_t i = b * kBlock; i < e * kBlock; ++i) buf[i] = 1.0f;
  });
  const bool avx512 = cpu::simd_path() == cpu::SimdPath::Avx512;
  std::vector<float> partial(static_cast<size_t>(pool.size()) * 16);
  std::vector<double> rates;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
    pool.parallel_for(blocks, [&](size_t b, size_t e) {
      const float* p = buf.get() + b * kBlock;
      const size_t len = (e - b) * kBlock;
#if defined(__x86_64__)
      const float s = avx512 ? sum_avx512(p, len) : sum_portable(p, len);
#else
      const float s = sum_portable(p, len);
#endif
      partial[b * 16 / blocks] = s;  // keep the sum alive
    });
    rates.push_back(static_cast<double>(n * sizeof(float)) / seconds_since(t0) / 1e9);
  }
  (void)avx512;
  const auto [lo, hi] = std::minmax_element(rates.begin(), rates.end());
  return {*hi, (*hi - *lo) / *hi};
}

// Ops per second of `loop(iters)` run once on every thread of the pool (each doing ops_per_iter
// operations per iteration), in billions.
template <class Loop>
double per_thread_peak(ThreadPool& pool, Loop loop, double ops_per_iter) {
  const long iters = 20'000'000;
  std::vector<double> sink(static_cast<size_t>(pool.size()));  // keeps the loops' results alive
  const auto t0 = Clock::now();
  pool.parallel_for(static_cast<size_t>(pool.size()), [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) sink[i] = loop(iters);
  });
  return static_cast<double>(pool.size()) * iters * ops_per_iter / seconds_since(t0) / 1e9;
}

#if defined(__x86_64__)
// FP32 FMA peak: 16 independent accumulator chains per thread.
__attribute__((target("avx512f,fma"))) float fma_loop_avx512(long iters) {
  __m512 a[16];
  for (auto& v : a) v = _mm512_set1_ps(0.5f);
  const __m512 m = _mm512_set1_ps(0.9999f), c = _mm512_set1_ps(1e-4f);
  for (long i = 0; i < iters; ++i)
    for (auto& v : a) v = _mm512_fmadd_ps(v, m, c);
  __m512 s = a[0];
  for (int k = 1; k < 16; ++k) s = _mm512_add_ps(s, a[k]);
  return _mm512_reduce_add_ps(s);
}

double fma_peak_gflops(ThreadPool& pool) {
  if (cpu::simd_path() != cpu::SimdPath::Avx512) return 0;  // only measured where the kernels use it
  return per_thread_peak(pool, fma_loop_avx512, 16 * 16 * 2);
}

// Int8 peak (AVX512_VNNI): 12 independent vpdpbusd chains per thread, 64 multiply-adds (128 ops)
// each; the rate a q8_0 prefill's matmuls run at.
__attribute__((target("avx512f,avx512vnni"))) int vnni_loop(long iters) {
  __m512i a[12];
  for (auto& v : a) v = _mm512_setzero_si512();
  const __m512i x = _mm512_set1_epi8(3), y = _mm512_set1_epi8(-2);
  for (long i = 0; i < iters; ++i) {
    for (auto& v : a) v = _mm512_dpbusd_epi32(v, x, y);
    asm volatile("" : "+v"(a[0]), "+v"(a[1]), "+v"(a[2]), "+v"(a[3]), "+v"(a[4]), "+v"(a[5]), "+v"(a[6]), "+v"(a[7]),
                 "+v"(a[8]), "+v"(a[9]), "+v"(a[10]), "+v"(a[11]));
  }
  alignas(64) int32_t lanes[16];
  __m512i s = a[0];
  for (int k = 1; k < 12; ++k) s = _mm512_add_epi32(s, a[k]);
  _mm512_store_si512(lanes, s);
  return lanes[0];
}

double vnni_peak_gops(ThreadPool& pool) {
  if (cpu::simd_path() != cpu::SimdPath::Avx512 || !cpu::has_avx512_vnni()) return 0;
  return per_thread_peak(pool, vnni_loop, 12 * 64 * 2);
}
#else
double fma_peak_gflops(ThreadPool&) { return 0; }
double vnni_peak_gops(ThreadPool&) { return 0; }
#endif

// The machine's peaks at one thread count: read bandwidth (GB/s) and the FP32 FMA peak (GFLOP/s)
// or, for q8_0 weights, the int8 VNNI peak (GOP/s); 0 where not measured.
struct Peaks {
  double bandwidth = 0, compute = 0;
  double bandwidth_spread = 0;  // (best - worst) / best over the probe's repetitions
};
// Above this spread between repetitions, the machine was busy while probed: percentages of its
// peak are unreliable, and bench says so.
constexpr double kBusySpread = 0.15;

bool write_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// The peaks at each of `threads`, measured in a forked child process so that the probe's 1 GiB
// read buffer never counts in this process's peak RSS (getrusage's ru_maxrss, which the report
// shows for the model). Linux can also reset the peak (`echo 5 > /proc/self/clear_refs`, since
// 4.0, resets ru_maxrss with VmHWM), but a child needs neither /proc nor a kernel version, and it
// keeps the probe's pages out of this process altogether. It runs before any engine exists, so the
// process forked has one thread.
std::vector<Peaks> probe_machine(const std::vector<int>& threads, bool q8) {
  int fd[2];
  check(pipe(fd) == 0, "bench: cannot create a pipe for the peak probe: ", std::strerror(errno));
  std::fflush(stdout);  // nothing buffered is written twice (the child ends with _exit anyway)
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid < 0) {
    const int err = errno;
    close(fd[0]);
    close(fd[1]);
    throw_error("bench: cannot fork the peak probe: ", std::strerror(err), " (--no-probe skips it)");
  }
  if (pid == 0) {  // the child: measure, write the peaks, and leave without running any destructor
    close(fd[0]);
    bool ok = true;
    try {
      for (int t : threads) {
        ThreadPool pool(t);
        const Bandwidth bw = read_bandwidth_gbs(pool);
        const Peaks p{bw.best, q8 ? vnni_peak_gops(pool) : fma_peak_gflops(pool), bw.spread};
        ok = ok && write_all(fd[1], &p, sizeof p);
      }
    } catch (...) {
      ok = false;
    }
    _exit(ok ? 0 : 1);
  }
  close(fd[1]);
  std::vector<Peaks> peaks(threads.size());
  char* at = reinterpret_cast<char*>(peaks.data());
  size_t left = peaks.size() * sizeof(Peaks);
  while (left > 0) {
    const ssize_t r = read(fd[0], at, left);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    at += r;
    left -= static_cast<size_t>(r);
  }
  close(fd[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  const bool exited = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  check(exited && left == 0, "bench: the peak probe failed (",
        WIFSIGNALED(status) ? std::string("killed by signal ") + std::to_string(WTERMSIG(status))
                            : "exit status " + std::to_string(WEXITSTATUS(status)),
        "; a 1 GiB buffer may not fit): --no-probe skips it");
  return peaks;
}

// The CPU's largest cache in bytes as the OS reports it (0 when unknown).
double last_level_cache_bytes() {
  long b = 0;
#if defined(_SC_LEVEL3_CACHE_SIZE)
  b = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (b <= 0) b = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
  return b > 0 ? static_cast<double>(b) : 0.0;
}

// 129140736 -> "129.14 M", as llama-bench's params column.
std::string format_count(double n) {
  const char* units[] = {"", " K", " M", " B"};
  int u = 0;
  while (n >= 1000 && u < 3) {
    n /= 1000;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.2f%s" : "%.0f%s", n, units[u]);
  return buf;
}

std::string json_quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char ch : s) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += static_cast<char>(ch);
    } else if (ch < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", ch);
      out += buf;
    } else {
      out += static_cast<char>(ch);
    }
  }
  return out + "\"";
}

std::string csv_quote(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char ch : s) out += ch == '"' ? std::string("\"\"") : std::string(1, ch);
  return out + "\"";
}

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

// What every row shares: the model and the cache storage of the run.
struct RunInfo {
  std::string name, family, dtype, state_dtype, kv_dtype;
  double params = 0, weight_bytes = 0, state_bytes = 0, kv_bytes_per_token = 0;
  bool q8 = false;       // pp is measured against the int8 VNNI peak
  bool profile = false;  // --profile: rows carry their kernel ops' time
};

// One test's result.
struct Row {
  int n_prompt = 0, n_gen = 0;  // exactly one is > 0: a pp or a tg test
  int n_depth = 0;              // tokens of context before the test's own
  int threads = 0, batch = 1;
  Stat tps;
  double rate = 0;             // pp: GFLOP/s (GOP/s at q8_0); tg: GB/s of weights
  double rate_with_state = 0;  // tg: GB/s of weights + every sequence's state read and written (+ KV at depth)
  double bytes_per_step = 0, bytes_with_state = 0;  // tg: what those rates count per step
  // tg: of those, what the matmuls read and their multiply-adds (x 2: FLOPs), the recurrent state
  // read and written, and the KV read (--profile's line by part).
  double matmul_bytes = 0, matmul_flops = 0, state_step_bytes = 0, kv_step_bytes = 0;
  double regions_per_step = 0;  // tg: thread-pool parallel regions per decode step (wake-up + join each)
  Peaks peaks;
  double peak_rss = 0;  // this process's peak RSS after the test
  // --profile: the kernel ops' time over the timed repetitions, their steps (pp: one prompt; tg:
  // one decode step) and their wall time.
  std::vector<OpTime> profile;
  double profile_steps = 0, profile_seconds = 0;
  bool pp() const { return n_prompt > 0; }
  std::string test() const {
    const std::string t = pp() ? "pp" + std::to_string(n_prompt) : "tg" + std::to_string(n_gen);
    return n_depth > 0 ? t + " @ d" + std::to_string(n_depth) : t;  // llama-bench's spelling
  }
};

// One output column of csv, json and jsonl; an empty value is "not applicable" (a blank csv cell,
// a key left out of the JSON object). Numbers are written unquoted.
struct Field {
  const char* key;
  std::string value;
  bool text = false;
};

// --profile's ms per step by op, the largest first, then "other": the wall time outside the ops
// (the forward's own loops, waits in parallel regions outside an op, sampling in tg).
std::vector<std::pair<std::string, double>> profile_ms(const Row& r) {
  std::vector<std::pair<std::string, double>> ms;
  if (r.profile_steps <= 0) return ms;
  double ops = 0;
  for (const OpTime& t : r.profile) {
    ms.emplace_back(t.op, 1e3 * t.seconds / r.profile_steps);
    ops += t.seconds;
  }
  std::stable_sort(ms.begin(), ms.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  ms.emplace_back("other", 1e3 * std::max(0.0, r.profile_seconds - ops) / r.profile_steps);
  return ms;
}

std::vector<Field> fields_of(const RunInfo& in, const Row& r, bool probe) {
  const bool pp = r.pp();
  std::vector<Field> f = {
      {"model", in.name, true},
      {"parameters", fixed(in.params, 0)},
      {"weight_bytes", fixed(in.weight_bytes, 0)},
      {"family", in.family, true},
      {"dtype", in.dtype, true},
      {"test", r.test(), true},
      {"n_prompt", std::to_string(r.n_prompt)},
      {"n_gen", std::to_string(r.n_gen)},
      {"n_depth", std::to_string(r.n_depth)},
      {"threads", std::to_string(r.threads)},
      {"batch", std::to_string(r.batch)},
      {"tokens_per_second", fixed(r.tps.mean, 3)},
      {"stddev", fixed(r.tps.sd, 3)},
      {"gflops", pp ? fixed(r.rate, 2) : ""},
      {"gbps", pp ? "" : fixed(r.rate, 2)},
      {"gbps_with_state", pp ? "" : fixed(r.rate_with_state, 2)},
      {"weight_bytes_per_step", pp ? "" : fixed(r.bytes_per_step, 0)},
      {"parallel_regions_per_step", pp ? "" : fixed(r.regions_per_step, 1)},
  };
  if (probe) {
    f.push_back({"peak_gflops", pp ? fixed(r.peaks.compute, 2) : ""});
    f.push_back({"peak_is_int8", pp ? (in.q8 ? "1" : "0") : ""});
    f.push_back({"peak_gbps", pp ? "" : fixed(r.peaks.bandwidth, 2)});
    f.push_back({"peak_gbps_spread", pp ? "" : fixed(r.peaks.bandwidth_spread, 3)});
  }
  f.push_back({"state_dtype", in.state_dtype, true});
  f.push_back({"state_bytes_per_sequence", fixed(in.state_bytes, 0)});
  f.push_back({"kv_dtype", in.kv_dtype, true});
  f.push_back({"kv_bytes_per_token", fixed(in.kv_bytes_per_token, 0)});
  f.push_back({"peak_rss_bytes", fixed(r.peak_rss, 0)});
  if (in.profile) {  // "op=ms;op=ms;...;other=ms", ms per step
    std::string p;
    for (const auto& [op, ms] : profile_ms(r)) p += (p.empty() ? "" : ";") + op + "=" + fixed(ms, 3);
    f.push_back({"profile_ms_per_step", p, true});
    f.push_back({"matmul_bytes_per_step", pp ? "" : fixed(r.matmul_bytes, 0)});
    f.push_back({"matmul_flops_per_step", pp ? "" : fixed(r.matmul_flops, 0)});
  }
  return f;
}

std::string json_object(const std::vector<Field>& fields) {
  std::string s = "{";
  for (const Field& f : fields) {
    if (f.value.empty()) continue;
    if (s.size() > 1) s += ", ";
    s += json_quote(f.key) + ": " + (f.text ? json_quote(f.value) : f.value);
  }
  return s + "}";
}

// Writes the report as the tests finish (llama-bench prints each row when it is done).
class Report {
 public:
  Report(BenchOutput out, bool probe) : out_(out), probe_(probe) {}

  // The peaks measured at each of `threads` (the markdown report opens with them).
  void set_peaks(const std::vector<int>& threads, const std::vector<Peaks>& peaks, bool q8) {
    threads_ = threads;
    peaks_ = peaks;
    q8_ = q8;
  }

  void row(const RunInfo& in, const Row& r) {
    if (rows_ == 0) begin();
    switch (out_) {
      case BenchOutput::Markdown:
        markdown_row(in, r);
        break;
      case BenchOutput::Csv: {
        const std::vector<Field> f = fields_of(in, r, probe_);
        std::string line;
        if (rows_ == 0) {
          for (const Field& x : f) line += (line.empty() ? "" : ",") + std::string(x.key);
          std::printf("%s\n", line.c_str());
          line.clear();
        }
        for (size_t i = 0; i < f.size(); ++i) line += (i ? "," : "") + csv_quote(f[i].value);
        std::printf("%s\n", line.c_str());
        break;
      }
      case BenchOutput::Json:
        std::printf("%s\n  %s", rows_ ? "," : "", json_object(fields_of(in, r, probe_)).c_str());
        break;
      case BenchOutput::Jsonl:
        std::printf("%s\n", json_object(fields_of(in, r, probe_)).c_str());
        break;
    }
    ++rows_;
    std::fflush(stdout);
  }

  // Markdown: the footnotes of percentages above 100%, then the cache and memory of the run.
  void end(const RunInfo& in, double peak_rss) {
    if (rows_ == 0) begin();
    if (out_ == BenchOutput::Json) std::printf("\n]\n");
    if (out_ != BenchOutput::Markdown) return;
    if (in_cache_)
      std::printf("† above 100%%: the bytes read per decode step (weights %s, plus state) fit in the CPU's last-level "
                  "cache (%s as the OS reports it), so decode reads them from cache while the bandwidth probe reads "
                  "1 GiB from memory\n",
                  format_bytes(in.weight_bytes).c_str(), format_bytes(last_level_cache_bytes()).c_str());
    if (over_probe_)
      std::printf("‡ above 100%%: the test outpaced the peak its probe measured at the start of the run; on a shared "
                  "host a single probe swings widely (docs/benchmarks.md)\n");
    for (const std::string& line : after_table_) std::printf("%s\n", line.c_str());
    for (const std::string& line : profiles_) std::printf("%s\n", line.c_str());
    std::printf("state per sequence: %s at %s (read and written once per decode step)\n",
                format_bytes(in.state_bytes).c_str(), in.state_dtype.c_str());
    if (in.kv_dtype != "none")
      std::printf("kv per token: %s at %s\n", format_bytes(in.kv_bytes_per_token).c_str(), in.kv_dtype.c_str());
    std::printf("peak RSS: %s (weights %s%s)\n", format_bytes(peak_rss).c_str(), format_bytes(in.weight_bytes).c_str(),
                probe_ ? "; the peak probe ran in a child process, not counted" : "");
  }

 private:
  // Written with the first row, so that a run that fails before it (a bad model directory) leaves
  // stdout empty.
  void begin() {
    if (out_ == BenchOutput::Markdown) {
      for (size_t i = 0; i < threads_.size() && probe_; ++i)
        std::printf("machine (same run, %d threads): read bandwidth %.1f GB/s (5 reads within %.0f%%), %s %.0f G%s/s\n",
                    threads_[i], peaks_[i].bandwidth, 100 * peaks_[i].bandwidth_spread,
                    q8_ ? "int8 VNNI peak" : "FP32 FMA peak", peaks_[i].compute, q8_ ? "OP" : "FLOP");
      std::printf("| model | size | params | family | dtype | threads | batch | test | t/s | achieved |%s with state |\n",
                  probe_ ? " of peak |" : "");
      std::printf("|---|---:|---:|---|---|---:|---:|---|---:|---:|%s---:|\n", probe_ ? "---:|" : "");
    } else if (out_ == BenchOutput::Json) {
      std::printf("[");
    }
  }

  // `v` as a percentage of `base`; above 100% it carries the footnote mark that says why: † when
  // the `bytes` read per step fit in the last-level cache (tg), ‡ otherwise.
  std::string pct(double v, double base, double bytes) {
    if (base <= 0) return "-";
    const double p = 100 * v / base;
    std::string s = std::to_string(static_cast<long long>(p + 0.5)) + "%";
    if (p <= 100) return s;
    const double llc = last_level_cache_bytes();
    if (bytes > 0 && llc > 0 && bytes <= llc) {
      in_cache_ = true;
      return s + " †";
    }
    over_probe_ = true;
    return s + " ‡";
  }

  // A decode step's profile by what bounds each part: the matmuls (the weights they read against
  // the probe's bandwidth, their FLOPs against its FMA or int8 peak), the ops that read and write
  // the recurrent state (against the bandwidth), attention (the KV it reads) and the rest.
  std::string parts_line(const RunInfo& in, const Row& r, const std::vector<std::pair<std::string, double>>& ms,
                         double total) const {
    static const std::set<std::string> kStateOps = {"conv1d_causal",     "mamba1_scan",      "mamba1_scan_bf16",
                                                    "ssd_scan",          "ssd_step",         "ssd_step_bf16",
                                                    "mamba2_step",       "mamba2_step_bf16", "ssd_scan_discrete",
                                                    "ssd_step_discrete", "gated_delta_scan", "gated_delta_step"};
    double mm = 0, st = 0, at = 0, ignored = 0;  // ms of each part
    for (const auto& [op, v] : ms) {
      double& part = op == "matmul" || op == "quantize_q8_0_rows" ? mm
                     : kStateOps.count(op)                        ? st
                     : op == "attention"                          ? at
                                                                  : ignored;
      part += v;
    }
    if (r.kv_step_bytes <= 0) at = 0;  // no KV to read: attention is one of the rest
    auto share = [&](double v) { return " ms (" + fixed(total > 0 ? 100 * v / total : 0, 0) + "%)"; };
    // bytes (or FLOPs) over milliseconds, in G per second, and against the probe's `peak`
    auto rate = [&](double n, double ms_, double peak, const char* unit, const char* of) {
      const double g = ms_ > 0 ? n / (ms_ * 1e6) : 0.0;
      std::string s = fixed(g, 1) + " " + unit;
      if (probe_ && peak > 0) s += " (" + fixed(100 * g / peak, 0) + "% of the probe's " + of + ")";
      return s;
    };
    const char* bw = "bandwidth";
    std::string line =
        "by part, " + r.test() + " (" + std::to_string(r.threads) + " threads, batch " + std::to_string(r.batch) +
        "): matmul " + fixed(mm, 3) + share(mm) + ": " + format_bytes(r.matmul_bytes) + " of weights at " +
        rate(r.matmul_bytes, mm, r.peaks.bandwidth, "GB/s", bw) + ", " + fixed(r.matmul_flops / 1e9, 2) +
        (in.q8 ? " GOP at " : " GFLOP at ") +
        rate(r.matmul_flops, mm, r.peaks.compute, in.q8 ? "GOP/s" : "GFLOP/s", in.q8 ? "int8 peak" : "FMA peak");
    if (st > 0)
      line += "; state ops " + fixed(st, 3) + share(st) + ": " + format_bytes(r.state_step_bytes) +
              " read and written at " + rate(r.state_step_bytes, st, r.peaks.bandwidth, "GB/s", bw);
    if (at > 0)
      line += "; attention " + fixed(at, 3) + share(at) + ": " + format_bytes(r.kv_step_bytes) + " of KV at " +
              rate(r.kv_step_bytes, at, r.peaks.bandwidth, "GB/s", bw);
    const double rest = std::max(0.0, total - mm - st - at);
    return line + "; the rest " + fixed(rest, 3) + share(rest);
  }

  void markdown_row(const RunInfo& in, const Row& r) {
    const bool pp = r.pp();
    std::string of_peak, with_state = "-";
    if (probe_) {
      of_peak = " " + (pp ? pct(r.rate, r.peaks.compute, 0) : pct(r.rate, r.peaks.bandwidth, r.bytes_per_step)) + " |";
    }
    if (!pp) {
      with_state = fixed(r.rate_with_state, 1) + " GB/s";
      if (probe_) with_state += " (" + pct(r.rate_with_state, r.peaks.bandwidth, r.bytes_with_state) + ")";
    }
    std::printf("| %s | %s | %s | %s | %s | %d | %d | %s | %.2f ± %.2f | %.1f %s |%s %s |\n", in.name.c_str(),
                format_bytes(in.weight_bytes).c_str(), format_count(in.params).c_str(), in.family.c_str(),
                in.dtype.c_str(), r.threads, r.batch, r.test().c_str(), r.tps.mean, r.tps.sd, r.rate,
                pp ? (in.q8 ? "GOP/s" : "GFLOP/s") : "GB/s", of_peak.c_str(), with_state.c_str());
    if (in.profile) {
      std::string line = "profile of " + r.test() + " (" + std::to_string(r.threads) + " threads, batch " +
                         std::to_string(r.batch) + "), ms a step:";
      const std::vector<std::pair<std::string, double>> ms = profile_ms(r);
      double total = 0, rest = 0;
      for (const auto& [op, v] : ms) total += v;
      auto item = [&](const std::string& name, double v, bool last) {
        line += " " + name + " " + fixed(v, 3) + " (" + fixed(total > 0 ? 100 * v / total : 0, 0) + "%)" +
                (last ? "" : ",");
      };
      for (size_t i = 0; i + 1 < ms.size(); ++i) {  // the ops; "other" is last
        if (ms[i].second < 0.005 * total) rest += ms[i].second;  // under 0.5%: summed as "the rest"
        else item(ms[i].first, ms[i].second, false);
      }
      if (rest > 0) item("the rest", rest, false);
      item(ms.back().first, ms.back().second, true);
      profiles_.push_back(line);
      if (!pp) profiles_.push_back(parts_line(in, r, ms, total));
    }
    if (!pp) {  // once per distinct line (a sweep over -n or -d repeats them)
      const std::string line = "parallel regions per decode step (" + std::to_string(r.threads) + " threads, batch " +
                               std::to_string(r.batch) + "): " + fixed(r.regions_per_step, 1);
      auto once = [&](const std::string& s) {
        if (std::find(after_table_.begin(), after_table_.end(), s) == after_table_.end()) after_table_.push_back(s);
      };
      once(line);
      if (r.bytes_per_step < 0.99 * in.weight_bytes)  // a mixture of experts, an untied embedding
        once("weights read per decode step (batch " + std::to_string(r.batch) + "): " + format_bytes(r.bytes_per_step) +
             " of " + format_bytes(in.weight_bytes) +
             " (the experts its tokens are routed to, if routed uniformly; one embedding row a token)");
    }
  }

  BenchOutput out_;
  bool probe_;
  std::vector<int> threads_;
  std::vector<Peaks> peaks_;
  bool q8_ = false;
  int rows_ = 0;
  bool in_cache_ = false, over_probe_ = false;  // which footnotes the table needs
  std::vector<std::string> profiles_;  // --profile: a line per test
  std::vector<std::string> after_table_;  // tg rows' parallel regions and weights read per step, once each
};

// The sizes of a sweep without its 0s (-p 0: no pp tests).
std::vector<int> nonzero(const std::vector<int>& v) {
  std::vector<int> out;
  for (int x : v)
    if (x > 0) out.push_back(x);
  return out;
}

}  // namespace

std::vector<int> parse_int_list(const std::string& s, const char* flag, int lo, int hi) {
  std::vector<int> out;
  size_t at = 0;
  while (at <= s.size()) {
    const size_t comma = std::min(s.find(',', at), s.size());
    std::string item = s.substr(at, comma - at);
    const size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    item = b == std::string::npos ? "" : item.substr(b, e - b + 1);
    const size_t digits = item.size() - (item.starts_with('-') ? 1 : 0);
    bool ok = digits >= 1 && digits <= 9 && item.find_first_not_of("0123456789", item.size() - digits) == std::string::npos;
    const long v = ok ? std::stol(item) : 0;
    check(ok && v >= lo && v <= hi, flag, ": '", item, "' is not an integer in [", lo, ", ", hi,
          "] (expected a comma-separated list)");
    out.push_back(static_cast<int>(v));
    at = comma + 1;
  }
  return out;
}

BenchOutput parse_bench_output(const std::string& s) {
  if (s == "md") return BenchOutput::Markdown;
  if (s == "csv") return BenchOutput::Csv;
  if (s == "json") return BenchOutput::Json;
  if (s == "jsonl") return BenchOutput::Jsonl;
  throw_error("-o/--output ", s, ": use md, csv, json or jsonl");
}

int run_bench(const BenchOptions& o) {
  check(o.reps >= 1 && o.reps <= 100, "bench: -r must be in [1, 100]");
  const std::vector<int> prompts = nonzero(o.prompt_tokens), gens = nonzero(o.gen_tokens);
  check(!prompts.empty() || !gens.empty(), "bench: -p and -n are both 0: no test to run");
  check(!o.threads.empty() && !o.batch.empty(), "bench: -t and --batch need at least one value");
  const int max_prompt = prompts.empty() ? 0 : *std::max_element(prompts.begin(), prompts.end());
  const int max_gen = gens.empty() ? 0 : *std::max_element(gens.begin(), gens.end());
  const int max_batch = *std::max_element(o.batch.begin(), o.batch.end());
  check(!o.depths.empty(), "bench: -d needs at least one value");
  const int max_depth = *std::max_element(o.depths.begin(), o.depths.end());

  // Thread counts as run (0 = every core this process may use); more than the cores is allowed.
  const int cores = available_cores();
  std::vector<int> threads;
  for (int t : o.threads) threads.push_back(t > 0 ? t : cores);
  const int max_threads = *std::max_element(threads.begin(), threads.end());
  if (max_threads > cores)
    std::fprintf(stderr, "warning: -t %d is more than the %d CPUs this process may run on: threads will share cores\n",
                 max_threads, cores);

  // q8_0 and q4_0 matmuls run on int8 dot products (VNNI): their prefill is measured against the
  // int8 peak.
  const WeightDType wd = o.engine.load.dtype.value_or(WeightDType::F32);
  const bool q8 = (wd == WeightDType::Q8_0 || wd == WeightDType::Q4_0) && cpu::simd_path() == cpu::SimdPath::Avx512 &&
                  cpu::has_avx512_vnni();
  const std::vector<Peaks> peaks = o.probe ? probe_machine(threads, q8) : std::vector<Peaks>(threads.size());

  for (size_t i = 0; i < threads.size() && o.probe; ++i)
    if (peaks[i].bandwidth_spread > kBusySpread)
      std::fprintf(stderr,
                   "warning: the bandwidth probe's 5 reads at %d threads differ by %.0f%% (best %.1f GB/s): the "
                   "machine is busy, so rates against its peaks are unreliable; rerun on a quiet machine\n",
                   threads[i], 100 * peaks[i].bandwidth_spread, peaks[i].bandwidth);
  Report report(o.output, o.probe);
  report.set_peaks(threads, peaks, q8);
  RunInfo info;
  std::mt19937_64 rng(o.seed);
  // One engine per thread count (its pool is sized at construction), each freed before the next
  // loads; every engine holds slots for the largest batch and room for the longest test.
  for (size_t ti = 0; ti < threads.size(); ++ti) {
    EngineOptions eo = o.engine;
    if (o.profile) eo.kernels = &profiling_kernels(o.engine.kernels ? *o.engine.kernels : cpu_kernels());
    eo.threads = threads[ti];
    eo.max_sequences = max_batch + (max_depth > 0 ? 1 : 0);  // and the context the tests fork
    eo.context = std::max(eo.context, max_depth + std::max(max_prompt, max_gen) + 1);
    Engine engine(o.model_dir, eo);
    if (ti == 0) report_mlock(engine);
    const Model& m = engine.model();
    const HybridConfig& c = m.config();
    const int V = engine.vocab_size();
    auto random_ids = [&](int n) {
      std::vector<int32_t> ids(n);
      for (auto& id : ids) id = static_cast<int32_t>(rng() % static_cast<uint64_t>(V));
      return ids;
    };
    info.name = model_name(o.model_dir);
    info.family = c.family;
    info.dtype = weight_dtype_name(m.weight_dtype());
    info.params = static_cast<double>(m.param_count());
    info.weight_bytes = static_cast<double>(m.weight_bytes());
    // The cache storage this run used; KV "none" without attention layers.
    info.state_dtype = cache_dtype_name(engine.cache().state_dtype());
    info.kv_dtype = engine.cache().has_kv() ? cache_dtype_name(engine.cache().kv_dtype()) : "none";
    // Decode also reads and writes every sequence's recurrent state (conv + SSM) once per step.
    info.state_bytes = static_cast<double>(engine.cache().state_bytes_per_sequence());
    info.kv_bytes_per_token = static_cast<double>(engine.cache().kv_bytes_per_token());
    info.q8 = q8;
    info.profile = o.profile;
    // Matmul FLOPs per prompt token: 2 x the projection weights (the embedding is a lookup and the
    // head runs once per prompt).
    const double head_params = static_cast<double>(V) * c.d_model * (c.tie_embeddings ? 1 : 2);
    const double flops_per_token = 2.0 * (info.params - head_params);

    for (int depth : o.depths) {
      // The context every test of this depth starts from: filled once, forked per sequence.
      int base = -1;
      if (depth > 0) {
        std::fprintf(stderr, "bench: filling a context of %d tokens\n", depth);
        base = engine.new_sequence();
        engine.prefill(base, random_ids(depth), false);
      }
      auto start_sequence = [&] { return base >= 0 ? engine.cache().fork(base) : engine.new_sequence(); };
      for (int p : prompts) {  // pp: one prompt of p tokens in a single step, fresh state each repetition
        Row row;
        row.n_prompt = p;
        row.n_depth = depth;
        row.threads = engine.threads();
        row.peaks = peaks[ti];
        std::vector<double> tps, rate;
        for (int r = 0; r < o.reps + 1; ++r) {  // the first run warms up
          const std::vector<int32_t> ids = random_ids(p);
          const int s = start_sequence();
          if (r == 1) reset_kernel_profile();
          const auto t0 = Clock::now();
          engine.prefill(s, ids, false, p);
          const double dt = seconds_since(t0);
          engine.free_sequence(s);
          if (r == 0) continue;
          row.profile_seconds += dt;
          tps.push_back(p / dt);
          rate.push_back(p * flops_per_token / dt / 1e9);
        }
        row.tps = stat_of(tps);
        row.rate = stat_of(rate).mean;
        row.peak_rss = peak_rss_bytes();
        if (o.profile) {
          row.profile = kernel_profile();
          row.profile_steps = o.reps;
        }
        report.row(info, row);
      }
      for (int n : gens) {
        for (int batch : o.batch) {  // tg: batch sequences decode n steps together; each reads all weights once
          Row row;
          row.n_gen = n;
          row.n_depth = depth;
          row.threads = engine.threads();
          row.batch = batch;
          row.peaks = peaks[ti];
          // The weights a step reads: all that the model holds, less the experts no token of the
          // step is routed to and an untied embedding's other rows.
          const WeightReads reads = decode_weight_reads(c, m.weight_dtype(), batch);
          row.bytes_per_step = std::max(0.0, info.weight_bytes - (reads.all - reads.read));
          // At depth, each step also reads every sequence's KV: depth + i + 1 tokens at step i.
          const double kv_read = info.kv_bytes_per_token * (depth + (n + 1) / 2.0) * batch;
          row.bytes_with_state = row.bytes_per_step + 2.0 * info.state_bytes * batch + kv_read;
          row.matmul_bytes = reads.matmul_bytes;
          row.matmul_flops = 2.0 * reads.matmul_macs * batch;
          row.state_step_bytes = 2.0 * info.state_bytes * batch;
          row.kv_step_bytes = kv_read;
          std::vector<double> tps, rate, rate_state;
          uint64_t regions = 0;
          for (int r = 0; r < o.reps + 1; ++r) {
            std::vector<int> slots;
            std::vector<BatchRun> runs;
            std::vector<int> logit_rows;
            for (int b = 0; b < batch; ++b) {
              slots.push_back(start_sequence());
              runs.push_back({slots.back(), 1});
              logit_rows.push_back(b);
            }
            std::vector<int32_t> toks = random_ids(batch);
            const uint64_t regions0 = engine.parallel_regions();
            if (r == 1) reset_kernel_profile();
            const auto t0 = Clock::now();
            for (int step = 0; step < n; ++step) {
              std::span<const float> l = engine.step(toks, runs, logit_rows);
              for (int b = 0; b < batch; ++b) {  // greedy next token, as a real decode loop would
                const float* logits = l.data() + static_cast<size_t>(b) * V;
                toks[b] = argmax_first(std::span(logits, static_cast<size_t>(V)));
              }
            }
            const double dt = seconds_since(t0);
            regions = engine.parallel_regions() - regions0;  // the same every repetition
            for (int s : slots) engine.free_sequence(s);
            if (r == 0) continue;
            row.profile_seconds += dt;
            tps.push_back(static_cast<double>(batch) * n / dt);
            rate.push_back(row.bytes_per_step * n / dt / 1e9);
            rate_state.push_back(row.bytes_with_state * n / dt / 1e9);
          }
          row.tps = stat_of(tps);
          row.rate = stat_of(rate).mean;
          row.rate_with_state = stat_of(rate_state).mean;
          row.regions_per_step = static_cast<double>(regions) / n;
          row.peak_rss = peak_rss_bytes();
          if (o.profile) {
            row.profile = kernel_profile();
            row.profile_steps = static_cast<double>(o.reps) * n;
          }
          report.row(info, row);
        }
      }
      if (base >= 0) engine.free_sequence(base);
    }
  }
  report.end(info, peak_rss_bytes());
  return 0;
}

}  // namespace hybridlm

namespace hybridlm {

Subcommand add_bench(CLI::App& parent) {
  // The sweeps are read as text and parsed when the command runs, so that a bad item is a user
  // error (exit 1) naming the flag and the item.
  struct Flags {
    ModelFlags model;
    BenchOptions bench;
    std::string prompt = "512", gen = "128", threads = "0", batch = "1", depth = "0", output;
    bool json = false, no_probe = false, mmap = false;
  };
  auto f = std::make_shared<Flags>();
  CLI::App* bench = parent.add_subcommand("bench", "prompt (pp) and generation (tg) tokens/s, llama-bench style");
  f->model.no_mmap = true;  // benchmarks read weights into memory (the VM's reclaim daemon pages out mappings)
  f->model.add(bench, false);
  bench->add_option("-p,--n-prompt", f->prompt, "prompt tokens per pp test, comma-separated (0: no pp tests)")
      ->capture_default_str();
  bench->add_option("-n,--n-gen", f->gen, "decode steps per tg test, comma-separated (0: no tg tests)")
      ->capture_default_str();
  bench->add_option("-t,--threads", f->threads, "threads, comma-separated (0 = all cores)")->capture_default_str();
  bench->add_option("--batch", f->batch, "sequences decoding together in tg, comma-separated")->capture_default_str();
  bench->add_option("-d,--n-depth", f->depth,
                    "tokens of context (random ids, filled once, not timed) before each test, comma-separated; "
                    "tg's with-state rate then counts the KV each step reads")
      ->capture_default_str();
  bench->add_option("-r,--repetitions", f->bench.reps, "repetitions (after one warm-up)")->capture_default_str();
  bench->add_option("-o,--output", f->output, "output format: md (default), csv, json or jsonl");
  bench->add_flag("--json", f->json, "the same as -o json");
  bench->add_flag("--no-probe", f->no_probe, "skip measuring the machine's peaks (and the % of peak columns)");
  bench->add_option("--seed", f->bench.seed, "seed of the random token ids")->capture_default_str();
  bench->add_flag("--mmap", f->mmap, "map the weight files instead of reading them into memory");
  bench->add_flag("--profile", f->bench.profile,
                  "time every kernel op: each test's milliseconds a step by op (matmul, attention, ...), "
                  "under the md table or as profile_ms_per_step");
  return {bench, [f] {
            BenchOptions& b = f->bench;
            b.prompt_tokens = parse_int_list(f->prompt, "-p/--n-prompt", 0, 1 << 20);
            b.gen_tokens = parse_int_list(f->gen, "-n/--n-gen", 0, 1 << 20);
            b.threads = parse_int_list(f->threads, "-t/--threads", 0, 1024);
            b.batch = parse_int_list(f->batch, "--batch", 1, 1024);
            b.depths = parse_int_list(f->depth, "-d/--n-depth", 0, 1 << 20);
            check(!f->json || f->output.empty() || f->output == "json", "bench: --json and -o ", f->output,
                  " disagree: use one");
            b.output = parse_bench_output(f->json ? "json" : f->output.empty() ? "md" : f->output);
            b.probe = !f->no_probe;
            if (f->mmap) f->model.no_mmap = false;
            b.model_dir = f->model.dir;
            b.engine = f->model.options();
            return run_bench(b);
          }};
}

}  // namespace hybridlm
