// Exact top-k with explicit tie-breaking: larger score first, and among
// equal scores the lower index wins (MODEL.md §8.4, §9.2).
#pragma once
#include <cstdint>
#include <vector>

namespace dsv4 {

// Indices of the k largest of score[0..n), ordered by (score desc, index asc).
// NaN scores rank below every number.
void topk_indices(const float* score, int64_t n, int64_t k, std::vector<int32_t>* out);

}  // namespace dsv4
