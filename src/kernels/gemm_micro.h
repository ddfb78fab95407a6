// The gemm micro-kernel, written once over a vector type V and instantiated
// per instruction set: scalar and AVX2 in gemm.cc, AVX-512 in
// gemm_avx512.cc (the one file compiled with -mavx512f; core/cpu.h picks the
// variant at run time). Every variant computes each output as the same FMA
// chain, so they agree bit for bit.
//
// V provides: T (a vector of kLanes floats), kRows (A rows per micro-tile)
// and kPanels (panels per micro-tile), sized to its register file together,
// zero(), load(p), store(p, v), broadcast(p) and fma(a, b, c) = a·b + c
// rounded once.
#pragma once
#include <cstdint>

#include "kernels/gemm.h"

namespace dsv4 {

// Internal linkage on purpose: gemm_avx512.cc compiles these templates with
// -mavx512f, and an instantiation with external linkage there could be the
// copy the linker keeps for the whole program, AVX-512 code on a CPU
// without it.
namespace {

// C[R][NP·16] (row stride ldc, fp32 partial sums) continues its FMA chains
// over kc more k: C = fma(A[r][k], P[k][j], C) in ascending k, where panel p
// (of NP, pstride floats apart) gives columns p·16 + j. A is read in place
// (row stride lda): the R rows are R sequential streams, which the hardware
// prefetches as well as a packed copy, and packing cost a full pass over A.
// `first`: the chains start here from 0. Splitting K into blocks keeps every
// chain one chain: the fp32 partial sum is stored and reloaded exactly.
// Taking NP panels at once changes which chains run side by side, never a
// chain. The loops over r and v are unrolled so that the accumulators live
// in registers (at -O2 they were spilled to the stack otherwise).
template <class V, int R, int NP>
inline void micro_tile(const float* A, int64_t lda, const float* P, int64_t pstride, int64_t kc, float* C,
                       int64_t ldc, bool first) {
  constexpr int NV = kGemmNR / V::kLanes, L = V::kLanes, W = NP * NV;
  static_assert(NV * L == kGemmNR, "a panel row is whole vectors");
  typename V::T c[R][W];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < W; ++v) c[r][v] = first ? V::zero() : V::load(C + r * ldc + v * L);
  for (int64_t k = 0; k < kc; ++k) {
    typename V::T b[W];
#pragma GCC unroll 16
    for (int v = 0; v < W; ++v) b[v] = V::load(P + (v / NV) * pstride + k * kGemmNR + (v % NV) * L);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const typename V::T a = V::broadcast(A + r * lda + k);
#pragma GCC unroll 16
      for (int v = 0; v < W; ++v) c[r][v] = V::fma(a, b[v], c[r][v]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < W; ++v) V::store(C + r * ldc + v * L, c[r][v]);
}

// `rows` in [1, R]: the full micro-tile, or a shorter one for the last rows
// of a chunk; `panels` in [1, V::kPanels], fewer for a task's last panel.
template <class V, int R = V::kRows>
inline void micro_rows(int rows, int panels, const float* A, int64_t lda, const float* P, int64_t pstride,
                       int64_t kc, float* C, int64_t ldc, bool first) {
  if constexpr (R > 1) {
    if (rows < R) return micro_rows<V, R - 1>(rows, panels, A, lda, P, pstride, kc, C, ldc, first);
  }
  static_assert(V::kPanels == 1 || V::kPanels == 2, "one or two panels per micro-tile");
  if constexpr (V::kPanels == 2) {
    if (panels == 2) return micro_tile<V, R, 2>(A, lda, P, pstride, kc, C, ldc, first);
  }
  micro_tile<V, R, 1>(A, lda, P, pstride, kc, C, ldc, first);
}

}  // namespace

// The signature every variant's micro_rows is called through.
using GemmMicroRows = void (*)(int rows, int panels, const float* A, int64_t lda, const float* P,
                               int64_t pstride, int64_t kc, float* C, int64_t ldc, bool first);

// gemm_avx512.cc: micro_rows over 16-lane vectors, up to kGemmMRAvx512 rows
// and kGemmNPAvx512 panels. Call only where kernel_isa() allows Isa::kAvx512.
constexpr int kGemmMRAvx512 = 12, kGemmNPAvx512 = 2;
void gemm_micro_rows_avx512(int rows, int panels, const float* A, int64_t lda, const float* P, int64_t pstride,
                            int64_t kc, float* C, int64_t ldc, bool first);

// gemm_avx512bf16.cc, for Isa::kAvx512Bf16 only. Pairs are dwords of two
// bf16 values, k in the high half and k + 1 in the low one (zero past K).
// micro_rows over pair operands: A rows of kp pairs (stride lda dwords),
// panels [kp][16] pairs, pstride dwords apart; the same chains as above.
void gemm_micro_rows_avx512bf16(int rows, int panels, const uint32_t* A, int64_t lda, const uint32_t* P,
                                int64_t pstride, int64_t kp, float* C, int64_t ldc, bool first);
// Packs a [K][16] fp32 panel into [ceil(K/2)][16] pairs. True when every
// value is a bf16 value that is zero or normal; *min_exponent is the
// smallest biased exponent of the non-zero values (255 when there are none).
bool gemm_pack_panel_bf16(const float* panel, int64_t K, uint32_t* out, int* min_exponent);
// Packs `rows` rows of K fp32 values (stride lda) into rows of ceil(K/2)
// pairs (stride ldo dwords), with the same check.
bool gemm_pack_rows_bf16(const float* A, int64_t lda, int64_t rows, int64_t K, uint32_t* out, int64_t ldo,
                         int* min_exponent);
// The panel of B rows rows[0..15] (null: a zero row), K fp32 values each,
// straight into [ceil(K/2)][16] pairs, with the same check: what a gather
// into an fp32 panel and gemm_pack_panel_bf16 give, in one pass.
bool gemm_pack_gathered_rows_bf16(const float* const* rows, int64_t K, uint32_t* out, int* min_exponent);

}  // namespace dsv4
