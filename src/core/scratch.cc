#include "core/scratch.h"

#include <cstdint>

#ifdef __linux__
#include <sys/mman.h>
#endif

namespace dsv4 {

void advise_huge_pages(void* p, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  // Only whole 2 MB pages inside the block (madvise wants page alignment;
  // the block's partial ends stay in small pages).
  constexpr uintptr_t kHuge = uintptr_t(2) << 20;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(kHuge - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);  // advice: failure changes nothing
#else
  (void)p, (void)bytes;
#endif
}

}  // namespace dsv4
