// The GEMV tile on vdpbf16ps: a BF16 weight's pair panels (Weight::
// pair_panels, k in the high half of each dword) against input rows given
// as pairs the same way, one instruction per 16 rows and two steps of k,
// which continues each lane's chain as two FMAs in ascending k would
// (core/cpu.h). gemv (gemv.cc) calls it only where no value can be flushed
// (kDotMinBiasedExponentSum, kernels/gemm.h). Compiled with -mavx512f
// -mavx512bf16 (CMakeLists.txt); like gemv_avx512.cc it calls no inline
// function or template of another header.
#include "kernels/gemv_avx512.h"
#include "kernels/gemv_tile_parts.h"

#ifdef __AVX512BF16__
#include <immintrin.h>

namespace dsv4 {

namespace {

// G panels (16 rows each) from row o0, MR input rows.
template <int G, int MR>
void pair_tile(const Weight& w, const uint32_t* xp, int64_t ldxp, int64_t o0, int64_t n, float* y, int64_t ldy) {
  const int64_t kp = w.in / 2;
  const uint32_t* panel[G];
  __m512 acc[MR][G];
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
    panel[g] = w.pair_panels + (o0 / kLanes + g) * kp * kLanes;
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) acc[m][g] = _mm512_setzero_ps();
  }
  for (int64_t j = 0; j < kp; ++j) {
    __m512bh b[G];
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) b[g] = (__m512bh)_mm512_load_si512(panel[g] + j * kLanes);
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32(int(xp[m * ldxp + j]));
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) acc[m][g] = _mm512_dpbf16_ps(acc[m][g], a, b[g]);
    }
  }
  for (int g = 0; g < G; ++g) {
    const int64_t left = n - g * kLanes;
    const __mmask16 keep = left >= kLanes ? __mmask16(0xffff) : __mmask16((1u << left) - 1);
    for (int m = 0; m < MR; ++m) _mm512_mask_storeu_ps(y + m * ldy + g * kLanes, keep, acc[m][g]);
  }
}

// pair_tile<G, M> for a run-time M in [1, MR].
template <int G, int MR>
void pair_tile_rows(const Weight& w, const uint32_t* xp, int64_t M, int64_t ldxp, int64_t o0, int64_t n, float* y,
                    int64_t ldy) {
  if constexpr (MR > 1) {
    if (M < MR) return pair_tile_rows<G, MR - 1>(w, xp, M, ldxp, o0, n, y, ldy);
  }
  pair_tile<G, MR>(w, xp, ldxp, o0, n, y, ldy);
}

}  // namespace

void gemv_pair_tile_avx512bf16(const Weight& w, const uint32_t* xp, int64_t M, int64_t ldxp, int64_t o0, int64_t n,
                               float* y, int64_t ldy) {
  static_assert(kGemvTileRows == 2 * kLanes, "a tile is at most two panels");
  if (n > kLanes) return pair_tile_rows<2, kGemvTileInputRows>(w, xp, M, ldxp, o0, n, y, ldy);
  pair_tile_rows<1, kGemvTileInputRows>(w, xp, M, ldxp, o0, n, y, ldy);
}

}  // namespace dsv4
#endif
