#include "core/formats.h"

#include <algorithm>
#include <array>

#include "core/bf16_simd.h"

namespace dsv4 {

void bf16r_inplace(float* x, size_t n) { bf16r_copy(x, n, x); }

void bf16r_copy(const float* x, size_t n, float* y) {
  size_t i = 0;
#ifdef __AVX2__
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, bf16r8(_mm256_loadu_ps(x + i)));
#endif
  for (; i < n; ++i) y[i] = bf16r(x[i]);
}

float e4m3_to_f32(uint8_t b) {
  int sign = b >> 7, exp = (b >> 3) & 15, man = b & 7;
  if (exp == 15 && man == 7) return std::nanf("");
  float v = exp == 0 ? std::ldexp(float(man), -9) : std::ldexp(float(8 + man), exp - 10);
  return sign ? -v : v;
}

static std::array<float, 256> make_e4m3_table() {
  std::array<float, 256> t{};
  for (int i = 0; i < 256; ++i) t[i] = e4m3_to_f32(uint8_t(i));
  return t;
}
static const std::array<float, 256> kTable = make_e4m3_table();
const float* e4m3_table() { return kTable.data(); }

uint8_t f32_to_e4m3(float f) {
  uint32_t u = f32_bits(f);
  uint8_t sign = uint8_t((u >> 24) & 0x80);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7f;             // NaN
  float x = bits_f32(a);
  if (x >= 448.0f) return sign | 0x7e;          // saturate (also +inf)
  // The e4m3 grid step for x: subnormals and the first binade (x < 2^-5) step 2^-9,
  // else 2^(floor(log2 x) - 3). Dividing by the step and rounding to nearest
  // even gives the integer mantissa*2^k exactly (all steps are powers of two).
  int e = int(a >> 23) - 127;
  int step_exp = e < -6 ? -9 : e - 3;
  // x · 2^-step_exp is exact (a power-of-two multiply, no ldexp call).
  float q = std::nearbyint(x * exp2i(-step_exp));  // default mode: ties to even
  // q is in [0, 16]; 16 means it rounded up into the next binade.
  int qi = int(q);
  if (step_exp == -9) {
    // Subnormals and the first normal binade share the step 2^-9, and the
    // value q·2^-9 (q in 0..16) is exactly code q: subnormals for q < 8,
    // exponent 1 with mantissa q-8 for 8..15, and 2^-5 (exponent 2) for 16.
    return sign | uint8_t(qi);
  }
  int exp_field = step_exp + 3 + 7;  // value = q * 2^step_exp, q in [8, 16]
  if (qi == 16) { qi = 8; ++exp_field; }
  if (exp_field > 15 || (exp_field == 15 && qi - 8 > 6)) return sign | 0x7e;
  return sign | uint8_t(exp_field << 3) | uint8_t(qi - 8);
}

namespace {

float q8_scale(float amax, bool pow2) {
  return pow2 ? fp8_pow2_scale(amax) : (amax > 1e-4f ? amax : 1e-4f) / 448.0f;
}

// One block as the definition reads: scale, clamp, round to e4m3, rescale.
void q8_block_reference(float* x, size_t n, bool pow2) {
  float amax = 0.f;
  for (size_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float s = q8_scale(amax, pow2);
  for (size_t i = 0; i < n; ++i) {
    float v = std::clamp(x[i] / s, -448.0f, 448.0f);
    x[i] = kTable[f32_to_e4m3(v)] * s;
  }
}

#ifdef __AVX2__
// The largest |x[i]| of a block for the vectorised quantisers: false when n
// is not a multiple of 8 or some x[i] is NaN or infinite (their blocks take
// the plain path).
bool finite_block_amax_avx2(const float* x, size_t n, float* block_amax) {
  if (n % 8 != 0) return false;
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  __m256 amax = _mm256_setzero_ps();
  __m256i nonfinite = _mm256_setzero_si256();
  for (size_t i = 0; i < n; i += 8) {
    const __m256i a = _mm256_and_si256(_mm256_castps_si256(_mm256_loadu_ps(x + i)), abs_mask);
    nonfinite = _mm256_or_si256(nonfinite, _mm256_cmpgt_epi32(a, _mm256_sub_epi32(inf, _mm256_set1_epi32(1))));
    amax = _mm256_max_ps(amax, _mm256_castsi256_ps(a));
  }
  if (!_mm256_testz_si256(nonfinite, nonfinite)) return false;
  alignas(32) float m[8];
  _mm256_store_ps(m, amax);
  *block_amax = *std::max_element(m, m + 8);
  return true;
}

// The same block 8 values at a time, for n a multiple of 8 and finite x
// (returns false, touching nothing, otherwise). Rounding |v| to e4m3 is
// (|v| + M) - M with M = 2^(e + 20), e = max(exponent of |v|, -6): the sum
// lies in a binade whose ulp is the e4m3 step 2^(e - 3), so the addition
// rounds to the grid, ties to even, and the subtraction is exact. After the
// clamp |v| <= 448 is on or inside the grid's range, so nothing saturates.
bool q8_block_avx2(float* x, size_t n, bool pow2) {
  float amax;
  if (!finite_block_amax_avx2(x, n, &amax)) return false;
  const float s = q8_scale(amax, pow2);
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  const __m256 vs = _mm256_set1_ps(s), hi = _mm256_set1_ps(448.0f), lo = _mm256_set1_ps(-448.0f);
  const __m256i min_exp = _mm256_set1_epi32(121);  // biased exponent of 2^-6
  for (size_t i = 0; i < n; i += 8) {
    const __m256 v = _mm256_min_ps(_mm256_max_ps(_mm256_div_ps(_mm256_loadu_ps(x + i), vs), lo), hi);
    const __m256i bits = _mm256_castps_si256(v);
    const __m256i a = _mm256_and_si256(bits, abs_mask);
    const __m256i e = _mm256_max_epi32(_mm256_srli_epi32(a, 23), min_exp);
    const __m256 M = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(20)), 23));
    const __m256 r = _mm256_sub_ps(_mm256_add_ps(_mm256_castsi256_ps(a), M), M);
    const __m256i sign = _mm256_andnot_si256(abs_mask, bits);
    _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_castsi256_ps(_mm256_or_si256(_mm256_castps_si256(r), sign)), vs));
  }
  return true;
}
#endif

}  // namespace

void q8_inplace_reference(float* x, size_t n, size_t block, bool pow2) {
  for (size_t b0 = 0; b0 < n; b0 += block) q8_block_reference(x + b0, std::min(n, b0 + block) - b0, pow2);
}

void q8_inplace(float* x, size_t n, size_t block, bool pow2) {
  for (size_t b0 = 0; b0 < n; b0 += block) {
    const size_t len = std::min(n, b0 + block) - b0;
#ifdef __AVX2__
    if (q8_block_avx2(x + b0, len, pow2)) continue;
#endif
    q8_block_reference(x + b0, len, pow2);
  }
}

namespace {

// One block as the definition reads: scale, clamp, round to e2m1, rescale.
void q4_block_reference(float* x, size_t n) {
  float amax = 0.f;
  for (size_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float s = fp4_pow2_scale(amax);
  for (size_t i = 0; i < n; ++i) {
    float v = std::clamp(x[i] / s, -6.0f, 6.0f);
    x[i] = e2m1_to_f32(f32_to_e2m1(v)) * s;
  }
}

#ifdef __AVX2__
// The same block 8 values at a time, for n a multiple of 8 and finite x
// (returns false, touching nothing, otherwise: NaN would need the clamp's
// and the rounding's NaN rules). The magnitude code counts the rounding
// midpoints below |v| with f32_to_e2m1's comparisons, and one 8-entry
// vpermps gives the magnitude; the sign is v's (a clamped -0 stays -0).
// Why: the indexer quantises every query and compressed key this way, a
// visible share of a prefill's time in the scalar loop.
bool q4_block_avx2(float* x, size_t n) {
  float amax;
  if (!finite_block_amax_avx2(x, n, &amax)) return false;
  const float s = fp4_pow2_scale(amax);
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  const __m256 vs = _mm256_set1_ps(s), hi = _mm256_set1_ps(6.0f), lo = _mm256_set1_ps(-6.0f);
  const __m256 magnitudes = _mm256_setr_ps(0.f, .5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f);
  for (size_t i = 0; i < n; i += 8) {
    const __m256 v = _mm256_min_ps(_mm256_max_ps(_mm256_div_ps(_mm256_loadu_ps(x + i), vs), lo), hi);
    const __m256 a = _mm256_castsi256_ps(_mm256_and_si256(_mm256_castps_si256(v), abs_mask));
    // Each true comparison is -1: the code is minus their sum.
    __m256i c = _mm256_castps_si256(_mm256_cmp_ps(a, _mm256_set1_ps(0.25f), _CMP_GT_OQ));
    c = _mm256_add_epi32(c, _mm256_castps_si256(_mm256_cmp_ps(a, _mm256_set1_ps(0.75f), _CMP_GE_OQ)));
    c = _mm256_add_epi32(c, _mm256_castps_si256(_mm256_cmp_ps(a, _mm256_set1_ps(1.25f), _CMP_GT_OQ)));
    c = _mm256_add_epi32(c, _mm256_castps_si256(_mm256_cmp_ps(a, _mm256_set1_ps(1.75f), _CMP_GE_OQ)));
    c = _mm256_add_epi32(c, _mm256_castps_si256(_mm256_cmp_ps(a, _mm256_set1_ps(2.5f), _CMP_GT_OQ)));
    c = _mm256_add_epi32(c, _mm256_castps_si256(_mm256_cmp_ps(a, _mm256_set1_ps(3.5f), _CMP_GE_OQ)));
    c = _mm256_add_epi32(c, _mm256_castps_si256(_mm256_cmp_ps(a, _mm256_set1_ps(5.0f), _CMP_GT_OQ)));
    const __m256 mag = _mm256_permutevar8x32_ps(magnitudes, _mm256_sub_epi32(_mm256_setzero_si256(), c));
    const __m256 q = _mm256_or_ps(mag, _mm256_andnot_ps(_mm256_castsi256_ps(abs_mask), v));
    _mm256_storeu_ps(x + i, _mm256_mul_ps(q, vs));
  }
  return true;
}
#endif

}  // namespace

void q4_inplace_reference(float* x, size_t n, size_t block) {
  for (size_t b0 = 0; b0 < n; b0 += block) q4_block_reference(x + b0, std::min(n, b0 + block) - b0);
}

void q4_inplace(float* x, size_t n, size_t block) {
  for (size_t b0 = 0; b0 < n; b0 += block) {
    const size_t len = std::min(n, b0 + block) - b0;
#ifdef __AVX2__
    if (q4_block_avx2(x + b0, len)) continue;
#endif
    q4_block_reference(x + b0, len);
  }
}

}  // namespace dsv4
