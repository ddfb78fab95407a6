// The lightning indexer's per-row score (MODEL.md §8.3) from the per-head
// dot products: score[r] = bf16(Σ_h bf16(max(dots[h][r], 0) · w[h])), the
// sum in ascending h, one fp32 sum per row.
#pragma once
#include <cstdint>

namespace dsv4 {

// dots: heads rows of n values, row stride ld. max(d, 0) as std::max gives
// it: NaN and −0 stay as they are.
void indexer_scores(const float* dots, int64_t ld, int heads, const float* w, int64_t n, float* score);

// The same in plain loops: what the vectorised variant is tested against.
void indexer_scores_reference(const float* dots, int64_t ld, int heads, const float* w, int64_t n, float* score);

}  // namespace dsv4
