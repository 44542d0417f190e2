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

#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include "base/error.h"
#include "base/thread_pool.h"
#include "tools/hybridlm/cli.h"
#include "tools/hybridlm/format.h"
#include "kernels/cpu/cpu_features.h"

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

// Read bandwidth with `threads` threads: each sums its part of a 1 GiB buffer; best of 3.
double read_bandwidth_gbs(ThreadPool& pool) {
  const size_t n = (1u << 30) / sizeof(float);
  std::unique_ptr<float[]> buf(new float[n]);
  pool.parallel_for(n, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) buf[i] = 1.0f;
  });
  double best = 0;
  std::vector<float> partial(static_cast<size_t>(pool.size()) * 16);
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = Clock::now();
    pool.parallel_for(n, [&](size_t b, size_t e) {
      float acc[16] = {};
      for (size_t i = b; i + 16 <= e; i += 16)
        for (int l = 0; l < 16; ++l) acc[l] += buf[i + l];
      float s = 0;
      for (float a : acc) s += a;
      partial[b * 16 / n] = s;  // keep the sum alive
    });
    best = std::max(best, static_cast<double>(n * sizeof(float)) / seconds_since(t0) / 1e9);
  }
  return best;
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

struct Row {
  std::string test;
  Stat tps;
  double rate = 0;             // GB/s of weights (tg) or GFLOP/s (pp)
  double rate_with_state = 0;  // tg: GB/s of weights + every sequence's state read and written
};

}  // namespace

int run_bench(const BenchOptions& o) {
  check(o.prompt_tokens >= 1 && o.gen_tokens >= 1, "bench: -p and -n must be >= 1");
  check(o.reps >= 1 && o.reps <= 100, "bench: -r must be in [1, 100]");
  check(o.batch >= 1 && o.batch <= 1024, "bench: --batch must be in [1, 1024]");
  EngineOptions eo = o.engine;
  eo.max_sequences = o.batch;
  eo.context = std::max(eo.context, o.prompt_tokens + o.gen_tokens + 1);
  Engine engine(o.model_dir, eo);
  if (!engine.mlock_error().empty())
    std::fprintf(stderr, "warning: --mlock failed (%s): weights may be paged out\n", engine.mlock_error().c_str());
  const Model& m = engine.model();
  const HybridConfig& c = m.config();
  const int V = engine.vocab_size();
  std::mt19937_64 rng(o.seed);
  auto random_ids = [&](int n) {
    std::vector<int32_t> ids(n);
    for (auto& id : ids) id = static_cast<int32_t>(rng() % static_cast<uint64_t>(V));
    return ids;
  };

  ThreadPool probe(engine.threads());
  const double bw = read_bandwidth_gbs(probe);
  // q8_0 matmuls run on int8 dot products (VNNI): their prefill is measured against the int8 peak.
  const bool q8 = o.engine.load.dtype == WeightDType::Q8_0 && cpu::simd_path() == cpu::SimdPath::Avx512 &&
                  cpu::has_avx512_vnni();
  const double peak = q8 ? vnni_peak_gops(probe) : fma_peak_gflops(probe);
  const char* peak_name = q8 ? "int8 VNNI peak" : "FP32 FMA peak";
  // Decode also reads and writes every sequence's recurrent state (conv + SSM) once per step.
  const double state_bytes = static_cast<double>(engine.cache().state_bytes_per_sequence());
  // Matmul FLOPs per prompt token: 2 x the projection weights (the embedding is a lookup and the
  // head runs once per prompt).
  const double head_params = static_cast<double>(V) * c.d_model * (c.tie_embeddings ? 1 : 2);
  const double flops_per_token = 2.0 * (static_cast<double>(m.param_count()) - head_params);

  std::vector<Row> rows;
  {  // pp: one prompt of prompt_tokens in a single step, fresh state each repetition
    std::vector<double> tps, rate;
    for (int r = 0; r < o.reps + 1; ++r) {  // the first run warms up
      const std::vector<int32_t> ids = random_ids(o.prompt_tokens);
      const int s = engine.new_sequence();
      const auto t0 = Clock::now();
      engine.prefill(s, ids, false, o.prompt_tokens);
      const double dt = seconds_since(t0);
      engine.free_sequence(s);
      if (r == 0) continue;
      tps.push_back(o.prompt_tokens / dt);
      rate.push_back(o.prompt_tokens * flops_per_token / dt / 1e9);
    }
    rows.push_back({"pp" + std::to_string(o.prompt_tokens), stat_of(tps), stat_of(rate).mean});
  }
  {  // tg: batch sequences decode gen_tokens steps together; every step reads all weights once
    std::vector<double> tps, rate, rate_state;
    for (int r = 0; r < o.reps + 1; ++r) {
      std::vector<int> slots;
      std::vector<BatchRun> runs;
      std::vector<int> logit_rows;
      for (int b = 0; b < o.batch; ++b) {
        slots.push_back(engine.new_sequence());
        runs.push_back({slots.back(), 1});
        logit_rows.push_back(b);
      }
      std::vector<int32_t> toks = random_ids(o.batch);
      const auto t0 = Clock::now();
      for (int step = 0; step < o.gen_tokens; ++step) {
        std::span<const float> l = engine.step(toks, runs, logit_rows);
        for (int b = 0; b < o.batch; ++b) {  // greedy next token, as a real decode loop would
          const float* row = l.data() + static_cast<size_t>(b) * V;
          toks[b] = static_cast<int32_t>(std::max_element(row, row + V) - row);
        }
      }
      const double dt = seconds_since(t0);
      for (int s : slots) engine.free_sequence(s);
      if (r == 0) continue;
      tps.push_back(static_cast<double>(o.batch) * o.gen_tokens / dt);
      rate.push_back(static_cast<double>(m.weight_bytes()) * o.gen_tokens / dt / 1e9);
      rate_state.push_back((static_cast<double>(m.weight_bytes()) + 2.0 * state_bytes * o.batch) * o.gen_tokens / dt /
                           1e9);
    }
    rows.push_back({"tg" + std::to_string(o.gen_tokens), stat_of(tps), stat_of(rate).mean, stat_of(rate_state).mean});
  }

  const std::string dtype = o.engine.load.dtype == WeightDType::BF16   ? "bf16"
                            : o.engine.load.dtype == WeightDType::Q8_0 ? "q8_0"
                                                                        : "f32";
  // The cache storage this run used; KV "none" without attention layers.
  const char* state_dtype = cache_dtype_name(engine.cache().state_dtype());
  const char* kv_dtype = engine.cache().has_kv() ? cache_dtype_name(engine.cache().kv_dtype()) : "none";
  if (o.json) {
    std::printf("[\n");
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      const bool pp = r.test[0] == 'p';
      std::printf(
          "  {\"model\": \"%s\", \"family\": \"%s\", \"dtype\": \"%s\", \"test\": \"%s\", \"threads\": %d, "
          "\"batch\": %d, \"tokens_per_second\": %.3f, \"stddev\": %.3f, \"%s\": %.2f, \"%s\": %.2f, "
          "\"%s\": %.2f, \"weight_bytes\": %zu, \"state_dtype\": \"%s\", \"state_bytes_per_sequence\": %.0f, "
          "\"kv_dtype\": \"%s\", \"kv_bytes_per_token\": %zu, \"peak_rss_bytes\": %.0f}%s\n",
          o.model_dir.c_str(), c.family.c_str(), dtype.c_str(), r.test.c_str(), engine.threads(), pp ? 1 : o.batch,
          r.tps.mean, r.tps.sd, pp ? "gflops" : "gbps", r.rate, pp ? "peak_gflops" : "peak_gbps", pp ? peak : bw,
          pp ? "peak_is_int8" : "gbps_with_state", pp ? (q8 ? 1.0 : 0.0) : r.rate_with_state,
          m.weight_bytes(), state_dtype, state_bytes, kv_dtype, engine.cache().kv_bytes_per_token(), peak_rss_bytes(),
          i + 1 < rows.size() ? "," : "");
    }
    std::printf("]\n");
    return 0;
  }
  std::printf("machine (same run, %d threads): read bandwidth %.1f GB/s, %s %.0f G%s/s\n", engine.threads(), bw,
              peak_name, peak, q8 ? "OP" : "FLOP");
  std::printf("| model | family | dtype | threads | batch | test | t/s | achieved | of peak | with state |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  auto pct = [](double v, double base) {
    return base > 0 ? std::to_string(static_cast<int>(100 * v / base + 0.5)) + "%" : std::string("-");
  };
  for (const Row& r : rows) {
    const bool pp = r.test[0] == 'p';
    const double base = pp ? peak : bw;
    // tg "with state": weights plus each sequence's recurrent state read and written per step.
    char ws[64] = "-";
    if (!pp) std::snprintf(ws, sizeof ws, "%.1f GB/s (%s)", r.rate_with_state, pct(r.rate_with_state, bw).c_str());
    const std::string with_state = ws;
    std::printf("| %s | %s | %s | %d | %d | %s | %.2f ± %.2f | %.1f %s | %s | %s |\n", o.model_dir.c_str(),
                c.family.c_str(), dtype.c_str(), engine.threads(), pp ? 1 : o.batch, r.test.c_str(), r.tps.mean,
                r.tps.sd, r.rate, pp ? (q8 ? "GOP/s" : "GFLOP/s") : "GB/s", pct(r.rate, base).c_str(),
                with_state.c_str());
  }
  std::printf("state per sequence: %s at %s (read and written once per decode step)\n", format_bytes(state_bytes).c_str(),
              state_dtype);
  if (engine.cache().has_kv())
    std::printf("kv per token: %s at %s\n", format_bytes(static_cast<double>(engine.cache().kv_bytes_per_token())).c_str(),
                kv_dtype);
  std::printf("peak RSS: %s (weights %s)\n", format_bytes(peak_rss_bytes()).c_str(),
              format_bytes(static_cast<double>(m.weight_bytes())).c_str());
  return 0;
}

}  // namespace hybridlm

namespace hybridlm {

Subcommand add_bench(CLI::App& parent) {
  struct Flags {
    ModelFlags model;
    BenchOptions bench;
    bool mmap = false;
  };
  auto f = std::make_shared<Flags>();
  BenchOptions& bopt = f->bench;
  CLI::App* bench = parent.add_subcommand("bench", "prompt (pp) and generation (tg) tokens/s, llama-bench style");
  f->model.no_mmap = true;  // benchmarks read weights into memory (the VM's reclaim daemon pages out mappings)
  f->model.add(bench);
  bench->add_option("-p,--n-prompt", bopt.prompt_tokens, "prompt tokens per pp test")->capture_default_str();
  bench->add_option("-n,--n-gen", bopt.gen_tokens, "decode steps per tg test")->capture_default_str();
  bench->add_option("-r,--repetitions", bopt.reps, "repetitions (after one warm-up)")->capture_default_str();
  bench->add_option("--batch", bopt.batch, "sequences decoding together in tg")->capture_default_str();
  bench->add_flag("--json", bopt.json, "print a JSON array, one object per test");
  bench->add_option("--seed", bopt.seed, "seed of the random token ids")->capture_default_str();
  bench->add_flag("--mmap", f->mmap, "map the weight files instead of reading them into memory");
  return {bench, [f] {
            if (f->mmap) f->model.no_mmap = false;
            f->bench.model_dir = f->model.dir;
            f->bench.engine = f->model.options();
            return run_bench(f->bench);
          }};
}

}  // namespace hybridlm
