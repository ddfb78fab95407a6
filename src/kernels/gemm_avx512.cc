// The AVX-512 gemm micro-kernel. This file alone is compiled with -mavx512f
// (CMakeLists.txt), and nothing else in it may be: gemm.cc calls it only
// after core/cpu.h found AVX-512F on the CPU.
//
// One 16-lane vector holds a whole panel row. A micro-tile of 12 rows and
// two panels keeps 24 accumulators (of 32 registers) and issues 12
// broadcasts and 2 panel loads per 24 FMAs. One panel would take 13 loads
// per 12 FMAs, more than the two vector loads a cycle that keep up with two
// FMAs a cycle.
#include "kernels/gemm_micro.h"

#ifdef __AVX512F__
#include <immintrin.h>

namespace dsv4 {

namespace {

struct Zmm {
  using T = __m512;
  static constexpr int kLanes = 16, kRows = kGemmMRAvx512, kPanels = kGemmNPAvx512;
  static T zero() { return _mm512_setzero_ps(); }
  static T load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, T v) { _mm512_storeu_ps(p, v); }
  static T broadcast(const float* p) { return _mm512_set1_ps(*p); }
  static T fma(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
};

}  // namespace

void gemm_micro_rows_avx512(int rows, int panels, const float* A, int64_t lda, const float* P, int64_t pstride,
                            int64_t kc, float* C, int64_t ldc, bool first) {
  micro_rows<Zmm>(rows, panels, A, lda, P, pstride, kc, C, ldc, first);
}

}  // namespace dsv4
#endif
