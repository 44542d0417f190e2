// The prefill projections as GEMMs: hybridlm's matmul (the outer-product GEMM on lane panels, on
// row-major weights and, as the baseline measured in the same run, the dot-product tiles it
// replaced) against OpenBLAS
// cblas_sgemm and oneDNN dnnl_sgemm where the build found them. Shapes are the in/out/x/dt
// projections of the four checkpoint presets; T tokens per call (default 512, as pp512).
//
//   build/bench_gemm [-T 512] [-t 2] [-r 5] [-c 1]
//
// -c 1 adds a row per shape for lane panels with the weights coming from memory, as in a forward
// pass where every matrix is read once a step: each call reads the next of enough copies of the
// weights (256 MB in all) that none is still cached when its turn comes again.
//
// Prints GFLOP/s per shape and implementation, best of -r calls after a warm-up, each against
// the FP32 FMA peak measured in the same process, and the f32 weights' bytes per second (the
// decode figure at -T 1: the weights leave the caches between calls only when they outgrow
// them). Speed only: never run by ctest.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "base/huge_alloc.h"
#include "base/thread_pool.h"
#include "kernels/kernels.h"

#ifdef HYBRIDLM_BENCH_OPENBLAS
#include <cblas.h>
#endif
#ifdef HYBRIDLM_BENCH_DNNL
#include <dnnl.h>
#endif

namespace {

using Clock = std::chrono::steady_clock;
using hybridlm::DType;
using hybridlm::KernelContext;
using hybridlm::ThreadPool;
using hybridlm::WeightView;

struct Shape {
  const char* where;
  int K, N;  // in, out
};

double best_seconds(int reps, const std::function<void()>& fn) {
  fn();  // warm-up: packs scratch, pages, thread pools
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

// 12 independent FMA chains per thread, kept in registers by the asm barrier.
__attribute__((target("avx512f"))) float fma_chains(long iters) {
  __m512 a0 = _mm512_set1_ps(0.5f), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, a8 = a0,
         a9 = a0, a10 = a0, a11 = a0;
  const __m512 m = _mm512_set1_ps(0.9999f), c = _mm512_set1_ps(1e-4f);
  for (long i = 0; i < iters; ++i) {
    a0 = _mm512_fmadd_ps(a0, m, c), a1 = _mm512_fmadd_ps(a1, m, c), a2 = _mm512_fmadd_ps(a2, m, c);
    a3 = _mm512_fmadd_ps(a3, m, c), a4 = _mm512_fmadd_ps(a4, m, c), a5 = _mm512_fmadd_ps(a5, m, c);
    a6 = _mm512_fmadd_ps(a6, m, c), a7 = _mm512_fmadd_ps(a7, m, c), a8 = _mm512_fmadd_ps(a8, m, c);
    a9 = _mm512_fmadd_ps(a9, m, c), a10 = _mm512_fmadd_ps(a10, m, c), a11 = _mm512_fmadd_ps(a11, m, c);
    asm volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5), "+v"(a6), "+v"(a7), "+v"(a8),
                 "+v"(a9), "+v"(a10), "+v"(a11));
  }
  const __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                                 _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11))));
  float sum = 0;
  for (float v : lanes) sum += v;
  return sum;
}

double fma_peak(ThreadPool& pool) {
  const long iters = 50'000'000;
  std::vector<float> sink(static_cast<size_t>(pool.size()));
  const auto t0 = Clock::now();
  pool.parallel_for(sink.size(), [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) sink[i] = fma_chains(iters);
  });
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  return static_cast<double>(pool.size()) * iters * 12 * 32 / s / 1e9;
}

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::fabs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::fabs(static_cast<double>(b[i])));
  }
  return den > 0 ? num / den : num;
}

}  // namespace

int main(int argc, char** argv) {
  int T = 512, threads = 2, reps = 5, cold = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string f = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (f == "-T") T = v;
    else if (f == "-t") threads = v;
    else if (f == "-r") reps = v;
    else if (f == "-c") cold = v;
    else {
      std::fprintf(stderr, "usage: bench_gemm [-T tokens] [-t threads] [-r reps] [-c 0|1]\n");
      return 2;
    }
  }
  if (T < 1 || threads < 1 || reps < 1) {
    std::fprintf(stderr, "bench_gemm: -T, -t and -r must be >= 1\n");
    return 2;
  }
#ifdef HYBRIDLM_BENCH_DNNL
  // oneDNN's OpenMP threads busy-wait between calls unless told otherwise, and the OpenMP
  // runtime reads its environment when the library loads: set it and start again.
  if (!std::getenv("OMP_WAIT_POLICY")) {
    setenv("OMP_WAIT_POLICY", "passive", 1);
    setenv("OMP_NUM_THREADS", std::to_string(threads).c_str(), 1);
    execv("/proc/self/exe", argv);
  }
#endif
  ThreadPool pool(threads);
  const KernelContext ctx{&pool};
  const double peak = fma_peak(pool);
#ifdef HYBRIDLM_BENCH_OPENBLAS
  openblas_set_num_threads(threads);
  std::printf("OpenBLAS %s, core %s\n", openblas_get_config(), openblas_get_corename());
#endif
#ifdef HYBRIDLM_BENCH_DNNL
  const dnnl_version_t* dv = dnnl_version();
  std::printf("oneDNN %d.%d.%d (OMP_NUM_THREADS=%s, OMP_WAIT_POLICY=%s)\n", dv->major, dv->minor, dv->patch,
              std::getenv("OMP_NUM_THREADS"), std::getenv("OMP_WAIT_POLICY"));
#endif
  std::printf("T = %d tokens, %d threads, best of %d; FP32 FMA peak (same run) %.0f GFLOP/s\n\n", T, threads, reps,
              peak);
  const Shape shapes[] = {
      {"mamba2-130m in_proj", 768, 3352},  {"mamba2-130m out_proj", 1536, 768}, {"mamba-130m in_proj", 768, 3072},
      {"mamba-130m x_proj", 1536, 80},     {"mamba-130m dt_proj", 48, 1536},    {"mamba2-1.3b in_proj", 2048, 8512},
      {"mamba2-1.3b out_proj", 4096, 2048}, {"mamba-1.4b x_proj", 4096, 160},    {"mamba-1.4b dt_proj", 128, 4096},
  };
  struct Impl {
    const char* name;
    std::function<void(const Shape&, const float* x, const float* w, const WeightView& W, float* y)> run;
  };
  std::vector<Impl> impls;
  impls.push_back({"hybridlm GEMM, lane panels", [&](const Shape&, const float* x, const float*, const WeightView& W,
                                                       float* y) { hybridlm::cpu::matmul(ctx, W, nullptr, x, T, y); }});
  // Copies of each shape's lane panels for -c 1, and the copy the next call reads.
  std::vector<std::vector<hybridlm::HugeVector<float>>> copies;
  size_t turn = 0;
  if (cold)
    impls.push_back({"hybridlm GEMM, lane panels, from memory",
                     [&](const Shape& s, const float* x, const float*, const WeightView& W, float* y) {
                       const auto& c = copies[static_cast<size_t>(&s - shapes)];
                       WeightView Wc = W;
                       Wc.data = c[turn++ % c.size()].data();
                       hybridlm::cpu::matmul(ctx, Wc, nullptr, x, T, y);
                     }});
  // Row-major weights (as mapped from a checkpoint): from 64 tokens on the GEMM packs each panel per
  // call; below, the dot-product tiles.
  impls.push_back({"hybridlm row-major", [&](const Shape& s, const float* x, const float* w, const WeightView&,
                                               float* y) {
                     hybridlm::cpu::matmul(ctx, WeightView{DType::F32, w, s.N, s.K}, nullptr, x, T, y);
                   }});
  impls.push_back({"hybridlm dot tiles", [&](const Shape& s, const float* x, const float* w, const WeightView&,
                                               float* y) {
                     // Calls of fewer tokens than the GEMM threshold run the 4x4 dot-product tiles.
                     for (int t0 = 0; t0 < T; t0 += 12)
                       hybridlm::cpu::matmul(ctx, WeightView{DType::F32, w, s.N, s.K}, nullptr,
                                             x + static_cast<size_t>(t0) * s.K, std::min(12, T - t0),
                                             y + static_cast<size_t>(t0) * s.N);
                   }});
  // Training's forward product: the strided GEMM (no lane classes) on the row-major weights.
  impls.push_back({"hybridlm training GEMM", [&](const Shape& s, const float* x, const float* w, const WeightView&,
                                                   float* y) {
                     hybridlm::cpu::matmul_train(ctx, WeightView{DType::F32, w, s.N, s.K}, nullptr, x, T, y);
                   }});
#ifdef HYBRIDLM_BENCH_OPENBLAS
  impls.push_back({"OpenBLAS sgemm", [&](const Shape& s, const float* x, const float* w, const WeightView&, float* y) {
                     cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, s.N, s.K, 1.0f, x, s.K, w, s.K, 0.0f, y,
                                 s.N);
                   }});
#endif
#ifdef HYBRIDLM_BENCH_DNNL
  impls.push_back({"oneDNN sgemm", [&](const Shape& s, const float* x, const float* w, const WeightView&, float* y) {
                     dnnl_sgemm('N', 'T', T, s.N, s.K, 1.0f, x, s.K, w, s.K, 0.0f, y, s.N);
                   }});
#endif
  const size_t n_shapes = std::size(shapes);
  std::vector<std::vector<float>> xs(n_shapes), ws(n_shapes), wps(n_shapes), first(n_shapes);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (size_t i = 0; i < n_shapes; ++i) {
    const Shape& s = shapes[i];
    xs[i].resize(static_cast<size_t>(T) * s.K);
    ws[i].resize(static_cast<size_t>(s.N) * s.K);
    for (float& v : xs[i]) v = nd(rng);
    for (float& v : ws[i]) v = 0.05f * nd(rng);
    // The panel layout matmul uses for copied weights.
    wps[i].assign(hybridlm::panel_count(s.N, s.K), 0.0f);
    for (int r = 0; r < s.N; ++r)
      for (int k = 0; k < s.K; ++k) wps[i][hybridlm::panel_index(r, k, s.K)] = ws[i][static_cast<size_t>(r) * s.K + k];
    if (cold) {  // in 2 MiB pages, as the engine holds weights (base/huge_alloc.h)
      copies.emplace_back(std::max<size_t>(2, (256u << 20) / (wps[i].size() * sizeof(float))));
      for (auto& c : copies.back()) c.assign(wps[i].begin(), wps[i].end());
    }
  }
  // One implementation at a time over every shape (another library's idle threads would spin
  // beside ours), then the table by shape.
  std::vector<std::vector<double>> gflops(n_shapes, std::vector<double>(impls.size()));
  std::vector<std::vector<double>> gbs(n_shapes, std::vector<double>(impls.size()));  // f32 weight bytes read
  std::vector<std::vector<double>> diff(n_shapes, std::vector<double>(impls.size()));
  for (size_t m = 0; m < impls.size(); ++m)
    for (size_t i = 0; i < n_shapes; ++i) {
      const Shape& s = shapes[i];
      const WeightView W{DType::F32, wps[i].data(), s.N, s.K, nullptr, true};
      std::vector<float> y(static_cast<size_t>(T) * s.N, 0.0f);
      const double sec = best_seconds(reps, [&] { impls[m].run(s, xs[i].data(), ws[i].data(), W, y.data()); });
      gflops[i][m] = 2.0 * T * s.K * s.N / sec / 1e9;
      gbs[i][m] = 4.0 * s.K * s.N / sec / 1e9;
      if (m == 0) first[i] = y;
      diff[i][m] = max_rel_diff(y, first[i]);
    }
  // The dot tiles (the kernel the GEMM replaced), timed in this run, are the baseline of the ratios.
  size_t baseline = 0;
  while (std::string(impls[baseline].name) != "hybridlm dot tiles") ++baseline;
  std::printf(
      "| projection | K -> N | impl | GFLOP/s | of peak | x dot tiles | weight GB/s | max rel diff vs first |\n"
      "|---|---|---|---|---|---|---|---|\n");
  for (size_t i = 0; i < n_shapes; ++i)
    for (size_t m = 0; m < impls.size(); ++m)
      std::printf("| %s | %d -> %d | %s | %.1f | %.0f%% | %.2fx | %.1f | %.1e |\n", shapes[i].where, shapes[i].K,
                  shapes[i].N, impls[m].name, gflops[i][m], 100.0 * gflops[i][m] / peak,
                  gflops[i][m] / gflops[i][baseline], gbs[i][m], diff[i][m]);
  std::printf(
      "\nLane panels are what the engine stores for copied weights of >= 256 rows; narrower ones (x_proj) it keeps "
      "row-major.\n");
  return 0;
}
