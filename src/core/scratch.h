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

// Asks the kernel to back [p, p + bytes) with transparent huge pages where
// it allows them on request (Linux THP "madvise" mode; elsewhere nothing).
// On the project VM, faulting in fresh memory 4 KB at a time cost ~3.5 ms
// per MB (400 MB: 1.42 s); in 2 MB pages 0.04-0.9 s.
void advise_huge_pages(void* p, size_t bytes);

// v holds at least n elements; what it held before is not kept when it
// grows. Blocks of 4 MB and more are advised into huge pages before their
// first touch.
template <class T>
T* scratch(std::vector<T>& v, size_t n) {
  if (v.size() < n) {
    std::vector<T> fresh;
    fresh.reserve(n);
    if (n * sizeof(T) >= (size_t(4) << 20)) advise_huge_pages(fresh.data(), n * sizeof(T));
    fresh.resize(n);
    v.swap(fresh);
  }
  return v.data();
}

}  // namespace dsv4
