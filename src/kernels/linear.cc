#include "kernels/linear.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/formats.h"
#include "core/thread_pool.h"
#include "kernels/gemm.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace dsv4 {

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
      int64_t scols = (in + block - 1) / block;
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
  thread_local std::vector<float> row;
  row.resize(size_t(in));
  for (int j = 0; j < kGemmNR; ++j) {
    const int64_t o = o0 + j;
    if (o < o_end) {
      dequant_row(o, row.data());
      for (int64_t k = 0; k < in; ++k) panel[k * kGemmNR + j] = row[size_t(k)];
    } else {
      for (int64_t k = 0; k < in; ++k) panel[k * kGemmNR + j] = 0.f;
    }
  }
}

#if defined(__AVX2__) && defined(__FMA__)
namespace {

// r[i] holds row i, k0..k0+7; afterwards r[i] holds k0 + i, rows 0..7.
inline void transpose8(__m256 r[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int h = 0; h < 2; ++h) {
    const int b = 4 * h;
    u[b + 0] = _mm256_shuffle_ps(t[b + 0], t[b + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[b + 1] = _mm256_shuffle_ps(t[b + 0], t[b + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[b + 2] = _mm256_shuffle_ps(t[b + 1], t[b + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[b + 3] = _mm256_shuffle_ps(t[b + 1], t[b + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

// Values k..k+7 of row o, dequantised exactly as dequant_row does.
template <Weight::Kind kKind>
inline __m256 load8(const Weight& w, int64_t o, int64_t k) {
  if constexpr (kKind == Weight::Kind::kF32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(w.data + 4 * (o * w.in + k)));
  } else if constexpr (kKind == Weight::Kind::kBF16) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.data + 2 * (o * w.in + k)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else {
    static_assert(kKind == Weight::Kind::kBF16, "row-wise formats: F32, BF16");
  }
}

// Row-wise formats: 8 values of each of 8 rows, transposed in registers.
template <Weight::Kind kKind>
void panel_rows8(const Weight& w, int64_t o0, int64_t o_end, float* panel) {
  for (int h = 0; h < 2; ++h)
    for (int64_t k = 0; k < w.in; k += 8) {
      __m256 r[8];
      for (int i = 0; i < 8; ++i) {
        const int64_t o = o0 + 8 * h + i;
        r[i] = o < o_end ? load8<kKind>(w, o, k) : _mm256_setzero_ps();
      }
      transpose8(r);
      for (int i = 0; i < 8; ++i) _mm256_storeu_ps(panel + (k + i) * kGemmNR + 8 * h, r[i]);
    }
}

// The 8 weight rows [first, first + 8) seen by one gather: byte offsets from
// row `base` (rows of row_bytes), a lane mask that zeroes rows at or past
// o_end, and the row each lane reads, data and scales: `base`, a valid row,
// stands in for the masked ones.
struct Rows8 {
  __m256i off;
  __m256 keep;
  int64_t row[8];
  Rows8(int64_t first, int64_t o_end, int64_t row_bytes, int64_t base) {
    alignas(32) int32_t o[8], k[8];
    for (int i = 0; i < 8; ++i) {
      k[i] = first + i < o_end ? -1 : 0;
      row[i] = first + i < o_end ? first + i : base;
      o[i] = int32_t((row[i] - base) * row_bytes);
    }
    off = _mm256_load_si256(reinterpret_cast<const __m256i*>(o));
    keep = _mm256_castsi256_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(k)));
  }
};

// FP4 needs no transpose: one gather takes 4 bytes (8 values) of each of 8
// rows, and nibble i of every lane is panel row k + i. Magnitude from the 8
// positive codes, sign from bit 3, times the row's power-of-two scale.
void panel_fp4(const Weight& w, int64_t o0, int64_t o_end, float* panel) {
  const int64_t rb = w.in / 2, sb = w.in / 32;
  const __m256 mags = _mm256_setr_ps(0.f, .5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f);
  const __m256i nib = _mm256_set1_epi32(15), signbit = _mm256_set1_epi32(8);
  for (int h = 0; h < 2; ++h) {
    const Rows8 r(o0 + 8 * h, o_end, rb, o0);
    const uint8_t* base = w.data + o0 * rb;
    for (int64_t k = 0; k < w.in; k += 32) {
      alignas(32) float sc[8];
      for (int i = 0; i < 8; ++i) sc[i] = e8m0_to_f32(w.scale[r.row[i] * sb + k / 32]);
      const __m256 scale = _mm256_load_ps(sc);
      for (int64_t kk = k; kk < k + 32; kk += 8) {
        const __m256i v = _mm256_i32gather_epi32(reinterpret_cast<const int*>(base + kk / 2), r.off, 1);
        float* dst = panel + kk * kGemmNR + 8 * h;
#pragma GCC unroll 8
        for (int i = 0; i < 8; ++i) {
          const __m256i code = _mm256_and_si256(_mm256_srli_epi32(v, 4 * i), nib);
          const __m256 mag = _mm256_permutevar8x32_ps(mags, code);
          const __m256 sign = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_and_si256(code, signbit), 28));
          _mm256_storeu_ps(dst + i * kGemmNR, _mm256_and_ps(_mm256_mul_ps(_mm256_or_ps(mag, sign), scale), r.keep));
        }
      }
    }
  }
}

// FP8 the same way: one gather takes 4 codes of each of 8 rows; e4m3 is
// decoded arithmetically (normal: the bits moved into an fp32 exponent;
// subnormal: m · 2^-9; the NaN codes as the table has them).
inline __m256 e4m3_decode(__m256i c, __m256i nan_pos, __m256i nan_neg) {
  const __m256i a = _mm256_and_si256(c, _mm256_set1_epi32(0x7f));
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(c, _mm256_set1_epi32(0x80)), 24);
  const __m256i normal = _mm256_add_epi32(_mm256_slli_epi32(a, 20), _mm256_set1_epi32(120 << 23));
  const __m256 sub = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_and_si256(a, _mm256_set1_epi32(7))), _mm256_set1_ps(0x1p-9f));
  const __m256i is_sub = _mm256_cmpgt_epi32(_mm256_set1_epi32(8), a);
  __m256i bits = _mm256_blendv_epi8(normal, _mm256_castps_si256(sub), is_sub);
  bits = _mm256_or_si256(bits, sign);
  const __m256i is_nan = _mm256_cmpeq_epi32(a, _mm256_set1_epi32(0x7f));
  const __m256i nan = _mm256_blendv_epi8(nan_pos, nan_neg, _mm256_cmpgt_epi32(sign, _mm256_set1_epi32(-1)) ^ _mm256_set1_epi32(-1));
  return _mm256_castsi256_ps(_mm256_blendv_epi8(bits, nan, is_nan));
}

void panel_fp8(const Weight& w, int64_t o0, int64_t o_end, float* panel) {
  const int64_t in = w.in, B = w.block, scols = (in + B - 1) / B;
  uint32_t np, nn;
  std::memcpy(&np, e4m3_table() + 0x7f, 4);
  std::memcpy(&nn, e4m3_table() + 0xff, 4);
  const __m256i nan_pos = _mm256_set1_epi32(int32_t(np)), nan_neg = _mm256_set1_epi32(int32_t(nn));
  for (int h = 0; h < 2; ++h) {
    const Rows8 r(o0 + 8 * h, o_end, in, o0);
    const uint8_t* base = w.data + o0 * in;
    __m256 scale = _mm256_setzero_ps();
    for (int64_t k = 0; k < in; k += 4) {
      if (k % B == 0) {
        alignas(32) float sc[8];
        for (int i = 0; i < 8; ++i) sc[i] = e8m0_to_f32(w.scale[(r.row[i] / B) * scols + k / B]);
        scale = _mm256_load_ps(sc);
      }
      const __m256i v = _mm256_i32gather_epi32(reinterpret_cast<const int*>(base + k), r.off, 1);
      float* dst = panel + k * kGemmNR + 8 * h;
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        const __m256i code = _mm256_and_si256(_mm256_srli_epi32(v, 8 * i), _mm256_set1_epi32(0xff));
        _mm256_storeu_ps(dst + i * kGemmNR, _mm256_and_ps(_mm256_mul_ps(e4m3_decode(code, nan_pos, nan_neg), scale), r.keep));
      }
    }
  }
}

}  // namespace

void Weight::dequant_panel(int64_t o0, int64_t o_end, float* panel) const {
  // The 8-wide paths need whole groups of 8 inside one scale block.
  if (in % 8 != 0 || (kind == Kind::kFP8 && block % 4 != 0)) return dequant_panel_reference(o0, o_end, panel);
  switch (kind) {
    case Kind::kF32: return panel_rows8<Kind::kF32>(*this, o0, o_end, panel);
    case Kind::kBF16: return panel_rows8<Kind::kBF16>(*this, o0, o_end, panel);
    case Kind::kFP8: return panel_fp8(*this, o0, o_end, panel);
    case Kind::kFP4: return panel_fp4(*this, o0, o_end, panel);
  }
}
#else
void Weight::dequant_panel(int64_t o0, int64_t o_end, float* panel) const {
  dequant_panel_reference(o0, o_end, panel);
}
#endif

Weight load_weight(const Checkpoint& ck, const std::string& prefix, Weight::Kind kind, int64_t out, int64_t in,
                   int block) {
  Weight w;
  w.kind = kind;
  w.out = out;
  w.in = in;
  w.block = block;
  const std::string wn = prefix + ".weight";
  auto scale_name = [&]() {
    std::string s = prefix + ".scale";
    if (!ck.has(s) && ck.has(prefix + ".weight_scale_inv")) s = prefix + ".weight_scale_inv";
    return s;
  };
  switch (kind) {
    case Weight::Kind::kF32:
      w.data = ck.get(wn, DType::kF32, {out, in}).data;
      break;
    case Weight::Kind::kBF16:
      w.data = ck.get(wn, DType::kBF16, {out, in}).data;
      break;
    case Weight::Kind::kFP8:
      w.data = ck.get(wn, DType::kF8E4M3, {out, in}).data;
      w.scale = ck.get(scale_name(), DType::kF8E8M0, {(out + block - 1) / block, (in + block - 1) / block}).data;
      break;
    case Weight::Kind::kFP4:
      if (in % 32 != 0) throw Error(wn + ": FP4 input width " + std::to_string(in) + " is not a multiple of 32");
      w.data = ck.get_any(wn, {DType::kI8, DType::kU8}, {out, in / 2}).data;
      w.scale = ck.get(scale_name(), DType::kF8E8M0, {out, in / 32}).data;
      break;
  }
  return w;
}

LinearOpts quant_linear_opts(int act_block, bool pow2) {
  LinearOpts o;
  o.act_quant = true;
  o.act_block = act_block;
  o.act_pow2 = pow2;
  o.out_bf16 = true;
  return o;
}

void linear(const Weight& w, const float* x, int64_t M, float* y, const LinearOpts& opts, int64_t row_begin,
            int64_t row_end, int64_t ldx, int64_t ldy) {
  if (row_end < 0) row_end = w.out;
  if (ldx < 0) ldx = w.in;
  if (ldy < 0) ldy = row_end - row_begin;
  const int64_t K = w.in;
  std::vector<float> xq;
  if (opts.act_quant) {
    xq.resize(size_t(M * K));
    for (int64_t m = 0; m < M; ++m) {
      std::copy(x + m * ldx, x + m * ldx + K, xq.begin() + m * K);
      q8_inplace(xq.data() + m * K, size_t(K), size_t(opts.act_block), opts.act_pow2);
    }
    x = xq.data();
    ldx = K;
  }
  // Panels of 16 weight rows are dequantised on the fly; gemm fixes the
  // reduction order (one FMA chain per output, ascending k).
  const int64_t rows = row_end - row_begin;
  auto load = [&](int64_t n0, float* panel) { w.dequant_panel(row_begin + n0, row_end, panel); };
  gemm(x, ldx, M, K, rows, load, GemmOut{y, ldy, opts.out_bf16});
}

}  // namespace dsv4
