// A persistent pool of worker threads. parallel_for splits [0, n) into contiguous ranges, one per
// thread (the caller's thread takes part), and returns when all are done. No thread is created per
// call. A decode step makes hundreds of small parallel calls, so workers spin briefly on an atomic
// generation counter before they sleep on a condition variable: waking a sleeping thread costs
// tens of microseconds, a spinning one well under one.
#pragma once

#include <atomic>
#include <condition_variable>
#include <exception>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "base/function_ref.h"

namespace hybridlm {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }
  // fn(begin, end) over a split of [0, n); each range is at least `grain` long (except the last).
  // Not reentrant: fn must not call parallel_for on the same pool. An exception thrown by fn on
  // any thread is rethrown here, after every thread has finished its range.
  void parallel_for(size_t n, FunctionRef<void(size_t, size_t)> fn, size_t grain = 1);
  // The calling thread's index in the pool it works for: 1 .. size() - 1 on a worker, 0 on any
  // other thread (the one that calls parallel_for takes part as thread 0). Per-thread scratch
  // (kernels/scratch.h) is indexed by it.
  static int thread_index();
  // Parallel regions run so far: calls of parallel_for that woke the workers (a call whose range
  // fits one thread runs inline and is not counted). A decode step's count of these is its fixed
  // cost in wake-ups and joins (hybridlm bench reports it per step). Written by the caller only.
  uint64_t regions() const { return regions_.load(std::memory_order_relaxed); }

 private:
  void worker(int index);
  void run_chunk(size_t i);
  int n_threads_;
  std::vector<std::thread> threads_;
  // The job of the current generation (written before generation_ is bumped).
  const FunctionRef<void(size_t, size_t)>* job_ = nullptr;
  size_t job_n_ = 0, job_chunks_ = 0;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<int> sleepers_{0};
  std::atomic<uint64_t> regions_{0};
  std::mutex error_mu_;
  std::exception_ptr error_;
};

// Cores this process may run on (the affinity mask, which containers and taskset narrow).
int available_cores();

}  // namespace hybridlm
