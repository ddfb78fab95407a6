// The AVX-512 GEMV tiles of gemv_avx512.cc, which gemv (gemv.cc) calls only
// when gemv_isa() (core/cpu.h) is Isa::kAvx512 or later.
#pragma once
#include <cstdint>

#include "kernels/linear.h"

namespace dsv4 {

// Output rows per tile: two groups of 16, one zmm lane per row: a single
// input row still has two independent FMA chains, and a tile reads no more
// row streams than the hardware prefetcher follows well (gemv_avx512.cc).
constexpr int64_t kGemvTileRows = 32;
// BF16 tiles for up to kGemvBf16NarrowInputRows input rows are one group:
// its decoding is a shift or a mask per two weights, so one chain per lane
// and input row still outruns memory, and 16 row streams arrive faster than
// 32 (bf16 8192 × 4096 streamed on one thread at 1, 2, 4 rows: +8–20%, on
// two +2–18%). With 8 and 16 rows, which share each decoded weight, and for
// FP8 and FP4, whose decoding needs the second group's chains, 16-row tiles
// lost 7–10% or gained nothing (session 17).
constexpr int64_t kGemvBf16TileRows = 16;
constexpr int64_t kGemvBf16NarrowInputRows = 4;

// Input rows a tile takes at once: 8 rows × 2 groups are 16 accumulators,
// which with the decoding's registers still fit the 32 zmm; each further
// pass over the tile (from L2) decodes its weights again, so 16 streams
// decoding together take 2 passes, not 4.
constexpr int64_t kGemvTileInputRows = 8;

// Input rows an FP4 or FP8 panel tile on vdpbf16ps takes at once: past
// kGemvTileInputRows, one panel (16 weight rows) at a time with 16
// accumulators, so 16 streams decoding together decode each weight once,
// not twice.
constexpr int64_t kGemvPanelInputRows = 16;
// Output rows per tile of FP4 or FP8 panels on vdpbf16ps, at most: 8
// panels, which one input row decodes at once (gemv_avx512bf16.cc).
constexpr int64_t kGemvPanelTileRows = 128;
// Whether a tile of rows o0, o0 + stride, ... reads w's pair panels: where
// it has them, and the tile takes consecutive rows from a panel's start.
// (Defined in gemv.cc: an inline copy compiled with -mavx512f could be the
// one the linker keeps.)
bool gemv_reads_pair_panels(const Weight& w, int64_t o0, int64_t stride);

// Rows o0 + stride · i, i in [0, n) (n ≤ kGemvTileRows), of the product for
// M ≤ kGemvTileInputRows input rows x (stride ldx): the fp32 sums to
// y[m][stride · i] (stride ldy). False where a value cannot be decoded
// exactly in registers (FP8 NaN codes, FP8 scales above 2^7); y is then
// partly written.
bool gemv_tile_avx512(const Weight& w, const float* x, int64_t M, int64_t ldx, int64_t o0, int64_t stride, int64_t n,
                      float* y, int64_t ldy);

// Rows o0 .. o0 + n - 1 (n ≤ kGemvTileRows; o0 a multiple of 16) of a BF16
// weight's pair panels for kGemvTileInputRows < M ≤ kGemvPanelInputRows
// input rows on fp32 FMAs, in one pass: the two sets of rows take turns
// over blocks of k.
void gemv_pair_panel_tile_avx512(const Weight& w, const float* x, int64_t M, int64_t ldx, int64_t o0, int64_t n,
                                 float* y, int64_t ldy);

// The same rows (pair panels only) on vdpbf16ps, for M ≤
// kGemvPanelInputRows input rows given as pairs (xp: rows of w.in / 2
// dwords, stride ldxp; k in the high half): the caller has checked that
// this gives the fp32 chain's bits (gemv.cc). Only where the build has the
// AVX512-BF16 kernels and gemv_isa() is Isa::kAvx512Bf16.
void gemv_pair_tile_avx512bf16(const Weight& w, const uint32_t* xp, int64_t M, int64_t ldxp, int64_t o0, int64_t n,
                               float* y, int64_t ldy);

// An FP4 tile (rows o0, o0 + stride, ...; n of them) on vdpbf16ps, for M ≤
// kGemvTileInputRows input rows given as pairs (as above; exact bf16
// values, x_min_exponent the smallest biased exponent of the non-zero
// ones). False, with y partly written, where a product could be flushed
// (a scale code outside 2-252, or too small for the inputs): the caller
// then computes the tile with gemv_tile_avx512. Same build and ISA
// conditions as gemv_pair_tile_avx512bf16.
bool gemv_fp4_tile_avx512bf16(const Weight& w, const uint32_t* xp, int64_t M, int64_t ldxp, int x_min_exponent,
                              int64_t o0, int64_t stride, int64_t n, float* y, int64_t ldy);

// The same on w's FP4 panels (Weight::fp4_panels): rows o0 .. o0 + n - 1,
// o0 a multiple of 16, n ≤ kGemvPanelTileRows, M ≤ kGemvPanelInputRows; false,
// with y partly written, under the same conditions.
bool gemv_fp4_panel_tile_avx512bf16(const Weight& w, const uint32_t* xp, int64_t M, int64_t ldxp, int x_min_exponent,
                                    int64_t o0, int64_t n, float* y, int64_t ldy);

// Writes panel `panel` of w's FP4 panels (Weight::fp4_panels): its
// in / 8 steps of 16 dwords to data, its in / 32 scale steps of 16 codes to
// scales (kernels/gemv.h pack_quant_panels).
void pack_fp4_panel_avx512bf16(const Weight& w, int64_t panel, uint32_t* data, uint8_t* scales);

// The same on w's FP8 panels (Weight::fp8_panels): rows o0 .. o0 + n - 1,
// o0 a multiple of 16, n ≤ kGemvPanelTileRows, M ≤ kGemvPanelInputRows; false,
// with y partly written, where a product could be flushed (a scale code
// outside 10-246, or too small for the inputs): the caller then computes
// the tile with gemv_tile_avx512.
bool gemv_fp8_panel_tile_avx512bf16(const Weight& w, const uint32_t* xp, int64_t M, int64_t ldxp, int x_min_exponent,
                                    int64_t o0, int64_t n, float* y, int64_t ldy);
// Rows o0 .. o0 + n - 1 (one panel: o0 a multiple of 16, n ≤ 16) of w's FP8
// panels for kGemvTileInputRows < M ≤ kGemvPanelInputRows input rows x
// (fp32, stride ldx) on fp32 FMAs, the panel decoded as for vdpbf16ps:
// where vdpbf16ps is the slower. False, with y partly written, where a
// scale code is outside 10-246. Same build and CPU conditions as
// gemv_pair_tile_avx512bf16.
bool gemv_fp8_panel_fma_tile(const Weight& w, const float* x, int64_t M, int64_t ldx, int64_t o0, int64_t n, float* y,
                             int64_t ldy);
// Writes panel `panel` of w's FP8 panels (Weight::fp8_panels): its in / 4
// steps of 16 dwords to data. False where a code is NaN.
bool pack_fp8_panel_avx512bf16(const Weight& w, int64_t panel, uint32_t* data);
// Weight::dequant_panel_pairs from panel `panel` of w's FP8 panels: the
// same pairs, decoded as gemv_fp8_panel_tile decodes them; false where a
// scale code is outside 10-246.
bool fp8_panel_pairs_avx512bf16(const Weight& w, int64_t panel, uint32_t* pairs, int* min_exponent);
}  // namespace dsv4
