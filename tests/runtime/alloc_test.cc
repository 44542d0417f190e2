// No heap allocation in a warm forward step (ARCHITECTURE.md: one arena per lifetime). This binary
// replaces the global operator new with one that counts, runs a hybrid model's batched steps until
// every buffer has reached its size, and then counts the allocations of further steps of the same
// shapes: a varlen prefill step and a batched decode step, on 2 threads, with f32 and bf16 state.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <random>

#include "runtime/engine.h"

namespace {
std::atomic<long> g_allocs{0};
// Set while a counted step runs when the environment has HYBRIDLM_TRAP_ALLOC: the first
// allocation then stops the process, and `gdb -ex run -ex bt` shows who allocated.
bool g_trap = false;
}

void* operator new(std::size_t n) {
  g_allocs.fetch_add(1, std::memory_order_relaxed);
  if (g_trap) __builtin_trap();
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void* operator new(std::size_t n, std::align_val_t a) {
  g_allocs.fetch_add(1, std::memory_order_relaxed);
  const size_t al = static_cast<size_t>(a);
  if (void* p = std::aligned_alloc(al, (n + al - 1) / al * al)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n, std::align_val_t a) { return operator new(n, a); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

namespace hybridlm {
namespace {

std::filesystem::path fixture(const char* name) {
  const char* d = std::getenv("HYBRIDLM_TEST_MODELS");
  if (!d) throw std::runtime_error("HYBRIDLM_TEST_MODELS is not set (run through ctest)");
  return std::filesystem::path(d) / name;
}

// Allocations of `steps` repetitions of one prefill step (three sequences, varlen) followed by
// decode steps of all three, after `warm` such rounds.
long allocations_of_warm_steps(Engine& e, int warm, int counted) {
  const int lens[3] = {9, 1, 17};
  std::mt19937 rng(1);
  std::vector<int32_t> toks;
  std::vector<BatchRun> runs;
  std::vector<int> rows;
  std::vector<int32_t> next(3);
  const std::vector<int> decode_rows = {0, 1, 2};
  long counted_allocs = 0;
  for (int round = 0; round < warm + counted; ++round) {
    toks.clear();
    runs.clear();
    rows.clear();
    for (int i = 0; i < 3; ++i) {
      for (int t = 0; t < lens[i]; ++t) toks.push_back(static_cast<int32_t>(rng() % 100));
      runs.push_back({e.new_sequence(), lens[i]});
      rows.push_back(static_cast<int>(toks.size()) - 1);
    }
    const long before = g_allocs.load();
    if (round >= warm && std::getenv("HYBRIDLM_TRAP_ALLOC")) g_trap = true;
    e.step(toks, runs, rows);
    for (int step = 0; step < 4; ++step) {
      for (int i = 0; i < 3; ++i) {
        next[i] = static_cast<int32_t>(rng() % 100);
        runs[i].len = 1;
      }
      e.step(next, runs, decode_rows);
    }
    g_trap = false;
    const long n = g_allocs.load() - before;
    if (round >= warm) counted_allocs += n;
    for (const BatchRun& r : runs) e.free_sequence(r.seq);
  }
  return counted_allocs;
}

class WarmStepAllocations : public ::testing::TestWithParam<const char*> {};

TEST_P(WarmStepAllocations, None) {
  for (DType state : {DType::F32, DType::BF16}) {
    EngineOptions o;
    o.threads = 2;
    o.max_sequences = 3;
    o.context = 64;
    o.state_dtype = state;
    Engine e(fixture(GetParam()), o);
    EXPECT_EQ(allocations_of_warm_steps(e, 2, 2), 0) << "state " << dtype_name(state);
  }
}

// Hybrids with every mixer kind between them: Mamba-1 + attention + MoE (jamba), Mamba-2 +
// attention (bamba, hybridlm_var with m, m2, t and relu^2 MLP), short conv (lfm2), Falcon-H1's
// parallel mixer, Zamba2's shared blocks, Nemotron-H's MLP-only layers, gated DeltaNet (hybridlm_gdn).
const char* kModels[] = {"jamba", "bamba", "hybridlm_var", "lfm2", "falcon_h1", "zamba2", "nemotron_h", "granite",
                          "lfm2_moe", "zamba", "hybridlm_gdn", "qwen3_5_moe"};
INSTANTIATE_TEST_SUITE_P(Fixtures, WarmStepAllocations, ::testing::ValuesIn(kModels));

// The counter sees allocations at all (a test that cannot fail is no test).
TEST(WarmStepAllocations, CounterCounts) {
  const long before = g_allocs.load();
  auto* v = new std::vector<int>(100);
  delete v;
  EXPECT_GE(g_allocs.load() - before, 2);
}

}  // namespace
}  // namespace hybridlm
