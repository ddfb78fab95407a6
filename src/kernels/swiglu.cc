#include "kernels/swiglu.h"

#include <algorithm>

#include "core/formats.h"
#include "kernels/exp.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace dsv4 {

namespace {

// h before its rounding to bf16.
float swiglu_one(float g, float u, float limit, float weight) {
  if (limit > 0) {
    u = std::clamp(u, -limit, limit);
    g = std::min(g, limit);
  }
  return g / (1.0f + exp_f32(-g)) * u * weight;
}

}  // namespace

void swiglu_bf16_reference(const float* g, const float* u, int64_t n, float limit, float weight, float* h) {
  for (int64_t i = 0; i < n; ++i) h[i] = bf16r(swiglu_one(g[i], u[i], limit, weight));
}

void swiglu_bf16(const float* g, const float* u, int64_t n, float limit, float weight, float* h) {
  int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  // std::min(g, L) is (L < g ? L : g), which vminps(L, g) is, NaN included;
  // std::clamp(u, −L, L) is then vmaxps(−L, vminps(L, u)).
  const bool clamp = limit > 0;
  const __m256 L = _mm256_set1_ps(limit), minus_L = _mm256_set1_ps(-limit), one = _mm256_set1_ps(1.f),
               w = _mm256_set1_ps(weight), sign = _mm256_set1_ps(-0.f);
  for (; i + 8 <= n; i += 8) {
    __m256 gv = _mm256_loadu_ps(g + i), uv = _mm256_loadu_ps(u + i);
    if (clamp) {
      uv = _mm256_max_ps(minus_L, _mm256_min_ps(L, uv));
      gv = _mm256_min_ps(L, gv);
    }
    const __m256 e = exp_f32_lanes<Lanes8>(_mm256_xor_ps(gv, sign));
    _mm256_storeu_ps(h + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)), uv), w));
  }
#endif
  for (; i < n; ++i) h[i] = swiglu_one(g[i], u[i], limit, weight);
  bf16r_inplace(h, size_t(n));  // equal to bf16r element by element (test BF16.RoundInplaceEqualsBf16r)
}

}  // namespace dsv4
