// Linear layers for a few input rows (decode): y = x · Wᵀ with the weight
// streamed once, decoded in registers straight into the dot products.
//
// Decode multiplies one row (or a few, one per session decoding together)
// by every active weight, about 2 flops per weight byte: the time is the
// weight's trip from memory. gemm's dequantised 16-row panels cost a store
// and a reload of every weight value for one multiply-add per row; here 16
// weight rows sit one per zmm lane and each lane keeps its own fp32
// accumulator fed by fused multiply-adds in ascending k, the same chain
// gemm and gemm_reference compute, so the results are the same bits
// (gemm.h).
#pragma once
#include <cstdint>
#include <memory>

#include "kernels/linear.h"

namespace dsv4 {

// Up to this many input rows linear() takes the GEMV path (8 rows at a time,
// the weight read from memory once): with the weight in L2 it matched or
// beat gemm on one thread at 8 rows for FP8, FP4 and BF16 (session 14).
// Decode streams the weights from memory, where gemm's panels (decoded to
// fp32, stored, packed again) cost more than gemv's second pass over a tile
// in L2: 16 streams decoding together (issue 23) take the GEMV path too.
// Except FP8 under Isa::kAvx512Bf16, whose gemm panels are bf16 pairs on
// vdpbf16ps: there FP8 takes gemv up to 8 rows (session 19, Zen 4).
constexpr int64_t kGemvMaxRows = 16;

// Whether gemv can take this weight and M here: gemv_isa() (core/cpu.h)
// AVX2 (gemv_avx2.h) or AVX-512 (gemv_avx512.h), an FP8 (in and block
// multiples of 16), FP4 or BF16 (in a multiple of 8) weight, 1 ≤ M ≤
// kGemvMaxRows (FP8 under avx512bf16: M ≤ 8).
bool gemv_available(const Weight& w, int64_t M);

// y[m][o - row_begin] = Σ_k x[m][k] · W[o][k] for o in [row_begin, row_end),
// x rows of w.in values with stride ldx (already FP8-quantised where the
// linear asks for it), y with stride ldy, rounded to bf16 where out_bf16.
// The threads of the pool split the output rows. Returns false, having
// written nothing meaningful, where a value could not be decoded in
// registers exactly (an FP8 NaN code, a scale past 2^7): the caller then
// takes the gemm path. Call only where gemv_available.
bool gemv(const Weight& w, const float* x, int64_t M, int64_t ldx, float* y, int64_t ldy, bool out_bf16,
          int64_t row_begin, int64_t row_end);

// Packs a weight's values as bf16 pair panels (Weight::pair_panels), on
// the pool's threads, points w at them and returns their owner: a BF16
// weight's rows (in a multiple of 8, an AVX2 or AVX-512 CPU), and, where
// gemv_isa() is Isa::kAvx2, an FP8 weight's dequant_row values. Returns
// null and leaves w alone otherwise, or where an FP8 value is not exactly
// a bf16 value (a NaN code). For the head: on flash4 half of a decode
// step's bytes, whose 16 × 16 transposes were half of the BF16 tile's
// instructions. For FP8 on AVX2: twice the bytes, but decoding FP8 in
// registers, not the memory, held decode's projections there.
std::shared_ptr<const uint32_t> pack_pair_panels(Weight& w);

// An FP4 or FP8 weight's codes (FP4: and scales) repacked as 16-row panels
// (Weight::fp4_panels, Weight::fp8_panels) for the vdpbf16ps tiles and
// (FP4) the AVX2 tiles: the row layout's transposes and nibble picking held
// decode's FP4 GEMV at about half the read bandwidth on Zen 4, its FP8 one
// on fp32 FMAs at about a third; the AVX2 FP4 tiles ran 1.6-2x faster on
// them (Zen 3). quant_panel_bytes: their size, a multiple of 64, or 0 where
// nothing would read them (not FP4 or FP8, in not a multiple of 32 (FP4)
// or 16 (FP8, and its block), gemv_isa() neither Isa::kAvx512Bf16 nor, for
// FP4, Isa::kAvx2). pack_quant_panels writes
// them on the pool's threads to dst (64-byte aligned, that size) and points
// w at them; false, with w untouched, where an FP8 code is NaN. The second
// form first allocates them (on 2 MB pages) and returns their owner, or
// null with w untouched.
size_t quant_panel_bytes(const Weight& w);
bool pack_quant_panels(Weight& w, void* dst);
std::shared_ptr<const uint8_t> pack_quant_panels(Weight& w);

// Tiles gemv has computed since the process started, and those of them
// that ran on vdpbf16ps (pair panels, FP4, FP8 panels): lets tests see that a path ran.
int64_t gemv_tile_count();
int64_t gemv_dot_tile_count();

// The definition: per output one std::fma chain in ascending k over
// Weight::dequant_row. What the tests compare gemv with.
void gemv_reference(const Weight& w, const float* x, int64_t M, int64_t ldx, float* y, int64_t ldy, bool out_bf16,
                    int64_t row_begin, int64_t row_end);

}  // namespace dsv4
