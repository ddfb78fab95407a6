// The AVX512-BF16 gemm micro-kernel and the packing it reads. This file
// alone is compiled with -mavx512f -mavx512bf16 (CMakeLists.txt); gemm.cc
// calls it only where kernel_isa() is Isa::kAvx512Bf16. Like
// gemm_avx512.cc it calls no inline function of another header (an
// out-of-line copy compiled here could be the one the linker keeps).
//
// Layout: a "pair" dword holds two bf16 values of consecutive k, k in the
// high half and k + 1 in the low half. vdpbf16ps does the high half's FMA
// first (core/cpu.h), so each lane continues its chain in ascending k:
// c = fma(a[k+1], b[k+1], fma(a[k], b[k], c)), the fp32 kernels' chain.
#include "kernels/gemm_micro.h"

#ifdef __AVX512BF16__
#include <immintrin.h>

// GCC 12's AVX-512 intrinsics pass _mm512_undefined_*() (a self-initialised
// variable) as the unused merge operand, which -Wmaybe-uninitialized reports
// (or -Wuninitialized) once they are inlined here (GCC bug 105593, fixed in
// GCC 13).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace dsv4 {

namespace {

// C[R][NP·16] continues its chains over kp more pairs of k; A: R rows of
// pairs (row stride lda dwords); P: NP panels of [kp][16] pairs, pstride
// dwords apart. Two accumulators per row, 24 of 32 registers at R = 12.
template <int R, int NP>
inline void micro_tile_bf16(const uint32_t* A, int64_t lda, const uint32_t* P, int64_t pstride, int64_t kp, float* C,
                            int64_t ldc, bool first) {
  __m512 c[R][NP];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int p = 0; p < NP; ++p) c[r][p] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(C + r * ldc + p * kGemmNR);
  for (int64_t k = 0; k < kp; ++k) {
    __m512bh b[NP];
#pragma GCC unroll 4
    for (int p = 0; p < NP; ++p) b[p] = (__m512bh)_mm512_loadu_si512(P + p * pstride + k * kGemmNR);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32(int(A[r * lda + k]));
#pragma GCC unroll 4
      for (int p = 0; p < NP; ++p) c[r][p] = _mm512_dpbf16_ps(c[r][p], a, b[p]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int p = 0; p < NP; ++p) _mm512_storeu_ps(C + r * ldc + p * kGemmNR, c[r][p]);
}

template <int R = kGemmMRAvx512>
inline void micro_rows_bf16(int rows, int panels, const uint32_t* A, int64_t lda, const uint32_t* P, int64_t pstride,
                            int64_t kp, float* C, int64_t ldc, bool first) {
  if constexpr (R > 1) {
    if (rows < R) return micro_rows_bf16<R - 1>(rows, panels, A, lda, P, pstride, kp, C, ldc, first);
  }
  if (panels == 2) return micro_tile_bf16<R, 2>(A, lda, P, pstride, kp, C, ldc, first);
  micro_tile_bf16<R, 1>(A, lda, P, pstride, kp, C, ldc, first);
}

// Per lane: 0 where the fp32 value is not exactly a bf16 value usable by
// vdpbf16ps (low half non-zero, infinite, NaN or subnormal), and the
// smallest biased exponent of the non-zero values so far.
struct PairCheck {
  __m512i bad = _mm512_setzero_si512();
  __m512i min_exp = _mm512_set1_epi32(255);
  void add(__m512i v) {
    const __m512i mag = _mm512_and_si512(v, _mm512_set1_epi32(0x7fffffff));
    const __m512i e = _mm512_srli_epi32(mag, 23);
    const __mmask16 nonzero = _mm512_test_epi32_mask(mag, mag);
    // Inexact, or a non-zero value with exponent 0 (subnormal) or 255.
    const __mmask16 low = _mm512_test_epi32_mask(v, _mm512_set1_epi32(0xffff));
    const __mmask16 edge = _mm512_mask_cmpeq_epi32_mask(nonzero, e, _mm512_setzero_si512()) |
                           _mm512_cmpeq_epi32_mask(e, _mm512_set1_epi32(255));
    bad = _mm512_mask_mov_epi32(bad, __mmask16(low | edge), _mm512_set1_epi32(1));
    min_exp = _mm512_mask_min_epu32(min_exp, nonzero, min_exp, e);
  }
  bool exact(int* min_exponent) const {
    *min_exponent = _mm512_reduce_min_epu32(min_exp);
    return _mm512_test_epi32_mask(bad, bad) == 0;
  }
};

// The pair dword of x (k) and y (k + 1), 16 lanes.
inline __m512i pair16(__m512i x, __m512i y) {
  return _mm512_or_si512(_mm512_and_si512(x, _mm512_set1_epi32(int(0xffff0000u))), _mm512_srli_epi32(y, 16));
}

// The 16 pairs of 32 consecutive values of one row (lo: values 0-15, hi:
// 16-31): the two lanes of each pair come apart into even (k) and odd
// (k + 1) values by one two-source permute each.
inline __m512i pairs_of_32(__m512i lo, __m512i hi) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  return pair16(_mm512_permutex2var_epi32(lo, even, hi), _mm512_permutex2var_epi32(lo, odd, hi));
}

}  // namespace

void gemm_micro_rows_avx512bf16(int rows, int panels, const uint32_t* A, int64_t lda, const uint32_t* P,
                                int64_t pstride, int64_t kp, float* C, int64_t ldc, bool first) {
  micro_rows_bf16(rows, panels, A, lda, P, pstride, kp, C, ldc, first);
}

bool gemm_pack_panel_bf16(const float* panel, int64_t K, uint32_t* out, int* min_exponent) {
  PairCheck check;
  const __m512i zero = _mm512_setzero_si512();
  for (int64_t k = 0; k < K; k += 2) {
    const __m512i x = _mm512_loadu_si512(panel + k * kGemmNR);
    const __m512i y = k + 1 < K ? _mm512_loadu_si512(panel + (k + 1) * kGemmNR) : zero;
    check.add(x);
    check.add(y);
    _mm512_storeu_si512(out + (k / 2) * kGemmNR, pair16(x, y));
  }
  return check.exact(min_exponent);
}

bool gemm_pack_rows_bf16(const float* A, int64_t lda, int64_t rows, int64_t K, uint32_t* out, int64_t ldo,
                         int* min_exponent) {
  const int64_t kp = (K + 1) / 2;
  PairCheck check;
  for (int64_t m = 0; m < rows; ++m) {  // sixteen pairs at a time
    const float* a = A + m * lda;
    uint32_t* o = out + m * ldo;
    int64_t j = 0;
    for (; 2 * j + 32 <= K; j += 16) {
      const __m512i lo = _mm512_loadu_si512(a + 2 * j), hi = _mm512_loadu_si512(a + 2 * j + 16);
      check.add(lo);
      check.add(hi);
      _mm512_storeu_si512(o + j, pairs_of_32(lo, hi));
    }
    for (; j < kp; ++j) {  // the tail, one pair at a time through a masked lane
      alignas(64) uint32_t x[16] = {}, y[16] = {};
      __builtin_memcpy(&x[0], a + 2 * j, 4);
      if (2 * j + 1 < K) __builtin_memcpy(&y[0], a + 2 * j + 1, 4);
      const __m512i vx = _mm512_load_si512(x), vy = _mm512_load_si512(y);
      check.add(vx);
      check.add(vy);
      alignas(64) uint32_t p[16];
      _mm512_store_si512(p, pair16(vx, vy));
      o[j] = p[0];
    }
  }
  return check.exact(min_exponent);
}

bool gemm_pack_gathered_rows_bf16(const float* const* rows, int64_t K, uint32_t* out, int* min_exponent) {
  PairCheck check;
  // 32 values (16 pairs) of every row at a time: row j's pairs as one
  // vector, then a 16 × 16 dword transpose puts row j in lane j.
  for (int64_t k = 0; k < K; k += 32) {
    const int64_t left = K - k;
    const __mmask16 m_lo = left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1);
    const __mmask16 m_hi = left >= 32   ? __mmask16(0xffff)
                           : left <= 16 ? __mmask16(0)
                                        : __mmask16((1u << (left - 16)) - 1);
    __m512i t[16];
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) {
      if (!rows[j]) {
        t[j] = _mm512_setzero_si512();
        continue;
      }
      // Masked loads: nothing past the row's K values is read.
      const __m512i lo = _mm512_maskz_loadu_epi32(m_lo, rows[j] + k);
      const __m512i hi = _mm512_maskz_loadu_epi32(m_hi, rows[j] + k + 16);
      check.add(lo);
      check.add(hi);
      t[j] = pairs_of_32(lo, hi);
    }
    // Transpose: after it, t'[i] lane j = t[j] lane i.
    __m512i u[16];
#pragma GCC unroll 8
    for (int j = 0; j < 16; j += 2) {
      u[j] = _mm512_unpacklo_epi32(t[j], t[j + 1]);
      u[j + 1] = _mm512_unpackhi_epi32(t[j], t[j + 1]);
    }
#pragma GCC unroll 4
    for (int j = 0; j < 16; j += 4) {
      t[j] = _mm512_unpacklo_epi64(u[j], u[j + 2]);
      t[j + 1] = _mm512_unpackhi_epi64(u[j], u[j + 2]);
      t[j + 2] = _mm512_unpacklo_epi64(u[j + 1], u[j + 3]);
      t[j + 3] = _mm512_unpackhi_epi64(u[j + 1], u[j + 3]);
    }
    // t[4q + r]: 128-bit lane l holds pair 4l + r of rows 4q .. 4q + 3;
    // gathering the 128-bit lanes gives u[i]: pair i of every row.
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      const __m512i a = _mm512_shuffle_i32x4(t[r], t[4 + r], 0x88), b = _mm512_shuffle_i32x4(t[r], t[4 + r], 0xdd);
      const __m512i c = _mm512_shuffle_i32x4(t[8 + r], t[12 + r], 0x88),
                    d = _mm512_shuffle_i32x4(t[8 + r], t[12 + r], 0xdd);
      u[r] = _mm512_shuffle_i32x4(a, c, 0x88);
      u[4 + r] = _mm512_shuffle_i32x4(b, d, 0x88);
      u[8 + r] = _mm512_shuffle_i32x4(a, c, 0xdd);
      u[12 + r] = _mm512_shuffle_i32x4(b, d, 0xdd);
    }
    const int64_t pairs = left >= 32 ? 16 : (left + 1) / 2;
    for (int i = 0; i < pairs; ++i) _mm512_storeu_si512(out + (k / 2 + i) * kGemmNR, u[i]);
  }
  return check.exact(min_exponent);
}

}  // namespace dsv4
#endif
