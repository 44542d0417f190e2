#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <vector>

#include "base/thread_pool.h"

namespace hybridlm {
namespace {

TEST(ThreadPool, CoversTheRangeExactlyOnceForManyCalls) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    for (size_t n : {1u, 2u, 7u, 1000u}) {
      for (int rep = 0; rep < 200; ++rep) {
        std::vector<std::atomic<int>> hits(n);
        pool.parallel_for(n, [&](size_t b, size_t e) {
          for (size_t i = b; i < e; ++i) hits[i].fetch_add(1);
        });
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << threads << " threads, n=" << n;
      }
    }
  }
}

TEST(ThreadPool, ExceptionFromAnyThreadIsRethrownAfterAllFinish) {
  ThreadPool pool(3);
  for (size_t thrower = 0; thrower < 3; ++thrower) {
    std::atomic<int> finished{0};
    EXPECT_THROW(pool.parallel_for(3, [&](size_t b, size_t) {
      if (b == thrower) throw std::runtime_error("boom");
      finished.fetch_add(1);
    }),
                 std::runtime_error);
    EXPECT_EQ(finished.load(), 2) << "the other ranges still ran to completion";
    // The pool is usable afterwards.
    std::atomic<int> sum{0};
    pool.parallel_for(10, [&](size_t b, size_t e) { sum.fetch_add(static_cast<int>(e - b)); });
    EXPECT_EQ(sum.load(), 10);
  }
}

TEST(ThreadPool, AvailableCoresIsPositive) { EXPECT_GE(available_cores(), 1); }

}  // namespace
}  // namespace hybridlm
