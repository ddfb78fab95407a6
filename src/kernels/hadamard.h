// Walsh–Hadamard transform in Sylvester order, scaled by n^(-1/2), fp32
// inside, bf16 out (MODEL.md §7). n must be a power of two.
#pragma once
#include <cstdint>

namespace dsv4 {

void hadamard_bf16(float* x, int64_t n);

}  // namespace dsv4
