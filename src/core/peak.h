// The machine's measured arithmetic peak, for `dsv4 bench` (PREFILL.md §5:
// achieved GEMM FLOP/s against the measured peak).
//
// The peak is the throughput of the arithmetic the GEMM kernels use
// (core/cpu.h), measured with many independent accumulator chains in
// registers on every thread of a ThreadPool: the BF16 dot-product
// instruction vdpbf16ps where the kernels use it (Isa::kAvx512Bf16), else
// fp32 FMA on the widest vectors the CPU has (AVX-512 where present, else
// AVX2). The fp32 FMA rate is reported beside it, and a BF16 dot product
// over L1-resident data (convert, then FMA) shows what the conversion costs
// when it sits in the inner loop.
#pragma once
#include <string>

#include "core/thread_pool.h"

namespace dsv4 {

struct PeakResult {
  int threads = 0;
  double gflops = 0;              // the kernels' arithmetic, registers only, all threads: the peak
  double gflops_1thread = 0;      // the same on one thread
  double fma_gflops = 0;          // fp32 FMA on the widest vectors, registers only, all threads
  double bf16_dot_gflops = 0;     // bf16 x bf16 dot products (convert + fp32 FMA), L1 data, all threads
  double bf16_insn_gflops = 0;    // vdpbf16ps, registers only, all threads; 0: the CPU lacks it
  std::string method;             // what the peak measured, in words
};

// Takes about `seconds` per measurement (three of each, the best counts).
PeakResult measure_peak(ThreadPool& pool, double seconds = 0.25);

// PeakResult::gflops alone on all threads of `pool` (best of three). Other
// processes lower it: `dsv4 bench` measures it at the start and the end of a
// run and keeps the larger value.
double measure_peak_gflops(ThreadPool& pool, double seconds = 0.25);

}  // namespace dsv4
