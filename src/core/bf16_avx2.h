// bf16r (core/formats.h) on 8 lanes, for AVX2 code. Internal linkage, as in
// kernels/gemm_micro.h: a file built with AVX-512 flags that included it
// must not give the linker an AVX-512 copy for the others.
#pragma once

#ifdef __AVX2__
#include <immintrin.h>

namespace dsv4 {
namespace {

// f32_to_bf16 then back to fp32, per lane: add 0x7fff plus the lowest kept
// bit (ties to even), clear the low half; NaNs keep their top bits and turn
// quiet.
inline __m256 bf16r8(__m256 x) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000),
                hi = _mm256_set1_epi32(int32_t(0xffff0000u)), one = _mm256_set1_epi32(1),
                half = _mm256_set1_epi32(0x7fff), quiet = _mm256_set1_epi32(0x00400000);
  const __m256i u = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
  const __m256i rounded = _mm256_and_si256(_mm256_add_epi32(u, _mm256_add_epi32(half, lsb)), hi);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
  const __m256i nan_bits = _mm256_or_si256(_mm256_and_si256(u, hi), quiet);
  return _mm256_castsi256_ps(_mm256_blendv_epi8(rounded, nan_bits, nan));
}

}  // namespace
}  // namespace dsv4
#endif
