// `dsv4 bench` (PREFILL.md §5, docs/PERFORMANCE.md "How to benchmark"):
// prefill tokens/s and seconds per stage for a list of prompt lengths, model
// FLOPs and the fraction of the measured machine peak they reach, the
// engine's BF16 GEMM against OpenBLAS's cblas_sbgemm on prefill shapes, and
// the conversion kernels against their plain references. With --decode
// instead: decode tokens/s against the read bandwidth (tools/bench_decode.h).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/arith.h"
#include "engine/kernel_bench.h"
#include "engine/request.h"
#include "io/synthetic.h"

namespace dsv4 {

struct BenchOptions {
  std::string model_dir;        // load this checkpoint; empty: generate `preset`
  SyntheticOptions synthetic;   // else this preset, written to a temporary directory
  std::vector<int64_t> tokens = {512, 1024, 2048, 4096, 8192};
  int threads = 0;              // 0: the process-wide pool as it is
  int64_t tile_tokens = 128;
  int64_t chunk_tokens = PrefillOptions{}.chunk_tokens;
  std::vector<GemmShape> gemm_shapes = default_gemm_shapes();
  int gemm_reps = 3;            // best of at most this many timed runs per shape and library
  double peak_seconds = 0.25;   // per peak measurement (each is taken three times)
  bool json = false;
  // --decode: only the read bandwidth and decode (docs/PERFORMANCE.md, "Decode").
  bool decode = false;
  std::vector<int64_t> streams = {1, 4, 16};  // sessions decoding together, one run each
  int64_t context = 1024;                     // prompt tokens before decoding
  int64_t decode_tokens = 32;                 // timed steps per run
  size_t bandwidth_bytes = 0;                 // read-bandwidth buffer; 0: 8 × LLC (core/bandwidth.h)

  static std::vector<GemmShape> default_gemm_shapes();
};

// "512,1024" -> {512, 1024}; throws dsv4::Error on anything else.
std::vector<int64_t> parse_token_counts(const std::string& s);
// "1,4,16" for --streams (each 1..4096); throws dsv4::Error on anything else.
std::vector<int64_t> parse_stream_counts(const std::string& s);
// "default", "none" or "MxKxN,MxKxN,..."; throws dsv4::Error on anything else.
std::vector<GemmShape> parse_gemm_shapes(const std::string& s);

// Runs the benchmark, prints text or one JSON object on stdout (progress on
// stderr when it is a terminal); returns the exit code.
int run_bench(const BenchOptions& o);

// FNV-1a 64 over the bytes of the logits: bench's "same bits" check.
inline uint64_t logits_checksum(const std::vector<float>& logits) {
  return fnv1a64(logits.data(), logits.size() * sizeof(float));
}

}  // namespace dsv4
