// Do small weight matrices gain from huge pages? A MoE decode step in isolation: per step, `-k`
// matrices picked at random from `-e` matrices of 1 MiB (f32, 256 x 1024: a qwen3-next-750m
// expert projection) each multiply one token (hybridlm's matmul), then, outside the timing, a
// buffer of `-s` MB is summed, as the attention layers' KV reads are between a deep context's
// GEMVs (it evicts the weights and the page-table lines their TLB misses walk). The same
// matrices are held two ways: each in its own operator new block (4 KB pages, as weights under
// 2 MiB were before WeightAllocator) and as WeightVectors (carved from huge-page slabs). Steps
// on the two alternate, so a busy host slows both alike; prints min and median ms of the GEMVs
// per step and their ratio.
//
//   build/bench_weight_pages [-t 2] [-e 1152] [-k 288] [-s 0,400] [-r 40]
//
// Speed only: never run by ctest.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "base/huge_alloc.h"
#include "base/thread_pool.h"
#include "kernels/kernels.h"

namespace {

using Clock = std::chrono::steady_clock;
using hybridlm::DType;
using hybridlm::KernelContext;
using hybridlm::ThreadPool;
using hybridlm::WeightView;

constexpr int kRows = 256, kCols = 1024;

__attribute__((target("avx512f"))) float sum_range(const float* p, size_t b, size_t e) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = b; i < e; ++i) {
    const float* q = p + i * 64;
    a0 = _mm512_add_ps(a0, _mm512_loadu_ps(q));
    a1 = _mm512_add_ps(a1, _mm512_loadu_ps(q + 16));
    a2 = _mm512_add_ps(a2, _mm512_loadu_ps(q + 32));
    a3 = _mm512_add_ps(a3, _mm512_loadu_ps(q + 48));
  }
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
  float s = 0;
  for (float v : lanes) s += v;
  return s;
}

// The first n floats of p summed by the pool's threads (n a multiple of 64).
float sum_buffer(ThreadPool& pool, const float* p, size_t n) {
  std::vector<float> part(static_cast<size_t>(pool.size()), 0.0f);
  pool.parallel_for(n / 64, [&](size_t b, size_t e) {
    part[static_cast<size_t>(ThreadPool::thread_index())] += sum_range(p, b, e);
  });
  float s = 0;
  for (float v : part) s += v;
  return s;
}

std::vector<int> parse_list(const char* s) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::atoi(item.c_str()));
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, experts = 1152, per_step = 288, reps = 40;
  std::vector<int> stream_mb = {0, 400};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "-t") threads = std::atoi(argv[i + 1]);
    else if (a == "-e") experts = std::atoi(argv[i + 1]);
    else if (a == "-k") per_step = std::atoi(argv[i + 1]);
    else if (a == "-r") reps = std::atoi(argv[i + 1]);
    else if (a == "-s") stream_mb = parse_list(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: %s [-t threads] [-e matrices] [-k per step] [-s MB,...] [-r steps]\n", argv[0]);
      return 2;
    }
  }
  ThreadPool pool(threads);
  const KernelContext ctx{&pool};
  const size_t n = static_cast<size_t>(kRows) * kCols;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<std::unique_ptr<float[]>> small_pages;  // operator new: 4 KB pages
  std::vector<hybridlm::WeightVector<float>> slabs;   // huge-page slabs
  for (int e = 0; e < experts; ++e) {
    small_pages.emplace_back(new float[n]);
    slabs.emplace_back(n);
    for (size_t i = 0; i < n; ++i) small_pages.back()[i] = slabs.back()[i] = u(rng);
  }
  const int max_mb = *std::max_element(stream_mb.begin(), stream_mb.end());
  std::vector<float> kv(static_cast<size_t>(std::max(max_mb, 1)) << 18, 1.0f);
  std::vector<float> x(kCols, 0.5f), y(kRows);
  std::printf("%d matrices of %d x %d f32 (1 MiB), %d per step, %d threads, %d steps each\n", experts, kRows, kCols,
              per_step, threads, reps);
  std::printf("| stream MB | 4 KB pages min / median ms | slabs min / median ms | ratio (min) | ratio (median) |\n");
  std::printf("|---|---|---|---|---|\n");
  float sink = 0;
  for (int mb : stream_mb) {
    std::vector<double> t_small, t_slab;
    std::uniform_int_distribution<int> pick(0, experts - 1);
    for (int r = 0; r < reps + 1; ++r) {
      for (int which = 0; which < 2; ++which) {
        std::vector<int> ids(static_cast<size_t>(per_step));
        for (int& id : ids) id = pick(rng);
        if (mb > 0) sink += sum_buffer(pool, kv.data(), static_cast<size_t>(mb) << 18);
        const auto t0 = Clock::now();
        for (int id : ids) {
          const size_t i = static_cast<size_t>(id);
          const float* w = which == 0 ? small_pages[i].get() : slabs[i].data();
          hybridlm::cpu::matmul(ctx, WeightView{DType::F32, w, kRows, kCols}, nullptr, x.data(), 1, y.data());
          sink += y[0];
        }
        const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        if (r > 0) (which == 0 ? t_small : t_slab).push_back(ms);  // step 0 warms up
      }
    }
    const double a = *std::min_element(t_small.begin(), t_small.end());
    const double b = *std::min_element(t_slab.begin(), t_slab.end());
    std::printf("| %d | %.2f / %.2f | %.2f / %.2f | %.2fx | %.2fx |\n", mb, a, median(t_small), b, median(t_slab),
                a / b, median(t_small) / median(t_slab));
  }
  return sink == 12345.0f ? 1 : 0;
}
