// exp for the attention softmax, defined by its own sequence of fp32
// operations so that the vector versions (exp_f32_lanes below) can give
// exactly the bits of this scalar one. std::exp is a library call whose bits
// differ between libm versions and which does not vectorise.
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

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

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

// Branch-free (selects, not jumps), so that a loop of it vectorises.
inline float exp_f32(float x) {
  namespace k = exp_f32_constants;
  float c = x < k::kMin ? k::kMin : x;
  c = c > k::kMax ? k::kMax : c;
  c = c == c ? c : 0.f;  // NaN: any finite value, the result is x below
  const float n = std::nearbyint(c * k::kLog2e);
  float r = std::fma(-n, k::kLn2Hi, c);
  r = std::fma(-n, k::kLn2Lo, r);
  float p = std::fma(k::kC[0], r, k::kC[1]);  // written out: a loop here kept the caller's loop scalar
  p = std::fma(p, r, k::kC[2]);
  p = std::fma(p, r, k::kC[3]);
  p = std::fma(p, r, k::kC[4]);
  p = std::fma(p, r, k::kC[5]);
  p = std::fma(p, r, k::kC[6]);
  p = std::fma(p, r, 1.f);
  const int32_t ni = int32_t(n), n1 = ni >> 1, n2 = ni - n1;
  const uint32_t b1 = uint32_t(n1 + 127) << 23, b2 = uint32_t(n2 + 127) << 23;
  float s1, s2;
  std::memcpy(&s1, &b1, 4);
  std::memcpy(&s2, &b2, 4);
  const float y = (p * s1) * s2;
  return x == x ? y : x;
}

// Internal linkage on purpose, as in kernels/gemm_micro.h: the file compiled
// with -mavx512f instantiates this too, and an instantiation with external
// linkage there could be the copy the linker keeps for every caller.
namespace {

// exp_f32 on a vector of lanes, each lane taking exp_f32's operations and so
// its bits: written once for the 8-lane AVX2 versions (kernels/swiglu.cc,
// kernels/sparse_attention_avx2.cc) and the 16-lane AVX-512 one
// (kernels/sparse_attention_avx512.cc). F is the vector type, V gives the
// steps that need a width's intrinsics: splat(v), clamp(x, lo, hi) =
// min(max(x, lo), hi) (a NaN x gives lo), round(x) to the nearest integer
// and fma(a, b, c) = a·b + c rounded once. The rest is
// GCC's (and clang's) vector operators, which serve either width: the
// products, the integer steps, and the NaN select x == x ? y : x (a compare
// and a blend). min and max stay intrinsics: the same select with a
// constant operand was left a compare and a blend, not vmaxps. fma(n, −ln2,
// r) is fnmadd(n, ln2, r) bit for bit (the negation is exact), so the
// scalar's −n is a negated constant here.
template <class V, class F>
F exp_f32_lanes(F x) {
  namespace k = exp_f32_constants;
  typedef int32_t I __attribute__((vector_size(sizeof(F))));
  const F c = V::clamp(x, V::splat(k::kMin), V::splat(k::kMax));  // NaN: kMin, the result is x below
  const F n = V::round(c * V::splat(k::kLog2e));
  F r = V::fma(n, V::splat(-k::kLn2Hi), c);
  r = V::fma(n, V::splat(-k::kLn2Lo), r);
  F p = V::splat(k::kC[0]);
  for (int i = 1; i < 7; ++i) p = V::fma(p, r, V::splat(k::kC[i]));
  p = V::fma(p, r, V::splat(1.f));
  // n is a whole number in [−150, 129]: converting it truncates nothing.
  const I ni = __builtin_convertvector(n, I), n1 = ni >> 1, n2 = ni - n1;
  const F s1 = (F)((n1 + 127) << 23), s2 = (F)((n2 + 127) << 23);
  return x == x ? (p * s1) * s2 : x;
}

#if defined(__AVX2__) && defined(__FMA__)
// The 8-lane steps of exp_f32_lanes.
struct Lanes8 {
  static __m256 splat(float v) { return _mm256_set1_ps(v); }
  static __m256 clamp(__m256 x, __m256 lo, __m256 hi) { return _mm256_min_ps(_mm256_max_ps(x, lo), hi); }
  static __m256 round(__m256 x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static __m256 fma(__m256 a, __m256 b, __m256 c) { return _mm256_fmadd_ps(a, b, c); }
};
#endif

}  // namespace

}  // namespace dsv4
