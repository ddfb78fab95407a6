#include "core/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <utility>

#include "core/arith.h"

namespace dsv4 {

namespace {
int g_requested_threads = 0;
// The worker id of the job this thread is running, -1 outside any job: a
// parallel_for called from inside a job runs inline on the calling thread
// (the pool's workers are busy with the outer job, and waiting for them
// there would deadlock).
thread_local int tl_worker = -1;
struct InJob {
  explicit InJob(int id) { tl_worker = id; }
  ~InJob() { tl_worker = -1; }
};
std::unique_ptr<ThreadPool> g_pool;
std::mutex g_pool_mu;

// Waking a sleeping thread takes tens to hundreds of microseconds (a
// futex, the scheduler; more in a VM), as long as a whole decode GEMV in
// cache: one-stream decode calls parallel_for a few hundred times a step,
// and the worker woke so late that the caller did most of each call (FP4
// expert matrix, 2 threads: 1.2x one thread's speed). So a thread that runs
// out of work watches for the next job, or for the last chunk's end, for up
// to kSpin before it sleeps, and yields the core while it watches, in case
// another process wants it.
constexpr auto kSpin = std::chrono::microseconds(200);

template <class Ready>
void spin_until(Ready&& ready) {
  const auto end = std::chrono::steady_clock::now() + kSpin;
  for (int i = 1; !ready(); ++i) {
    if (i % 64 != 0) continue;
    if (std::chrono::steady_clock::now() > end) return;
    std::this_thread::yield();
  }
}
}  // namespace

ThreadPool::ThreadPool(int threads) {
  threads = std::max(1, threads);
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker_loop(int id) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t, int64_t, int)>* job;
    spin_until([&] { return stop_.load() || generation_.load() != seen; });
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
    }
    run_chunks(*job, id);
    {
      std::lock_guard<std::mutex> l(mu_);
      if (--active_ == 0) done_cv_.notify_all();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn, int64_t min_chunk) {
  if (n <= 0) return;
  int64_t threads = size();
  if (tl_worker >= 0) {
    fn(0, n, tl_worker);
    return;
  }
  if (threads == 1 || n <= min_chunk) {
    InJob in_job(0);
    fn(0, n, 0);
    return;
  }
  // A few chunks per thread balance uneven work; chunking only decides who
  // computes an index, never how.
  int64_t chunk = std::max<int64_t>(min_chunk, ceil_div(n, threads * 4));
  {
    std::lock_guard<std::mutex> l(mu_);
    job_ = &fn;
    n_ = n;
    chunk_ = chunk;
    next_ = 0;
    active_ = int(workers_.size());
    ++generation_;
  }
  cv_.notify_all();
  run_chunks(fn, 0);
  spin_until([&] { return active_.load() == 0; });
  std::unique_lock<std::mutex> l(mu_);
  done_cv_.wait(l, [&] { return active_ == 0; });
  job_ = nullptr;
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void ThreadPool::run_chunks(const std::function<void(int64_t, int64_t, int)>& fn, int id) {
  for (;;) {
    int64_t b, e;
    {
      std::lock_guard<std::mutex> l(mu_);
      b = next_;
      next_ += chunk_;
      e = std::min(n_, b + chunk_);
    }
    if (b >= n_) return;
    try {
      InJob in_job(id);
      fn(b, e, id);
    } catch (...) {
      std::lock_guard<std::mutex> l(mu_);
      if (!error_) error_ = std::current_exception();
      next_ = n_;  // start no more chunks
      return;
    }
  }
}

ThreadPool& ThreadPool::global() {
  std::lock_guard<std::mutex> l(g_pool_mu);
  if (!g_pool) {
    int n = g_requested_threads > 0 ? g_requested_threads : int(std::thread::hardware_concurrency());
    g_pool = std::make_unique<ThreadPool>(n);
  }
  return *g_pool;
}

void ThreadPool::set_threads(int threads) {
  std::lock_guard<std::mutex> l(g_pool_mu);
  g_requested_threads = threads;
  // A pool of that size stays: callers may hold a reference to it.
  if (g_pool && g_pool->size() != threads) g_pool.reset();
}

}  // namespace dsv4
