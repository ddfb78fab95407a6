#include "kernels/linear.h"

#include <algorithm>
#include <array>
#include <cstring>

#include "core/arith.h"
#include "core/bf16_simd.h"
#include "core/cpu.h"
#include "core/formats.h"
#include "core/scratch.h"
#include "core/thread_pool.h"
#include "kernels/gemm.h"
#include "kernels/gemv.h"
#include "kernels/gemv_avx512.h"
#include "kernels/linear_avx512.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace dsv4 {

int64_t Weight::row_bytes() const {
  switch (kind) {
    case Kind::kFP8: return in;
    case Kind::kFP4: return in / 2;
    case Kind::kBF16: return 2 * in;
    case Kind::kF32: break;
  }
  return 4 * in;
}

void Weight::dequant_row(int64_t o, float* dst) const {
  switch (kind) {
    case Kind::kF32: {
      std::memcpy(dst, data + 4 * o * in, size_t(in) * 4);
      break;
    }
    case Kind::kBF16: {
      const uint8_t* r = data + 2 * o * in;  // mapped data need not be 2-byte aligned
      for (int64_t i = 0; i < in; ++i) {
        uint16_t h;
        std::memcpy(&h, r + 2 * i, 2);
        dst[i] = bf16_to_f32(h);
      }
      break;
    }
    case Kind::kFP8: {
      const float* lut = e4m3_table();
      const uint8_t* r = data + o * in;
      int64_t scols = ceil_div<int64_t>(in, block);
      const uint8_t* srow = scale + (o / block) * scols;
      for (int64_t b = 0; b < scols; ++b) {
        float s = e8m0_to_f32(srow[b]);
        int64_t i1 = std::min(in, (b + 1) * block);
        for (int64_t i = b * block; i < i1; ++i) dst[i] = lut[r[i]] * s;
      }
      break;
    }
    case Kind::kFP4: {
      // One table lookup per byte gives both values (low nibble: even index).
      static const std::array<std::array<float, 2>, 256> pairs = [] {
        std::array<std::array<float, 2>, 256> t{};
        for (int b = 0; b < 256; ++b) t[size_t(b)] = {e2m1_to_f32(uint8_t(b & 15)), e2m1_to_f32(uint8_t(b >> 4))};
        return t;
      }();
      const uint8_t* r = data + o * (in / 2);
      const uint8_t* srow = scale + o * (in / 32);
      for (int64_t b = 0; b < in / 32; ++b) {
        const float s = e8m0_to_f32(srow[b]);  // a power of two: the products are exact
        for (int64_t j = 0; j < 16; ++j) {
          const auto& v = pairs[r[b * 16 + j]];
          dst[b * 32 + 2 * j] = v[0] * s;
          dst[b * 32 + 2 * j + 1] = v[1] * s;
        }
      }
      break;
    }
  }
}

void Weight::dequant_panel_reference(int64_t o0, int64_t o_end, float* panel) const {
  float* const row = workspace<float>(Buf::kPanelRow, size_t(in));
  for (int j = 0; j < kGemmNR; ++j) {
    const int64_t o = o0 + j;
    if (o < o_end) {
      dequant_row(o, row);
      for (int64_t k = 0; k < in; ++k) panel[k * kGemmNR + j] = row[k];
    } else {
      for (int64_t k = 0; k < in; ++k) panel[k * kGemmNR + j] = 0.f;
    }
  }
}

#if defined(__AVX2__) && defined(__FMA__)
namespace {

// e8m0 codes, one per lane, as e8m0_to_f32 gives them (0: 2^-127).
inline __m256 e8m0_values(__m256i e) {
  const __m256i zero = _mm256_cmpeq_epi32(e, _mm256_setzero_si256());
  return _mm256_castsi256_ps(_mm256_blendv_epi8(_mm256_slli_epi32(e, 23), _mm256_set1_epi32(0x00400000), zero));
}

// Eight weight rows [first, first + 8) read side by side, one per lane:
// where each row's data and scales start, and a lane mask that zeroes rows at
// or past o_end (those lanes read row `valid`, a real one, instead).
struct Rows8 {
  const uint8_t* data[8];
  const uint8_t* scale[8];
  __m256 keep;
  Rows8(const Weight& w, int64_t first, int64_t o_end, int64_t row_bytes, int64_t scale_row_bytes,
        int64_t rows_per_scale_row, int64_t valid) {
    alignas(32) int32_t k[8];
    for (int i = 0; i < 8; ++i) {
      const int64_t row = first + i < o_end ? first + i : valid;
      k[i] = first + i < o_end ? -1 : 0;
      data[i] = w.data + row * row_bytes;
      scale[i] = w.scale + (row / rows_per_scale_row) * scale_row_bytes;
    }
    keep = _mm256_castsi256_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(k)));
  }
  // Dword j of bytes [byte, byte + 16) of every row: out[j] lane i = row i.
  void dwords4(int64_t byte, __m256i out[4]) const {
    __m256 y[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i)
      y[i] = _mm256_insertf128_ps(
          _mm256_castps128_ps256(_mm_loadu_ps(reinterpret_cast<const float*>(data[i] + byte))),
          _mm_loadu_ps(reinterpret_cast<const float*>(data[i + 4] + byte)), 1);
    // A 4×4 transpose of dwords in each 128-bit half: rows 0-3 low, 4-7 high.
    const __m256 t0 = _mm256_unpacklo_ps(y[0], y[1]), t1 = _mm256_unpackhi_ps(y[0], y[1]);
    const __m256 t2 = _mm256_unpacklo_ps(y[2], y[3]), t3 = _mm256_unpackhi_ps(y[2], y[3]);
    out[0] = _mm256_castps_si256(_mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0)));
    out[1] = _mm256_castps_si256(_mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2)));
    out[2] = _mm256_castps_si256(_mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0)));
    out[3] = _mm256_castps_si256(_mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2)));
  }
  // The eight rows' e8m0 scales of block `col`, as e8m0_to_f32 gives them.
  __m256 scales(int64_t col) const {
    return e8m0_values(_mm256_setr_epi32(scale[0][col], scale[1][col], scale[2][col], scale[3][col], scale[4][col],
                                         scale[5][col], scale[6][col], scale[7][col]));
  }
};

// Writes 8 values (one per row) to the panel, zeroing the rows past the end.
template <bool kFull>
inline void put8(float* dst, __m256 v, const Rows8& r) {
  _mm256_storeu_ps(dst, kFull ? v : _mm256_and_ps(v, r.keep));
}

// The panel is written a 64-byte line of each weight row at a time, first
// for rows 0-7, then 8-15: rows `in` bytes apart share L1 sets (4 KB
// aliasing at in = 4096), and 16 rows read step by step would evict each
// other's lines before they were used up; the panel lines written meanwhile
// (a few KB) stay in L1 for the second half.
//
// FP4 needs no per-value transpose: with 4 bytes (8 values) of each of 8 rows
// in one register, nibble n of every lane is panel row k + n. Magnitude from
// the 8 positive codes (vpermps reads the low 3 bits), sign from bit 3 moved
// to bit 31, times the row's power-of-two scale (exact, as in dequant_row).
template <bool kFull>
void panel_fp4_rows16(const Weight& w, const Rows8 (&r)[2], float* panel) {
  const __m256 mags = _mm256_setr_ps(0.f, .5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f);
  const __m256 signbit = _mm256_castsi256_ps(_mm256_set1_epi32(int32_t(0x80000000u)));
  for (int64_t k0 = 0; k0 < w.in; k0 += 128)
    for (int h = 0; h < 2; ++h)
      for (int64_t k = k0; k < std::min(w.in, k0 + 128); k += 32) {
        const __m256 scale = r[h].scales(k / 32);
        __m256i v[4];
        r[h].dwords4(k / 2, v);
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j)
#pragma GCC unroll 8
          for (int n = 0; n < 8; ++n) {
            const __m256 mag = _mm256_permutevar8x32_ps(mags, _mm256_srli_epi32(v[j], 4 * n));
            const __m256 sign = _mm256_and_ps(_mm256_castsi256_ps(_mm256_slli_epi32(v[j], 28 - 4 * n)), signbit);
            put8<kFull>(panel + (k + 8 * j + n) * kGemmNR + 8 * h, _mm256_mul_ps(_mm256_or_ps(mag, sign), scale), r[h]);
          }
      }
}

// FP8 the same way, 4 codes per lane. e4m3 is decoded from its bits: exponent
// and mantissa moved into an fp32's (bits 20-26) read as a float are the
// value times 2^-120 for every code, subnormals included (they become fp32
// subnormals), so one exact multiply by 2^120 gives it. The two NaN codes
// (0x7f, 0xff) take the table's NaNs; they are looked for once per 16 codes
// of the 8 rows, and only such a step pays for the blend.
template <bool kFull, bool kNaN>
inline void fp8_step(const __m256i (&v)[4], __m256 scale, const Rows8& r, float* dst) {
  const __m256i em = _mm256_set1_epi32(0x7f << 20), sm = _mm256_set1_epi32(int32_t(0x80000000u));
  const __m256 p120 = _mm256_set1_ps(0x1p120f);
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j)
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      // Byte i: bits 0-6 to 20-26, bit 7 to 31.
      const __m256i e = _mm256_and_si256(i <= 2 ? _mm256_slli_epi32(v[j], 20 - 8 * i) : _mm256_srli_epi32(v[j], 4), em);
      const __m256i sgn = _mm256_and_si256(_mm256_slli_epi32(v[j], 24 - 8 * i), sm);
      __m256 y = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_or_si256(e, sgn)), p120);
      if constexpr (kNaN) {
        const __m256 nan = _mm256_blendv_ps(_mm256_set1_ps(e4m3_table()[0x7f]), _mm256_set1_ps(e4m3_table()[0xff]),
                                            _mm256_castsi256_ps(sgn));
        y = _mm256_blendv_ps(y, nan, _mm256_castsi256_ps(_mm256_cmpeq_epi32(e, em)));
      }
      put8<kFull>(dst + (4 * j + i) * kGemmNR, _mm256_mul_ps(y, scale), r);
    }
}

template <bool kFull>
void panel_fp8_rows16(const Weight& w, const Rows8 (&r)[2], float* panel) {
  const int64_t B = w.block;
  const __m256i ones = _mm256_set1_epi8(-1), top = _mm256_set1_epi8(char(0x80));
  for (int64_t k0 = 0; k0 < w.in; k0 += 64)
    for (int h = 0; h < 2; ++h) {
      __m256 scale = r[h].scales(k0 / B);
      for (int64_t k = k0; k < std::min(w.in, k0 + 64); k += 16) {
        if (k != k0 && k % B == 0) scale = r[h].scales(k / B);
        __m256i v[4], nan = _mm256_setzero_si256();
        r[h].dwords4(k, v);
        for (int j = 0; j < 4; ++j) nan = _mm256_or_si256(nan, _mm256_cmpeq_epi8(_mm256_or_si256(v[j], top), ones));
        float* dst = panel + k * kGemmNR + 8 * h;
        if (_mm256_testz_si256(nan, nan))
          fp8_step<kFull, false>(v, scale, r[h], dst);
        else
          fp8_step<kFull, true>(v, scale, r[h], dst);
      }
    }
}

// F32 and BF16 the same way, with no scales: kPerDword values to a dword,
// so a 64-byte line of a row holds 16 · kPerDword of them. F32 (1): dword j
// is value k + j. BF16 (2): dword j is values k + 2j and k + 2j + 1, the low
// half moved up the first, the high half with the low one cleared the second.
template <bool kFull, int kPerDword>
void panel_plain_rows16(const Weight& w, const Rows8 (&r)[2], float* panel) {
  constexpr int64_t kLine = 16 * kPerDword, kStep = 4 * kPerDword;  // values in 64 bytes, in 16 (dwords4)
  for (int64_t k0 = 0; k0 < w.in; k0 += kLine)
    for (int h = 0; h < 2; ++h)
      for (int64_t k = k0; k < std::min(w.in, k0 + kLine); k += kStep) {
        __m256i v[4];
        r[h].dwords4(k * (4 / kPerDword), v);
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
          float* dst = panel + (k + kPerDword * j) * kGemmNR + 8 * h;
          if constexpr (kPerDword == 1) {
            put8<kFull>(dst, _mm256_castsi256_ps(v[j]), r[h]);
          } else {
            put8<kFull>(dst, bf16_low(v[j]), r[h]);
            put8<kFull>(dst + kGemmNR, bf16_high(v[j]), r[h]);
          }
        }
      }
}

// F32 (kPerDword 1) or BF16 (2) rows [o0, o0 + 16) to the panel.
template <int kPerDword>
void panel_plain(const Weight& w, int64_t o0, int64_t o_end, float* panel) {
  const int64_t row_bytes = w.row_bytes();
  const Rows8 r[2] = {Rows8(w, o0, o_end, row_bytes, 0, 1, o0), Rows8(w, o0 + 8, o_end, row_bytes, 0, 1, o0)};
  if (o0 + 16 <= o_end)
    panel_plain_rows16<true, kPerDword>(w, r, panel);
  else
    panel_plain_rows16<false, kPerDword>(w, r, panel);
}

// The same panel from w's FP4 panels (Weight::fp4_panels), which hold it
// as it lies, 8 values of each row a dword: where the AVX2 GEMV tiles read
// them (gemv.h pack_quant_panels), the rows' pages were let go, and reading
// them here would page them in beside the panels. In a lane's dword, k =
// 8s + 2b + 1 is nibble b and 8s + 2b nibble 4 + b; rows past `out` have
// zero codes, so +0.
void panel_fp4_from_panels(const Weight& w, int64_t panel_index, float* panel) {
  const __m256 mags = _mm256_setr_ps(0.f, .5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f);
  const __m256 signbit = _mm256_castsi256_ps(_mm256_set1_epi32(int32_t(0x80000000u)));
  const int64_t steps = w.in / 8, blocks = w.in / 32;
  const uint32_t* const data = w.fp4_panels + panel_index * steps * kGemmNR;
  const uint8_t* const scale = w.fp4_panel_scales + panel_index * blocks * kGemmNR;
  for (int64_t c = 0; c < blocks; ++c)
    for (int h = 0; h < 2; ++h) {
      const __m256 s = e8m0_values(
          _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(scale + c * kGemmNR + 8 * h))));
#pragma GCC unroll 4
      for (int64_t t = 4 * c; t < 4 * c + 4; ++t) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(data + t * kGemmNR + 8 * h));
#pragma GCC unroll 8
        for (int n = 0; n < 8; ++n) {
          const int nib = n % 2 ? n / 2 : 4 + n / 2;
          const __m256 mag = _mm256_permutevar8x32_ps(mags, _mm256_srli_epi32(v, 4 * nib));
          const __m256 sign = _mm256_and_ps(_mm256_castsi256_ps(_mm256_slli_epi32(v, 28 - 4 * nib)), signbit);
          _mm256_storeu_ps(panel + (8 * t + n) * kGemmNR + 8 * h, _mm256_mul_ps(_mm256_or_ps(mag, sign), s));
        }
      }
    }
}

void panel_fp4(const Weight& w, int64_t o0, int64_t o_end, float* panel) {
  if (w.fp4_panels && o0 % kGemmNR == 0 && std::min(o0 + kGemmNR, w.out) <= o_end)
    return panel_fp4_from_panels(w, o0 / kGemmNR, panel);
  const Rows8 r[2] = {Rows8(w, o0, o_end, w.row_bytes(), w.in / 32, 1, o0),
                      Rows8(w, o0 + 8, o_end, w.row_bytes(), w.in / 32, 1, o0)};
  if (o0 + 16 <= o_end)
    panel_fp4_rows16<true>(w, r, panel);
  else
    panel_fp4_rows16<false>(w, r, panel);
}

#ifdef DSV4_HAVE_AVX512_KERNELS
// A panel of an FP4 or FP8 weight repacked for gemv's vdpbf16ps tiles
// (pack_quant_panels), from those panels. Where gemv_isa() runs the tiles
// and the gemm runs fp32 kernels (the Xeon of core/cpu.h), reading the rows
// instead would page them in beside the panels: twice the expert weights,
// more than a Flash-sized model leaves. FP4 is decoded as from the rows;
// FP8 as the bf16 pairs of the vdpbf16ps gemm, then the two fp32 values
// each pair holds (bf16 values, so exactly the rows' values). False, with
// the panel to be written again, where the panels do not cover these rows
// or an FP8 scale would put a value outside bf16's normal range.
bool panel_from_quant_panels(const Weight& w, int64_t o0, int64_t o_end, float* panel) {
  if ((!w.fp4_panels && !w.fp8_panels) || o0 % 16 != 0 || std::min(o0 + 16, w.out) > o_end) return false;
  if (w.fp4_panels) {
    panel_fp4_from_panels_avx512(w, o0 / 16, panel);
    return true;
  }
#ifdef DSV4_HAVE_AVX512BF16_KERNELS
  int min_exponent = 0;
  if (fp8_panel_pairs_avx512bf16(w, o0 / 16, reinterpret_cast<uint32_t*>(panel), &min_exponent)) {
    spread_panel_pairs_avx512(w.in / 2, panel);
    return true;
  }
#endif
  return false;
}
#endif

void panel_fp8(const Weight& w, int64_t o0, int64_t o_end, float* panel) {
  const int64_t scols = ceil_div<int64_t>(w.in, w.block);
  const Rows8 r[2] = {Rows8(w, o0, o_end, w.in, scols, w.block, o0), Rows8(w, o0 + 8, o_end, w.in, scols, w.block, o0)};
  if (o0 + 16 <= o_end)
    panel_fp8_rows16<true>(w, r, panel);
  else
    panel_fp8_rows16<false>(w, r, panel);
}

}  // namespace

bool Weight::dequant_panel_pairs(int64_t o0, int64_t o_end, uint32_t* pairs, int* min_exponent) const {
#ifdef DSV4_HAVE_AVX512_KERNELS
  if (kernel_isa() == Isa::kAvx512Bf16) {
    if (kind == Kind::kFP4) return panel_fp4_pairs_avx512(*this, o0, o_end, pairs, min_exponent);
    if (kind == Kind::kFP8) {
#ifdef DSV4_HAVE_AVX512BF16_KERNELS
      if (fp8_panels && o0 % 16 == 0 && std::min(o0 + 16, out) <= o_end)
        return fp8_panel_pairs_avx512bf16(*this, o0 / 16, pairs, min_exponent);
#endif
      return panel_fp8_pairs_avx512(*this, o0, o_end, pairs, min_exponent);
    }
  }
#endif
  (void)o0, (void)o_end, (void)pairs, (void)min_exponent;
  return false;
}

void Weight::dequant_panel(int64_t o0, int64_t o_end, float* panel) const {
  // The 8-wide paths read rows 16 bytes at a time: whole groups of 4 or 8
  // values (F32, BF16), 32 (FP4, its scale block) or 16 inside one scale block (FP8).
  if (in % 8 != 0 || (kind == Kind::kFP8 && (in % 16 != 0 || block % 16 != 0)))
    return dequant_panel_reference(o0, o_end, panel);
#ifdef DSV4_HAVE_AVX512_KERNELS
  // (Panels packed for the vdpbf16ps tiles, read by AVX-512 code: not where
  // every kernel runs AVX2, which takes FP4 panels in panel_fp4.)
  if ((kernel_isa() >= Isa::kAvx512 || gemv_isa() >= Isa::kAvx512) && panel_from_quant_panels(*this, o0, o_end, panel))
    return;
  if (kind == Kind::kFP4 && kernel_isa() >= Isa::kAvx512) return panel_fp4_avx512(*this, o0, o_end, panel);
#endif
  switch (kind) {
    case Kind::kF32: return panel_plain<1>(*this, o0, o_end, panel);
    case Kind::kBF16: return panel_plain<2>(*this, o0, o_end, panel);
    case Kind::kFP8: return panel_fp8(*this, o0, o_end, panel);
    case Kind::kFP4: return panel_fp4(*this, o0, o_end, panel);
  }
}
#else
void Weight::dequant_panel(int64_t o0, int64_t o_end, float* panel) const {
  dequant_panel_reference(o0, o_end, panel);
}
#endif

LinearOpts quant_linear_opts(int act_block, bool pow2) {
  LinearOpts o;
  o.act_quant = true;
  o.act_block = act_block;
  o.act_pow2 = pow2;
  o.out_bf16 = true;
  return o;
}

void act_quant_rows(const float* x, int64_t M, int64_t K, int64_t ldx, const LinearOpts& opts, float* out) {
  parallel_for_each(M, [&](int64_t m) {
    std::copy(x + m * ldx, x + m * ldx + K, out + m * K);
    q8_inplace(out + m * K, size_t(K), size_t(opts.act_block), opts.act_pow2);
  });
}

void linear(const Weight& w, const float* x, int64_t M, float* y, const LinearOpts& opts, int64_t row_begin,
            int64_t row_end, int64_t ldx, int64_t ldy) {
  if (row_end < 0) row_end = w.out;
  if (ldx < 0) ldx = w.in;
  if (ldy < 0) ldy = row_end - row_begin;
  const int64_t K = w.in;
  if (opts.act_quant) {
    float* const xq = workspace<float>(Buf::kLinearInput, size_t(M * K));
    act_quant_rows(x, M, K, ldx, opts, xq);
    x = xq;
    ldx = K;
  }
  // A few rows (decode): the weight streamed once, decoded in registers into
  // the same chains; it declines the rare weight it cannot decode exactly.
  if (gemv_available(w, M) && gemv(w, x, M, ldx, y, ldy, opts.out_bf16, row_begin, row_end)) return;
  // Panels of 16 weight rows are dequantised on the fly; gemm fixes the
  // reduction order (one FMA chain per output, ascending k).
  const int64_t rows = row_end - row_begin;
  auto load = [&](int64_t n0, float* panel) { w.dequant_panel(row_begin + n0, row_end, panel); };
  // For the BF16 kernel, formats with a pair decoder (FP4, FP8) skip the
  // fp32 panel.
  const PairLoader load_pairs = [&](int64_t n0, uint32_t* pairs, int* min_exponent) {
    return w.dequant_panel_pairs(row_begin + n0, row_end, pairs, min_exponent);
  };
  gemm(x, ldx, M, K, rows, load, GemmOut{y, ldy, opts.out_bf16}, true, &load_pairs);
}

}  // namespace dsv4
