// The kernel measurements of `dsv4 bench` (docs/PERFORMANCE.md): the
// engine's BF16 GEMM against OpenBLAS on prefill shapes, and the conversion
// kernels (weight panel dequantisation, FP8 activation quantisation, bf16
// rounding) against their plain references. Front ends get plain numbers.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace dsv4 {

struct GemmShape {
  int64_t m = 0, k = 0, n = 0;  // C[m][n] = A[m][k] · B[n][k]ᵀ
};

struct GemmResult {
  GemmShape shape;
  double seconds = 0, gflops = 0;
  double openblas_seconds = 0, openblas_gflops = 0;  // 0 when OpenBLAS is not built in
  double max_rel_diff = 0;                           // max |engine − OpenBLAS| / max |OpenBLAS|
};

// True when the build has OpenBLAS to compare with.
bool have_openblas();
// Which OpenBLAS routine is the baseline, and its kernels, in words.
std::string openblas_routine();
// Makes OpenBLAS use `threads` threads and starts them (not part of any timing).
void prepare_openblas(int threads);

// Best of at most `reps` alternating runs of the engine's linear() and the
// OpenBLAS baseline on random bf16 values of this shape.
GemmResult bench_gemm(const GemmShape& g, int reps);

struct ConversionTiming {
  std::string name;
  double ns_per_value = 0, reference_ns_per_value = 0;
};

// Each conversion against its plain reference on one thread.
std::vector<ConversionTiming> bench_conversions();

}  // namespace dsv4
