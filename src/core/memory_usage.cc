#include "core/memory_usage.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <fstream>

namespace dsv4 {

size_t peak_rss_bytes() {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return size_t(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

namespace {
// A mapping's header line in smaps: "start-end perms offset dev inode path".
bool is_mapping_header(const std::string& line) {
  return !line.empty() && std::isxdigit((unsigned char)line[0]) && line.find('-') != std::string::npos &&
         line.find(' ') > line.find('-');
}
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

size_t mapped_rss_bytes(const std::string& suffix) {
  std::ifstream f("/proc/self/smaps");
  std::string line;
  bool in_file = false;
  size_t kb = 0;
  while (std::getline(f, line)) {
    if (is_mapping_header(line))
      in_file = ends_with(line, suffix);
    else if (in_file && line.rfind("Rss:", 0) == 0)
      kb += std::strtoull(line.c_str() + 4, nullptr, 10);
  }
  return kb * 1024;
}

size_t available_memory_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("MemAvailable:", 0) == 0) return size_t(std::strtoull(line.c_str() + 13, nullptr, 10)) * 1024;
  return 0;
}

void release_mapped_pages(const void* p, size_t bytes) {
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE)), begin = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page,
                  end = (reinterpret_cast<uintptr_t>(p) + bytes) / page * page;
  if (p && end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

}  // namespace dsv4
