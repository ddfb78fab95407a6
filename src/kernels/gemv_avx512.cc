// AVX-512 GEMV tiles: 16 weight rows per zmm, one lane per row, decoded
// from FP8 / FP4 / BF16 in registers and fed straight into each lane's FMA
// chain (ascending k, as gemm_reference). Compiled with -mavx512f
// (CMakeLists.txt); like linear_avx512.cc it calls no inline function or
// template of another header, whose out-of-line copy compiled here could be
// the one the linker keeps for the whole program.
//
// Why this shape: a tile of 2 groups of 16 rows gives even a single input
// row two independent FMA chains, as many as the decoding between two FMAs
// of a chain leaves room for, and the bytes of 16 rows are turned into
// lanes by a 16 × 16 dword transpose of whole 64-byte lines (a dword is 4
// steps of k in FP8, 8 in FP4, 2 in BF16).
#include "kernels/gemv_avx512.h"

#include "core/bf16_simd.h"
#include "kernels/gemv_tile_parts.h"

#ifdef __AVX512F__
#include <immintrin.h>

namespace dsv4 {

namespace {

// ---- FP8 -------------------------------------------------------------------
// An e4m3 code's exponent and mantissa moved into an fp32's bits 20-26 (sign
// to bit 31) read as a float are the value times 2^-120, subnormals
// included, so one multiply by 2^-120 · scale = 2^(s - 7) gives
// lut[code] · scale: the same exact product, rounded once. That factor is a
// normal float for scale codes s ≤ 134 (larger ones are refused). Code
// byte i of a dword moved to bits 24-31 and shifted right arithmetically by
// 4 leaves the sign in bits 27-31 and the magnitude in 20-26; one AND keeps
// bit 31 and bits 20-26. The NaN codes (low 7 bits all ones) are looked for
// with a carry: adding 1 to a byte's low 7 bits reaches bit 7 only for them.
// (An e4m3 subnormal code gives an fp32 subnormal, which Intel CPUs multiply
// through a slow microcode assist: exact, and rare in real weights.)
constexpr int kFp8MaxScaleCode = 134;

template <int G, int MR>
bool fp8_tile(const Weight& w, const Rows<G>& r, const float* x, int64_t ldx, Sums<G, MR>& acc) {
  const int64_t B = w.block, lines = (w.in + 63) / 64;
  const __m512i keep_bits = _mm512_set1_epi32(int32_t(0x87f00000u)), low7 = _mm512_set1_epi32(0x7f7f7f7f),
                one = _mm512_set1_epi32(0x01010101);
  __m512i nan = _mm512_setzero_si512(), max_scale = _mm512_setzero_si512();
  __m512 factor[G];
  Lines<G> buf;
  int64_t next_block = 0;  // where the next scale block starts (no division per dword)
  for (int64_t line = 0; line < lines; ++line) {
    r.prefetch(line, lines);
    const int64_t k0 = 64 * line;
    const int dwords = int(w.in - k0 >= 64 ? 16 : (w.in - k0) / 4);
    load_lines(r, k0, dwords, buf,
               [&](__m512i v) { nan = _mm512_or_si512(nan, _mm512_add_epi32(_mm512_and_si512(v, low7), one)); });
    for (int d = 0; d < dwords; ++d) {
      const int64_t k = k0 + 4 * d;
      if (k == next_block) {  // B is a multiple of 16: a block starts on a dword
        next_block += B;
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) {
          const __m512i s = r.scale_codes(g, k / B);
          max_scale = _mm512_max_epi32(max_scale, s);
          factor[g] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(s, _mm512_set1_epi32(120)), 23));
        }
      }
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        __m512 val[G];
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) {
          const __m512i v = buf.load(g, d);
          const __m512i top = i < 3 ? _mm512_slli_epi32(v, 24 - 8 * i) : v;
          const __m512i bits = _mm512_and_si512(_mm512_srai_epi32(top, 4), keep_bits);
          val[g] = _mm512_mul_ps(_mm512_castsi512_ps(bits), factor[g]);
        }
        acc.fma(x + k + i, ldx, val);
      }
    }
  }
  const bool any_nan = _mm512_test_epi32_mask(nan, _mm512_set1_epi32(int32_t(0x80808080u))) != 0;
  return !any_nan && _mm512_reduce_max_epi32(max_scale) <= kFp8MaxScaleCode;
}

// ---- FP4 -------------------------------------------------------------------
// A 16-entry vpermps table gives the signed e2m1 value of every lane's code
// at once (it reads the low 4 bits of the index); times the row's
// power-of-two scale (Fp4Scales), the exact product of dequant_row.
template <int G, int MR>
void fp4_tile(const Weight& w, const Rows<G>& r, const float* x, int64_t ldx, Sums<G, MR>& acc) {
  const __m512 table = _mm512_setr_ps(0.f, .5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f, -0.f, -.5f, -1.f, -1.5f, -2.f, -3.f,
                                      -4.f, -6.f);
  const int64_t cols = w.in / 32, row_bytes = w.row_bytes(), lines = (row_bytes + 63) / 64;
  Fp4Scales scales;
  Lines<G> buf;
  __m512 scale[G];
  for (int64_t line = 0; line < lines; ++line) {
    r.prefetch(line, lines);
    const int64_t byte0 = 64 * line;
    const int dwords = int(row_bytes - byte0 >= 64 ? 16 : (row_bytes - byte0) / 4);
    load_lines(r, byte0, dwords, buf, [](__m512i) {});
    for (int d = 0; d < dwords; ++d) {
      const int64_t k = 2 * byte0 + 8 * d;
      if (d % 4 == 0) {
        const int64_t col = k / 32;
        if (col % 16 == 0) scales.load(r, col, cols);
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) scale[g] = scales.value(g, int(col % 16));
      }
#pragma GCC unroll 8
      for (int n = 0; n < 8; ++n) {
        __m512 val[G];
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) {
          const __m512i v = buf.load(g, d);
          val[g] = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(v, unsigned(4 * n)), table), scale[g]);
        }
        acc.fma(x + k + n, ldx, val);
      }
    }
  }
}

// ---- BF16 ------------------------------------------------------------------
// A dword holds values k (low half) and k + 1 (high half): the first moved
// up, the second with the low half cleared.
template <int G, int MR>
void bf16_tile(const Weight& w, const Rows<G>& r, const float* x, int64_t ldx, Sums<G, MR>& acc) {
  const int64_t row_bytes = w.row_bytes(), lines = (row_bytes + 63) / 64;
  Lines<G> buf;
  for (int64_t line = 0; line < lines; ++line) {
    r.prefetch(line, lines);
    const int64_t byte0 = 64 * line;
    const int dwords = int(row_bytes - byte0 >= 64 ? 16 : (row_bytes - byte0) / 4);
    load_lines(r, byte0, dwords, buf, [](__m512i) {});
    for (int d = 0; d < dwords; ++d) {
      const int64_t k = byte0 / 2 + 2 * d;
      __m512 even[G], odd[G];
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) {
        const __m512i v = buf.load(g, d);
        even[g] = bf16_low(v);
        odd[g] = bf16_high(v);
      }
      acc.fma(x + k, ldx, even);
      acc.fma(x + k + 1, ldx, odd);
    }
  }
}

// ---- BF16 from pair panels ------------------------------------------------
// Weight::pair_panels hold dword j (k = 2j in the high half, 2j + 1 in the
// low) of 16 rows as one 64-byte line: a group costs one load per two steps
// of k and no transpose, and a tile reads G sequential streams.
template <int G, int MR>
void bf16_panel_tile(const Weight& w, int64_t o0, const float* x, int64_t ldx, Sums<G, MR>& acc) {
  const int64_t kp = w.in / 2;
  const uint32_t* panel[G];
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) panel[g] = w.pair_panels + (o0 / kLanes + g) * kp * kLanes;
  for (int64_t j = 0; j < kp; ++j) {
    __m512 even[G], odd[G];
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      const __m512i v = _mm512_load_si512(panel[g] + j * kLanes);
      even[g] = bf16_high(v);
      odd[g] = bf16_low(v);
    }
    acc.fma(x + 2 * j, ldx, even);
    acc.fma(x + 2 * j + 1, ldx, odd);
  }
}

// Past kGemvTileInputRows input rows (16 streams decoding together), two
// sets of rows take turns over blocks of kPairBlock steps of k (16 KB of
// two panels), as gemv_avx512bf16.cc pair_tile does on vdpbf16ps: the
// second set reads each block from L1 and meanwhile asks for the next,
// instead of a second pass over the whole tile from L2 while the memory
// idles. Each chain still runs in ascending k.
constexpr int64_t kPairBlock = 128;

template <int G, int MR, bool kPrefetchNext>
void bf16_panel_steps(const uint32_t* const (&panel)[G], const float* x, int64_t ldx, int64_t j0, int64_t j1,
                      int64_t kp, Sums<G, MR>& sums) {
  Sums<G, MR> acc = sums;
  for (int64_t j = j0; j < j1; ++j) {
    __m512 even[G], odd[G];
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      if (kPrefetchNext && j + kPairBlock < kp)
        prefetch_l1(panel[g] + (j + kPairBlock) * kLanes);
      const __m512i v = _mm512_load_si512(panel[g] + j * kLanes);
      even[g] = bf16_high(v);
      odd[g] = bf16_low(v);
    }
    acc.fma(x + 2 * j, ldx, even);
    acc.fma(x + 2 * j + 1, ldx, odd);
  }
  sums = acc;
}

// Rows o0 .. o0 + n - 1 (G panels) for kGemvTileInputRows + MR input rows.
template <int G, int MR>
void bf16_panel_two_sets(const Weight& w, const float* x, int64_t ldx, int64_t o0, int64_t n, float* y,
                         int64_t ldy) {
  const int64_t kp = w.in / 2;
  const PairPanels<G> p(w, o0, n);
  Sums<G, kGemvTileInputRows> first;
  Sums<G, MR> second;
  for (int64_t j0 = 0; j0 < kp; j0 += kPairBlock) {
    const int64_t j1 = j0 + kPairBlock < kp ? j0 + kPairBlock : kp;
    bf16_panel_steps<G, kGemvTileInputRows, false>(p.panel, x, ldx, j0, j1, kp, first);
    bf16_panel_steps<G, MR, true>(p.panel, x + kGemvTileInputRows * ldx, ldx, j0, j1, kp, second);
  }
  first.store(p.keep, y, ldy, 1);
  second.store(p.keep, y + kGemvTileInputRows * ldy, ldy, 1);
}

template <int G>
void bf16_panel_two_sets_rows(const Weight& w, const float* x, int64_t M, int64_t ldx, int64_t o0, int64_t n,
                              float* y, int64_t ldy) {
  static_assert(kGemvTileInputRows == 8, "one case per row count");
  switch (M - kGemvTileInputRows) {
    case 1: return bf16_panel_two_sets<G, 1>(w, x, ldx, o0, n, y, ldy);
    case 2: return bf16_panel_two_sets<G, 2>(w, x, ldx, o0, n, y, ldy);
    case 3: return bf16_panel_two_sets<G, 3>(w, x, ldx, o0, n, y, ldy);
    case 4: return bf16_panel_two_sets<G, 4>(w, x, ldx, o0, n, y, ldy);
    case 5: return bf16_panel_two_sets<G, 5>(w, x, ldx, o0, n, y, ldy);
    case 6: return bf16_panel_two_sets<G, 6>(w, x, ldx, o0, n, y, ldy);
    case 7: return bf16_panel_two_sets<G, 7>(w, x, ldx, o0, n, y, ldy);
    default: return bf16_panel_two_sets<G, 8>(w, x, ldx, o0, n, y, ldy);
  }
}

template <int G, int MR>
bool tile(const Weight& w, const float* x, int64_t ldx, int64_t o0, int64_t stride, int64_t n, float* y,
          int64_t ldy) {
  if (w.kind != Weight::Kind::kFP8 && w.kind != Weight::Kind::kFP4 && w.kind != Weight::Kind::kBF16) return false;
  const Rows<G> r = rows_of<G>(w, o0, stride, n);
  Sums<G, MR> acc;
  bool ok = true;
  if (w.kind == Weight::Kind::kBF16 && gemv_reads_pair_panels(w, o0, stride))
    bf16_panel_tile(w, o0, x, ldx, acc);
  else if (w.kind == Weight::Kind::kFP8)
    ok = fp8_tile(w, r, x, ldx, acc);
  else if (w.kind == Weight::Kind::kFP4)
    fp4_tile(w, r, x, ldx, acc);
  else
    bf16_tile(w, r, x, ldx, acc);
  acc.store(r.keep, y, ldy, stride);
  return ok;
}

template <int G>
bool tile_rows(const Weight& w, const float* x, int64_t M, int64_t ldx, int64_t o0, int64_t stride, int64_t n,
               float* y, int64_t ldy) {
  static_assert(kGemvTileInputRows == 8, "one case per row count");
  switch (M) {
    case 1: return tile<G, 1>(w, x, ldx, o0, stride, n, y, ldy);
    case 2: return tile<G, 2>(w, x, ldx, o0, stride, n, y, ldy);
    case 3: return tile<G, 3>(w, x, ldx, o0, stride, n, y, ldy);
    case 4: return tile<G, 4>(w, x, ldx, o0, stride, n, y, ldy);
    case 5: return tile<G, 5>(w, x, ldx, o0, stride, n, y, ldy);
    case 6: return tile<G, 6>(w, x, ldx, o0, stride, n, y, ldy);
    case 7: return tile<G, 7>(w, x, ldx, o0, stride, n, y, ldy);
    default: return tile<G, 8>(w, x, ldx, o0, stride, n, y, ldy);
  }
}

}  // namespace

void gemv_pair_panel_tile_avx512(const Weight& w, const float* x, int64_t M, int64_t ldx, int64_t o0, int64_t n,
                                 float* y, int64_t ldy) {
  static_assert(kGemvPanelInputRows == 2 * kGemvTileInputRows, "two sets of rows");
  if (n > kLanes) return bf16_panel_two_sets_rows<2>(w, x, M, ldx, o0, n, y, ldy);
  bf16_panel_two_sets_rows<1>(w, x, M, ldx, o0, n, y, ldy);
}

bool gemv_tile_avx512(const Weight& w, const float* x, int64_t M, int64_t ldx, int64_t o0, int64_t stride, int64_t n,
                      float* y, int64_t ldy) {
  static_assert(kGemvTileRows == 2 * kLanes, "a tile is at most two groups");
  if (n > kLanes) return tile_rows<2>(w, x, M, ldx, o0, stride, n, y, ldy);
  return tile_rows<1>(w, x, M, ldx, o0, stride, n, y, ldy);
}

}  // namespace dsv4
#endif
