// The AVX-512 panel decoders of linear_avx512.cc, which Weight::dequant_panel
// calls when kernel_isa() is Isa::kAvx512 or later, or the weight has FP4/FP8
// panels (never on CPUs without AVX-512F).
#pragma once
#include <cstdint>

#include "kernels/linear.h"

namespace dsv4 {

// Weight::dequant_panel for an FP4 weight (w.in a multiple of 32), bitwise
// equal to dequant_panel_reference.
void panel_fp4_avx512(const Weight& w, int64_t o0, int64_t o_end, float* panel);

// The same from panel `panel_index` of w's FP4 panels (Weight::fp4_panels):
// every row of it, those past `out` as +0.
void panel_fp4_from_panels_avx512(const Weight& w, int64_t panel_index, float* panel);

// Weight::dequant_panel_pairs for an FP4 weight: the same panel as bf16
// pairs (gemm.h PairLoader); false when a scale would make a value
// subnormal or infinite.
bool panel_fp4_pairs_avx512(const Weight& w, int64_t o0, int64_t o_end, uint32_t* pairs, int* min_exponent);

// The same for an FP8 weight; false also for a NaN code or where w.in or the
// scale block is not a multiple of 16.
bool panel_fp8_pairs_avx512(const Weight& w, int64_t o0, int64_t o_end, uint32_t* pairs, int* min_exponent);

// Spreads kp panel rows of bf16 pairs, written to the front of `panel` (pair
// j at dwords [16j, 16j + 16), k = 2j in the high halves), into the fp32
// panel they hold: rows 2j and 2j + 1 at panel[32j .. 32j + 32). Works from
// the last pair down, so each pair is read before anything lands on it.
void spread_panel_pairs_avx512(int64_t kp, float* panel);

}  // namespace dsv4
