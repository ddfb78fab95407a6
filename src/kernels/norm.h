// RMSNorm variants (MODEL.md §4, §6.2).
#pragma once
#include <cstdint>

namespace dsv4 {

// y = bf16(w · (v · r)), r = 1/sqrt(mean(v²) + eps), in fp32. w may be null
// (no weight). y may alias v.
void rms_norm_bf16(const float* v, const float* w, int64_t n, float eps, float* y);

// rms_norm_bf16 on each of `rows` dense rows of n values, the rows split over
// the thread pool (one row per index: the split changes nothing).
void rms_norm_rows_bf16(const float* v, int64_t rows, const float* w, int64_t n, float eps, float* y);

// The per-head q normalisation of MODEL.md §6.2, op by op in bf16 as the
// reference does it: sq = bf16(q²), m = bf16(mean(sq)), r = bf16(rsqrt(bf16(m
// + bf16(eps)))), q = bf16(q · r). In place.
void q_head_norm_bf16(float* q, int64_t n, float eps);

}  // namespace dsv4
