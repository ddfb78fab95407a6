// Working buffers kept from call to call.
//
// A hot function that needs a large temporary (an activation block, a
// query's scores) takes it from a thread_local vector through scratch():
// the vector grows to the largest size asked of it and stays. A fresh
// std::vector per call was zero-filled every time and, over glibc's mmap
// threshold (blocks of up to 32 MB get their own mapping), also mapped and
// faulted in anew: a 2048-row shared expert ran at half the speed of the
// same product on kept buffers. The caller writes every element it reads,
// and the function must not be re-entered on its thread while it holds the
// buffer (a nested parallel_for runs inline, so none of the users is).
#pragma once
#include <cstddef>
#include <vector>

namespace dsv4 {

template <class T>
T* scratch(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

}  // namespace dsv4
