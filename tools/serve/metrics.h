// GET /metrics: the scheduler's counters and the process's memory in the
// Prometheus text format 0.0.4 (names in docs/SERVER.md).
#pragma once
#include <cstddef>
#include <string>

#include "serve/scheduler.h"

namespace dsv4::serve {

// Bytes resident now (/proc/self/statm); 0 where it cannot be read.
size_t resident_memory_bytes();

std::string metrics_text(const SchedulerMetrics& m, size_t resident_bytes);

}  // namespace dsv4::serve
