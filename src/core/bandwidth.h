// The machine's measured memory read bandwidth, for `dsv4 bench --decode`
// (docs/PERFORMANCE.md, "Decode"): a decode step reads every weight it uses
// once for a handful of rows, so its limit is bytes read / read bandwidth,
// not FLOPs / peak.
//
// Every thread of a ThreadPool streams over its own contiguous slice of one
// buffer many times larger than the last-level cache, summing the words it
// reads in vector registers, so that what is measured is DRAM (or whatever
// lies behind the LLC), not a cache.
#pragma once
#include <cstddef>

#include "core/thread_pool.h"

namespace dsv4 {

// The largest data cache of this CPU in bytes, from sysconf or else sysfs;
// 32 MiB when neither says (an upper guess, so that a buffer sized from it
// still leaves the cache behind).
size_t last_level_cache_bytes();

// The buffer measure_read_bandwidth reads by default: 8 × the LLC, at least
// 256 MiB, at most 4 GiB or 1/16 of the memory.
size_t default_bandwidth_buffer_bytes();

struct BandwidthResult {
  int threads = 0;
  double gbps = 0;            // bytes read / seconds / 1e9, all threads, best of three
  size_t buffer_bytes = 0;    // the buffer streamed over
  size_t llc_bytes = 0;       // last_level_cache_bytes()
};

// Takes about `seconds` per measurement (three of them, the best counts),
// after one untimed pass that also faults the buffer in. buffer_bytes 0:
// default_bandwidth_buffer_bytes().
BandwidthResult measure_read_bandwidth(ThreadPool& pool, double seconds = 0.25, size_t buffer_bytes = 0);

}  // namespace dsv4
