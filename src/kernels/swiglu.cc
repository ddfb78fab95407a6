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

#if defined(__AVX2__) && defined(__FMA__)
// exp_f32, the same operations 8 lanes at a time.
__m256 exp8(__m256 x) {
  namespace k = exp_f32_constants;
  __m256 c = _mm256_max_ps(x, _mm256_set1_ps(k::kMin));
  c = _mm256_min_ps(c, _mm256_set1_ps(k::kMax));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(c, _mm256_set1_ps(k::kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(k::kLn2Hi), c);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(k::kLn2Lo), r);
  __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(k::kC[0]), r, _mm256_set1_ps(k::kC[1]));
  for (int i = 2; i < 7; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(k::kC[i]));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  const __m256i ni = _mm256_cvtps_epi32(n), n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  const __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
  return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));  // NaN stays NaN
}
#endif

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
    const __m256 e = exp8(_mm256_xor_ps(gv, sign));
    _mm256_storeu_ps(h + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)), uv), w));
  }
#endif
  for (; i < n; ++i) h[i] = swiglu_one(g[i], u[i], limit, weight);
  bf16r_inplace(h, size_t(n));  // equal to bf16r element by element (test BF16.RoundInplaceEqualsBf16r)
}

}  // namespace dsv4
