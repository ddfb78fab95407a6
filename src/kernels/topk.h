// Exact top-k with explicit tie-breaking: larger score first, and among
// equal scores the lower index wins (MODEL.md §8.4, §9.2).
#pragma once
#include <cstdint>
#include <vector>

namespace dsv4 {

// Indices of the k largest of score[0..n), ordered by (score desc, index asc).
// NaN scores rank below every number.
void topk_indices(const float* score, int64_t n, int64_t k, std::vector<int32_t>* out);

// The same k indices in ascending index order. A selection, not a partial
// sort: the order above is total, so the set is the same, and it is found
// in O(n) instead of O(n log k).
void topk_set(const float* score, int64_t n, int64_t k, std::vector<int32_t>* out);

}  // namespace dsv4
