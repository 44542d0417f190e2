#include "base/thread_pool.h"

#include <algorithm>

namespace hybridlm {

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  for (int i = 1; i < n_threads_; ++i) threads_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_start_.notify_all();
  for (auto& t : threads_) t.join();
}

static void run_chunk(const std::function<void(size_t, size_t)>& fn, size_t n, size_t chunks, size_t i) {
  size_t begin = n * i / chunks, end = n * (i + 1) / chunks;
  if (begin < end) fn(begin, end);
}

void ThreadPool::worker(int index) {
  unsigned long seen = 0;
  for (;;) {
    const std::function<void(size_t, size_t)>* job;
    size_t n, chunks;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_start_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
      n = job_n_;
      chunks = job_chunks_;
    }
    if (static_cast<size_t>(index) < chunks) run_chunk(*job, n, chunks, static_cast<size_t>(index));
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) cv_done_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(size_t n, const std::function<void(size_t, size_t)>& fn, size_t grain) {
  if (n == 0) return;
  size_t chunks = std::min<size_t>(n_threads_, (n + grain - 1) / std::max<size_t>(grain, 1));
  if (chunks <= 1 || threads_.empty()) {
    fn(0, n);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    job_n_ = n;
    job_chunks_ = chunks;
    pending_ = static_cast<int>(threads_.size());
    ++generation_;
  }
  cv_start_.notify_all();
  run_chunk(fn, n, chunks, 0);
  std::unique_lock<std::mutex> lock(mu_);
  cv_done_.wait(lock, [&] { return pending_ == 0; });
}

}  // namespace hybridlm
