// The thread pool: every index once, and an exception thrown by a chunk
// reaches the caller instead of ending the process.
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
