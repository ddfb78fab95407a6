// Number formats of the checkpoint and of the activation simulations
// (MODEL.md §2): bf16, e4m3fn (FP8), e2m1 (FP4), e8m0 scales, and the
// power-of-two block quantisation q8 / q4. All rounding is exact
// round-to-nearest-even computed on the float bits.
#pragma once
#include <cstdint>
#include <cstring>
#include <cmath>
#include <cstddef>

namespace dsv4 {

inline uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bits_f32(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

// bf16 is stored as the upper 16 bits of an fp32.
inline float bf16_to_f32(uint16_t h) { return bits_f32(uint32_t(h) << 16); }
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
// bf16(x): round an fp32 to the nearest bf16 value, kept as fp32.
inline float bf16r(float f) { return bf16_to_f32(f32_to_bf16(f)); }
// bf16r of every element (vectorised; test BF16.RoundInplaceEqualsBf16r), in
// place or from x into y (y == x allowed).
void bf16r_inplace(float* x, size_t n);
void bf16r_copy(const float* x, size_t n, float* y);

// e4m3fn: bias 7, subnormals, max 448, 0x7f / 0xff are NaN, no infinities.
float e4m3_to_f32(uint8_t b);
// Round to nearest even, saturating at +-448. NaN maps to 0x7f.
uint8_t f32_to_e4m3(float f);
// Decoded value of every e4m3 code (256 entries).
const float* e4m3_table();

// e2m1: bit 3 sign, magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}.
inline float e2m1_to_f32(uint8_t code) {
  static const float mag[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  float v = mag[code & 7];
  return (code & 8) ? -v : v;
}
// Round to nearest, ties to the even code, saturating at +-6; NaN gives 0.
// Branch-free (it runs on every FP4 weight and activation): the magnitude
// code is the number of rounding midpoints 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5
// below |f|, where a midpoint that |f| equals counts only if the code above
// it is even (0.75 -> 1, 1.75 -> 2, 3.5 -> 4; 0.25 -> 0, 1.25 -> 1, 2.5 -> 2, 5 -> 4).
inline uint8_t f32_to_e2m1(float f) {
  const float a = std::fabs(f);
  const int c = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) + (a > 5.0f);
  const int sign = int(f32_bits(f) >> 28) & 8;
  return std::isnan(f) ? uint8_t(0) : uint8_t(sign | c);
}

// e8m0: value 2^(b-127). 0xff is NaN in the OCP spec; never produced here.
inline float e8m0_to_f32(uint8_t b) {
  if (b == 0) return bits_f32(0x00400000u);  // 2^-127 is subnormal in fp32
  return bits_f32(uint32_t(b) << 23);
}

// ceil(log2(x)) of a positive normal float, from its bits: the exponent, plus
// one when the mantissa is non-zero.
inline int ceil_log2(float x) {
  uint32_t u = f32_bits(x);
  int e = int((u >> 23) & 0xff) - 127;
  return (u & 0x7fffffu) ? e + 1 : e;
}
// 2^e as a float (e in the normal range, or down to -149 as subnormals).
inline float exp2i(int e) {
  if (e >= -126) return bits_f32(uint32_t(e + 127) << 23);
  return std::ldexp(1.0f, e);
}

// Power-of-two block scales of MODEL.md §2.
inline float fp8_pow2_scale(float amax) {
  float a = amax > 1e-4f ? amax : 1e-4f;
  return exp2i(ceil_log2(a * (1.0f / 448.0f)));
}
inline float fp4_pow2_scale(float amax) {
  const float tiny = 6.0f * 0x1p-126f;
  float a = amax > tiny ? amax : tiny;
  return exp2i(ceil_log2(a * (1.0f / 6.0f)));
}

// q8(x, B): FP8 simulation in blocks of `block` contiguous elements (the last
// block may be short). pow2=false uses amax/448 scales (scale_fmt != ue8m0).
// Vectorised where the CPU allows; bitwise equal to q8_inplace_reference,
// the plain definition (test Q8.FastEqualsReferenceBitwise).
void q8_inplace(float* x, size_t n, size_t block, bool pow2 = true);
void q8_inplace_reference(float* x, size_t n, size_t block, bool pow2 = true);
// q4(x): FP4 simulation in blocks of 32. Vectorised where the CPU allows;
// bitwise equal to q4_inplace_reference, the plain definition (test
// Q4.FastEqualsReferenceBitwise).
void q4_inplace(float* x, size_t n, size_t block = 32);
void q4_inplace_reference(float* x, size_t n, size_t block = 32);

}  // namespace dsv4
