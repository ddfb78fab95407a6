// Per-worker buffers of the model's activations (model/activations.h).
#pragma once
#include <cstddef>
#include <vector>

#include "core/thread_pool.h"

namespace dsv4 {

// v with one slot per worker of the global pool, to be indexed by the
// worker id ThreadPool::parallel_for passes (a nested parallel_for runs
// inline under its outer task's id, so no two running tasks share a slot).
// Call it before the loop: growing v moves its slots.
template <class T>
std::vector<T>& worker_slots(std::vector<T>& v) {
  const size_t workers = size_t(ThreadPool::global().size());
  if (v.size() < workers) v.resize(workers);
  return v;
}

}  // namespace dsv4
