// exp for the attention softmax, defined by its own sequence of fp32
// operations so that a vector version (kernels/sparse_attention_avx512.cc)
// can give exactly the bits of this scalar one. std::exp is a library call
// whose bits differ between libm versions and which does not vectorise.
//
// exp(x) = 2^n · e^r with n = nearest integer to x·log2(e) and
// r = x − n·ln 2 (|r| ≤ ~0.347), ln 2 split in a 17-bit high part (n·hi is
// exact for |n| ≤ 150) and the rest. e^r is its Taylor series to r^7
// (truncation ≤ 0.35^8/8! ≈ 6e-9, a tenth of an fp32 ulp) by Horner with
// FMAs. 2^n is applied as two normal powers of two, 2^(n>>1) then the rest,
// so that results in the subnormal range are rounded once, like IEEE's.
// Against double-precision exp, every 97th float of [−104, 89]: within
// 1 ulp of the rounded value, 0.5% of them off by that ulp.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

namespace dsv4 {

namespace exp_f32_constants {
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693145751953125f;          // 0x3f317200
constexpr float kLn2Lo = 1.42860682030941723212e-6f;  // ln 2 − kLn2Hi
// exp(−104) underflows to 0 and exp(89) overflows; clamping there keeps n
// in [−150, 129], where both halves of 2^n are normal.
constexpr float kMin = -104.f, kMax = 89.f;
// 1/k! for k = 7 .. 1.
constexpr float kC[7] = {1.f / 5040, 1.f / 720, 1.f / 120, 1.f / 24, 1.f / 6, 0.5f, 1.f};
}  // namespace exp_f32_constants

inline float exp_f32(float x) {
  namespace k = exp_f32_constants;
  if (x != x) return x;
  const float c = std::fmin(std::fmax(x, k::kMin), k::kMax);
  const float n = std::nearbyint(c * k::kLog2e);
  float r = std::fma(-n, k::kLn2Hi, c);
  r = std::fma(-n, k::kLn2Lo, r);
  float p = k::kC[0];
  for (int i = 1; i < 7; ++i) p = std::fma(p, r, k::kC[i]);
  p = std::fma(p, r, 1.f);
  const int ni = int(n), n1 = ni >> 1, n2 = ni - n1;
  auto pow2 = [](int e) {
    const uint32_t b = uint32_t(e + 127) << 23;
    float f;
    std::memcpy(&f, &b, 4);
    return f;
  };
  return (p * pow2(n1)) * pow2(n2);
}

}  // namespace dsv4
