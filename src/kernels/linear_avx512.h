// The AVX-512 panel decoders of linear_avx512.cc, which Weight::dequant_panel
// calls when kernel_isa() is Isa::kAvx512 or later (never on CPUs without
// AVX-512F).
#pragma once
#include <cstdint>

#include "kernels/linear.h"

namespace dsv4 {

// Weight::dequant_panel for an FP4 weight (w.in a multiple of 32), bitwise
// equal to dequant_panel_reference.
void panel_fp4_avx512(const Weight& w, int64_t o0, int64_t o_end, float* panel);

// Weight::dequant_panel_pairs for an FP4 weight: the same panel as bf16
// pairs (gemm.h PairLoader); false when a scale would make a value
// subnormal or infinite.
bool panel_fp4_pairs_avx512(const Weight& w, int64_t o0, int64_t o_end, uint32_t* pairs, int* min_exponent);

// The same for an FP8 weight; false also for a NaN code or where w.in or the
// scale block is not a multiple of 16.
bool panel_fp8_pairs_avx512(const Weight& w, int64_t o0, int64_t o_end, uint32_t* pairs, int* min_exponent);

}  // namespace dsv4
