// The thread pool: every index once, a parallel_for inside a job runs inline
// (no deadlock), and an exception thrown by a chunk reaches the caller
// instead of ending the process.
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <vector>

#include "core/thread_pool.h"

namespace dsv4 {
namespace {

TEST(ThreadPool, EveryIndexOnce) {
  ThreadPool pool(3);
  std::vector<int> hits(1000, 0);
  pool.parallel_for(1000, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) ++hits[size_t(i)];
  });
  for (int h : hits) EXPECT_EQ(h, 1);
}

TEST(ThreadPool, NestedParallelForRunsInlineOnTheCallingWorker) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    std::vector<int> hits(64 * 100, 0);
    std::atomic<int> mismatched{0}, whole{0};
    pool.parallel_for(64, [&](int64_t b, int64_t e, int outer) {
      for (int64_t i = b; i < e; ++i)
        pool.parallel_for(100, [&](int64_t ib, int64_t ie, int inner) {
          if (inner != outer) ++mismatched;
          if (ib == 0 && ie == 100) ++whole;
          for (int64_t j = ib; j < ie; ++j) ++hits[size_t(i * 100 + j)];
        });
    });
    for (int h : hits) EXPECT_EQ(h, 1);
    EXPECT_EQ(mismatched.load(), 0) << threads << " threads";
    EXPECT_EQ(whole.load(), 64) << threads << " threads";
  }
}

TEST(ThreadPool, ExceptionReachesTheCallerAndThePoolStaysUsable) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int64_t bad : {0, 517, 999}) {  // in the caller's chunk or a worker's
      EXPECT_THROW(pool.parallel_for(1000,
                                     [&](int64_t b, int64_t e, int) {
                                       if (bad >= b && bad < e) throw std::runtime_error("chunk failed");
                                     }),
                   std::runtime_error)
          << threads << " threads, index " << bad;
      std::atomic<int64_t> sum{0};
      pool.parallel_for(100, [&](int64_t b, int64_t e, int) {
        for (int64_t i = b; i < e; ++i) sum += i;
      });
      EXPECT_EQ(sum.load(), 4950);
    }
  }
}

}  // namespace
}  // namespace dsv4
