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

// Flops per second of vdpbf16ps over those of AVX-512 fp32 FMA, measured
// once per process on the calling thread (best of three runs of about a
// millisecond each; later calls return that number); 0 where the CPU or
// the build lacks AVX512-BF16. Above 1 on AMD Zen 4 and 5 (~1.8 on Zen 5);
// about 0.5 on the Intel Xeon of session 18, whose vdpbf16ps issues once
// every two cycles where fp32 FMA issues twice a cycle.
double bf16_dot_to_fma_ratio();

}  // namespace dsv4
