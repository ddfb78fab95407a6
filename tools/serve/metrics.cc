#include "serve/metrics.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>

namespace dsv4::serve {

size_t resident_memory_bytes() {
  std::ifstream statm("/proc/self/statm");
  size_t pages_total = 0, pages_resident = 0;
  if (!(statm >> pages_total >> pages_resident)) return 0;
  return pages_resident * size_t(sysconf(_SC_PAGESIZE));
}

namespace {

void add(std::string* out, const char* name, const char* type, const char* help, double value) {
  char line[64];
  std::snprintf(line, sizeof line, "%.17g", value);
  *out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + " " + line + "\n";
}

}  // namespace

std::string metrics_text(const SchedulerMetrics& m, size_t resident_bytes) {
  std::string out;
  add(&out, "dsv4_requests_running", "gauge", "Requests running now.", double(m.running));
  add(&out, "dsv4_requests_queued", "gauge", "Requests waiting for admission.", double(m.queued));
  add(&out, "dsv4_requests_total", "counter", "Requests submitted.", double(m.requests_total));
  add(&out, "dsv4_requests_rejected_total", "counter", "Requests refused with a full queue.",
      double(m.requests_rejected));
  add(&out, "dsv4_requests_cancelled_total", "counter", "Requests whose client went away.",
      double(m.requests_cancelled));
  add(&out, "dsv4_requests_failed_total", "counter", "Requests that ended in an error.", double(m.requests_failed));
  add(&out, "dsv4_prompt_tokens_total", "counter", "Prompt tokens of finished requests.",
      double(m.prompt_tokens_total));
  add(&out, "dsv4_cached_tokens_total", "counter", "Prompt tokens restored from the prefix cache.",
      double(m.cached_tokens_total));
  add(&out, "dsv4_generated_tokens_total", "counter", "Tokens generated.", double(m.generated_tokens_total));
  add(&out, "dsv4_cache_pool_bytes_used", "gauge", "Cache pool bytes the sessions hold.",
      double(m.cache_pool_bytes_used));
  add(&out, "dsv4_cache_pool_bytes_total", "gauge", "Cache pool size.", double(m.cache_pool_bytes_total));
  add(&out, "dsv4_prefix_cache_bytes", "gauge", "Bytes the prefix cache's states hold.",
      double(m.prefix_cache_bytes));
  add(&out, "dsv4_prefix_cache_entries", "gauge", "States in the prefix cache.", double(m.prefix_cache_entries));
  add(&out, "dsv4_prefill_tokens_per_second", "gauge", "Prompt tokens prefilled per second, last minute.",
      m.prefill_tokens_per_second);
  add(&out, "dsv4_decode_tokens_per_second", "gauge", "Tokens generated per second, last minute.",
      m.decode_tokens_per_second);
  add(&out, "dsv4_resident_memory_bytes", "gauge", "The process's resident memory.", double(resident_bytes));
  return out;
}

}  // namespace dsv4::serve
