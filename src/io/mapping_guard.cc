#include "io/mapping_guard.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>

namespace dsv4 {

namespace {

struct Slot {
  std::atomic<uintptr_t> base{0};
  std::atomic<size_t> size{0};
  std::atomic<const std::string*> path{nullptr};
};
constexpr size_t kSlots = 4096;
Slot g_slots[kSlots];

void write_str(const char* s) {
  size_t n = std::strlen(s);
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w;
    n -= size_t(w);
  }
}

void on_sigbus(int, siginfo_t* info, void*) {
  write_str("dsv4: error: checkpoint file changed or truncated while mapped (SIGBUS)");
  const uintptr_t a = reinterpret_cast<uintptr_t>(info ? info->si_addr : nullptr);
  for (Slot& s : g_slots) {
    const uintptr_t b = s.base.load(std::memory_order_acquire);
    if (b > 1 && a >= b && a - b < s.size.load(std::memory_order_relaxed)) {
      const std::string* p = s.path.load(std::memory_order_relaxed);
      if (p) {
        write_str(": ");
        write_str(p->c_str());
      }
      break;
    }
  }
  write_str("\n");
  ::_exit(2);
}

}  // namespace

void register_mapping(const void* base, size_t size, const std::string* path) {
  if (!base) return;
  for (Slot& s : g_slots) {
    uintptr_t expected = 0;
    // Claimed by a sentinel first so that the handler never sees a base
    // without its size and path.
    if (s.base.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
      s.size.store(size, std::memory_order_relaxed);
      s.path.store(path, std::memory_order_relaxed);
      s.base.store(reinterpret_cast<uintptr_t>(base), std::memory_order_release);
      return;
    }
  }
}

void unregister_mapping(const void* base) {
  if (!base) return;
  for (Slot& s : g_slots) {
    uintptr_t expected = reinterpret_cast<uintptr_t>(base);
    if (s.base.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
      s.path.store(nullptr, std::memory_order_relaxed);
      s.size.store(0, std::memory_order_relaxed);
      s.base.store(0, std::memory_order_release);
      return;
    }
  }
}

void install_sigbus_handler() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_sigbus;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGBUS, &sa, nullptr);
}

}  // namespace dsv4
