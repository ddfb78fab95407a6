#include "core/formats.h"

#include <algorithm>
#include <array>

namespace dsv4 {

void bf16r_inplace(float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] = bf16r(x[i]);
}

float e4m3_to_f32(uint8_t b) {
  int sign = b >> 7, exp = (b >> 3) & 15, man = b & 7;
  if (exp == 15 && man == 7) return std::nanf("");
  float v = exp == 0 ? std::ldexp(float(man), -9) : std::ldexp(float(8 + man), exp - 10);
  return sign ? -v : v;
}

static std::array<float, 256> make_e4m3_table() {
  std::array<float, 256> t{};
  for (int i = 0; i < 256; ++i) t[i] = e4m3_to_f32(uint8_t(i));
  return t;
}
static const std::array<float, 256> kTable = make_e4m3_table();
const float* e4m3_table() { return kTable.data(); }

uint8_t f32_to_e4m3(float f) {
  uint32_t u = f32_bits(f);
  uint8_t sign = uint8_t((u >> 24) & 0x80);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7f;             // NaN
  float x = bits_f32(a);
  if (x >= 448.0f) return sign | 0x7e;          // saturate (also +inf)
  // The e4m3 grid step for x: subnormals and the first binade (x < 2^-5) step 2^-9,
  // else 2^(floor(log2 x) - 3). Dividing by the step and rounding to nearest
  // even gives the integer mantissa*2^k exactly (all steps are powers of two).
  int e = int(a >> 23) - 127;
  int step_exp = e < -6 ? -9 : e - 3;
  // x · 2^-step_exp is exact (a power-of-two multiply, no ldexp call).
  float q = std::nearbyint(x * exp2i(-step_exp));  // default mode: ties to even
  // q is in [0, 16]; 16 means it rounded up into the next binade.
  int qi = int(q);
  if (step_exp == -9) {
    // Subnormals and the first normal binade share the step 2^-9, and the
    // value q·2^-9 (q in 0..16) is exactly code q: subnormals for q < 8,
    // exponent 1 with mantissa q-8 for 8..15, and 2^-5 (exponent 2) for 16.
    return sign | uint8_t(qi);
  }
  int exp_field = step_exp + 3 + 7;  // value = q * 2^step_exp, q in [8, 16]
  if (qi == 16) { qi = 8; ++exp_field; }
  if (exp_field > 15 || (exp_field == 15 && qi - 8 > 6)) return sign | 0x7e;
  return sign | uint8_t(exp_field << 3) | uint8_t(qi - 8);
}

void q8_inplace(float* x, size_t n, size_t block, bool pow2) {
  for (size_t b0 = 0; b0 < n; b0 += block) {
    size_t b1 = std::min(n, b0 + block);
    float amax = 0.f;
    for (size_t i = b0; i < b1; ++i) amax = std::max(amax, std::fabs(x[i]));
    float s;
    if (pow2) {
      s = fp8_pow2_scale(amax);
    } else {
      s = (amax > 1e-4f ? amax : 1e-4f) / 448.0f;
    }
    for (size_t i = b0; i < b1; ++i) {
      float v = std::clamp(x[i] / s, -448.0f, 448.0f);
      x[i] = kTable[f32_to_e4m3(v)] * s;
    }
  }
}

void q4_inplace(float* x, size_t n, size_t block) {
  for (size_t b0 = 0; b0 < n; b0 += block) {
    size_t b1 = std::min(n, b0 + block);
    float amax = 0.f;
    for (size_t i = b0; i < b1; ++i) amax = std::max(amax, std::fabs(x[i]));
    float s = fp4_pow2_scale(amax);
    for (size_t i = b0; i < b1; ++i) {
      float v = std::clamp(x[i] / s, -6.0f, 6.0f);
      x[i] = e2m1_to_f32(f32_to_e2m1(v)) * s;
    }
  }
}

}  // namespace dsv4
