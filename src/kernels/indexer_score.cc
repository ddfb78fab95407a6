#include "kernels/indexer_score.h"

#include <algorithm>

#include "core/bf16_simd.h"
#include "core/formats.h"

namespace dsv4 {

void indexer_scores_reference(const float* dots, int64_t ld, int heads, const float* w, int64_t n, float* score) {
  for (int64_t r = 0; r < n; ++r) {
    float sum = 0.f;
    for (int h = 0; h < heads; ++h) sum += bf16r(std::max(dots[h * ld + r], 0.f) * w[h]);
    score[r] = bf16r(sum);
  }
}

void indexer_scores(const float* dots, int64_t ld, int heads, const float* w, int64_t n, float* score) {
  int64_t r = 0;
#ifdef __AVX2__
  // 32 rows at a time, one lane per row: each lane runs the reference's
  // sum over h in the same order. The rows of a head are contiguous, where
  // the reference's inner loop strides ld floats per head.
  constexpr int kVecs = 4;
  const __m256 zero = _mm256_setzero_ps();
  for (; r + 8 * kVecs <= n; r += 8 * kVecs) {
    __m256 sum[kVecs];
    for (int v = 0; v < kVecs; ++v) sum[v] = zero;
    for (int h = 0; h < heads; ++h) {
      const __m256 wh = _mm256_set1_ps(w[h]);
      const float* d = dots + h * ld + r;
      for (int v = 0; v < kVecs; ++v) {
        // max_ps returns its second operand for a NaN or two zeros, which is
        // what std::max(d, 0.f) returns for them.
        const __m256 x = _mm256_max_ps(zero, _mm256_loadu_ps(d + 8 * v));
        sum[v] = _mm256_add_ps(sum[v], bf16r8(_mm256_mul_ps(x, wh)));
      }
    }
    for (int v = 0; v < kVecs; ++v) _mm256_storeu_ps(score + r + 8 * v, bf16r8(sum[v]));
  }
#endif
  indexer_scores_reference(dots + r, ld, heads, w, n - r, score + r);
}

}  // namespace dsv4
