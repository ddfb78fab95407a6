// AVX-512 panel decoding: FP4 weights to fp32 panels and to bf16 pairs, FP8
// weights to bf16 pairs.
// Compiled with -mavx512f (CMakeLists.txt); Weight::dequant_panel(_pairs)
// calls it only when kernel_isa() is Isa::kAvx512 or later, the pair
// decoders (AVX512-BW and -VBMI through target attributes) only for
// Isa::kAvx512Bf16, which requires both, and the decoders from FP4/FP8
// panels wherever a weight has them (packed only where gemv_isa() is
// Isa::kAvx512Bf16). Like
// gemm_avx512.cc this file calls no inline function or template of another
// header: an out-of-line copy compiled here could be the one the linker
// keeps for the whole program.
//
// Why: next to the AVX-512 micro-kernel, decoding the FP4 expert panels on
// AVX2 costs about as much CPU as the products themselves. A zmm holds one
// value of each of a panel's 16 rows, so a panel row is
// one vector: a 16-entry vpermps table gives sign and magnitude of every
// code at once (the AVX2 path needs 5 more operations per 8 values to
// rebuild the sign and can only fill half a panel row).
#include "kernels/linear_avx512.h"

#include "core/bf16_simd.h"
#include "core/prefetch.h"
#include "kernels/gemm.h"

#ifdef __AVX512F__
#include <immintrin.h>

// GCC 12's AVX-512 intrinsics pass _mm512_undefined_*() (a self-initialised
// variable) as the unused merge operand, which -Wmaybe-uninitialized reports
// (or -Wuninitialized) once they are inlined here (GCC bug 105593, fixed in
// GCC 13).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace dsv4 {

namespace {

// The 16 panel rows [o0, o0 + 16), one per lane: where each row's data and
// scales start, and a lane mask of the rows before o_end (the others read row
// o0 instead, a real one, and are written as +0).
struct Rows16 {
  const uint8_t* data[16];
  const uint8_t* scale[16];
  __mmask16 keep = 0;
  int64_t row_bytes;
  // Scales: one row of scale_row_bytes per rows_per_scale_row weight rows.
  Rows16(const Weight& w, int64_t o0, int64_t o_end, int64_t row_bytes_, int64_t scale_row_bytes,
         int64_t rows_per_scale_row = 1)
      : row_bytes(row_bytes_) {
    for (int i = 0; i < 16; ++i) {
      const bool valid = o0 + i < o_end;
      const int64_t row = valid ? o0 + i : o0;
      if (valid) keep = __mmask16(keep | (1u << i));
      data[i] = w.data + row * row_bytes;
      scale[i] = w.scale + (row / rows_per_scale_row) * scale_row_bytes;
    }
  }
  // Dword j of bytes [byte, byte + 16) of every row: out[j] lane i = row i.
  void dwords4(int64_t byte, __m512 out[4]) const { transpose4(data, byte, out); }
  static void transpose4(const uint8_t* const* data, int64_t byte, __m512 out[4]) {
    __m512 z[4];
    // z[i]: rows i, i + 4, i + 8, i + 12 in the four 128-bit lanes.
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      z[i] = _mm512_castps128_ps512(_mm_loadu_ps(reinterpret_cast<const float*>(data[i] + byte)));
      z[i] = _mm512_insertf32x4(z[i], _mm_loadu_ps(reinterpret_cast<const float*>(data[i + 4] + byte)), 1);
      z[i] = _mm512_insertf32x4(z[i], _mm_loadu_ps(reinterpret_cast<const float*>(data[i + 8] + byte)), 2);
      z[i] = _mm512_insertf32x4(z[i], _mm_loadu_ps(reinterpret_cast<const float*>(data[i + 12] + byte)), 3);
    }
    // A 4×4 transpose of dwords in each 128-bit lane: lane q, slot i = row 4q + i.
    const __m512 t0 = _mm512_unpacklo_ps(z[0], z[1]), t1 = _mm512_unpackhi_ps(z[0], z[1]);
    const __m512 t2 = _mm512_unpacklo_ps(z[2], z[3]), t3 = _mm512_unpackhi_ps(z[2], z[3]);
    out[0] = _mm512_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
    out[1] = _mm512_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
    out[2] = _mm512_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
    out[3] = _mm512_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
  }
  // The next panel's rows (o0 + 16 .. o0 + 31) follow this panel's rows in
  // memory: 16 · row_bytes contiguous bytes. Decoding reads 16 rows at once,
  // 16 short streams (2 KB each at in = 4096) that the hardware prefetcher
  // follows poorly (the decoders' samples sat on their row loads); the next
  // panel is asked for in address order instead, a few lines per step
  // spread over this panel's `steps` steps: one stream, ahead of use. Into
  // L2 (T1): the panel is read only once the current one is done
  // (docs/PERFORMANCE_LOG.md, session 10, compares it with one line per row). A
  // prefetch never faults, so past the weight's end it costs only the
  // request.
  void prefetch_next_panel(int64_t step, int64_t steps) const {
    const int64_t lines = (16 * row_bytes + 63) / 64, per_step = (lines + steps - 1) / steps;
    const char* next = reinterpret_cast<const char*>(data[0] + 16 * row_bytes);
    const int64_t end = (step + 1) * per_step < lines ? (step + 1) * per_step : lines;
    for (int64_t l = step * per_step; l < end; ++l) prefetch_l2(next + 64 * l);
  }
  // The rows' e8m0 scale codes of block `col`, one per lane.
  __m512i scale_codes(int64_t col) const {
    alignas(64) int32_t e[16];
    for (int i = 0; i < 16; ++i) e[i] = scale[i][col];
    return _mm512_load_si512(e);
  }
  // Codes as fp32, as e8m0_to_f32 gives them (code 0 is 2^-127, an fp32
  // subnormal).
  static __m512 scale_values(__m512i v) {
    const __mmask16 zero = _mm512_cmpeq_epi32_mask(v, _mm512_setzero_si512());
    return _mm512_castsi512_ps(_mm512_mask_mov_epi32(_mm512_slli_epi32(v, 23), zero, _mm512_set1_epi32(0x00400000)));
  }
};

// The scale codes of blocks 0, 1, 2, … of the rows, one block after the
// other. Building a vector from 16 single bytes (Rows16::scale_codes) stalls
// on the store-to-load forward each block, and the FP4 decoders take a new
// block every 32 values. Here one 16-byte load per row serves 16 blocks,
// transposed like the codes.
class ScaleStream {
 public:
  ScaleStream(const Rows16& r, int64_t cols) : r_(r), cols_(cols) {}
  // Must be called for col = 0, 1, 2, … in turn.
  __m512i next(int64_t col) {
    const int64_t group = col - col % 16;
    if (group + 16 > cols_) return r_.scale_codes(col);  // a last partial group
    if (col == group) Rows16::transpose4(r_.scale, group, dwords_);
    return _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(dwords_[(col % 16) / 4]), int(8 * (col % 4))),
                            _mm512_set1_epi32(0xff));
  }

 private:
  const Rows16& r_;
  int64_t cols_;
  __m512 dwords_[4];
};

// The smallest and largest scale code of the kept rows (the pair decoders'
// exactness checks).
struct ScaleRange {
  __m512i lo = _mm512_set1_epi32(255), hi = _mm512_setzero_si512();
  void add(__m512i s, __mmask16 keep) {
    lo = _mm512_mask_min_epi32(lo, keep, lo, s);
    hi = _mm512_mask_max_epi32(hi, keep, hi, s);
  }
  int lowest() const { return _mm512_reduce_min_epi32(lo); }
  int highest() const { return _mm512_reduce_max_epi32(hi); }
};

// Pair dwords of two word indices: the high word from `high` (its bits
// 16-31), the low word from `low` (its bits 0-15).
inline __m512i join_words(__m512i high, __m512i low) {
  return _mm512_ternarylogic_epi32(_mm512_set1_epi32(0xffff), low, high, 0xca);  // (mask & low) | (~mask & high)
}

// The scale 2^(s-127) of each lane as an addend to the exponent field (bits
// 7-14) of both its bf16 words. Wrapping 16-bit adds keep the sign bit while
// the result's exponent stays in 1-254, which the decoders' checks ensure.
inline __m512i exponent_addend(__m512i s) {
  const __m512i e = _mm512_slli_epi32(_mm512_sub_epi32(s, _mm512_set1_epi32(127)), 7);
  return _mm512_ternarylogic_epi32(_mm512_slli_epi32(e, 16), e, _mm512_set1_epi32(0xffff), 0xf8);  // a | (b & c)
}

// x scaled: the addend added to every non-zero bf16 word (zeros stay zero).
__attribute__((target("avx512bw"))) inline __m512i scale_words(__m512i x, __m512i addend) {
  return _mm512_mask_add_epi16(x, _mm512_test_epi16_mask(x, _mm512_set1_epi16(0x7fff)), x, addend);
}

}  // namespace

void panel_fp4_avx512(const Weight& w, int64_t o0, int64_t o_end, float* panel) {
  static_assert(kGemmNR == 16, "one zmm lane per panel row");
  const Rows16 r(w, o0, o_end, w.row_bytes(), w.in / 32);
  // e2m1 codes 0-15: bit 3 the sign, bits 0-2 the magnitude (MODEL.md §2).
  const __m512 table = _mm512_setr_ps(0.f, .5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f, -0.f, -.5f, -1.f, -1.5f, -2.f, -3.f,
                                      -4.f, -6.f);
  ScaleStream scales(r, w.in / 32);
  for (int64_t k = 0; k < w.in; k += 32) {  // one scale block: 16 bytes of each row
    r.prefetch_next_panel(k / 32, w.in / 32);
    const __m512 scale = Rows16::scale_values(scales.next(k / 32));
    __m512 v[4];
    r.dwords4(k / 2, v);
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      const __m512i codes = _mm512_castps_si512(v[j]);
      // Nibble n of every lane is panel row k + 8j + n; vpermps reads the
      // low 4 bits of each index. The scale is a power of two: the product
      // is exact, as in dequant_row. Rows past o_end are written as +0.
#pragma GCC unroll 8
      for (int n = 0; n < 8; ++n) {
        const __m512 value = _mm512_permutexvar_ps(_mm512_srli_epi32(codes, 4 * n), table);
        _mm512_storeu_ps(panel + (k + 8 * j + n) * kGemmNR, _mm512_maskz_mul_ps(r.keep, value, scale));
      }
    }
  }
}

void panel_fp4_from_panels_avx512(const Weight& w, int64_t panel_index, float* panel) {
  static_assert(kGemmNR == 16, "one zmm lane per panel row");
  const __m512 table = _mm512_setr_ps(0.f, .5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f, -0.f, -.5f, -1.f, -1.5f, -2.f, -3.f,
                                      -4.f, -6.f);
  const int64_t steps = w.in / 8, blocks = w.in / 32;
  const uint32_t* const data = w.fp4_panels + panel_index * steps * kGemmNR;
  const uint8_t* const scale = w.fp4_panel_scales + panel_index * blocks * kGemmNR;
  for (int64_t c = 0; c < blocks; ++c) {
    const __m512 s = Rows16::scale_values(
        _mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(scale + c * kGemmNR))));
#pragma GCC unroll 4
    for (int64_t t = 4 * c; t < 4 * c + 4; ++t) {
      const __m512i codes = _mm512_load_si512(data + t * kGemmNR);
      // k = 8t + 2b in bits 16 + 4b of each lane, 8t + 2b + 1 in bits 4b;
      // vpermps reads the low 4 bits of each index. Exact products, as in
      // panel_fp4_avx512; rows past `out` have zero codes, so +0.
#pragma GCC unroll 4
      for (int b = 0; b < 4; ++b) {
        const __m512 even = _mm512_permutexvar_ps(_mm512_srli_epi32(codes, unsigned(16 + 4 * b)), table);
        const __m512 odd = _mm512_permutexvar_ps(_mm512_srli_epi32(codes, unsigned(4 * b)), table);
        _mm512_storeu_ps(panel + (8 * t + 2 * b) * kGemmNR, _mm512_mul_ps(even, s));
        _mm512_storeu_ps(panel + (8 * t + 2 * b + 1) * kGemmNR, _mm512_mul_ps(odd, s));
      }
    }
  }
}

namespace {

// bf16 bits of the e2m1 codes, twice: vpermw reads the low 5 bits of each
// word index, and bit 4 is whatever bit follows the code.
inline __m512i fp4_pair_table() {
  return _mm512_set_epi16(short(0xc0c0), short(0xc080), short(0xc040), short(0xc000), short(0xbfc0), short(0xbf80),
                          short(0xbf00), short(0x8000), 0x40c0, 0x4080, 0x4040, 0x4000, 0x3fc0, 0x3f80, 0x3f00, 0x0000,
                          short(0xc0c0), short(0xc080), short(0xc040), short(0xc000), short(0xbfc0), short(0xbf80),
                          short(0xbf00), short(0x8000), 0x40c0, 0x4080, 0x4040, 0x4000, 0x3fc0, 0x3f80, 0x3f00,
                          0x0000);
}

// The FP4 pair decoder's loop; kFull: all 16 rows are kept (no masking).
// Needs AVX512-BW (vpermw, word masks) and AVX512-VBMI (vpmultishiftqb),
// which cpu_has(Isa::kAvx512Bf16) checks.
template <bool kFull>
__attribute__((target("avx512bw,avx512vbmi"))) void fp4_pairs_loop(const Rows16& r, int64_t in, uint32_t* pairs,
                                                                    ScaleRange& range) {
  const __m512i table = fp4_pair_table();
  // Byte b of a lane holds codes 2b (low nibble) and 2b + 1 (high nibble)
  // of the lane's 8; the pair wants code 2b's index in its high word and
  // code 2b + 1's in its low word. vpmultishiftqb copies, into each byte,
  // the 8 bits of its qword (two lanes) at the offset its control byte
  // names: one instruction builds all 32 word indices of a pair vector.
  __m512i index_of[4];
#pragma GCC unroll 4
  for (int b = 0; b < 4; ++b)
    index_of[b] = _mm512_set1_epi64(int64_t(uint64_t(8 * b + 4) | uint64_t(8 * b) << 16 |
                                            uint64_t(32 + 8 * b + 4) << 32 | uint64_t(32 + 8 * b) << 48));
  ScaleStream scales(r, in / 32);
  for (int64_t k = 0; k < in; k += 32) {
    r.prefetch_next_panel(k / 32, in / 32);
    const __m512i s = scales.next(k / 32);
    range.add(s, r.keep);
    const __m512i addend = exponent_addend(s);
    __m512 v[4];
    r.dwords4(k / 2, v);
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      const __m512i codes = _mm512_castps_si512(v[j]);  // codes k + 8j .. k + 8j + 7 of each row
#pragma GCC unroll 4
      for (int b = 0; b < 4; ++b) {
        const __m512i index = _mm512_multishift_epi64_epi8(index_of[b], codes);
        __m512i pair = scale_words(_mm512_permutexvar_epi16(index, table), addend);
        if constexpr (!kFull) pair = _mm512_maskz_mov_epi32(r.keep, pair);
        _mm512_storeu_si512(pairs + ((k + 8 * j + 2 * b) / 2) * kGemmNR, pair);
      }
    }
  }
}

// The same pairs from panel `panel` of w's FP4 panels (Weight::fp4_panels),
// all of whose rows are kept (rows past `out` are zero codes): a step is one
// load, and word shifts by 0, 4, 8, 12 bring pair b's codes to the bottom
// of their words.
__attribute__((target("avx512bw"))) void fp4_pairs_from_panel(const Weight& w, int64_t panel, uint32_t* pairs,
                                                               ScaleRange& range) {
  const __m512i table = fp4_pair_table();
  const int64_t steps = w.in / 8, blocks = w.in / 32;
  const uint32_t* const data = w.fp4_panels + panel * steps * kGemmNR;
  const uint8_t* const scale = w.fp4_panel_scales + panel * blocks * kGemmNR;
  for (int64_t c = 0; c < blocks; ++c) {
    const __m512i s = _mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(scale + c * kGemmNR)));
    range.add(s, __mmask16(0xffff));
    const __m512i addend = exponent_addend(s);
#pragma GCC unroll 4
    for (int64_t t = 4 * c; t < 4 * c + 4; ++t) {
      const __m512i codes = _mm512_load_si512(data + t * kGemmNR);
#pragma GCC unroll 4
      for (int b = 0; b < 4; ++b) {
        const __m512i index = b == 0 ? codes : _mm512_srli_epi16(codes, unsigned(4 * b));
        _mm512_storeu_si512(pairs + (4 * t + b) * kGemmNR,
                            scale_words(_mm512_permutexvar_epi16(index, table), addend));
      }
    }
  }
}

}  // namespace

bool panel_fp4_pairs_avx512(const Weight& w, int64_t o0, int64_t o_end, uint32_t* pairs, int* min_exponent) {
  static_assert(kGemmNR == 16, "one zmm lane per panel row");
  ScaleRange range;
  if (w.fp4_panels && o0 % 16 == 0 && std::min(o0 + 16, w.out) <= o_end) {
    fp4_pairs_from_panel(w, o0 / 16, pairs, range);
  } else {
    const Rows16 r(w, o0, o_end, w.row_bytes(), w.in / 32);
    if (r.keep == 0xffff)
      fp4_pairs_loop<true>(r, w.in, pairs, range);
    else
      fp4_pairs_loop<false>(r, w.in, pairs, range);
  }
  // Codes 2-252 keep every value normal and finite: 0.5 · 2^(2-127) =
  // 2^-126, 6 · 2^(252-127) < 2^128. The smallest non-zero magnitude, 0.5,
  // gives the smallest exponent: s - 1 biased.
  const int lowest = range.lowest(), highest = range.highest();
  *min_exponent = lowest - 1;
  return lowest >= 2 && highest <= 252;
}

namespace {

// bf16 bits of the e4m3 magnitudes, codes 0-127 (MODEL.md §2): exponent
// field e, mantissa m; e = 0 is m · 2^-9, else (1 + m/8) · 2^(e-7). Code 127
// is NaN; the decoder refuses a panel that holds it.
struct E4m3Bf16Table {
  alignas(64) uint16_t bits[128];
  constexpr E4m3Bf16Table() : bits() {
    for (int c = 0; c < 128; ++c) {
      const int e = c >> 3, m = c & 7;
      if (e > 0) {
        bits[c] = uint16_t(((e + 120) << 7) | (m << 4));
      } else if (m > 0) {  // m · 2^-9: normalise the mantissa
        int p = 2;
        while (!(m >> p)) --p;  // m = 2^p + rest
        bits[c] = uint16_t(((p - 9 + 127) << 7) | (((m - (1 << p)) << (7 - p)) & 0x7f));
      }
    }
  }
};
constexpr E4m3Bf16Table kE4m3Bf16;

}  // namespace

// Needs AVX512-BW (vpermi2w, word masks), as the FP4 pair decoder.
__attribute__((target("avx512bw"))) bool panel_fp8_pairs_avx512(const Weight& w, int64_t o0, int64_t o_end,
                                                                  uint32_t* pairs, int* min_exponent) {
  static_assert(kGemmNR == 16, "one zmm lane per panel row");
  const int64_t B = w.block;
  if (w.in % 16 != 0 || B % 16 != 0) return false;  // 16 codes of a row at a time, in one scale block
  const Rows16 r(w, o0, o_end, w.in, (w.in + B - 1) / B, B);
  // Each word looks its code's magnitude up in the 128-entry table (two
  // 64-entry vpermi2w, chosen by bit 6; the index's higher bits are
  // ignored), then adds the power-of-two scale to the exponent field of a
  // non-zero value and takes the sign from bit 7: exact while the result is
  // normal, as the checks below make sure.
  const __m512i t0 = _mm512_load_si512(kE4m3Bf16.bits), t1 = _mm512_load_si512(kE4m3Bf16.bits + 32);
  const __m512i t2 = _mm512_load_si512(kE4m3Bf16.bits + 64), t3 = _mm512_load_si512(kE4m3Bf16.bits + 96);
  const __m512i bit6 = _mm512_set1_epi16(0x40), sign = _mm512_set1_epi16(short(0x8000));
  const __m512i nan_bytes = _mm512_set1_epi8(0x7f);
  // Bytes of the kept rows (4 per lane) for the NaN check.
  __mmask64 keep_bytes = 0;
  for (int i = 0; i < 16; ++i)
    if (r.keep >> i & 1) keep_bytes |= __mmask64(0xf) << (4 * i);
  ScaleRange range;
  __m512i addend = _mm512_setzero_si512();
  __mmask64 nan = 0;
  for (int64_t k = 0; k < w.in; k += 16) {
    r.prefetch_next_panel(k / 16, w.in / 16);
    if (k % B == 0) {
      const __m512i s = r.scale_codes(k / B);
      range.add(s, r.keep);
      addend = exponent_addend(s);
    }
    __m512 v[4];
    r.dwords4(k, v);
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      const __m512i codes = _mm512_castps_si512(v[j]);  // codes k + 4j .. k + 4j + 3 of each row
      nan |= _mm512_mask_cmpeq_epi8_mask(keep_bytes, _mm512_and_si512(codes, nan_bytes), nan_bytes);
      // Pair 0: code 0 in the high word, code 1 in the low one; pair 1: 2, 3.
      const __m512i idx[2] = {join_words(_mm512_slli_epi32(codes, 16), _mm512_srli_epi32(codes, 8)),
                              join_words(codes, _mm512_srli_epi32(codes, 24))};
#pragma GCC unroll 2
      for (int p = 0; p < 2; ++p) {
        __m512i x = _mm512_mask_blend_epi16(_mm512_test_epi16_mask(idx[p], bit6),
                                            _mm512_permutex2var_epi16(t0, idx[p], t1),
                                            _mm512_permutex2var_epi16(t2, idx[p], t3));
        x = scale_words(x, addend);
        x = _mm512_ternarylogic_epi32(x, _mm512_slli_epi16(idx[p], 8), sign, 0xf8);  // x | (idx << 8 & sign)
        _mm512_storeu_si512(pairs + ((k + 4 * j) / 2 + p) * kGemmNR, _mm512_maskz_mov_epi32(r.keep, x));
      }
    }
  }
  // Codes 10-246 keep every value normal and finite: the smallest non-zero
  // e4m3 value 2^-9 times 2^(10-127) is 2^-126; 448 · 2^(246-127) < 2^128.
  const int lowest = range.lowest(), highest = range.highest();
  *min_exponent = lowest - 9;
  return nan == 0 && lowest >= 10 && highest <= 246;
}

void spread_panel_pairs_avx512(int64_t kp, float* panel) {
  static_assert(kGemmNR == 16, "one zmm lane per panel row");
  for (int64_t j = kp - 1; j >= 0; --j) {
    const __m512i pair = _mm512_loadu_si512(panel + 16 * j);
    _mm512_storeu_ps(panel + 32 * j, bf16_high(pair));
    _mm512_storeu_ps(panel + 32 * j + 16, bf16_low(pair));
  }
}

}  // namespace dsv4
#endif
