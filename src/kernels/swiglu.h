// The experts' gated activation (MODEL.md §9.3), one expert's rows at a time.
#pragma once
#include <cstdint>

namespace dsv4 {

// h[i] = bf16( silu(g') · u' · weight ) for i < n, where, with L = limit > 0,
// u' = clamp(u, −L, L) and g' = min(g, L) (no clamps for L ≤ 0), and
// silu(g') = g' / (1 + exp_f32(−g')) (kernels/exp.h). weight 1 leaves the
// product as it is (the shared expert). h may be g.
void swiglu_bf16(const float* g, const float* u, int64_t n, float limit, float weight, float* h);

// The definition, one element at a time; swiglu_bf16 equals it bit for bit.
void swiglu_bf16_reference(const float* g, const float* u, int64_t n, float limit, float weight, float* h);

}  // namespace dsv4
