// bf16 on SIMD registers: bf16r (core/formats.h) on 8 lanes, and the two
// values of a dword that holds a pair of bf16 as fp32. Internal linkage, as
// in kernels/gemm_micro.h: a file built with AVX-512 flags that included it
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

// Dwords that each hold two bf16 values, per lane as fp32: the high half
// in place with the low half cleared, and the low half shifted up. Which
// half holds the earlier k is the layout's, and each caller says.
inline __m256 bf16_high(__m256i w) {
  return _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32(int32_t(0xffff0000u))));
}
inline __m256 bf16_low(__m256i w) { return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)); }

#ifdef __AVX512F__
inline __m512 bf16_high(__m512i w) {
  return _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32(int32_t(0xffff0000u))));
}
inline __m512 bf16_low(__m512i w) { return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)); }
#endif

}  // namespace
}  // namespace dsv4
#endif
