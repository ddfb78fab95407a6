// Number formats of MODEL.md §2: e4m3fn, e2m1, e8m0, bf16, the exact
// ceil-log2 and the q8 / q4 block simulations.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/formats.h"

using namespace dsv4;

namespace {

// e4m3fn by the definition: bias 7, 3 mantissa bits, subnormals k·2^-9.
double e4m3_reference(int code) {
  const int sign = code >> 7, exp = (code >> 3) & 15, man = code & 7;
  if (exp == 15 && man == 7) return std::numeric_limits<double>::quiet_NaN();
  const double v = exp == 0 ? man * std::ldexp(1.0, -9) : (1.0 + man / 8.0) * std::ldexp(1.0, exp - 7);
  return sign ? -v : v;
}

// Nearest e2m1 magnitude code, ties to the even code, by brute force.
int e2m1_reference(float a) {
  static const float mag[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  int best = 0;
  for (int c = 1; c < 8; ++c) {
    const float d = std::fabs(a - mag[c]), db = std::fabs(a - mag[best]);
    if (d < db || (d == db && c % 2 == 0)) best = c;
  }
  return best;
}

}  // namespace

TEST(E4M3, AllCodesDecode) {
  const float* table = e4m3_table();
  for (int c = 0; c < 256; ++c) {
    const double want = e4m3_reference(c);
    const float got = e4m3_to_f32(uint8_t(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << "code " << c;
      EXPECT_TRUE(std::isnan(table[c])) << "code " << c;
    } else {
      EXPECT_EQ(double(got), want) << "code " << c;
      EXPECT_EQ(table[c], got) << "code " << c;
    }
  }
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0xff)));
  EXPECT_EQ(e4m3_to_f32(0x7e), 448.f);
  EXPECT_EQ(e4m3_to_f32(0xfe), -448.f);
  EXPECT_EQ(e4m3_to_f32(0x08), 0x1p-6f);  // smallest normal
  for (int k = 0; k < 8; ++k) EXPECT_EQ(e4m3_to_f32(uint8_t(k)), float(k) * 0x1p-9f);  // subnormals
  EXPECT_EQ(e4m3_to_f32(0x38), 1.f);
}

TEST(E4M3, EncodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    const float v = e4m3_to_f32(uint8_t(c));
    if (std::isnan(v)) {
      EXPECT_EQ(f32_to_e4m3(v), 0x7f) << "code " << c;  // NaN -> the canonical NaN code
    } else {
      EXPECT_EQ(f32_to_e4m3(v), c) << "code " << c;  // includes -0 -> 0x80
    }
  }
  EXPECT_EQ(f32_to_e4m3(std::numeric_limits<float>::quiet_NaN()), 0x7f);
}

TEST(E4M3, TiesToEvenBetweenNeighbours) {
  // Every pair of neighbouring finite codes: the midpoint goes to the code
  // with the even mantissa (the even code), and one float either side of it
  // goes to the nearer neighbour.
  for (int sign : {0, 0x80}) {
    for (int c = 0; c < 0x7e; ++c) {
      const float lo = e4m3_to_f32(uint8_t(sign | c)), hi = e4m3_to_f32(uint8_t(sign | (c + 1)));
      const float mid = (lo + hi) / 2;  // exact: both are short binary fractions
      const int even = c % 2 == 0 ? c : c + 1;
      EXPECT_EQ(f32_to_e4m3(mid), sign | even) << "between codes " << c << " and " << c + 1;
      EXPECT_EQ(f32_to_e4m3(std::nextafter(mid, lo)), sign | c);
      EXPECT_EQ(f32_to_e4m3(std::nextafter(mid, hi)), sign | (c + 1));
    }
  }
  // Hand-picked: 1.0625 is halfway between 1 (0x38) and 1.125 (0x39) -> 1.
  EXPECT_EQ(f32_to_e4m3(1.0625f), 0x38);
  // 1.1875 is halfway between 1.125 (0x39) and 1.25 (0x3a) -> 1.25.
  EXPECT_EQ(f32_to_e4m3(1.1875f), 0x3a);
  // Half the smallest subnormal ties to zero; just above it rounds up.
  EXPECT_EQ(f32_to_e4m3(0x1p-10f), 0x00);
  EXPECT_EQ(f32_to_e4m3(std::nextafter(0x1p-10f, 1.f)), 0x01);
}

TEST(E4M3, SaturatesAt448) {
  EXPECT_EQ(f32_to_e4m3(448.f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(449.f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(464.f), 0x7e);  // would be the 448/480 midpoint
  EXPECT_EQ(f32_to_e4m3(1e6f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(f32_to_e4m3(-448.f), 0xfe);
  EXPECT_EQ(f32_to_e4m3(-1e30f), 0xfe);
  EXPECT_EQ(f32_to_e4m3(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_EQ(f32_to_e4m3(440.f), 0x7e);  // 416 / 448 midpoint is 432
  EXPECT_EQ(f32_to_e4m3(432.f), 0x7e);  // tie: 448 has the even mantissa (6)
  EXPECT_EQ(f32_to_e4m3(431.f), 0x7d);
}

TEST(E2M1, AllCodes) {
  const float mag[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  for (int c = 0; c < 16; ++c) {
    const float v = e2m1_to_f32(uint8_t(c));
    EXPECT_EQ(v, (c & 8) ? -mag[c & 7] : mag[c & 7]) << "code " << c;
    EXPECT_EQ(f32_to_e2m1(v), c) << "code " << c;  // -0 (code 8) included
  }
}

TEST(E2M1, TiesToEvenCode) {
  const std::pair<float, float> ties[] = {{0.25f, 0.f}, {0.75f, 1.f}, {1.25f, 1.f}, {1.75f, 2.f},
                                          {2.5f, 2.f},  {3.5f, 4.f},  {5.f, 4.f}};
  for (auto [x, want] : ties) {
    EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(x)), want) << x;
    EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(-x)), -want) << -x;
  }
  // Saturation and NaN.
  EXPECT_EQ(f32_to_e2m1(6.f), 7);
  EXPECT_EQ(f32_to_e2m1(7.f), 7);
  EXPECT_EQ(f32_to_e2m1(1e9f), 7);
  EXPECT_EQ(f32_to_e2m1(-100.f), 15);
  EXPECT_EQ(f32_to_e2m1(std::numeric_limits<float>::quiet_NaN()), 0);
}

TEST(E2M1, MatchesNearestEvenEverywhere) {
  // A dense sweep through [-8, 8] plus one float either side of every midpoint.
  std::vector<float> xs;
  for (int k = -8192; k <= 8192; ++k) xs.push_back(float(k) / 1024.f);
  for (float m : {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.f})
    for (float s : {1.f, -1.f}) {
      xs.push_back(std::nextafter(s * m, 0.f));
      xs.push_back(std::nextafter(s * m, s * 10.f));
    }
  for (float x : xs) {
    const int want = e2m1_reference(std::fabs(x)) | (std::signbit(x) ? 8 : 0);
    EXPECT_EQ(f32_to_e2m1(x), want) << x;
  }
}

TEST(E8M0, Values) {
  EXPECT_EQ(e8m0_to_f32(127), 1.f);
  EXPECT_EQ(e8m0_to_f32(128), 2.f);
  EXPECT_EQ(e8m0_to_f32(126), 0.5f);
  EXPECT_EQ(e8m0_to_f32(117), 0x1p-10f);
  EXPECT_EQ(e8m0_to_f32(1), 0x1p-126f);
  EXPECT_EQ(e8m0_to_f32(0), 0x1p-127f);  // subnormal in fp32
  EXPECT_EQ(e8m0_to_f32(254), 0x1p127f);
  for (int b = 0; b < 255; ++b) EXPECT_EQ(double(e8m0_to_f32(uint8_t(b))), std::ldexp(1.0, b - 127)) << b;
}

TEST(BF16, RoundToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.f), 0x3f80);
  // 1 + 2^-8 is halfway between 1 (0x3f80, even) and 1 + 2^-7 (0x3f81).
  EXPECT_EQ(f32_to_bf16(1.f + 0x1p-8f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.f + 0x1p-8f + 0x1p-20f), 0x3f81);
  // 1 + 3·2^-8 is halfway between 0x3f81 (odd) and 0x3f82 (even).
  EXPECT_EQ(f32_to_bf16(1.f + 3 * 0x1p-8f), 0x3f82);
  EXPECT_EQ(f32_to_bf16(1.f + 3 * 0x1p-8f - 0x1p-20f), 0x3f81);
  EXPECT_EQ(f32_to_bf16(-1.f - 0x1p-8f), 0xbf80);
  EXPECT_EQ(f32_to_bf16(-1.f - 3 * 0x1p-8f), 0xbf82);
  // Overflow rounds to infinity; infinities and NaN stay what they are.
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(bf16r(3.140625f), 3.140625f);  // representable values are unchanged
  EXPECT_EQ(bf16_to_f32(0x4049), 3.140625f);
}

// The vectorised bf16r_inplace and bf16r_copy against bf16r on random bit
// patterns (NaNs, infinities and subnormals among them), exact ties, and a
// length that leaves a scalar tail.
TEST(BF16, RoundInplaceEqualsBf16r) {
  std::mt19937 rng(17);
  std::vector<float> x(1003);
  for (size_t i = 0; i < x.size(); ++i) {
    uint32_t u = uint32_t(rng());
    if (i % 5 == 0) u = (u & 0xffff0000u) | 0x8000u;  // a tie
    if (i % 97 == 0) u = (u & 0x80000000u) | 0x7f800000u | (u & 0x7fffffu);  // inf or NaN
    x[i] = bits_f32(u);
  }
  std::vector<float> fast = x, copied(x.size());
  bf16r_inplace(fast.data(), fast.size());
  bf16r_copy(x.data(), x.size(), copied.data());
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(f32_bits(fast[i]), f32_bits(bf16r(x[i]))) << i;
    ASSERT_EQ(f32_bits(copied[i]), f32_bits(bf16r(x[i]))) << i;
  }
}

TEST(CeilLog2, ExactFromBits) {
  for (int k = -126; k <= 127; ++k) {
    const float p = std::ldexp(1.f, k);
    EXPECT_EQ(ceil_log2(p), k) << k;
    if (k < 127) {
      EXPECT_EQ(ceil_log2(std::nextafter(p, std::numeric_limits<float>::infinity())), k + 1) << k;
    }
    if (k > -126) {
      EXPECT_EQ(ceil_log2(std::nextafter(p, 0.f)), k) << k;
    }
  }
  EXPECT_EQ(ceil_log2(0.75f), 0);
  EXPECT_EQ(ceil_log2(3.f), 2);
  EXPECT_EQ(ceil_log2(448.f), 9);
  // Against a double computation on values where log2 is well away from an integer.
  for (float x = 1e-30f; x < 1e30f; x *= 1.37f)
    EXPECT_EQ(ceil_log2(x), int(std::ceil(std::log2(double(x))))) << x;
  EXPECT_EQ(exp2i(-3), 0.125f);
  EXPECT_EQ(exp2i(-149), 0x1p-149f);
}

TEST(Pow2Scale, Fp8AndFp4) {
  EXPECT_EQ(fp8_pow2_scale(448.f), 1.f);
  EXPECT_EQ(fp8_pow2_scale(449.f), 2.f);
  EXPECT_EQ(fp8_pow2_scale(896.f), 2.f);
  EXPECT_EQ(fp8_pow2_scale(224.f), 0.5f);
  EXPECT_EQ(fp8_pow2_scale(0.f), exp2i(ceil_log2(1e-4f * (1.f / 448.f))));
  EXPECT_EQ(fp4_pow2_scale(6.f), 1.f);
  EXPECT_EQ(fp4_pow2_scale(6.01f), 2.f);
  EXPECT_EQ(fp4_pow2_scale(3.f), 0.5f);
  EXPECT_EQ(fp4_pow2_scale(0.f), 0x1p-126f);
}

TEST(Q8, HandCheckedBlocks) {
  // amax 448: scale 1. 3.3 -> 3.25 (step 0.25 in [2,4)), 0.1 -> 13·2^-7.
  std::vector<float> x = {448.f, 1.f, -3.3f, 0.1f};
  q8_inplace(x.data(), x.size(), 4);
  EXPECT_EQ(x, (std::vector<float>{448.f, 1.f, -3.25f, 0.1015625f}));

  // amax exactly 2·448: scale 2, the max maps to code 448 exactly.
  x = {896.f, 10.f, -1.f, 0.f, 3.f};
  q8_inplace(x.data(), x.size(), 5);
  EXPECT_EQ(x, (std::vector<float>{896.f, 10.f, -1.f, 0.f, 3.f}));

  // amax 448·2^-3 = 56: scale 1/8; 0.3 -> 2.4 on the grid -> 2.5 -> 0.3125.
  x = {56.f, -0.3f};
  q8_inplace(x.data(), x.size(), 2);
  EXPECT_EQ(x, (std::vector<float>{56.f, -0.3125f}));

  // All zero: stays zero (the amax floor 1e-4 keeps the scale finite).
  x.assign(8, 0.f);
  q8_inplace(x.data(), x.size(), 4);
  EXPECT_EQ(x, std::vector<float>(8, 0.f));

  // Two blocks (the last one short) are scaled independently: 1000 needs
  // scale 4 (1000/4 = 250 -> 256 at step 16; 1/4 and 3/4 are exact); the
  // second block has amax 5 and scale 2^-6 (5 -> 320, exact).
  x = {1000.f, 1.f, 3.f, 5.f, 1.f};
  q8_inplace(x.data(), x.size(), 3);
  EXPECT_EQ(x, (std::vector<float>{1024.f, 1.f, 3.f, 5.f, 1.f}));
  // The same with a value that falls between grid points of the large scale:
  // 1.1/4 = 0.275 -> 0.28125 (step 2^-5 in [0.25, 0.5)) -> 1.125.
  x = {1000.f, 1.1f, 5.f};
  q8_inplace(x.data(), x.size(), 2);
  EXPECT_EQ(x, (std::vector<float>{1024.f, 1.125f, 5.f}));

  // Results are bf16-exact.
  x = {0.123f, -7.77f, 300.f, 1e-3f};
  q8_inplace(x.data(), x.size(), 4);
  for (float v : x) EXPECT_EQ(bf16r(v), v);
}

// The vectorised q8 against its definition: random magnitudes over many
// binades (e4m3 subnormals after scaling included), exact ties, blocks of
// 64 and 128 with a short last block, both scale kinds, and blocks holding
// NaN or infinity (these take the reference path).
TEST(Q8, FastEqualsReferenceBitwise) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  std::uniform_int_distribution<int> binade(-30, 12);
  for (size_t block : {size_t(64), size_t(128), size_t(40)}) {
    for (bool pow2 : {true, false}) {
      std::vector<float> x(1000);
      for (size_t i = 0; i < x.size(); ++i) x[i] = nd(rng) * std::ldexp(1.f, binade(rng));
      // Ties: midpoints of the e4m3 grid at scale 1 (block amax 448).
      for (size_t i = 0; i < 64; ++i) x[i] = (i % 2 ? -1.f : 1.f) * (1.f + (2 * float(i % 8) + 1) / 16.f);
      x[10] = 448.f;
      x[300] = std::numeric_limits<float>::quiet_NaN();
      x[700] = -std::numeric_limits<float>::infinity();
      for (size_t i = 800; i < 900; ++i) x[i] = std::ldexp(nd(rng), -140);  // fp32 subnormals
      std::vector<float> fast = x, ref = x;
      q8_inplace(fast.data(), fast.size(), block, pow2);
      q8_inplace_reference(ref.data(), ref.size(), block, pow2);
      for (size_t i = 0; i < x.size(); ++i) {
        uint32_t a, b;
        std::memcpy(&a, &fast[i], 4);
        std::memcpy(&b, &ref[i], 4);
        ASSERT_EQ(a, b) << "block " << block << " pow2 " << pow2 << " i " << i << " x " << x[i];
      }
    }
  }
}

TEST(Q4, FastEqualsReferenceBitwise) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  std::uniform_int_distribution<int> binade(-30, 12);
  for (size_t block : {size_t(32), size_t(64), size_t(40), size_t(12)}) {
    std::vector<float> x(1000);
    for (size_t i = 0; i < x.size(); ++i) x[i] = nd(rng) * std::ldexp(1.f, binade(rng));
    // Every rounding midpoint and grid value at scale 1 (block amax 6), both
    // signs, and zeros of both signs.
    const float at_scale_1[] = {6.f, .25f, .75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.f,
                                0.f, .5f,  1.f,  1.5f,  2.f,   3.f,  4.f,  5.5f};
    for (size_t i = 0; i < 64; ++i) x[i] = (i / 16 % 2 ? -1.f : 1.f) * at_scale_1[i % 16];
    x[70] = -0.f;
    x[300] = std::numeric_limits<float>::quiet_NaN();
    x[700] = -std::numeric_limits<float>::infinity();
    for (size_t i = 800; i < 900; ++i) x[i] = std::ldexp(nd(rng), -140);  // fp32 subnormals
    for (size_t i = 900; i < 940; ++i) x[i] = 0.f;                           // an all-zero block
    std::vector<float> fast = x, ref = x;
    q4_inplace(fast.data(), fast.size(), block);
    q4_inplace_reference(ref.data(), ref.size(), block);
    for (size_t i = 0; i < x.size(); ++i) {
      uint32_t a, b;
      std::memcpy(&a, &fast[i], 4);
      std::memcpy(&b, &ref[i], 4);
      ASSERT_EQ(a, b) << "block " << block << " i " << i << " x " << x[i];
    }
  }
}

TEST(Q4, HandCheckedBlocks) {
  // amax 6: scale 1; 0.25 -> 0, 0.75 -> 1, -5 -> -4 (ties), 2.9 -> 3.
  std::vector<float> x(32, 0.f);
  x[0] = 6.f; x[1] = 0.25f; x[2] = 0.75f; x[3] = -5.f; x[4] = 2.9f; x[5] = -0.3f;
  q4_inplace(x.data(), x.size());
  std::vector<float> want(32, 0.f);
  want[0] = 6.f; want[2] = 1.f; want[3] = -4.f; want[4] = 3.f; want[5] = -0.5f;
  EXPECT_EQ(x, want);

  // amax exactly 12 = 2·6: scale 2; 1.5 -> 0.75 -> 1 -> 2, 2.5 -> 1.25 -> 1 -> 2.
  x.assign(32, 0.f);
  x[7] = -12.f; x[8] = 1.5f; x[9] = 2.5f; x[10] = 7.f;
  q4_inplace(x.data(), x.size());
  want.assign(32, 0.f);
  want[7] = -12.f; want[8] = 2.f; want[9] = 2.f; want[10] = 8.f;
  EXPECT_EQ(x, want);

  // All zero.
  x.assign(64, 0.f);
  q4_inplace(x.data(), x.size());
  EXPECT_EQ(x, std::vector<float>(64, 0.f));

  // Two blocks with different scales: amax 7 -> scale 2 (3.5 -> 4 -> 8,
  // 0.5 stays, 0.4 -> 0.5 -> 1); amax 0.75 -> scale 0.125 (0.75 -> 6, 0.8 -> 1).
  x.assign(64, 0.f);
  x[0] = 7.f; x[1] = 1.f; x[2] = 0.8f; x[32] = 0.75f; x[33] = 0.1f;
  q4_inplace(x.data(), x.size());
  want.assign(64, 0.f);
  want[0] = 8.f; want[1] = 1.f; want[2] = 1.f; want[32] = 0.75f; want[33] = 0.125f;
  EXPECT_EQ(x, want);
}
