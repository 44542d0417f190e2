// Decode attention at depth: one query per call over D cached keys (bf16 pages of 16 tokens, each
// KV head in its own region of the pool, as the cache stores them by default), cpu::attention
// against a plain read of the same K and V bytes measured in the same run (a 4-accumulator
// AVX-512 sum over the rows, the memory-speed floor of the step; the cache is far larger than L2
// from D = 4K on these shapes). Shapes: the attention layers of the granite-4.0-h-350m preset (12
// query heads on 4 KV heads of 64), of a Llama-3-8B-like layer (32 on 8 of 128) and of qwen3-next
// (16 on 2 of 256).
//
//   build/bench_attention [-t 2] [-r 20] [-d 1024,16384,65536] [-p 2048] [-s 12:4x64,...] [-b 16]
//                         [-e MB] [-T] [-o] [-c]
//
// -s replaces the shapes (query heads:KV heads x head_dim), -b sets the tokens per page, -T lays
// pages out token-major (each token's row of all KV heads together, as training's views), -o
// keeps the pages in order in the pool (consecutive, as one sequence allocating alone gets them;
// by default shuffled, as after many sequences came and went), and -c (hot) points every page of
// the table at one of 4 pages, which stay in L2: the same arithmetic over the same number of keys
// without the memory traffic, so a cold run against a hot one separates the kernel's arithmetic
// from its waiting on memory (the read floor stays the cold read of the whole buffer; at larger
// -b the 4 pages may outgrow L2). -e reads MB megabytes of another buffer, untimed, before every
// timed call of the kernel and of the read floor, as a decode step's weights pass between its
// attention layers: without it a last-level cache keeps part of a KV of 16-128 MB between calls,
// which favours the plain read (its floor then runs above the memory's speed); with -c it would
// evict the hot pages too. -p 0 skips the prefill table.
//
// Prints microseconds per call (the best of -r after a warm-up), the GB/s of K and V read, the
// ratio to the read floor, and the nanoseconds per key and query head on each thread. Speed only:
// never run by ctest. HYBRIDLM_CPU_PATH=avx2 runs the portable kernel instead of the AVX-512 one.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "base/huge_alloc.h"
#include "base/thread_pool.h"
#include "kernels/cpu/intrinsics.h"
#include "kernels/kernels.h"

namespace {

using hybridlm::KernelContext;
using hybridlm::PagedKv;
using hybridlm::ThreadPool;

// The best time of fn over reps calls after a warm-up; `before` runs untimed ahead of each.
double best_us(int reps, const std::function<void()>& before, const std::function<void()>& fn) {
  before();
  fn();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    before();
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// The 16-bit elements of K and V in blocks [b, e) of 32, read in 64-byte vectors and summed as
// ints with 4 accumulators (the read floor of an attention call).
__attribute__((target("avx512f"))) float read_blocks(const uint16_t* k, const uint16_t* v, size_t b, size_t e) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = b;
  for (; i + 2 <= e; i += 2) {
    a0 = _mm512_add_epi32(a0, _mm512_loadu_si512(k + 32 * i));
    a1 = _mm512_add_epi32(a1, _mm512_loadu_si512(v + 32 * i));
    a2 = _mm512_add_epi32(a2, _mm512_loadu_si512(k + 32 * i + 32));
    a3 = _mm512_add_epi32(a3, _mm512_loadu_si512(v + 32 * i + 32));
  }
  for (; i < e; ++i) {
    a0 = _mm512_add_epi32(a0, _mm512_loadu_si512(k + 32 * i));
    a1 = _mm512_add_epi32(a1, _mm512_loadu_si512(v + 32 * i));
  }
  return static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3))));
}

// Pages the hot mode (-c) maps every page of the table onto: at 16 tokens a page they stay in L2,
// so the call measures the kernel's arithmetic without the memory traffic.
constexpr int kHotPages = 4;

// bf16 K and V pages for D tokens of one layer, in order or shuffled in the pool as a cache's are
// after many sequences came and went.
struct Pages {
  Pages(int D, int kv_heads, int hd, int block, bool head_regions, bool in_order, std::mt19937& rng, bool hot) {
    const int n_pages = (D + block - 1) / block;
    const size_t row = static_cast<size_t>(kv_heads) * hd;
    elems = static_cast<size_t>(n_pages) * block * row;
    k.resize(elems);
    v.resize(elems);
    for (size_t i = 0; i < elems; ++i) {
      k[i] = static_cast<uint16_t>(0x3f00 + (rng() & 0xff));  // bf16 values in [0.5, 1)
      v[i] = static_cast<uint16_t>(0x3f00 + (rng() & 0xff));
    }
    table.resize(n_pages);
    for (int p = 0; p < n_pages; ++p) table[p] = hot ? p % kHotPages : p;
    if (!in_order) std::shuffle(table.begin(), table.end(), rng);
    kv.k = k.data();
    kv.v = v.data();
    kv.pages = table.data();
    kv.block_size = block;
    kv.n_kv_heads = kv_heads;
    kv.head_dim = hd;
    kv.dtype = hybridlm::DType::BF16;
    if (head_regions) {  // the cache's layout: K of head h, page p at (h * n_pages + p) * block * hd
      kv.page_stride = static_cast<size_t>(block) * hd;
      kv.token_stride = static_cast<size_t>(hd);
      kv.head_stride = kv.page_stride * n_pages;
    } else {
      kv.page_stride = static_cast<size_t>(block) * row;
      kv.set_token_major();
    }
  }
  size_t elems = 0;
  std::vector<uint16_t, hybridlm::HugePageAllocator<uint16_t>> k, v;
  std::vector<int32_t> table;
  PagedKv kv;
};

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> out;
  for (size_t pos = 0; pos < s.size();) {
    const size_t comma = std::min(s.find(',', pos), s.size());
    if (comma > pos) out.push_back(std::atoi(s.substr(pos, comma - pos).c_str()));
    pos = comma + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, reps = 20, block = 16, evict_mb = 0;
  bool hot = false, head_regions = true, in_order = false;
  std::string depths = "1024,4096,16384,65536", prompts = "2048", shape_list;
  for (int c; (c = getopt(argc, argv, "t:r:d:p:s:b:e:Toc")) != -1;) {
    if (c == 't') threads = std::atoi(optarg);
    else if (c == 'r') reps = std::atoi(optarg);
    else if (c == 'd') depths = optarg;
    else if (c == 'p') prompts = optarg;
    else if (c == 'c') hot = true;
    else if (c == 'T') head_regions = false;
    else if (c == 'o') in_order = true;
    else if (c == 's') shape_list = optarg;
    else if (c == 'b') block = std::max(1, std::atoi(optarg));
    else if (c == 'e') evict_mb = std::max(0, std::atoi(optarg));
    else {
      std::fprintf(stderr,
                   "usage: %s [-t threads] [-r reps] [-d depth,...] [-p prompt,...] [-s H:KVxHD,...] [-b block] "
                   "[-e MB] [-T] [-o] [-c]\n",
                   argv[0]);
      return 2;
    }
  }
  ThreadPool pool(threads);
  const KernelContext ctx{&pool};
  struct Shape {
    std::string name;
    int heads, kv_heads, hd;
  };
  std::vector<Shape> shapes = {{"granite-4.0-h-350m 12:4x64", 12, 4, 64},
                               {"llama-3-8b 32:8x128", 32, 8, 128},
                               {"qwen3-next 16:2x256", 16, 2, 256}};
  if (!shape_list.empty()) {
    shapes.clear();
    for (size_t pos = 0; pos < shape_list.size();) {
      const size_t comma = std::min(shape_list.find(',', pos), shape_list.size());
      Shape s{shape_list.substr(pos, comma - pos), 0, 0, 0};
      if (std::sscanf(s.name.c_str(), "%d:%dx%d", &s.heads, &s.kv_heads, &s.hd) != 3 || s.heads <= 0 ||
          s.kv_heads <= 0 || s.heads % s.kv_heads != 0 || s.hd <= 0) {
        std::fprintf(stderr, "bad shape '%s' (want HEADS:KV_HEADSxHEAD_DIM, e.g. 12:4x64)\n", s.name.c_str());
        return 2;
      }
      shapes.push_back(s);
      pos = comma + 1;
    }
  }
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> sink(256);
  // -e: a buffer read (untimed) before every timed call, as a decode step's weights pass between
  // its attention layers, so neither the kernel nor the read floor finds its bytes in a cache.
  std::vector<uint16_t, hybridlm::HugePageAllocator<uint16_t>> evict_buf(static_cast<size_t>(evict_mb) << 19, 1);
  const auto evict = [&] {
    const size_t half = evict_buf.size() / 64;  // blocks of 32 elements in each half
    pool.parallel_for(half, [&](size_t b, size_t e) {
      sink[b % sink.size()] += read_blocks(evict_buf.data(), evict_buf.data() + 32 * half, b, e);
    });
  };
  const auto no_evict = [] {};
  std::printf("Decode: one query over D keys, pages of %d tokens, %s, %s%s\n\n", block,
              head_regions ? "each KV head its own region" : "token-major", in_order ? "in order" : "shuffled",
              hot ? " (hot: every page one of 4, in L2)" : "");
  std::printf("| shape | depth | KV MiB | attention us | GB/s | read floor us | attention / floor | "
              "ns per key and head per thread |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (const Shape& s : shapes)
    for (int D : parse_list(depths)) {
      Pages pg(D, s.kv_heads, s.hd, block, head_regions, in_order, rng, hot);
      std::vector<float> q(static_cast<size_t>(s.heads) * s.hd), out(q.size());
      for (float& x : q) x = 0.1f * nd(rng);
      const double us = best_us(reps, evict, [&] {
        hybridlm::cpu::attention(ctx, q.data(), s.heads * s.hd, pg.kv, D - 1, 1, s.heads, 0.125f, out.data());
      });
      const size_t bytes = 2 * static_cast<size_t>(D) * s.kv_heads * s.hd * 2;
      const double floor_us = best_us(reps, evict, [&] {
        pool.parallel_for(pg.elems / 32, [&](size_t b, size_t e) {
          sink[b % sink.size()] += read_blocks(pg.k.data(), pg.v.data(), b, e);
        });
      });
      std::printf("| %s | %d | %.1f | %.1f | %.1f | %.1f | %.2f | %.2f |\n", s.name.c_str(), D, bytes / 1048576.0, us,
                  bytes / us / 1e3, floor_us, us / floor_us, us * 1e3 * threads / (static_cast<double>(D) * s.heads));
      std::fflush(stdout);
    }
  const std::vector<int> prompt_list = parse_list(prompts);
  if (std::none_of(prompt_list.begin(), prompt_list.end(), [](int P) { return P > 0; })) return sink[0] == 12345.0f;
  std::printf("\nPrefill: P queries from an empty cache (causal; P (P + 1) / 2 keys per head)\n\n");
  std::printf("| shape | prompt | attention ms | GFLOP/s (4 hd per key and head) |\n|---|---|---|---|\n");
  for (const Shape& s : shapes)
    for (int P : prompt_list) {
      if (P <= 0) continue;
      Pages pg(P, s.kv_heads, s.hd, block, head_regions, in_order, rng, hot);
      std::vector<float> q(static_cast<size_t>(P) * s.heads * s.hd), out(q.size());
      for (float& x : q) x = 0.1f * nd(rng);
      const double us = best_us(std::max(1, reps / 10), no_evict, [&] {
        hybridlm::cpu::attention(ctx, q.data(), s.heads * s.hd, pg.kv, 0, P, s.heads, 0.125f, out.data());
      });
      const double flops = 4.0 * s.hd * s.heads * (static_cast<double>(P) * (P + 1) / 2);
      std::printf("| %s | %d | %.1f | %.1f |\n", s.name.c_str(), P, us / 1e3, flops / us / 1e3);
      std::fflush(stdout);
    }
  return sink[0] == 12345.0f ? 1 : 0;
}
