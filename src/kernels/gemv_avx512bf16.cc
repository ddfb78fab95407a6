// The GEMV tiles on vdpbf16ps, for Isa::kAvx512Bf16: a BF16 weight's pair
// panels (Weight::pair_panels, k in the high half of each dword) and FP4
// weights decoded into pairs in registers, against input rows given as
// pairs the same way. One instruction per 16 rows and two steps of k
// continues each lane's chain as two FMAs in ascending k would
// (core/cpu.h), where no value can be flushed (kDotMinBiasedExponentSum,
// kernels/gemm.h): gemv (gemv.cc) checks the inputs and the panels, the FP4
// tile its scales. Compiled with -mavx512f -mavx512bf16 -mavx512bw
// -mavx512vbmi (CMakeLists.txt); like gemv_avx512.cc it calls no inline
// function or template of another header.
#include "kernels/gemv_avx512.h"

#include <algorithm>
#include <type_traits>

#include "core/bf16_simd.h"
#include "kernels/gemm.h"
#include "kernels/gemv_tile_parts.h"

#ifdef __AVX512BF16__
#include <immintrin.h>

namespace dsv4 {

namespace {

// Steps j0 .. j1 - 1 of k of G pair panels for MR input rows, continuing
// the chains in sums. kPrefetchNext: also asks for the lines of the next
// kPairBlock steps into L1.
constexpr int64_t kPairBlock = 128;

template <int G, int MR, bool kPrefetchNext>
void pair_steps(const uint32_t* const (&panel)[G], const uint32_t* xp, int64_t ldxp, int64_t j0, int64_t j1,
                int64_t kp, Sums<G, MR>& sums) {
  Sums<G, MR> acc = sums;
  for (int64_t j = j0; j < j1; ++j) {
    __m512bh b[G];
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      if (kPrefetchNext && j + kPairBlock < kp)
        prefetch_l1(panel[g] + (j + kPairBlock) * kLanes);
      b[g] = (__m512bh)_mm512_load_si512(panel[g] + j * kLanes);
    }
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32(int(xp[m * ldxp + j]));
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) acc.v[m][g] = _mm512_dpbf16_ps(acc.v[m][g], a, b[g]);
    }
  }
  sums = acc;
}

// G panels (16 rows each) from row o0: MR input rows, or 8 + MR where kTwoSets.
// Past 8 rows the registers hold one set of 8 rows' chains at a time, and
// the two sets take turns over blocks of kPairBlock steps of k (16 KB for two
// panels), so that the second set reads each block again from L1, not the
// whole tile again from L2 after the first; while it does, it asks for the
// next block, which the memory would otherwise not fetch until the first
// set's next turn. Each chain still runs in ascending k. A 32768 × 4096
// BF16 matrix at 16 rows, two Zen 5 threads, alternated in one process:
// 26.0-27.6 GB/s as two passes of 8 rows, 34.3-35.8 in blocks of 128 steps
// (64: the same; 256, which with the next block no longer fits L1: 31.6-32.4).
template <int G, int MR, bool kTwoSets>
void pair_tile(const Weight& w, const uint32_t* xp, int64_t ldxp, int64_t o0, int64_t n, float* y, int64_t ldy) {
  const int64_t kp = w.in / 2;
  const PairPanels<G> p(w, o0, n);
  if constexpr (kTwoSets) {
    Sums<G, kGemvTileInputRows> first;
    Sums<G, MR> second;
    for (int64_t j0 = 0; j0 < kp; j0 += kPairBlock) {
      const int64_t j1 = std::min(kp, j0 + kPairBlock);
      pair_steps<G, kGemvTileInputRows, false>(p.panel, xp, ldxp, j0, j1, kp, first);
      pair_steps<G, MR, true>(p.panel, xp + kGemvTileInputRows * ldxp, ldxp, j0, j1, kp, second);
    }
    first.store(p.keep, y, ldy, 1);
    second.store(p.keep, y + kGemvTileInputRows * ldy, ldy, 1);
  } else {
    Sums<G, MR> acc;
    pair_steps<G, MR, false>(p.panel, xp, ldxp, 0, kp, kp, acc);
    acc.store(p.keep, y, ldy, 1);
  }
}

// pair_tile<G, M, kTwoSets> for a run-time M in [1, MR].
template <int G, int MR, bool kTwoSets>
void pair_tile_rows(const Weight& w, const uint32_t* xp, int64_t M, int64_t ldxp, int64_t o0, int64_t n, float* y,
                    int64_t ldy) {
  if constexpr (MR > 1) {
    if (M < MR) return pair_tile_rows<G, MR - 1, kTwoSets>(w, xp, M, ldxp, o0, n, y, ldy);
  }
  pair_tile<G, MR, kTwoSets>(w, xp, ldxp, o0, n, y, ldy);
}

// Up to 2 · kGemvTileInputRows input rows.
template <int G>
void pair_tile_any_rows(const Weight& w, const uint32_t* xp, int64_t M, int64_t ldxp, int64_t o0, int64_t n,
                        float* y, int64_t ldy) {
  if (M > kGemvTileInputRows)
    return pair_tile_rows<G, kGemvTileInputRows, true>(w, xp, M - kGemvTileInputRows, ldxp, o0, n, y, ldy);
  pair_tile_rows<G, kGemvTileInputRows, false>(w, xp, M, ldxp, o0, n, y, ldy);
}

// ---- FP4 -------------------------------------------------------------------
// Byte j of a row holds codes 2j (low nibble) and 2j + 1 (high nibble); the
// lane's pair wants bf16(w[2j]) in its high word and bf16(w[2j + 1]) in its
// low word. One vpmultishiftqb builds the 32 word indices of a pair vector
// (byte p of each lane's dword of transposed codes), one vpermw reads a
// table of e2m1 × 2^125 as bf16 (both zeros +0; entries 16-31 repeat 0-15,
// since vpermw reads 5 bits of an index and the 5th is the next code's),
// and one unsigned saturating subtract of (252 − s) << 7 from both words
// applies the block's scale 2^(s − 127): a non-zero value's exponent stays
// in 1-254 for s in 2-252, a zero saturates to zero. (The chains start at
// +0 and never hold −0, so the sign of a zero product changes nothing.)
// Exact where every product is a normal number or zero: the smallest
// non-zero weight is 0.5 · 2^(s − 127), exponent s − 1 biased.
struct Fp4PairDecoder {
  __m512i table, index_of[4];
  Fp4PairDecoder() {
    alignas(64) static constexpr uint16_t kValues[32] = {
        0x0000, 0x7d80, 0x7e00, 0x7e40, 0x7e80, 0x7ec0, 0x7f00, 0x7f40,
        0x0000, 0xfd80, 0xfe00, 0xfe40, 0xfe80, 0xfec0, 0xff00, 0xff40,
        0x0000, 0x7d80, 0x7e00, 0x7e40, 0x7e80, 0x7ec0, 0x7f00, 0x7f40,
        0x0000, 0xfd80, 0xfe00, 0xfe40, 0xfe80, 0xfec0, 0xff00, 0xff40};
    table = _mm512_load_si512(kValues);
    // Control bytes: the low word's low byte from bit 8p + 4 of the lane
    // (code 2j + 1), the high word's from bit 8p (code 2j); the lane's
    // dword is the low or high half of its qword.
    for (int p = 0; p < 4; ++p)
      index_of[p] = _mm512_set1_epi64(int64_t(uint64_t(8 * p + 4) | uint64_t(8 * p) << 16 |
                                              uint64_t(32 + 8 * p + 4) << 32 | uint64_t(32 + 8 * p) << 48));
  }
  // The scale subtrahend of a block's codes s, in both words of each lane.
  static __m512i subtrahend(__m512i s) {
    const __m512i t = _mm512_slli_epi32(_mm512_sub_epi32(_mm512_set1_epi32(252), s), 7);
    return _mm512_or_si512(t, _mm512_slli_epi32(t, 16));
  }
  // Pair p of every lane's dword of codes, scaled.
  __m512bh pairs(__m512i codes, int p, __m512i sub) const {
    const __m512i index = _mm512_multishift_epi64_epi8(index_of[p], codes);
    return (__m512bh)_mm512_subs_epu16(_mm512_permutexvar_epi16(index, table), sub);
  }
};

template <int G, int MR>
bool fp4_pair_tile(const Weight& w, const Rows<G>& r, const uint32_t* xp, int64_t ldxp, int x_min_exponent,
                   Sums<G, MR>& acc) {
  const Fp4PairDecoder dec;
  const int64_t cols = w.in / 32, row_bytes = w.row_bytes(), lines = (row_bytes + 63) / 64;
  Fp4Scales scales;
  Lines<G> buf;
  __m512i sub[G];
  __m512i lowest = _mm512_set1_epi32(255), highest = _mm512_setzero_si512();
  for (int64_t line = 0; line < lines; ++line) {
    r.prefetch(line, lines);
    const int64_t byte0 = 64 * line;
    const int dwords = int(row_bytes - byte0 >= 64 ? 16 : (row_bytes - byte0) / 4);
    load_lines(r, byte0, dwords, buf, [](__m512i) {});
    for (int d = 0; d < dwords; ++d) {
      const int64_t j0 = byte0 + 4 * d;  // the pair (byte) index of the dword's first byte
      if (d % 4 == 0) {
        const int64_t col = j0 / 16;
        if (col % 16 == 0) scales.load(r, col, cols);
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) {
          const __m512i s = scales.codes(g, int(col % 16));
          lowest = _mm512_min_epu32(lowest, s);
          highest = _mm512_max_epu32(highest, s);
          sub[g] = Fp4PairDecoder::subtrahend(s);
        }
      }
#pragma GCC unroll 4
      for (int p = 0; p < 4; ++p) {
        __m512bh b[G];
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) b[g] = dec.pairs(buf.load(g, d), p, sub[g]);
#pragma GCC unroll 8
        for (int m = 0; m < MR; ++m) {
          const __m512bh a = (__m512bh)_mm512_set1_epi32(int(xp[m * ldxp + j0 + p]));
#pragma GCC unroll 4
          for (int g = 0; g < G; ++g) acc.v[m][g] = _mm512_dpbf16_ps(acc.v[m][g], a, b[g]);
        }
      }
    }
  }
  const int lo = int(_mm512_reduce_min_epu32(lowest)), hi = int(_mm512_reduce_max_epu32(highest));
  return lo >= 2 && hi <= 252 && x_min_exponent + lo - 1 >= kDotMinBiasedExponentSum;
}

template <int G, int MR>
bool fp4_tile_on_pairs(const Weight& w, const uint32_t* xp, int64_t ldxp, int x_min_exponent, int64_t o0,
                       int64_t stride, int64_t n, float* y, int64_t ldy) {
  const Rows<G> r = rows_of<G>(w, o0, stride, n);
  Sums<G, MR> acc;
  if (!fp4_pair_tile(w, r, xp, ldxp, x_min_exponent, acc)) return false;
  acc.store(r.keep, y, ldy, stride);
  return true;
}

template <int G, int MR>
bool fp4_tile_rows(const Weight& w, const uint32_t* xp, int64_t M, int64_t ldxp, int x_min_exponent, int64_t o0,
                   int64_t stride, int64_t n, float* y, int64_t ldy) {
  if constexpr (MR > 1) {
    if (M < MR) return fp4_tile_rows<G, MR - 1>(w, xp, M, ldxp, x_min_exponent, o0, stride, n, y, ldy);
  }
  return fp4_tile_on_pairs<G, MR>(w, xp, ldxp, x_min_exponent, o0, stride, n, y, ldy);
}

// ---- FP4 panels (Weight::fp4_panels) ------------------------------------------
// A step of a panel is one aligned 64-byte load, lane i the codes of 8 k of
// row i with the even k's in the high word: word shifts by 0, 4, 8 and 12
// bring pair p's two codes to the bottom of their words, where vpermw reads
// them (bit 4 is the next code's, which the doubled table ignores). No
// transpose and no vpmultishiftqb, which held the row-layout tile above to
// ~11.7 GB/s on one Zen 4 thread against ~20 here (session 21). A panel is
// one sequential stream, so the hardware prefetcher needs no row spans;
// the lines kPanelAhead blocks on are asked for into L1 as a block starts,
// and those kPanelFarAhead blocks (2 KB) on into L2: a thread streaming an
// expert's panels alone (moe.cc runs whole experts per thread) keeps more
// of its misses in flight than the hardware prefetcher does. 16 streams
// decoding together on Zen 4, experts' stage: 199-218 -> 157-168 ms a step
// (session 23, alternated runs).
constexpr int64_t kPanelAhead = 2, kPanelFarAhead = 8;

template <int G, int MR>
bool fp4_panel_tile(const Weight& w, const uint32_t* xp, int64_t ldxp, int x_min_exponent, int64_t o0, int64_t n,
                    float* y, int64_t ldy) {
  const Fp4PairDecoder dec;
  const int64_t steps = w.in / 8, blocks = w.in / 32;
  const uint32_t* data[G];
  const uint8_t* scale[G];
  __mmask16 keep[G];
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g) {
    const int64_t panel = o0 / kLanes + g;
    data[g] = w.fp4_panels + panel * steps * kLanes;
    scale[g] = w.fp4_panel_scales + panel * blocks * kLanes;
    keep[g] = panel_keep(n, g);
  }
  Sums<G, MR> acc;
  __m512i lowest = _mm512_set1_epi32(255), highest = _mm512_setzero_si512();
  for (int64_t b = 0; b < blocks; ++b) {
    __m512i sub[G];
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
      if (b + kPanelAhead < blocks)
#pragma GCC unroll 4
        for (int q = 0; q < 4; ++q)
          prefetch_l1(data[g] + (4 * (b + kPanelAhead) + q) * kLanes);
      if (b + kPanelFarAhead < blocks)
#pragma GCC unroll 4
        for (int q = 0; q < 4; ++q)
          prefetch_l2(data[g] + (4 * (b + kPanelFarAhead) + q) * kLanes);
      const __m512i s =
          _mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(scale[g] + b * kLanes)));
      lowest = _mm512_mask_min_epu32(lowest, keep[g], lowest, s);
      highest = _mm512_mask_max_epu32(highest, keep[g], highest, s);
      sub[g] = Fp4PairDecoder::subtrahend(s);
    }
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q) {
      const int64_t step = 4 * b + q;
      __m512i codes[G];
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g) codes[g] = _mm512_load_si512(data[g] + step * kLanes);
#pragma GCC unroll 4
      for (int p = 0; p < 4; ++p) {
        __m512bh pair[G];
#pragma GCC unroll 8
        for (int g = 0; g < G; ++g) {
          const __m512i index = p == 0 ? codes[g] : _mm512_srli_epi16(codes[g], unsigned(4 * p));
          pair[g] = (__m512bh)_mm512_subs_epu16(_mm512_permutexvar_epi16(index, dec.table), sub[g]);
        }
#pragma GCC unroll 16
        for (int m = 0; m < MR; ++m) {
          const __m512bh a = (__m512bh)_mm512_set1_epi32(int(xp[m * ldxp + 4 * step + p]));
#pragma GCC unroll 8
          for (int g = 0; g < G; ++g) acc.v[m][g] = _mm512_dpbf16_ps(acc.v[m][g], a, pair[g]);
        }
      }
    }
  }
  const int lo = int(_mm512_reduce_min_epu32(lowest)), hi = int(_mm512_reduce_max_epu32(highest));
  if (lo < 2 || hi > 252 || x_min_exponent + lo - 1 < kDotMinBiasedExponentSum) return false;
  acc.store(keep, y, ldy, 1);
  return true;
}

struct Fp4PanelTile {
  static constexpr int kMaxGroup = 8;
  template <int G, int MR>
  static bool run(const Weight& w, const uint32_t* xp, int64_t ldxp, int x_min_exponent, int64_t o0, int64_t n,
                  float* y, int64_t ldy) {
    return fp4_panel_tile<G, MR>(w, xp, ldxp, x_min_exponent, o0, n, y, ldy);
  }
};

// ---- FP8 panels (Weight::fp8_panels) ------------------------------------------
// A step of a panel is one aligned 64-byte load, lane i the codes of 4 k of
// row i: byte 0 k + 1, byte 1 k + 3, byte 2 k, byte 3 k + 2. The pair of k
// and k + 1 has its codes at the bottom of the two words, the pair of k + 2
// and k + 3 one byte up (a word shift by 8). Each word looks its code's
// magnitude up in a 128-entry table of e4m3 values times 2^119 (two
// 64-entry vpermi2w, chosen by bit 6; bits past 5 of an index are ignored),
// which puts every non-zero one at a biased exponent of 237-254, subnormal
// codes included. An unsigned saturating subtract of (246 - s) << 7 then
// applies the block scale 2^(s - 127): exact and normal for s in 10-246,
// and zero stays zero. Last the sign, bit 7 of the code. The 16 rows of a
// panel lie in one scale block (the block is a multiple of 16), so a
// block's subtrahend is one broadcast.
struct E4m3Bf16Table {
  alignas(64) uint16_t bits[128];
  constexpr E4m3Bf16Table() : bits() {
    for (int c = 0; c < 127; ++c) {  // 127: NaN, which the packer refuses
      const int e = c >> 3, m = c & 7;
      if (e > 0) {
        bits[c] = uint16_t(((e + 239) << 7) | (m << 4));  // (1 + m/8) · 2^(e - 7) · 2^119
      } else if (m > 0) {  // m · 2^-9 · 2^119, m = 2^p + rest
        int p = 2;
        while (!(m >> p)) --p;
        bits[c] = uint16_t(((p + 237) << 7) | (((m - (1 << p)) << (7 - p)) & 0x7f));
      }
    }
  }
};
constexpr E4m3Bf16Table kE4m3Times2To119;
constexpr int kFp8PanelMinScale = 10, kFp8PanelMaxScale = 246;

struct Fp8PairDecoder {
  __m512i t0, t1, t2, t3;
  Fp8PairDecoder()
      : t0(_mm512_load_si512(kE4m3Times2To119.bits)),
        t1(_mm512_load_si512(kE4m3Times2To119.bits + 32)),
        t2(_mm512_load_si512(kE4m3Times2To119.bits + 64)),
        t3(_mm512_load_si512(kE4m3Times2To119.bits + 96)) {}
  static __m512i subtrahend(int s) { return _mm512_set1_epi16(short((kFp8PanelMaxScale - s) << 7)); }
  // The scaled magnitude of the code in bits 0-6 of each word (bits 7-15
  // ignored).
  __m512i magnitude(__m512i index, __m512i sub) const {
    const __mmask32 high = _mm512_test_epi16_mask(index, _mm512_set1_epi16(0x40));
    const __m512i v = _mm512_mask_blend_epi16(high, _mm512_permutex2var_epi16(t0, index, t1),
                                              _mm512_permutex2var_epi16(t2, index, t3));
    return _mm512_subs_epu16(v, sub);
  }
  // A step's two pair vectors: k and k + 1, then k + 2 and k + 3.
  void pairs(__m512i codes, __m512i sub, __m512bh& first, __m512bh& second) const {
    const __m512i sign = _mm512_set1_epi16(short(0x8000)), up = _mm512_srli_epi16(codes, 8);
    // x | (y & sign): the sign of the first pair's codes is bit 7 of each word.
    first = (__m512bh)_mm512_ternarylogic_epi32(magnitude(codes, sub), _mm512_slli_epi16(codes, 8), sign, 0xf8);
    second = (__m512bh)_mm512_ternarylogic_epi32(magnitude(up, sub), codes, sign, 0xf8);
  }
};

// Steps (64 bytes of a panel, as an FP4 panel's) asked for ahead of the
// one decoded: the same bytes as the FP4 tile, whose blocks are 4 steps;
// 512 B into L1 and 2 KB into L2 (16 streams on Zen 4, projections:
// 44.9-47.0 -> 43.0-43.4 ms a step with the L2 one).
constexpr int64_t kFp8StepsAhead = 4 * kPanelAhead, kFp8StepsFarAhead = 4 * kPanelFarAhead;

template <int G, int MR>
bool fp8_panel_tile(const Weight& w, const uint32_t* xp, int64_t ldxp, int x_min_exponent, int64_t o0, int64_t n,
                    float* y, int64_t ldy) {
  const Fp8PairDecoder dec;
  const int64_t steps = w.in / 4, B = w.block, scols = (w.in + B - 1) / B;
  const uint32_t* data[G];
  const uint8_t* scale[G];
  __mmask16 keep[G];
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g) {
    const int64_t row = o0 + g * kLanes;
    data[g] = w.fp8_panels + (row / kLanes) * steps * kLanes;
    scale[g] = w.scale + (row / B) * scols;
    keep[g] = panel_keep(n, g);
  }
  Sums<G, MR> acc;
  int lowest = 255, highest = 0;
  for (int64_t c = 0; c < scols; ++c) {
    __m512i sub[G];
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
      const int s = scale[g][c];
      lowest = std::min(lowest, s);
      highest = std::max(highest, s);
      sub[g] = Fp8PairDecoder::subtrahend(s);
    }
    const int64_t end = std::min(steps, (c + 1) * B / 4);
    for (int64_t step = c * B / 4; step < end; ++step) {
      __m512bh first[G], second[G];
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g) {
        if (step + kFp8StepsAhead < steps)
          prefetch_l1(data[g] + (step + kFp8StepsAhead) * kLanes);
        if (step + kFp8StepsFarAhead < steps)
          prefetch_l2(data[g] + (step + kFp8StepsFarAhead) * kLanes);
        dec.pairs(_mm512_load_si512(data[g] + step * kLanes), sub[g], first[g], second[g]);
      }
#pragma GCC unroll 16
      for (int m = 0; m < MR; ++m) {
        const __m512bh a = (__m512bh)_mm512_set1_epi32(int(xp[m * ldxp + 2 * step])),
                       b = (__m512bh)_mm512_set1_epi32(int(xp[m * ldxp + 2 * step + 1]));
#pragma GCC unroll 8
        for (int g = 0; g < G; ++g) acc.v[m][g] = _mm512_dpbf16_ps(acc.v[m][g], a, first[g]);
#pragma GCC unroll 8
        for (int g = 0; g < G; ++g) acc.v[m][g] = _mm512_dpbf16_ps(acc.v[m][g], b, second[g]);
      }
    }
  }
  // The smallest non-zero weight is 2^-9 · 2^(s - 127): biased exponent s - 9.
  if (lowest < kFp8PanelMinScale || highest > kFp8PanelMaxScale ||
      x_min_exponent + lowest - 9 < kDotMinBiasedExponentSum)
    return false;
  acc.store(keep, y, ldy, 1);
  return true;
}

// Steps [s0, s1) of one FP8 panel (one scale block: subtrahend sub) for MR
// input rows on fp32 FMAs: each pair splits into its two fp32 values.
template <int MR>
void fp8_panel_fma_steps(const Fp8PairDecoder& dec, const uint32_t* data, int64_t steps, __m512i sub,
                         const float* x, int64_t ldx, int64_t s0, int64_t s1, Sums<1, MR>& sums) {
  Sums<1, MR> acc = sums;
  for (int64_t step = s0; step < s1; ++step) {
    if (step + kFp8StepsAhead < steps)
      prefetch_l1(data + (step + kFp8StepsAhead) * kLanes);
    __m512bh first, second;
    dec.pairs(_mm512_load_si512(data + step * kLanes), sub, first, second);
    const __m512i p[2] = {(__m512i)first, (__m512i)second};
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m512 even[1] = {bf16_high(p[h])}, odd[1] = {bf16_low(p[h])};
      acc.fma(x + 4 * step + 2 * h, ldx, even);
      acc.fma(x + 4 * step + 2 * h + 1, ldx, odd);
    }
  }
  sums = acc;
}

// One FP8 panel (o0 a multiple of 16, n ≤ 16 rows) for kGemvTileInputRows +
// MR input rows on fp32 FMAs, for CPUs where vdpbf16ps does fewer flops
// than fp32 FMA: two sets of rows take turns over the scale blocks, the
// second decoding the block's codes again from L1. False where a scale
// code is outside 10-246 (the pairs would not be normal bf16 values).
template <int MR>
bool fp8_panel_fma_tile(const Weight& w, const float* x, int64_t ldx, int64_t o0, int64_t n, float* y,
                        int64_t ldy) {
  const Fp8PairDecoder dec;
  const int64_t steps = w.in / 4, B = w.block, scols = (w.in + B - 1) / B;
  const uint32_t* const data = w.fp8_panels + (o0 / kLanes) * steps * kLanes;
  const uint8_t* const scale = w.scale + (o0 / B) * scols;
  const __mmask16 keep[1] = {panel_keep(n, 0)};
  Sums<1, kGemvTileInputRows> first;
  Sums<1, MR> second;
  for (int64_t c = 0; c < scols; ++c) {
    if (scale[c] < kFp8PanelMinScale || scale[c] > kFp8PanelMaxScale) return false;
    const __m512i sub = Fp8PairDecoder::subtrahend(scale[c]);
    const int64_t s0 = c * B / 4, s1 = std::min(steps, (c + 1) * B / 4);
    fp8_panel_fma_steps<kGemvTileInputRows>(dec, data, steps, sub, x, ldx, s0, s1, first);
    fp8_panel_fma_steps<MR>(dec, data, steps, sub, x + kGemvTileInputRows * ldx, ldx, s0, s1, second);
  }
  first.store(keep, y, ldy, 1);
  second.store(keep, y + kGemvTileInputRows * ldy, ldy, 1);
  return true;
}

struct Fp8PanelTile {
  static constexpr int kMaxGroup = 4;
  template <int G, int MR>
  static bool run(const Weight& w, const uint32_t* xp, int64_t ldxp, int x_min_exponent, int64_t o0, int64_t n,
                  float* y, int64_t ldy) {
    return fp8_panel_tile<G, MR>(w, xp, ldxp, x_min_exponent, o0, n, y, ldy);
  }
};

// ---- Either kind of panel ----------------------------------------------------
// Tile::run<G, M> for a run-time M in [1, MR].
template <class Tile, int G, int MR>
bool panel_tile_rows(const Weight& w, const uint32_t* xp, int64_t M, int64_t ldxp, int x_min_exponent, int64_t o0,
                     int64_t n, float* y, int64_t ldy) {
  if constexpr (MR > 1) {
    if (M < MR) return panel_tile_rows<Tile, G, MR - 1>(w, xp, M, ldxp, x_min_exponent, o0, n, y, ldy);
  }
  return Tile::template run<G, MR>(w, xp, ldxp, x_min_exponent, o0, n, y, ldy);
}

// Rows o0 .. o0 + n - 1 of an FP4 or FP8 panel tile, G panels at a time:
// each lane's chain waits ~6 cycles for its last vdpbf16ps (measured on
// Zen 4, which issues one a cycle), so a group wants G · M chains enough to
// keep the decoding busy. One input row over two panels (an FP4 expert
// chosen by one stream of 16, or by the only one) held FP4 panels in cache
// to 18 GB/s on one thread; over eight, 22 (docs/PERFORMANCE.md "Panel
// groups"). Past kGemvTileInputRows, one panel at a time with up to 16
// accumulators, so that each weight is decoded once. Tile::kMaxGroup is
// what the decoder's registers allow.
template <class Tile>
bool panel_tile(const Weight& w, const uint32_t* xp, int64_t M, int64_t ldxp, int x_min_exponent, int64_t o0,
                int64_t n, float* y, int64_t ldy) {
  // A group of G panels takes the rest of the tile where that holds more
  // than G - 1 panels.
  for (int64_t h = 0; h < n;) {
    const int64_t left = n - h;
    const auto group = [&](auto G, auto MR) {
      const int64_t at = h, rows = std::min<int64_t>(left, G * kLanes);
      h += rows;
      return panel_tile_rows<Tile, G, MR>(w, xp, M, ldxp, x_min_exponent, o0 + at, rows, y + at, ldy);
    };
    using One = std::integral_constant<int, 1>;
    bool ok;
    if (M == 1 && left > (Tile::kMaxGroup - 1) * kLanes)
      ok = group(std::integral_constant<int, Tile::kMaxGroup>(), One());
    else if (M <= 4 && left > 3 * kLanes)
      ok = group(std::integral_constant<int, 4>(), std::integral_constant<int, 4>());
    else if (M <= kGemvTileInputRows && left > kLanes)
      ok = group(std::integral_constant<int, 2>(), std::integral_constant<int, kGemvTileInputRows>());
    else
      ok = group(One(), std::integral_constant<int, kGemvPanelInputRows>());
    if (!ok) return false;
  }
  return true;
}

// Nibbles at bits 0, 8, 16, 24 of each dword to bits 0-15.
inline __m512i gather_nibbles(__m512i e) {
  e = _mm512_and_si512(_mm512_or_si512(e, _mm512_srli_epi32(e, 4)), _mm512_set1_epi32(0x00ff00ff));
  return _mm512_and_si512(_mm512_or_si512(e, _mm512_srli_epi32(e, 8)), _mm512_set1_epi32(0xffff));
}

}  // namespace

void pack_fp4_panel_avx512bf16(const Weight& w, int64_t panel, uint32_t* data, uint8_t* scales) {
  const int64_t row_bytes = w.row_bytes(), blocks = w.in / 32, rows = std::min<int64_t>(16, w.out - 16 * panel);
  const __m512i nibbles = _mm512_set1_epi32(0x0f0f0f0f);
  for (int64_t byte = 0; byte < row_bytes; byte += 64) {
    const int dwords = int(std::min<int64_t>(64, row_bytes - byte) / 4);
    __m512i r[kLanes];
#pragma GCC unroll 16
    for (int i = 0; i < kLanes; ++i)
      r[i] = i < rows ? _mm512_maskz_loadu_epi32(__mmask16((1u << dwords) - 1),
                                                 w.data + (16 * panel + i) * row_bytes + byte)
                      : _mm512_setzero_si512();
    transpose16(r);  // r[d]: dword d of the line, every row
    for (int d = 0; d < dwords; ++d) {
      const __m512i even = gather_nibbles(_mm512_and_si512(r[d], nibbles)),
                    odd = gather_nibbles(_mm512_and_si512(_mm512_srli_epi32(r[d], 4), nibbles));
      _mm512_store_si512(data + (byte / 4 + d) * kLanes, _mm512_or_si512(_mm512_slli_epi32(even, 16), odd));
    }
  }
  for (int64_t i = 0; i < kLanes; ++i) {
    const uint8_t* const s = w.scale + (16 * panel + (i < rows ? i : 0)) * blocks;
    for (int64_t c = 0; c < blocks; ++c) scales[c * kLanes + i] = s[c];
  }
}

bool pack_fp8_panel_avx512bf16(const Weight& w, int64_t panel, uint32_t* data) {
  const int64_t rows = std::min<int64_t>(16, w.out - 16 * panel);
  // Codes k, k + 1, k + 2, k + 3 of a dword to the order of a step (vpshufb
  // indexes bytes within each 128-bit lane).
  const __m512i order = _mm512_broadcast_i32x4(_mm_setr_epi32(0x02000301, 0x06040705, 0x0a080b09, 0x0e0c0f0d)),
                low7 = _mm512_set1_epi32(0x7f7f7f7f),
                one = _mm512_set1_epi32(0x01010101);
  __m512i nan = _mm512_setzero_si512();  // a code's low 7 bits plus 1 reach bit 7 only for NaN
  for (int64_t k = 0; k < w.in; k += 64) {
    const int dwords = int(std::min<int64_t>(64, w.in - k) / 4);
    __m512i r[kLanes];
#pragma GCC unroll 16
    for (int i = 0; i < kLanes; ++i) {
      r[i] = i < rows ? _mm512_maskz_loadu_epi32(__mmask16((1u << dwords) - 1), w.data + (16 * panel + i) * w.in + k)
                      : _mm512_setzero_si512();
      nan = _mm512_or_si512(nan, _mm512_add_epi32(_mm512_and_si512(r[i], low7), one));
    }
    transpose16(r);  // r[d]: codes k + 4d .. k + 4d + 3 of every row
    for (int d = 0; d < dwords; ++d)
      _mm512_store_si512(data + (k / 4 + d) * kLanes, _mm512_shuffle_epi8(r[d], order));
  }
  return _mm512_test_epi32_mask(nan, _mm512_set1_epi32(int32_t(0x80808080u))) == 0;
}

bool fp8_panel_pairs_avx512bf16(const Weight& w, int64_t panel, uint32_t* pairs, int* min_exponent) {
  const Fp8PairDecoder dec;
  const int64_t steps = w.in / 4, B = w.block, scols = (w.in + B - 1) / B;
  const uint32_t* const data = w.fp8_panels + panel * steps * kLanes;
  const uint8_t* const scale = w.scale + (16 * panel / B) * scols;
  int lowest = 255, highest = 0;
  for (int64_t c = 0; c < scols; ++c) {
    const int s = scale[c];
    lowest = std::min(lowest, s);
    highest = std::max(highest, s);
    const __m512i sub = Fp8PairDecoder::subtrahend(s);
    for (int64_t step = c * B / 4; step < std::min(steps, (c + 1) * B / 4); ++step) {
      __m512bh first, second;
      dec.pairs(_mm512_load_si512(data + step * kLanes), sub, first, second);
      _mm512_storeu_si512(pairs + (2 * step) * kLanes, (__m512i)first);
      _mm512_storeu_si512(pairs + (2 * step + 1) * kLanes, (__m512i)second);
    }
  }
  *min_exponent = lowest - 9;
  return lowest >= kFp8PanelMinScale && highest <= kFp8PanelMaxScale;
}

bool gemv_fp8_panel_tile_avx512bf16(const Weight& w, const uint32_t* xp, int64_t M, int64_t ldxp, int x_min_exponent,
                                    int64_t o0, int64_t n, float* y, int64_t ldy) {
  return panel_tile<Fp8PanelTile>(w, xp, M, ldxp, x_min_exponent, o0, n, y, ldy);
}

bool gemv_fp8_panel_fma_tile(const Weight& w, const float* x, int64_t M, int64_t ldx, int64_t o0, int64_t n, float* y,
                             int64_t ldy) {
  static_assert(kGemvPanelInputRows == 2 * kGemvTileInputRows && kGemvTileInputRows == 8, "one case per row count");
  switch (M - kGemvTileInputRows) {
    case 1: return fp8_panel_fma_tile<1>(w, x, ldx, o0, n, y, ldy);
    case 2: return fp8_panel_fma_tile<2>(w, x, ldx, o0, n, y, ldy);
    case 3: return fp8_panel_fma_tile<3>(w, x, ldx, o0, n, y, ldy);
    case 4: return fp8_panel_fma_tile<4>(w, x, ldx, o0, n, y, ldy);
    case 5: return fp8_panel_fma_tile<5>(w, x, ldx, o0, n, y, ldy);
    case 6: return fp8_panel_fma_tile<6>(w, x, ldx, o0, n, y, ldy);
    case 7: return fp8_panel_fma_tile<7>(w, x, ldx, o0, n, y, ldy);
    default: return fp8_panel_fma_tile<8>(w, x, ldx, o0, n, y, ldy);
  }
}

bool gemv_fp4_panel_tile_avx512bf16(const Weight& w, const uint32_t* xp, int64_t M, int64_t ldxp, int x_min_exponent,
                                    int64_t o0, int64_t n, float* y, int64_t ldy) {
  return panel_tile<Fp4PanelTile>(w, xp, M, ldxp, x_min_exponent, o0, n, y, ldy);
}

bool gemv_fp4_tile_avx512bf16(const Weight& w, const uint32_t* xp, int64_t M, int64_t ldxp, int x_min_exponent,
                              int64_t o0, int64_t stride, int64_t n, float* y, int64_t ldy) {
  if (n > kLanes) return fp4_tile_rows<2, kGemvTileInputRows>(w, xp, M, ldxp, x_min_exponent, o0, stride, n, y, ldy);
  return fp4_tile_rows<1, kGemvTileInputRows>(w, xp, M, ldxp, x_min_exponent, o0, stride, n, y, ldy);
}

void gemv_pair_tile_avx512bf16(const Weight& w, const uint32_t* xp, int64_t M, int64_t ldxp, int64_t o0, int64_t n,
                               float* y, int64_t ldy) {
  static_assert(kGemvTileRows == 2 * kLanes, "a tile is at most two panels");
  static_assert(kGemvPanelInputRows == 2 * kGemvTileInputRows, "gemv passes at most two sets of input rows");
  if (n > kLanes) return pair_tile_any_rows<2>(w, xp, M, ldxp, o0, n, y, ldy);
  pair_tile_any_rows<1>(w, xp, M, ldxp, o0, n, y, ldy);
}

}  // namespace dsv4
#endif
