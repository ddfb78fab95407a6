#include "core/scratch.h"

#include <array>
#include <cstdint>
#include <cstdlib>
#include <new>

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

std::shared_ptr<uint8_t> huge_page_block(size_t bytes) {
  constexpr size_t kHuge = size_t(2) << 20;
  uint8_t* const p = static_cast<uint8_t*>(std::aligned_alloc(kHuge, (bytes + kHuge - 1) / kHuge * kHuge));
  if (!p) throw std::bad_alloc();
  advise_huge_pages(p, bytes);
  return std::shared_ptr<uint8_t>(p, [](uint8_t* q) { std::free(q); });
}

namespace detail {

namespace {

constexpr std::align_val_t kAlign{64};

// One thread's buffers, freed when the thread ends.
struct Workspace {
  std::array<WorkspaceBuffer, size_t(Buf::kCount)> buffers;
  Workspace() = default;
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  ~Workspace() {
    for (WorkspaceBuffer& b : buffers) ::operator delete(b.data, kAlign);
  }
};

}  // namespace

WorkspaceBuffer& workspace_buffer(Buf b) {
  // The one thread_local behind every workspace<T>() (scratch.h).
  thread_local Workspace ws;
  return ws.buffers[size_t(b)];
}

void grow_workspace_buffer(WorkspaceBuffer& b, size_t bytes) {
  ::operator delete(b.data, kAlign);
  b.data = nullptr;
  b.bytes = 0;
  void* p = ::operator new(bytes, kAlign);  // not touched here: the first write faults the pages in
  if (bytes >= (size_t(4) << 20)) advise_huge_pages(p, bytes);
  b.data = p;
  b.bytes = bytes;
}

}  // namespace detail

}  // namespace dsv4
