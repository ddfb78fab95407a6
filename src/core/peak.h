// The machine's measured arithmetic peak, for `dsv4 bench` (PREFILL.md §5:
// achieved GEMM FLOP/s against the measured peak).
//
// The engine computes a BF16 product as bf16 -> fp32 conversion plus fp32
// FMA on every machine (core/cpu.h: BF16 dot-product instructions would
// change the rounding). The peak that bounds it is therefore the fp32 FMA
// throughput of the widest vectors the CPU has (AVX-512 where present, else
// AVX2), measured here with many independent accumulator chains in
// registers on every thread of a ThreadPool. A second number, a BF16 dot
// product over L1-resident data (convert, then FMA), shows what the
// conversion costs when it sits in the inner loop.
#pragma once
#include <string>

#include "core/thread_pool.h"

namespace dsv4 {

struct PeakResult {
  int threads = 0;
  double fma_gflops = 0;          // fp32 FMA, registers only, all threads: the peak
  double fma_gflops_1thread = 0;  // the same on one thread
  double bf16_dot_gflops = 0;     // bf16 x bf16 dot products (fp32 accumulate), L1 data, all threads
  double bf16_insn_gflops = 0;    // vdpbf16ps, registers only, all threads; 0: the CPU lacks it
  std::string method;             // what was measured, in words
};

// Takes about `seconds` per measurement (three of each, the best counts).
PeakResult measure_peak(ThreadPool& pool, double seconds = 0.25);

// The fp32 FMA rate alone on all threads of `pool` (GFLOP/s, best of three).
// Other processes lower it: `dsv4 bench` measures it at the start and the
// end of a run and keeps the larger value.
double measure_fma_gflops(ThreadPool& pool, double seconds = 0.25);

}  // namespace dsv4
