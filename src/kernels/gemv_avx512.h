// The AVX-512 GEMV tiles of gemv_avx512.cc, which gemv (gemv.cc) calls only
// when kernel_isa() is Isa::kAvx512 or later.
#pragma once
#include <cstdint>

#include "kernels/linear.h"

namespace dsv4 {

// Output rows per tile: two groups of 16, one zmm lane per row: a single
// input row still has two independent FMA chains, and a tile reads no more
// row streams than the hardware prefetcher follows well (gemv_avx512.cc).
constexpr int64_t kGemvTileRows = 32;

// FP4 with one input row: four groups (gemv_avx512.cc, "FP4, one input
// row"). Its decoding leaves room for four chains, and it runs below the
// read bandwidth, where the prefetcher's lower rate over 64 row streams
// does not bind.
constexpr int64_t kGemvFp4OneRowTileRows = 64;

// The rows of a tile for this weight and M.
inline int64_t gemv_tile_rows(const Weight& w, int64_t M) {
  return w.kind == Weight::Kind::kFP4 && M == 1 ? kGemvFp4OneRowTileRows : kGemvTileRows;
}

// What the FP4 one-row tile needs to know of its input row: the smallest
// biased exponent among its non-zero values (0 for a subnormal; 255 when
// every value is zero).
int gemv_min_biased_exponent(const float* x, int64_t n);

// Input rows a tile takes at once: 8 rows × 2 groups are 16 accumulators,
// which with the decoding's registers still fit the 32 zmm; each further
// pass over the tile (from L2) decodes its weights again, so 16 streams
// decoding together take 2 passes, not 4.
constexpr int64_t kGemvTileInputRows = 8;

// Rows [o0, o_end) of the product (o_end − o0 ≤ gemv_tile_rows(w, M)) for
// M ≤ kGemvTileInputRows input rows x (stride ldx): the fp32 sums to
// y[m][o − o0] (stride ldy). x_min_exponent: gemv_min_biased_exponent of x
// (read for FP4 with M = 1). False where a value cannot be decoded exactly
// in registers (FP8 NaN codes, FP8 scales above 2^7); y is then partly
// written.
bool gemv_tile_avx512(const Weight& w, const float* x, int64_t M, int64_t ldx, int x_min_exponent, int64_t o0,
                      int64_t o_end, float* y, int64_t ldy);

// FP4 one-row tiles computed with the scales factored out (gemv.h).
int64_t gemv_avx512_fp4_factored_tiles();

}  // namespace dsv4
