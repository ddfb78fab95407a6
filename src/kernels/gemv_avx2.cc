// AVX2 GEMV tiles: 8 weight rows per ymm, one lane per row, decoded from
// FP8 / FP4 / BF16 in registers and fed straight into each lane's FMA chain
// (ascending k, as gemm_reference), so the bits equal gemm's and prefill's.
// The AVX-512 tiles' design (gemv_avx512.cc) at half the width, for CPUs
// without AVX-512: a 64-byte line of each of a group's 8 rows is loaded
// whole and turned into lanes by two 8 × 8 dword transposes (a dword is 4
// steps of k in FP8, 8 in FP4, 2 in BF16), kept in a small buffer in L1.
// Pair panels (the head; FP8 matrices decoded at load, gemv.h
// pack_pair_panels) and FP4 panels (the routed experts, gemv.h
// pack_quant_panels) are read as they lie, without transposes.
//
// Before these tiles, decode on such CPUs took gemm's path, which decodes
// every weight into fp32 panels, stores and packs them for one multiply-add
// per input row.
#include "kernels/gemv_avx2.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "core/bf16_simd.h"
#include "core/prefetch.h"

namespace dsv4 {

namespace {

constexpr int kLanes = 8;
constexpr int kLineDwords = 16;

// Each row is its own stream; as in the AVX-512 tiles, each row's line
// kAhead lines on is asked for into L2 as a line is used (the hardware
// prefetcher follows few streams well).
constexpr int64_t kAhead = 2;

// G groups of 8 weight rows o0, o0 + stride, ...: where each lane's row data
// and scale row start (lanes at or past n read row o0, a real one; their
// sums are never stored).
template <int G>
struct Rows {
  const uint8_t* data[G][kLanes];
  const uint8_t* scale[G][kLanes];

  Rows(const Weight& w, int64_t o0, int64_t stride, int64_t n, int64_t scale_row_bytes, int64_t rows_per_scale_row) {
    const int64_t row_bytes = w.row_bytes();
    for (int g = 0; g < G; ++g)
      for (int i = 0; i < kLanes; ++i) {
        const int64_t lane = g * kLanes + i, row = lane < n ? o0 + stride * lane : o0;
        data[g][i] = w.data + row * row_bytes;
        scale[g][i] = w.scale ? w.scale + (row / rows_per_scale_row) * scale_row_bytes : nullptr;
      }
  }
  void prefetch(int64_t line, int64_t lines) const {
    if (line + kAhead >= lines) return;
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g)
#pragma GCC unroll 8
      for (int i = 0; i < kLanes; ++i)
        prefetch_l2(data[g][i] + 64 * (line + kAhead));
  }
  // Byte `col` of every lane's scale row, one per lane.
  __m256i scale_codes(int g, int64_t col) const {
    alignas(32) int32_t e[kLanes];
    for (int i = 0; i < kLanes; ++i) e[i] = scale[g][i][col];
    return _mm256_load_si256(reinterpret_cast<const __m256i*>(e));
  }
  // Bytes [col, col + count) (count ≤ 4) of every lane's scale row, as one
  // dword per lane.
  __m256i scale_dwords(int g, int64_t col, int64_t count) const {
    alignas(32) uint32_t e[kLanes] = {};
    if (count == 4)
      for (int i = 0; i < kLanes; ++i) std::memcpy(&e[i], scale[g][i] + col, 4);
    else
      for (int i = 0; i < kLanes; ++i) std::memcpy(&e[i], scale[g][i] + col, size_t(count));
    return _mm256_load_si256(reinterpret_cast<const __m256i*>(e));
  }
};

template <int G>
Rows<G> rows_of(const Weight& w, int64_t o0, int64_t stride, int64_t n) {
  switch (w.kind) {
    case Weight::Kind::kFP8: return Rows<G>(w, o0, stride, n, (w.in + w.block - 1) / w.block, w.block);
    case Weight::Kind::kFP4: return Rows<G>(w, o0, stride, n, w.in / 32, 1);
    default: return Rows<G>(w, o0, stride, n, 0, 1);
  }
}

// Per input row m and group g, one vector of 8 chains.
template <int G, int MR>
struct Sums {
  __m256 v[MR][G];
  Sums() {
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m)
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g) v[m][g] = _mm256_setzero_ps();
  }
  // Every chain continues with x[m][k] times its lane of val[g].
  inline void fma(const float* xk, int64_t ldx, const __m256 (&val)[G]) {
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      const __m256 xb = _mm256_broadcast_ss(xk + m * ldx);
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g) v[m][g] = _mm256_fmadd_ps(xb, val[g], v[m][g]);
    }
  }
  // Lane i of group g to y[m][stride · (8g + i)], for the tile's n rows.
  void store(int64_t n, float* y, int64_t ldy, int64_t stride) const {
    alignas(32) float lanes[kLanes];
    for (int m = 0; m < MR; ++m)
      for (int g = 0; g < G; ++g) {
        _mm256_store_ps(lanes, v[m][g]);
        for (int64_t i = 0; i < kLanes && g * kLanes + i < n; ++i)
          y[m * ldy + (g * kLanes + i) * stride] = lanes[i];
      }
  }
};

// ---- Lines: the tile's bytes turned into lanes --------------------------------
template <int G>
struct Lines {
  alignas(32) uint32_t dword[G][kLineDwords][kLanes];  // [group][dword of the line][lane]
  __m256i load(int g, int d) const { return _mm256_load_si256(reinterpret_cast<const __m256i*>(dword[g][d])); }
};

// 8 rows of 8 dwords to 8 vectors of a dword of every row: pairs of rows
// interleaved by dwords, then by qwords (each 128-bit half then holds one
// dword of four rows), then the halves of rows 0-3 and 4-7 joined.
__attribute__((always_inline)) inline void transpose8(__m256i (&r)[kLanes]) {
  __m256i a[kLanes];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    a[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
#pragma GCC unroll 8
  for (int h = 0; h < 2; ++h) {  // r[4h + c], 128-bit half L: dword 4L + c of rows 4h .. 4h + 3
    r[4 * h] = _mm256_unpacklo_epi64(a[4 * h], a[4 * h + 2]);
    r[4 * h + 1] = _mm256_unpackhi_epi64(a[4 * h], a[4 * h + 2]);
    r[4 * h + 2] = _mm256_unpacklo_epi64(a[4 * h + 1], a[4 * h + 3]);
    r[4 * h + 3] = _mm256_unpackhi_epi64(a[4 * h + 1], a[4 * h + 3]);
  }
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    a[c] = _mm256_permute2x128_si256(r[c], r[4 + c], 0x20);
    a[4 + c] = _mm256_permute2x128_si256(r[c], r[4 + c], 0x31);
  }
#pragma GCC unroll 8
  for (int d = 0; d < kLanes; ++d) r[d] = a[d];
}

// Loads bytes [byte, byte + 64) of every row (fewer at a row's end: `dwords`
// of them, a multiple of 4; the rest read as zero) into `out`; check(v)
// sees each row's loaded bytes first (the FP8 NaN search).
template <int G, class Check>
inline void load_lines(const Rows<G>& r, int64_t byte, int dwords, Lines<G>& out, Check&& check) {
  for (int g = 0; g < G; ++g) {
    for (int h = 0; h < 2 && 8 * h < dwords; ++h) {
      const int valid = dwords - 8 * h;
      const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(valid), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
      __m256i rows[kLanes];
#pragma GCC unroll 8
      for (int i = 0; i < kLanes; ++i) {
        const int* p = reinterpret_cast<const int*>(r.data[g][i] + byte + 32 * h);
        rows[i] = valid >= kLanes ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                                  : _mm256_maskload_epi32(p, mask);
        check(rows[i]);
      }
      transpose8(rows);
#pragma GCC unroll 8
      for (int d = 0; d < kLanes; ++d)
        _mm256_store_si256(reinterpret_cast<__m256i*>(out.dword[g][8 * h + d]), rows[d]);
    }
  }
}

// ---- FP8 -------------------------------------------------------------------
// As gemv_avx512.cc: an e4m3 code's exponent and mantissa moved into an
// fp32's bits 20-26 (sign to bit 31) read as a float are the value times
// 2^-120, subnormals included, so one multiply by 2^(s - 7) gives
// lut[code] · scale, the same exact product rounded once. That factor is a
// normal float for scale codes s ≤ 134 (larger ones are refused). NaN codes
// (low 7 bits all ones) are found with a carry into bit 7.
constexpr int kFp8MaxScaleCode = 134;

// Whether no lane of v is above limit (the tiles' check of the largest
// scale code they met).
bool lanes_at_most(__m256i v, int32_t limit) {
  return _mm256_testz_si256(_mm256_cmpgt_epi32(v, _mm256_set1_epi32(limit)), _mm256_set1_epi32(-1));
}

template <int G, int MR>
bool fp8_tile(const Weight& w, const Rows<G>& r, const float* x, int64_t ldx, Sums<G, MR>& sums) {
  Sums<G, MR> acc = sums;
  const int64_t B = w.block, lines = (w.in + 63) / 64;
  const __m256i keep_bits = _mm256_set1_epi32(int32_t(0x87f00000u)), low7 = _mm256_set1_epi32(0x7f7f7f7f),
                one = _mm256_set1_epi32(0x01010101);
  __m256i nan = _mm256_setzero_si256(), max_scale = _mm256_setzero_si256();
  __m256 factor[G] = {};
  Lines<G> buf;
  int64_t next_block = 0;  // where the next scale block starts (no division per dword)
  for (int64_t line = 0; line < lines; ++line) {
    r.prefetch(line, lines);
    const int64_t k0 = 64 * line;
    const int dwords = int(w.in - k0 >= 64 ? kLineDwords : (w.in - k0) / 4);
    load_lines(r, k0, dwords, buf,
               [&](__m256i v) { nan = _mm256_or_si256(nan, _mm256_add_epi32(_mm256_and_si256(v, low7), one)); });
    for (int d = 0; d < dwords; ++d) {
      const int64_t k = k0 + 4 * d;
      if (k == next_block) {  // B is a multiple of 16: a block starts on a dword
        next_block += B;
#pragma GCC unroll 8
        for (int g = 0; g < G; ++g) {
          const __m256i s = r.scale_codes(g, k / B);
          max_scale = _mm256_max_epi32(max_scale, s);
          factor[g] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(s, _mm256_set1_epi32(120)), 23));
        }
      }
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        __m256 val[G];
#pragma GCC unroll 8
        for (int g = 0; g < G; ++g) {
          const __m256i v = buf.load(g, d);
          const __m256i top = i < 3 ? _mm256_slli_epi32(v, 24 - 8 * i) : v;
          const __m256i bits = _mm256_and_si256(_mm256_srai_epi32(top, 4), keep_bits);
          val[g] = _mm256_mul_ps(_mm256_castsi256_ps(bits), factor[g]);
        }
        acc.fma(x + k + i, ldx, val);
      }
    }
  }
  sums = acc;
  const bool any_nan = !_mm256_testz_si256(nan, _mm256_set1_epi32(int32_t(0x80808080u)));
  return !any_nan && lanes_at_most(max_scale, kFp8MaxScaleCode);
}

// ---- FP4 -------------------------------------------------------------------
// Two decoders. The fast one looks up, per code, a byte t = sign · 0x80 |
// e << 4 | m (vpshufb, 16 entries, every lane's 4 even or 4 odd codes at
// once); t moved to the top byte and shifted right arithmetically by 5
// leaves the sign in bit 31 and e, m in bits 19-25: an fp32 of value
// value(code) · 2^-122 whose exponent e is 4 to 7, never subnormal. (The
// FP8 decoder's way would make the code 0.5, 1 code in 16, an fp32
// subnormal, which is slow to multiply: FP8 codes of which 1 in 16 decode to
// subnormals ran at 4.6 G weights/s on one Zen 3 thread, against 6.8
// without; real FP8 weights hardly have them.)
// One multiply by 2^(s - 5) gives dequant_row's exact product, rounded
// once; that factor is a normal float for scale codes s ≤ 132, which real
// checkpoints never pass (their largest value would be 6 · 2^5).
//
// A tile with a larger scale code runs again on the exact decoder: an
// 8-entry vpermps table gives every lane's magnitude (it reads the low 3
// bits of the index), the code's sign bit moved to bit 31 picks the scale
// or its negation, and their product is dequant_row's, for every code.
constexpr int kFp4MaxFastScaleCode = 132;

// Byte t of the codes 0-15 (7: 6 = 1.5 · 2^2, e = 2 + 5, m = 8).
constexpr char kFp4FastByte[16] = {0,       0x40,       0x50,       0x58,       0x60,       0x68,       0x70,       0x78,
                                   char(0x80), char(0xc0), char(0xd0), char(0xd8), char(0xe0), char(0xe8), char(0xf0), char(0xf8)};

template <int G>
struct Fp4Fast {
  __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kFp4FastByte)));
  __m256i nib = _mm256_set1_epi8(0x0f), keep_bits = _mm256_set1_epi32(int32_t(0x83f80000u)), max_code{};
  __m256 factor[G] = {};
  __m256i t[G][2];
  void set_scale(int g, __m256i codes) {
    max_code = _mm256_max_epi32(max_code, codes);
    factor[g] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(codes, _mm256_set1_epi32(122)), 23));
  }
  void set_codes(int g, __m256i v) {
    t[g][0] = _mm256_shuffle_epi8(table, _mm256_and_si256(v, nib));
    t[g][1] = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi32(v, 4), nib));
  }
  // The value of nibble I of each lane's dword (of the codes last set).
  template <int I>
  __m256 value(int g, __m256i) const {
    const __m256i b = t[g][I % 2];
    const __m256i top = I / 2 < 3 ? _mm256_slli_epi32(b, 8 * (3 - I / 2)) : b;
    return _mm256_mul_ps(_mm256_castsi256_ps(_mm256_and_si256(_mm256_srai_epi32(top, 5), keep_bits)), factor[g]);
  }
  bool ok() const { return lanes_at_most(max_code, kFp4MaxFastScaleCode); }
};

template <int G>
struct Fp4Exact {
  __m256 table = _mm256_setr_ps(0.f, .5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f);
  __m256 pos[G] = {}, neg[G] = {};
  void set_scale(int g, __m256i codes) {
    const __m256i bits = _mm256_blendv_epi8(_mm256_slli_epi32(codes, 23), _mm256_set1_epi32(0x00400000),  // code 0: 2^-127
                                            _mm256_cmpeq_epi32(codes, _mm256_setzero_si256()));
    pos[g] = _mm256_castsi256_ps(bits);
    neg[g] = _mm256_castsi256_ps(_mm256_or_si256(bits, _mm256_set1_epi32(int32_t(0x80000000u))));
  }
  void set_codes(int, __m256i) {}
  template <int I>
  __m256 value(int g, __m256i v) const {
    const __m256 mag = _mm256_permutevar8x32_ps(table, I > 0 ? _mm256_srli_epi32(v, 4 * I) : v);
    const __m256i code_sign = I < 7 ? _mm256_slli_epi32(v, 28 - 4 * I) : v;
    return _mm256_mul_ps(mag, _mm256_blendv_ps(pos[g], neg[g], _mm256_castsi256_ps(code_sign)));
  }
  bool ok() const { return true; }
};

// Step N of k takes nibble I of every lane's dword (the rows' layout: I = N).
template <int N, int I, int G, int MR, class Decoder>
__attribute__((always_inline)) inline void fp4_step(const Decoder& dec, const __m256i (&v)[G], const float* xk,
                                                    int64_t ldx, Sums<G, MR>& acc) {
  __m256 val[G];
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g) val[g] = dec.template value<I>(g, v[g]);
  acc.fma(xk + N, ldx, val);
}

// False where the decoder cannot take a scale code of the tile.
template <int G, int MR, class Decoder>
bool fp4_tile(const Weight& w, const Rows<G>& r, const float* x, int64_t ldx, Sums<G, MR>& sums) {
  Sums<G, MR> acc = sums;
  Decoder dec;
  const int64_t cols = w.in / 32, row_bytes = w.row_bytes(), lines = (row_bytes + 63) / 64;
  Lines<G> buf;
  __m256i scale_dwords[G];
  for (int64_t line = 0; line < lines; ++line) {
    r.prefetch(line, lines);
    const int64_t byte0 = 64 * line;
    const int dwords = int(row_bytes - byte0 >= 64 ? kLineDwords : (row_bytes - byte0) / 4);
    load_lines(r, byte0, dwords, buf, [](__m256i) {});
    // A line is 128 codes: 4 scale blocks of 32, a byte of each row's scale
    // row apiece.
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g)
      scale_dwords[g] = r.scale_dwords(g, 4 * line, cols - 4 * line < 4 ? cols - 4 * line : 4);
    for (int d = 0; d < dwords; ++d) {
      if (d % 4 == 0)
#pragma GCC unroll 8
        for (int g = 0; g < G; ++g)
          dec.set_scale(g, _mm256_and_si256(_mm256_srli_epi32(scale_dwords[g], 2 * d), _mm256_set1_epi32(0xff)));
      __m256i v[G];
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g) {
        v[g] = buf.load(g, d);
        dec.set_codes(g, v[g]);
      }
      const float* xk = x + 2 * byte0 + 8 * d;
      fp4_step<0, 0>(dec, v, xk, ldx, acc);
      fp4_step<1, 1>(dec, v, xk, ldx, acc);
      fp4_step<2, 2>(dec, v, xk, ldx, acc);
      fp4_step<3, 3>(dec, v, xk, ldx, acc);
      fp4_step<4, 4>(dec, v, xk, ldx, acc);
      fp4_step<5, 5>(dec, v, xk, ldx, acc);
      fp4_step<6, 6>(dec, v, xk, ldx, acc);
      fp4_step<7, 7>(dec, v, xk, ldx, acc);
    }
  }
  sums = acc;
  return dec.ok();
}

// ---- FP4 from panels -----------------------------------------------------------
// Weight::fp4_panels (gemv.h pack_quant_panels) hold a step of 8 k of 16
// rows as one 64-byte line, rows 0-7 in its first half, and a block's 16
// scale codes as 16 bytes: a group (8 rows from a multiple of 8) reads one
// half of each line, one load per 8 steps of k, and 8 scale bytes per
// block, as they lie. The row layout's transposes and scale gathers took a
// third of the FP4 tile's time, and its 32 rows 1-2 KB apart share L1
// sets; a tile of panels reads one or two sequential streams.
//
// In a lane's dword, k = 8s + 2b + 1 is nibble b and k = 8s + 2b nibble
// 4 + b (the even k's in the high half, for the vdpbf16ps tiles' pairs).
template <int N>
constexpr int kPanelNibble = N % 2 ? N / 2 : 4 + N / 2;

// Group g's chains through the 8 k of step s (its codes v, from xk).
template <int N, int g, int G, int MR, class Decoder>
__attribute__((always_inline)) inline void panel_group_step(const Decoder& dec, __m256i v, const float* xk,
                                                            int64_t ldx, Sums<G, MR>& acc) {
  const __m256 val = dec.template value<kPanelNibble<N>>(g, v);
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m) acc.v[m][g] = _mm256_fmadd_ps(_mm256_broadcast_ss(xk + m * ldx + N), val, acc.v[m][g]);
  if constexpr (N + 1 < 8) panel_group_step<N + 1, g>(dec, v, xk, ldx, acc);
}

// Each group's chains take a whole step before the next group's: one
// group's decoded codes live at a time, where all of them at once (as in
// fp4_tile) leave too few registers for the G groups' sums.
template <int g, int G, int MR, class Decoder>
__attribute__((always_inline)) inline void panel_groups(Decoder& dec, const uint32_t* const (&data)[G], int64_t s,
                                                        const float* xk, int64_t ldx, Sums<G, MR>& acc) {
  const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(data[g] + 16 * s));
  dec.set_codes(g, v);
  // The inputs' broadcasts again for each group: shared, 8 of them held
  // registers the sums then lacked (GCC kept those on the stack, a store and
  // a load in every chain's step). A broadcast is a load.
  const float* xg = xk;
  asm volatile("" : "+r"(xg));
  panel_group_step<0, g>(dec, v, xg, ldx, acc);
  if constexpr (g + 1 < G) panel_groups<g + 1>(dec, data, s, xk, ldx, acc);
}

// Not inlined into tile() with the other kinds' tiles: the code measured
// (session 33) was this function's own.
template <int G, int MR, class Decoder>
__attribute__((noinline)) bool fp4_panel_tile(const Weight& w, int64_t o0, const float* x, int64_t ldx,
                                              Sums<G, MR>& sums) {
  Sums<G, MR> acc = sums;
  Decoder dec;
  const int64_t steps = w.in / 8, blocks = w.in / 32;
  const uint32_t* data[G];
  const uint8_t* scale[G];
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g) {
    const int64_t row = o0 + kLanes * g;
    data[g] = w.fp4_panels + (row / 16) * steps * 16 + row % 16;
    scale[g] = w.fp4_panel_scales + (row / 16) * blocks * 16 + row % 16;
  }
  for (int64_t c = 0; c < blocks; ++c) {
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g)
      dec.set_scale(g, _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(scale[g] + 16 * c))));
#pragma GCC unroll 4
    for (int64_t s = 4 * c; s < 4 * c + 4; ++s) panel_groups<0>(dec, data, s, x + 8 * s, ldx, acc);
  }
  sums = acc;
  return dec.ok();
}

// ---- BF16 ------------------------------------------------------------------
// A dword holds values k (low half) and k + 1 (high half): the first moved
// up, the second with the low half cleared.
template <int G, int MR>
void bf16_tile(const Weight& w, const Rows<G>& r, const float* x, int64_t ldx, Sums<G, MR>& sums) {
  Sums<G, MR> acc = sums;
  const int64_t row_bytes = w.row_bytes(), lines = (row_bytes + 63) / 64;
  Lines<G> buf;
  for (int64_t line = 0; line < lines; ++line) {
    r.prefetch(line, lines);
    const int64_t byte0 = 64 * line;
    const int dwords = int(row_bytes - byte0 >= 64 ? kLineDwords : (row_bytes - byte0) / 4);
    load_lines(r, byte0, dwords, buf, [](__m256i) {});
    for (int d = 0; d < dwords; ++d) {
      const int64_t k = byte0 / 2 + 2 * d;
      __m256 even[G], odd[G];
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g) {
        const __m256i v = buf.load(g, d);
        even[g] = bf16_low(v);
        odd[g] = bf16_high(v);
      }
      acc.fma(x + k, ldx, even);
      acc.fma(x + k + 1, ldx, odd);
    }
  }
  sums = acc;
}

// ---- BF16 from pair panels ------------------------------------------------
// Weight::pair_panels (gemv.h pack_pair_panels) hold dword j (k = 2j in the
// high half, 2j + 1 in the low) of 16 rows as one 64-byte line, rows 0-7
// in its first half: a group (8 rows from a multiple of 8) reads one half,
// one load per two steps of k, no transpose, and a tile reads sequential
// streams. (The transposes took as many instructions as the BF16
// arithmetic.)
template <int G, int MR>
void bf16_panel_tile(const Weight& w, int64_t o0, const float* x, int64_t ldx, Sums<G, MR>& sums) {
  Sums<G, MR> acc = sums;
  const int64_t kp = w.in / 2;
  const uint32_t* half[G];
  for (int g = 0; g < G; ++g) {
    const int64_t row = o0 + kLanes * g;
    half[g] = w.pair_panels + (row / 16) * kp * 16 + row % 16;
  }
  for (int64_t j = 0; j < kp; ++j) {
    __m256 even[G], odd[G];
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
      const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(half[g] + j * 16));
      even[g] = bf16_high(v);
      odd[g] = bf16_low(v);
    }
    acc.fma(x + 2 * j, ldx, even);
    acc.fma(x + 2 * j + 1, ldx, odd);
  }
  sums = acc;
}

template <int G, int MR>
bool tile(const Weight& w, const float* x, int64_t ldx, int64_t o0, int64_t stride, int64_t n, float* y,
          int64_t ldy) {
  Sums<G, MR> acc;
  bool ok = true;
  if (w.pair_panels && stride == 1 && o0 % kLanes == 0) {
    // A BF16 weight's values, or an FP8 one's decoded (gemv.h
    // pack_pair_panels).
    bf16_panel_tile(w, o0, x, ldx, acc);
  } else if (w.fp4_panels && stride == 1 && o0 % kLanes == 0) {
    if (!fp4_panel_tile<G, MR, Fp4Fast<G>>(w, o0, x, ldx, acc)) {
      acc = Sums<G, MR>();
      fp4_panel_tile<G, MR, Fp4Exact<G>>(w, o0, x, ldx, acc);
    }
  } else {
    const Rows<G> r = rows_of<G>(w, o0, stride, n);
    switch (w.kind) {
      case Weight::Kind::kFP8: ok = fp8_tile(w, r, x, ldx, acc); break;
      case Weight::Kind::kFP4:
        if (!fp4_tile<G, MR, Fp4Fast<G>>(w, r, x, ldx, acc)) {
          acc = Sums<G, MR>();
          fp4_tile<G, MR, Fp4Exact<G>>(w, r, x, ldx, acc);
        }
        break;
      case Weight::Kind::kBF16: bf16_tile(w, r, x, ldx, acc); break;
      case Weight::Kind::kF32: return false;
    }
  }
  acc.store(n, y, ldy, stride);
  return ok;
}

template <int G>
bool tile_rows(const Weight& w, const float* x, int64_t M, int64_t ldx, int64_t o0, int64_t stride, int64_t n,
               float* y, int64_t ldy) {
  static_assert(kGemvAvx2TileInputRows == 8, "one case per row count");
  constexpr int G2 = G < 4 ? G : 4, G4 = G < 2 ? G : 2;  // gemv_avx2_tile_rows
  switch (M) {
    case 1: return tile<G, 1>(w, x, ldx, o0, stride, n, y, ldy);
    case 2: return tile<G2, 2>(w, x, ldx, o0, stride, n, y, ldy);
    case 3: return tile<G4, 3>(w, x, ldx, o0, stride, n, y, ldy);
    case 4: return tile<G4, 4>(w, x, ldx, o0, stride, n, y, ldy);
    case 5: return tile<1, 5>(w, x, ldx, o0, stride, n, y, ldy);
    case 6: return tile<1, 6>(w, x, ldx, o0, stride, n, y, ldy);
    case 7: return tile<1, 7>(w, x, ldx, o0, stride, n, y, ldy);
    default: return tile<1, 8>(w, x, ldx, o0, stride, n, y, ldy);
  }
}

}  // namespace

bool pack_fp4_panel_avx2(const Weight& w, int64_t panel, uint32_t* data, uint8_t* scales) {
  const int64_t steps = w.in / 8, blocks = w.in / 32, rows = std::min<int64_t>(16, w.out - 16 * panel);
  const __m256i nibbles = _mm256_set1_epi32(0x0f0f0f0f), pairs = _mm256_set1_epi32(0x00ff00ff),
                low_half = _mm256_set1_epi32(0xffff);
  // The low nibbles of a dword's 4 bytes to its nibbles 0-3.
  const auto squeeze = [&](__m256i n) {
    n = _mm256_and_si256(_mm256_or_si256(n, _mm256_srli_epi32(n, 4)), pairs);
    return _mm256_and_si256(_mm256_or_si256(n, _mm256_srli_epi32(n, 8)), low_half);
  };
  for (int h = 0; h < 2; ++h)
    for (int64_t s0 = 0; s0 < steps; s0 += kLanes) {
      const int count = int(std::min<int64_t>(kLanes, steps - s0));  // steps is a multiple of 4
      const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
      __m256i r[kLanes];
      for (int i = 0; i < kLanes; ++i) {
        const int64_t row = 8 * h + i;
        const int* p = reinterpret_cast<const int*>(w.data + (16 * panel + row) * w.row_bytes() + 4 * s0);
        r[i] = row >= rows ? _mm256_setzero_si256()
               : count == kLanes ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                                 : _mm256_maskload_epi32(p, mask);
      }
      transpose8(r);  // r[d]: step s0 + d of the 8 rows
      for (int d = 0; d < count; ++d) {
        const __m256i v = r[d];
        const __m256i even = squeeze(_mm256_and_si256(v, nibbles)),
                      odd = squeeze(_mm256_and_si256(_mm256_srli_epi32(v, 4), nibbles));
        _mm256_store_si256(reinterpret_cast<__m256i*>(data + (s0 + d) * 16 + 8 * h),
                           _mm256_or_si256(_mm256_slli_epi32(even, 16), odd));
      }
    }
  for (int64_t i = 0; i < 16; ++i) {
    const uint8_t* const sc = w.scale + (16 * panel + (i < rows ? i : 0)) * blocks;
    for (int64_t c = 0; c < blocks; ++c) scales[c * 16 + i] = sc[c];
  }
  return true;
}

bool gemv_tile_avx2(const Weight& w, const float* x, int64_t M, int64_t ldx, int64_t o0, int64_t stride, int64_t n,
                    float* y, int64_t ldy) {
  static_assert(gemv_avx2_tile_rows(1) <= 8 * kLanes, "a tile is at most eight groups");
  if (w.kind == Weight::Kind::kF32) return false;
  if (n > 4 * kLanes) return tile_rows<8>(w, x, M, ldx, o0, stride, n, y, ldy);
  if (n > 2 * kLanes) return tile_rows<4>(w, x, M, ldx, o0, stride, n, y, ldy);
  if (n > kLanes) return tile_rows<2>(w, x, M, ldx, o0, stride, n, y, ldy);
  return tile_rows<1>(w, x, M, ldx, o0, stride, n, y, ldy);
}

}  // namespace dsv4

#else

namespace dsv4 {

bool gemv_tile_avx2(const Weight&, const float*, int64_t, int64_t, int64_t, int64_t, int64_t, float*, int64_t) {
  return false;
}

bool pack_fp4_panel_avx2(const Weight&, int64_t, uint32_t*, uint8_t*) { return false; }

}  // namespace dsv4

#endif
