// What this process holds in memory, for the reports of prefill and bench.
#pragma once
#include <cstddef>
#include <string>

namespace dsv4 {

// The most resident memory this process has held (getrusage's ru_maxrss).
size_t peak_rss_bytes();

// Bytes resident now in this process's mappings of files whose names end in
// `suffix` (the Rss of each such mapping in /proc/self/smaps): for
// ".safetensors", the checkpoint bytes the run has touched. 0 where /proc is
// not available.
size_t mapped_rss_bytes(const std::string& suffix);

// The memory the kernel could give without swapping (MemAvailable in
// /proc/meminfo: free memory and the page cache it can drop, which holds
// the files it has read); 0 where /proc is not available.
size_t available_memory_bytes();

// Unmaps the whole pages inside [p, p + bytes) of a read-only file mapping
// from this process (madvise MADV_DONTNEED): they stay in the page cache,
// which may drop them, and a later read maps them in again.
void release_mapped_pages(const void* p, size_t bytes);

}  // namespace dsv4
