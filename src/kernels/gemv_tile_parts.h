// The parts of the AVX-512 GEMV tiles that gemv_avx512.cc (fp32 FMA
// chains) and gemv_avx512bf16.cc (vdpbf16ps) share: a tile's rows, their
// 64-byte lines transposed into lanes, the chains' sums and the FP4 block
// scales. Everything here has internal linkage (an anonymous namespace), so
// each of the two files, compiled with its own instruction set, keeps its
// own copy: no inline function of a wider instruction set can be the copy
// the linker keeps for the other.
#pragma once

#ifdef __AVX512F__
#include <immintrin.h>

#include <cstdint>

#include "core/prefetch.h"
#include "kernels/linear.h"

// GCC 12's AVX-512 intrinsics pass _mm512_undefined_*() as the unused merge
// operand, which -Wmaybe-uninitialized reports once inlined (GCC bug
// 105593), as in linear_avx512.cc; for the files that include this one too.
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

// The lanes of panel g (rows 16g .. 16g + 15 of a tile of n rows from a
// panel's start) that hold rows of the tile.
inline __mmask16 panel_keep(int64_t n, int g) {
  const int64_t left = n - g * kLanes;
  return left >= kLanes ? __mmask16(0xffff) : __mmask16((1u << left) - 1);
}

// G consecutive pair panels (Weight::pair_panels) from row o0, a multiple of
// 16, for a tile of n rows.
template <int G>
struct PairPanels {
  const uint32_t* panel[G];
  __mmask16 keep[G];
  PairPanels(const Weight& w, int64_t o0, int64_t n) {
    for (int g = 0; g < G; ++g) {
      panel[g] = w.pair_panels + (o0 / kLanes + g) * (w.in / 2) * kLanes;
      keep[g] = panel_keep(n, g);
    }
  }
};

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
        prefetch_l2(data[g][i] + 64 * (line + kAhead));
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

// ---- FP4 block scales -------------------------------------------------------
// A line of a row is 128 codes, 4 scale blocks of 32 (4 dwords each). The
// scale codes are transposed 16 blocks at a time (one 16-byte load per row)
// and kept in memory, where a block's vector is one load away.
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
  // The e8m0 codes of block col0 + c of group g, one per lane.
  __m512i codes(int g, int c) const {
    return _mm512_and_si512(_mm512_srli_epi32(_mm512_load_si512(dwords_[g][c / 4]), unsigned(8 * (c % 4))),
                            _mm512_set1_epi32(0xff));
  }
  // The scale values (as e8m0_to_f32) of block col0 + c of group g.
  __m512 value(int g, int c) const {
    const __m512i codes = this->codes(g, c);
    const __mmask16 zero = _mm512_cmpeq_epi32_mask(codes, _mm512_setzero_si512());  // code 0: 2^-127, subnormal
    return _mm512_castsi512_ps(
        _mm512_mask_mov_epi32(_mm512_slli_epi32(codes, 23), zero, _mm512_set1_epi32(0x00400000)));
  }

 private:
  alignas(64) uint32_t dwords_[2][4][kLanes];  // [group][dword][lane]
};

template <int G>
Rows<G> rows_of(const Weight& w, int64_t o0, int64_t stride, int64_t n) {
  switch (w.kind) {
    case Weight::Kind::kFP8: return Rows<G>(w, o0, stride, n, w.row_bytes(), (w.in + w.block - 1) / w.block, w.block);
    case Weight::Kind::kFP4: return Rows<G>(w, o0, stride, n, w.row_bytes(), w.in / 32, 1);
    default: return Rows<G>(w, o0, stride, n, w.row_bytes(), 0, 1);
  }
}

}  // namespace

}  // namespace dsv4
#endif
