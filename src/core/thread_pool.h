// A persistent pool of worker threads. parallel_for splits an index range into
// contiguous chunks; callers only ever let one index write one output, so the
// split never changes a result (PREFILL.md §6).
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dsv4 {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return int(workers_.size()) + 1; }
  // Calls fn(begin, end, worker) on disjoint chunks covering [0, n); blocks
  // until all are done. The calling thread takes part as worker 0. If fn
  // throws, no further chunks are started, the running ones finish, and the
  // first exception is rethrown here; the pool stays usable. Called from
  // inside a job (nested), it runs fn(0, n, id) inline on that thread.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn, int64_t min_chunk = 1);

  // The process-wide pool (created on first use with set_threads' count, or
  // hardware_concurrency).
  static ThreadPool& global();
  // The global pool's size from now on: a pool of another size is replaced
  // (references to it must not be used after), one of this size stays.
  static void set_threads(int threads);

 private:
  void worker_loop(int id);
  // Runs chunks of the current job until none are left (or one has thrown).
  void run_chunks(const std::function<void(int64_t, int64_t, int)>& fn, int id);
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int64_t, int64_t, int)>* job_ = nullptr;
  int64_t n_ = 0, chunk_ = 0, next_ = 0;
  // Written under mu_; atomic so that a thread can spin on them before it
  // sleeps (worker_loop, parallel_for).
  std::atomic<int> active_{0};
  std::atomic<uint64_t> generation_{0};
  std::exception_ptr error_;  // the first exception of the current job
  std::atomic<bool> stop_{false};
};

// Shorthand: parallel_for over the global pool with a per-index body.
template <class F>
void parallel_for_each(int64_t n, F&& body, int64_t min_chunk = 1) {
  ThreadPool::global().parallel_for(
      n, [&](int64_t b, int64_t e, int) { for (int64_t i = b; i < e; ++i) body(i); }, min_chunk);
}

}  // namespace dsv4
