#include "core/bandwidth.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/scratch.h"
#include "core/stage_timer.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace dsv4 {

namespace {

// "32768K", "2M", "1048576" (sysfs cache sizes) in bytes; 0 when unreadable.
size_t parse_cache_size(const std::string& s) {
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (end == s.c_str()) return 0;
  if (*end == 'K') return size_t(v) << 10;
  if (*end == 'M') return size_t(v) << 20;
  if (*end == 'G') return size_t(v) << 30;
  return size_t(v);
}

// The largest data or unified cache sysfs lists for cpu0.
size_t sysfs_cache_bytes() {
  size_t best = 0;
  for (int i = 0; i < 16; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::ifstream type(dir + "type"), size(dir + "size");
    if (!type || !size) continue;
    std::string t, s;
    type >> t;
    size >> s;
    if (t != "Instruction") best = std::max(best, parse_cache_size(s));
  }
  return best;
}

// The sum of every 64-bit word of [p, p + bytes) (bytes a multiple of 128).
// Four independent vector sums keep several loads in flight; the result
// depends on every load, so none can be dropped.
uint64_t sum_words(const uint64_t* p, size_t bytes) {
#if defined(__AVX2__)
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  const __m256i* v = reinterpret_cast<const __m256i*>(p);
  for (size_t i = 0, n = bytes / 32; i < n; i += 4) {
    a0 = _mm256_add_epi64(a0, _mm256_load_si256(v + i));
    a1 = _mm256_add_epi64(a1, _mm256_load_si256(v + i + 1));
    a2 = _mm256_add_epi64(a2, _mm256_load_si256(v + i + 2));
    a3 = _mm256_add_epi64(a3, _mm256_load_si256(v + i + 3));
  }
  alignas(32) uint64_t w[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(w), _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3)));
  return w[0] + w[1] + w[2] + w[3];
#else
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  for (size_t i = 0, n = bytes / 8; i < n; i += 4) {
    s0 += p[i];
    s1 += p[i + 1];
    s2 += p[i + 2];
    s3 += p[i + 3];
  }
  return s0 + s1 + s2 + s3;
#endif
}

std::atomic<uint64_t> g_sink{0};  // keeps the sums, and so the loads, alive

struct Buffer {
  struct Free {
    void operator()(uint64_t* p) const { std::free(p); }
  };
  std::unique_ptr<uint64_t, Free> data;
  size_t slice_bytes = 0;  // per thread; thread i reads [i·slice, (i+1)·slice)
  int threads = 0;
  const uint64_t* slice(int i) const { return data.get() + size_t(i) * (slice_bytes / 8); }
};

constexpr size_t kAlign = size_t(2) << 20;  // huge-page aligned

// Runs read(i) once on every thread of the pool, thread i its own i: the
// items wait for each other before reading, so no thread can take two.
// Returns wall seconds.
template <class F>
double on_every_thread(ThreadPool& pool, F&& read) {
  const int n = pool.size();
  std::atomic<int> arrived{0};
  const auto t0 = Clock::now();
  pool.parallel_for(n, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) {
      arrived.fetch_add(1);
      while (arrived.load() < n) std::this_thread::yield();
      read(int(i));
    }
  });
  return since(t0);
}

// One run: every thread reads its slice `passes` times.
double timed_run(ThreadPool& pool, const Buffer& buf, int64_t passes) {
  return on_every_thread(pool, [&](int i) {
    uint64_t s = 0;
    for (int64_t p = 0; p < passes; ++p) s += sum_words(buf.slice(i), buf.slice_bytes);
    g_sink.fetch_add(s);
  });
}

}  // namespace

size_t last_level_cache_bytes() {
  size_t best = 0;
#ifdef _SC_LEVEL3_CACHE_SIZE
  for (int name : {_SC_LEVEL1_DCACHE_SIZE, _SC_LEVEL2_CACHE_SIZE, _SC_LEVEL3_CACHE_SIZE, _SC_LEVEL4_CACHE_SIZE}) {
    const long v = sysconf(name);
    if (v > 0) best = std::max(best, size_t(v));
  }
#endif
  best = std::max(best, sysfs_cache_bytes());
  return best > 0 ? best : size_t(32) << 20;
}

size_t default_bandwidth_buffer_bytes() {
  // A VM may report the whole socket's L3 (480 MiB on the Xeon of session
  // 14): 8 × that would push the mapped weights out of the page cache, so
  // the buffer also stays under 1/16 of the memory.
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  const size_t memory = pages > 0 && page > 0 ? size_t(pages) * size_t(page) : size_t(16) << 30;
  const size_t most = std::max(size_t(256) << 20, std::min(size_t(4) << 30, memory / 16));
  return std::clamp(8 * last_level_cache_bytes(), size_t(256) << 20, most);
}

BandwidthResult measure_read_bandwidth(ThreadPool& pool, double seconds, size_t buffer_bytes) {
  BandwidthResult r;
  r.threads = pool.size();
  r.llc_bytes = last_level_cache_bytes();
  if (buffer_bytes == 0) buffer_bytes = default_bandwidth_buffer_bytes();
  Buffer buf;
  buf.threads = r.threads;
  // Slices of whole 4 KiB pages, so that every slice is aligned for the
  // vector loads and no two threads share a page.
  buf.slice_bytes = std::max<size_t>(4096, buffer_bytes / size_t(r.threads) / 4096 * 4096);
  const size_t total = (buf.slice_bytes * size_t(r.threads) + kAlign - 1) / kAlign * kAlign;
  buf.data.reset(static_cast<uint64_t*>(std::aligned_alloc(kAlign, total)));
  if (!buf.data) throw Error("read bandwidth: cannot allocate " + std::to_string(total >> 20) + " MiB");
  advise_huge_pages(buf.data.get(), total);
  r.buffer_bytes = buf.slice_bytes * size_t(r.threads);
  // Each thread writes its own slice first (its pages then sit near it),
  // which is also the untimed pass.
  const double first = on_every_thread(pool, [&](int i) {
    uint64_t* p = buf.data.get() + size_t(i) * (buf.slice_bytes / 8);
    for (size_t k = 0; k < buf.slice_bytes / 8; ++k) p[k] = k * 0x9E3779B97F4A7C15ull + uint64_t(i);
  });
  const double one_pass = std::max(1e-4, std::min(first, timed_run(pool, buf, 1)));
  const int64_t passes = std::max<int64_t>(1, int64_t(seconds / one_pass));
  for (int rep = 0; rep < 3; ++rep) {
    const double s = timed_run(pool, buf, passes);
    r.gbps = std::max(r.gbps, double(r.buffer_bytes) * double(passes) / s / 1e9);
  }
  return r;
}

}  // namespace dsv4
