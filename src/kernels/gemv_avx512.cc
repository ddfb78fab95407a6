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

#ifdef __AVX512F__
#include <immintrin.h>

// GCC 12's AVX-512 intrinsics pass _mm512_undefined_*() as the unused merge
// operand, which -Wmaybe-uninitialized reports once inlined (GCC bug
// 105593), as in linear_avx512.cc.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace dsv4 {

namespace {

constexpr int kLanes = 16;

// Dword j of bytes [byte, byte + 16) of 16 rows: out[j] lane i = row i.
inline void transpose4(const uint8_t* const* rows, int64_t byte, __m512i out[4]) {
  __m512 z[4];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {  // z[i]: rows i, i + 4, i + 8, i + 12 in the four 128-bit lanes
    z[i] = _mm512_castps128_ps512(_mm_loadu_ps(reinterpret_cast<const float*>(rows[i] + byte)));
    z[i] = _mm512_insertf32x4(z[i], _mm_loadu_ps(reinterpret_cast<const float*>(rows[i + 4] + byte)), 1);
    z[i] = _mm512_insertf32x4(z[i], _mm_loadu_ps(reinterpret_cast<const float*>(rows[i + 8] + byte)), 2);
    z[i] = _mm512_insertf32x4(z[i], _mm_loadu_ps(reinterpret_cast<const float*>(rows[i + 12] + byte)), 3);
  }
  const __m512 t0 = _mm512_unpacklo_ps(z[0], z[1]), t1 = _mm512_unpackhi_ps(z[0], z[1]);
  const __m512 t2 = _mm512_unpacklo_ps(z[2], z[3]), t3 = _mm512_unpackhi_ps(z[2], z[3]);
  out[0] = _mm512_castps_si512(_mm512_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0)));
  out[1] = _mm512_castps_si512(_mm512_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2)));
  out[2] = _mm512_castps_si512(_mm512_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0)));
  out[3] = _mm512_castps_si512(_mm512_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2)));
}

// G groups of 16 weight rows o0, o0 + stride, ...: where each lane's row data
// and scale row start (lanes at or past n read row o0, a real one; their
// sums are never stored).
//
// Each row is its own stream, and the hardware prefetcher follows few of
// them (a tile of 64 rows streamed at about 70% of a plain read, one of 32
// at about 85%, on the Xeon of session 14), so a tile is 32 rows and each
// row's line kAhead lines on is asked for into L2 as a line is used. Asking
// for the next tile in address order instead was slower. The L2 prefetcher
// works within 4 KB pages and follows one stream per page best, so rows
// shorter than a page are taken `stride` apart (gemv.cc).
constexpr int64_t kAhead = 2;

template <int G>
struct Rows {
  const uint8_t* data[G][kLanes];
  const uint8_t* scale[G][kLanes];
  __mmask16 keep[G];

  Rows(const Weight& w, int64_t o0, int64_t stride, int64_t n, int64_t row_bytes, int64_t scale_row_bytes,
       int64_t rows_per_scale_row) {
    for (int g = 0; g < G; ++g) {
      keep[g] = 0;
      for (int i = 0; i < kLanes; ++i) {
        const int64_t lane = g * kLanes + i, row = lane < n ? o0 + stride * lane : o0;
        if (lane < n) keep[g] = __mmask16(keep[g] | (1u << i));
        data[g][i] = w.data + row * row_bytes;
        scale[g][i] = w.scale ? w.scale + (row / rows_per_scale_row) * scale_row_bytes : nullptr;
      }
    }
  }
  // Asks for line `line` + kAhead of every row, into L2.
  void prefetch(int64_t line, int64_t lines) const {
    if (line + kAhead >= lines) return;
#pragma GCC unroll 2
    for (int g = 0; g < G; ++g)
#pragma GCC unroll 16
      for (int i = 0; i < kLanes; ++i)
        _mm_prefetch(reinterpret_cast<const char*>(data[g][i]) + 64 * (line + kAhead), _MM_HINT_T1);
  }
  // The e8m0 codes of scale column `col` of group g, one per lane.
  __m512i scale_codes(int g, int64_t col) const {
    alignas(64) int32_t e[kLanes];
    for (int i = 0; i < kLanes; ++i) e[i] = scale[g][i][col];
    return _mm512_load_si512(e);
  }
};

// Per input row m and group g, one vector of 16 chains.
template <int G, int MR>
struct Sums {
  __m512 v[MR][G];
  Sums() {
#pragma GCC unroll 16
    for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) v[m][g] = _mm512_setzero_ps();
  }
  // Every chain continues with x[m][k] times its lane of val[g].
  inline void fma(const float* xk, int64_t ldx, const __m512 (&val)[G]) {
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      const __m512 xb = _mm512_set1_ps(xk[m * ldx]);
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) v[m][g] = _mm512_fmadd_ps(xb, val[g], v[m][g]);
    }
  }
  // Lane i of group g to y[m][stride · (16g + i)].
  void store(const __mmask16 (&keep)[G], float* y, int64_t ldy, int64_t stride) const {
    const __m512i at = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                          _mm512_set1_epi32(int32_t(stride)));
    for (int m = 0; m < MR; ++m)
      for (int g = 0; g < G; ++g) {
        float* yg = y + m * ldy + g * kLanes * stride;
        if (stride == 1)
          _mm512_mask_storeu_ps(yg, keep[g], v[m][g]);
        else
          _mm512_mask_i32scatter_ps(yg, keep[g], at, v[m][g], 4);
      }
  }
};

// ---- Lines: the tile's bytes turned into lanes --------------------------------
// One 64-byte line of each of a group's 16 rows is loaded whole and
// transposed in registers (16 × 16 dwords: dword d of every row in one
// vector), then kept in a small buffer that stays in L1. A line is fetched
// once: rows `in` bytes apart share L1 sets (all 32 of a tile at in =
// 4096), so a line read in 16-byte pieces can be evicted between them. With
// weights in cache the two ways ran at the same speed (session 14); this
// one needs a quarter of the loads.
template <int G>
struct Lines {
  alignas(64) uint32_t dword[G][kLanes][kLanes];  // [group][dword of the line][lane]
  __m512i load(int g, int d) const { return _mm512_load_si512(dword[g][d]); }
};

// 16 rows of 16 dwords to 16 vectors of a dword of every row: pairs of
// rows interleaved by dwords, then by qwords (each 128-bit lane then holds
// one dword of four rows), then a 4 × 4 transpose of 128-bit lanes.
__attribute__((always_inline)) inline void transpose16(__m512i (&r)[kLanes]) {
  __m512i a[kLanes];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    a[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {  // r[4j + c], 128-bit lane L: dword 4L + c of rows 4j .. 4j + 3
    r[4 * j] = _mm512_unpacklo_epi64(a[4 * j], a[4 * j + 2]);
    r[4 * j + 1] = _mm512_unpackhi_epi64(a[4 * j], a[4 * j + 2]);
    r[4 * j + 2] = _mm512_unpacklo_epi64(a[4 * j + 1], a[4 * j + 3]);
    r[4 * j + 3] = _mm512_unpackhi_epi64(a[4 * j + 1], a[4 * j + 3]);
  }
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    const __m512i t0 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x88), t1 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xdd);
    const __m512i t2 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x88),
                  t3 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xdd);
    a[c] = _mm512_shuffle_i32x4(t0, t2, 0x88);
    a[4 + c] = _mm512_shuffle_i32x4(t1, t3, 0x88);
    a[8 + c] = _mm512_shuffle_i32x4(t0, t2, 0xdd);
    a[12 + c] = _mm512_shuffle_i32x4(t1, t3, 0xdd);
  }
#pragma GCC unroll 16
  for (int d = 0; d < kLanes; ++d) r[d] = a[d];
}

// Loads bytes [byte, byte + 64) of every row (fewer at a row's end: `dwords`
// of them, the rest read as zero) into `out`; check(line) sees each row's
// line first (the FP8 NaN search).
template <int G, class Check>
inline void load_lines(const Rows<G>& r, int64_t byte, int dwords, Lines<G>& out, Check&& check) {
  const __mmask16 valid = __mmask16((1u << dwords) - 1);
#pragma GCC unroll 1
  for (int g = 0; g < G; ++g) {
    __m512i rows[kLanes];
#pragma GCC unroll 16
    for (int i = 0; i < kLanes; ++i) {
      rows[i] = dwords == kLanes ? _mm512_loadu_si512(r.data[g][i] + byte)
                                 : _mm512_maskz_loadu_epi32(valid, r.data[g][i] + byte);
      check(rows[i]);
    }
    transpose16(rows);
#pragma GCC unroll 16
    for (int d = 0; d < kLanes; ++d) _mm512_store_si512(out.dword[g][d], rows[d]);
  }
}

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
// power-of-two scale, the exact product of dequant_row. A line of a row is
// 128 codes, 4 scale blocks of 32 (4 dwords each). The scale codes are
// transposed 16 blocks at a time (one 16-byte load per row) and kept in
// memory, where a block's vector is one load away.
class Fp4Scales {
 public:
  template <int G>
  void load(const Rows<G>& r, int64_t col0, int64_t cols) {
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      if (col0 + 16 <= cols) {
        __m512i t[4];
        transpose4(r.scale[g], col0, t);
        for (int q = 0; q < 4; ++q) _mm512_store_si512(dwords_[g][q], t[q]);
      } else {  // a last partial group of blocks
        for (int i = 0; i < kLanes; ++i)
          for (int c = 0; c < 16; ++c)
            reinterpret_cast<uint8_t*>(&dwords_[g][c / 4][i])[c % 4] = col0 + c < cols ? r.scale[g][i][col0 + c] : 0;
      }
    }
  }
  // The scale values (as e8m0_to_f32) of block col0 + c of group g.
  __m512 value(int g, int c) const {
    const __m512i codes = _mm512_and_si512(
        _mm512_srli_epi32(_mm512_load_si512(dwords_[g][c / 4]), unsigned(8 * (c % 4))), _mm512_set1_epi32(0xff));
    const __mmask16 zero = _mm512_cmpeq_epi32_mask(codes, _mm512_setzero_si512());  // code 0: 2^-127, subnormal
    return _mm512_castsi512_ps(
        _mm512_mask_mov_epi32(_mm512_slli_epi32(codes, 23), zero, _mm512_set1_epi32(0x00400000)));
  }

 private:
  alignas(64) uint32_t dwords_[2][4][kLanes];  // [group][dword][lane]
};

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
  const __m512i hi = _mm512_set1_epi32(int32_t(0xffff0000u));
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
        even[g] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
        odd[g] = _mm512_castsi512_ps(_mm512_and_si512(v, hi));
      }
      acc.fma(x + k, ldx, even);
      acc.fma(x + k + 1, ldx, odd);
    }
  }
}

template <int G>
Rows<G> rows_of(const Weight& w, int64_t o0, int64_t stride, int64_t n) {
  switch (w.kind) {
    case Weight::Kind::kFP8: return Rows<G>(w, o0, stride, n, w.row_bytes(), (w.in + w.block - 1) / w.block, w.block);
    case Weight::Kind::kFP4: return Rows<G>(w, o0, stride, n, w.row_bytes(), w.in / 32, 1);
    default: return Rows<G>(w, o0, stride, n, w.row_bytes(), 0, 1);
  }
}

template <int G, int MR>
bool tile(const Weight& w, const float* x, int64_t ldx, int64_t o0, int64_t stride, int64_t n, float* y,
          int64_t ldy) {
  if (w.kind != Weight::Kind::kFP8 && w.kind != Weight::Kind::kFP4 && w.kind != Weight::Kind::kBF16) return false;
  const Rows<G> r = rows_of<G>(w, o0, stride, n);
  Sums<G, MR> acc;
  bool ok = true;
  if (w.kind == Weight::Kind::kFP8)
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

bool gemv_tile_avx512(const Weight& w, const float* x, int64_t M, int64_t ldx, int64_t o0, int64_t stride, int64_t n,
                      float* y, int64_t ldy) {
  static_assert(kGemvTileRows == 2 * kLanes, "a tile is at most two groups");
  if (n > kLanes) return tile_rows<2>(w, x, M, ldx, o0, stride, n, y, ldy);
  return tile_rows<1>(w, x, M, ldx, o0, stride, n, y, ldy);
}

}  // namespace dsv4
#endif
