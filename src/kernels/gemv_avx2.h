// The AVX2 GEMV tiles of gemv_avx2.cc, which gemv (gemv.cc) calls where
// gemv_isa() (core/cpu.h) is Isa::kAvx2: CPUs without AVX-512, the build's
// floor.
#pragma once
#include <cstdint>

#include "kernels/linear.h"

namespace dsv4 {

// Output rows per tile for M input rows: groups of 8, one ymm lane per row,
// so that a tile has 8 independent chains of FMAs (M × groups): each chain
// waits on its last FMA (4 cycles on Zen 3), and two FMAs a cycle need 8 in
// flight. With two groups at one input row, FP4 ran at 3.3-4 GB/s on one
// Zen 3 thread, weights in cache. Past 4 input rows one group: its
// accumulators (M of them) and the decoding still fit the 16 ymm registers,
// and each weight is decoded once for 8 input rows, not twice.
constexpr int64_t gemv_avx2_tile_rows(int64_t M) { return M <= 2 ? 32 : M <= 4 ? 16 : 8; }

// Input rows a tile takes at once; more make further passes over the tile,
// from L2.
constexpr int64_t kGemvAvx2TileInputRows = 8;

// Rows o0 + stride · i, i in [0, n) (n ≤ gemv_avx2_tile_rows(M)), of the product
// for M ≤ kGemvAvx2TileInputRows input rows x (stride ldx): the fp32 sums to
// y[m][stride · i] (stride ldy). False where a value cannot be decoded
// exactly in registers (FP8 NaN codes, FP8 scales above 2^7); y is then
// partly written. Also false for a weight kind it does not take (F32) and
// in a build without AVX2.
bool gemv_tile_avx2(const Weight& w, const float* x, int64_t M, int64_t ldx, int64_t o0, int64_t stride, int64_t n,
                    float* y, int64_t ldy);

// Writes panel `panel` of w's FP4 panels (Weight::fp4_panels, a
// multiple-of-32 `in`): its in / 8 steps of 16 dwords to data (32-byte
// aligned), its in / 32 scale steps of 16 codes to scales
// (kernels/gemv.h pack_quant_panels), 8 rows at a time transposed in
// registers. The vdpbf16ps tiles' packer writes the same bytes. False in a
// build without AVX2.
bool pack_fp4_panel_avx2(const Weight& w, int64_t panel, uint32_t* data, uint8_t* scales);

}  // namespace dsv4
