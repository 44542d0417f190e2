#include "base/thread_pool.h"

#include <sched.h>

#include <algorithm>

// The spin-wait hint: x86 pause; on aarch64 an instruction barrier (isb), a short stall in the
// manner of pause (aarch64's `yield` hint does nothing on many cores); elsewhere a thread yield.
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HYBRIDLM_PAUSE() _mm_pause()
#elif defined(__aarch64__)
#define HYBRIDLM_PAUSE() asm volatile("isb" ::: "memory")
#else
#define HYBRIDLM_PAUSE() std::this_thread::yield()
#endif

namespace hybridlm {

namespace {
// Spin iterations (each a pause, ~tens of ns) before a worker goes to sleep.
constexpr int kSpins = 20000;

// Caller-side spins before it starts yielding the core (matters when threads outnumber cores).
constexpr int kCallerSpins = 2000;
}  // namespace

void ThreadPool::run_chunk(size_t i) {
  const size_t begin = job_n_ * i / job_chunks_, end = job_n_ * (i + 1) / job_chunks_;
  if (begin >= end) return;
  try {
    (*job_)(begin, end);
  } catch (...) {  // kept for the caller to rethrow once every thread is done
    std::lock_guard<std::mutex> lock(error_mu_);
    if (!error_) error_ = std::current_exception();
  }
}

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  try {
    for (int i = 1; i < n_threads_; ++i) threads_.emplace_back([this, i] { worker(i); });
  } catch (...) {  // could not start them all: stop the ones that run, then report
    stop_.store(true);
    {
      std::lock_guard<std::mutex> lock(mu_);
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
    throw;
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

namespace {
thread_local int tl_thread_index = 0;
}  // namespace

int ThreadPool::thread_index() { return tl_thread_index; }

void ThreadPool::worker(int index) {
  tl_thread_index = index;
  uint64_t seen = 0;
  for (;;) {
    uint64_t g = generation_.load(std::memory_order_acquire);
    for (int spin = 0; g == seen && spin < kSpins && !stop_.load(std::memory_order_relaxed); ++spin) {
      HYBRIDLM_PAUSE();
      g = generation_.load(std::memory_order_acquire);
    }
    if (g == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      sleepers_.fetch_add(1);
      cv_.wait(lock, [&] { return stop_.load() || generation_.load() != seen; });
      sleepers_.fetch_sub(1);
      g = generation_.load(std::memory_order_acquire);
    }
    if (stop_.load()) return;
    seen = g;
    if (static_cast<size_t>(index) < job_chunks_) run_chunk(static_cast<size_t>(index));
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::parallel_for(size_t n, FunctionRef<void(size_t, size_t)> fn, size_t grain) {
  if (n == 0) return;
  const size_t chunks = std::min<size_t>(n_threads_, (n + grain - 1) / std::max<size_t>(grain, 1));
  if (chunks <= 1 || threads_.empty()) {
    fn(0, n);
    return;
  }
  regions_.store(regions_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  job_ = &fn;
  job_n_ = n;
  job_chunks_ = chunks;
  pending_.store(static_cast<int>(threads_.size()), std::memory_order_relaxed);
  {
    // Bump under the lock so a worker that is about to sleep cannot miss it.
    std::lock_guard<std::mutex> lock(mu_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  if (sleepers_.load() > 0) cv_.notify_all();
  run_chunk(0);
  for (int spin = 0; pending_.load(std::memory_order_acquire) != 0; ++spin) {
    if (spin < kCallerSpins) HYBRIDLM_PAUSE();
    else std::this_thread::yield();
  }
  if (error_) {
    std::exception_ptr e;
    std::swap(e, error_);
    std::rethrow_exception(e);
  }
}

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

}  // namespace hybridlm
