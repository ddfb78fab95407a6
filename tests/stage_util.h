// Helpers shared by the stage tests (hc_test.cc, norm_test.cc, rope_test.cc,
// hadamard_test.cc, topk_test.cc, indexer_test.cc, linear_test.cc,
// compressor_test.cc, attention_test.cc, moe_test.cc): every stage of the
// forward (MODEL.md §2–§9) against a small reference written in the tests
// directly from the spec — plain loops, double precision where the spec
// accumulates in fp32, and the spec's rounding points. Inputs are small and
// random (fixed-seed std::mt19937), weights are built in the tests byte by
// byte; no checkpoint is needed.
//
// Tolerances.
// - Bitwise, where the reference passes through the same rounding points on
//   the same values. To make that legitimate, many inputs are drawn from
//   coarse grids (k / 2^m) on which every fp32 sum is exact in any order.
// - NearBf16, where the engine accumulates in fp32 and the reference in
//   double and the result is rounded to bf16 once: the engine's value must be
//   one of the two bf16 neighbours of the exact value (≤ 1 bf16 step), plus the
//   worst-case fp32 summation error, which only matters when a sum cancels.
// - ExpectMostlyExact, where several rounding points follow each other
//   (compressor, experts): an fp32-vs-double difference ahead of one rounding
//   point can move a value that sits on a rounding boundary by one step of
//   that format. Almost all elements must be bitwise equal, the rest one step
//   of the final format away.
//
// A helper used by one test file only lives in that file.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <list>
#include <random>
#include <string>
#include <vector>

#include "io/config.h"
#include "io/synthetic.h"
#include "kernels/linear.h"
#include "test_util.h"

namespace dsv4::testing {

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
inline constexpr float kInfF = std::numeric_limits<float>::infinity();

// ===========================================================================
// Bits, a reference bf16 rounding, and comparisons
// ===========================================================================

inline uint32_t to_bits(float f) { return std::bit_cast<uint32_t>(f); }
inline float from_bits(uint32_t u) { return std::bit_cast<float>(u); }

// Round-to-nearest-even to bf16, written independently of core/formats.h: the
// nearer of the two bf16 values that bracket f; on a tie the one whose last
// mantissa bit is even.
inline float bf(float f) {
  if (!std::isfinite(f)) return f;
  const uint32_t lo_bits = to_bits(f) & 0xffff0000u;
  const float lo = from_bits(lo_bits);  // toward zero
  if (lo == f) return f;
  const float hi = from_bits(lo_bits + 0x10000u);  // away from zero
  const double dl = std::fabs(double(f) - lo), dh = std::fabs(double(hi) - f);
  if (dl != dh) return dl < dh ? lo : hi;
  return ((lo_bits >> 16) & 1u) ? hi : lo;
}
// bf16 of a value the spec computes in fp32 and the tests in double.
inline float bfd(double x) { return bf(float(x)); }

// One bf16 step at the magnitude of v.
inline double bf16_step(double v) {
  v = std::fabs(v);
  if (v < 0x1p-126) return 0x1p-133;
  int e;
  std::frexp(v, &e);  // v in [2^(e-1), 2^e)
  return std::ldexp(1.0, e - 8);
}

inline std::string fmt(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.9g", v);
  return b;
}

// got: an engine value rounded to bf16 after fp32 arithmetic; ref: the exact
// value before that rounding. Passes when |got − ref| ≤ one bf16 step (got is
// one of the two bf16 values around ref) plus n·2^-24·abs_sum, the worst-case
// fp32 error of a sum of n terms whose magnitudes add up to abs_sum.
inline ::testing::AssertionResult NearBf16(float got, double ref, double abs_sum = 0.0, int64_t n = 0) {
  const double tol = bf16_step(ref) + double(n) * 0x1p-24 * abs_sum;
  if (std::fabs(double(got) - ref) <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "got " << fmt(got) << ", reference " << fmt(ref) << ", tolerance "
                                       << fmt(tol);
}

inline bool same_value(float a, float b) { return a == b || (std::isnan(a) && std::isnan(b)); }

// Values behind several rounding points (see the top of this file): at least min_exact
// of the elements equal, every other one within tol(i).
inline void ExpectMostlyExact(const std::vector<float>& got, const std::vector<float>& ref, double min_exact,
                       const std::function<double(size_t)>& tol, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  size_t exact = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (same_value(got[i], ref[i])) {
      ++exact;
      continue;
    }
    EXPECT_LE(std::fabs(double(got[i]) - ref[i]), tol(i))
        << what << " element " << i << ": got " << fmt(got[i]) << ", reference " << fmt(ref[i]);
  }
  EXPECT_GE(double(exact), min_exact * double(got.size()))
      << what << ": only " << exact << " of " << got.size() << " elements bitwise equal";
}

// ===========================================================================
// Random inputs
// ===========================================================================

struct Rng {
  std::mt19937 gen;
  explicit Rng(uint32_t seed) : gen(seed) {}
  double uniform(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(gen); }
  int integer(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(gen); }
  // A bf16 value, uniform in [lo, hi).
  float bf16(double lo, double hi) { return bfd(uniform(lo, hi)); }
  // k / 2^shift with k uniform in [-kmax, kmax]: a grid on which fp32 sums are exact.
  float grid(int kmax, int shift) { return std::ldexp(float(integer(-kmax, kmax)), -shift); }
  std::vector<float> bf16_vec(size_t n, double lo, double hi) {
    std::vector<float> v(n);
    for (float& x : v) x = bf16(lo, hi);
    return v;
  }
  std::vector<float> grid_vec(size_t n, int kmax, int shift) {
    std::vector<float> v(n);
    for (float& x : v) x = grid(kmax, shift);
    return v;
  }
};

// ===========================================================================
// Reference number formats (MODEL.md §2), from the field layouts
// ===========================================================================

inline double e4m3_value(int code) {
  const int e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return std::nan("");
  const double mag = e == 0 ? (m / 8.0) * 0x1p-6 : (1.0 + m / 8.0) * std::ldexp(1.0, e - 7);
  return (code & 0x80) ? -mag : mag;
}
inline double e2m1_value(int code) {
  const int e = (code >> 1) & 3, m = code & 1;
  const double mag = e == 0 ? 0.5 * m : (1.0 + 0.5 * m) * std::ldexp(1.0, e - 1);
  return (code & 8) ? -mag : mag;
}
inline double e8m0_value(int b) { return std::ldexp(1.0, b - 127); }

// The non-negative code of [0, ncodes) nearest to a ≥ 0; ties to the even code.
template <class Value>
double nearest_code_value(double a, int ncodes, Value value) {
  int best = 0;
  for (int c = 1; c < ncodes; ++c) {
    const double d = std::fabs(value(c) - a), db = std::fabs(value(best) - a);
    if (d < db || (d == db && c % 2 == 0)) best = c;
  }
  return value(best);
}
inline float e4m3_round(float v) {  // |v| ≤ 448
  const double r = nearest_code_value(std::fabs(v), 0x7f, e4m3_value);
  return float(v < 0 ? -r : r);
}

// 2^ceil(log2(max(amax, floor)·(1/qmax))), the product in fp32, the ceil exact.
inline float pow2_scale(float amax, float floor_v, float qmax) {
  const float x = std::max(amax, floor_v) * (1.0f / qmax);
  int e;
  const double m = std::frexp(double(x), &e);  // x = m·2^e, m in [0.5, 1)
  return std::ldexp(1.0f, m == 0.5 ? e - 1 : e);
}

// q8(x, B) of §2 (pow2 = false: amax/448 scales, scale_fmt != ue8m0).
inline void ref_q8(float* x, size_t n, size_t block, bool pow2 = true) {
  for (size_t b0 = 0; b0 < n; b0 += block) {
    const size_t b1 = std::min(n, b0 + block);
    float amax = 0.f;
    for (size_t i = b0; i < b1; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float s = pow2 ? pow2_scale(amax, 1e-4f, 448.0f) : std::max(amax, 1e-4f) / 448.0f;
    for (size_t i = b0; i < b1; ++i) x[i] = e4m3_round(std::clamp(x[i] / s, -448.0f, 448.0f)) * s;
  }
}

// Sylvester–Hadamard transform by the explicit matrix H[i][j] = (−1)^popcount(i&j),
// scale n^-1/2, in double, bf16 out.
inline std::vector<float> ref_hadamard(const float* x, int n) {
  std::vector<float> y(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    double s = 0;
    for (int j = 0; j < n; ++j) s += (std::popcount(unsigned(i & j)) & 1 ? -1.0 : 1.0) * x[j];
    y[size_t(i)] = bfd(s / std::sqrt(double(n)));
  }
  return y;
}

// ===========================================================================
// Reference RoPE (MODEL.md §5), fp32 exactly as the spec writes it
// ===========================================================================

// The tiny preset's RoPE (theta 1e4, compressed 1.6e5, YaRN factor 16 over
// 65536, beta 32/1) with `rd` rotated dims.
inline ModelConfig rope_config(int rd) {
  ModelConfig c = synthetic_config(SyntheticOptions{});
  c.qk_rope_head_dim = rd;
  return c;
}

struct YarnRange {
  double low, high;
};
inline YarnRange yarn_range(const ModelConfig& c, float base) {
  const int rd = c.qk_rope_head_dim;
  auto cd = [&](double n) {
    return rd * std::log(double(c.rope_original_max_position) / (2 * M_PI * n)) / (2 * std::log(double(base)));
  };
  YarnRange y{std::max(std::floor(cd(c.rope_beta_fast)), 0.0), std::min(std::ceil(cd(c.rope_beta_slow)), double(rd - 1))};
  if (y.high == y.low) y.high += 0.001;
  return y;
}

inline std::vector<float> ref_freqs(const ModelConfig& c, bool compressed) {
  const int rd = c.qk_rope_head_dim;
  const float base = compressed ? c.compress_rope_theta : c.rope_theta;
  std::vector<float> f(size_t(rd / 2));
  for (int p = 0; p < rd / 2; ++p) f[size_t(p)] = 1.0f / powf(base, float(2 * p) / float(rd));
  if (compressed && c.rope_original_max_position > 0) {
    const YarnRange y = yarn_range(c, base);
    for (int p = 0; p < rd / 2; ++p) {
      const float ramp = float(std::clamp((p - y.low) / (y.high - y.low), 0.0, 1.0));
      const float smooth = 1.0f - ramp;
      const float fp = f[size_t(p)];
      f[size_t(p)] = (fp / c.rope_factor) * (1.0f - smooth) + fp * smooth;
    }
  }
  return f;
}

// Rotates the rd dims at x by pos (inverse: −pos), fp32, each output bf16.
inline void ref_rope(float* x, const std::vector<float>& freqs, int64_t pos, bool inverse = false) {
  for (size_t p = 0; p < freqs.size(); ++p) {
    const float th = float(pos) * freqs[p];
    const float c = std::cos(th), s = inverse ? -std::sin(th) : std::sin(th);
    const float x0 = x[2 * p], x1 = x[2 * p + 1];
    const float y0 = x0 * c - x1 * s;
    const float y1 = x0 * s + x1 * c;
    x[2 * p] = bf(y0);
    x[2 * p + 1] = bf(y1);
  }
}

// ===========================================================================
// Weights over test-built buffers, with the test's own decoding
// ===========================================================================

// Owns the byte buffers the Weights point into (node addresses are stable).
class Arena {
 public:
  Arena() = default;
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  uint8_t* bytes(size_t n) {
    bufs_.emplace_back(n);
    return bufs_.back().data();
  }

 private:
  std::list<std::vector<uint8_t>> bufs_;
};

struct TestWeight {
  Weight w;
  std::vector<double> ref;  // [out][in], decoded by the test
  double at(int64_t o, int64_t i) const { return ref[size_t(o * w.in + i)]; }
};

inline TestWeight bf16_weight(Arena& arena, const std::vector<float>& v, int64_t out, int64_t in) {
  TestWeight t;
  t.w.kind = Weight::Kind::kBF16;
  t.w.out = out;
  t.w.in = in;
  uint8_t* d = arena.bytes(size_t(out * in * 2));
  for (size_t i = 0; i < v.size(); ++i) {
    const uint16_t h = uint16_t(to_bits(v[i]) >> 16);
    EXPECT_EQ(to_bits(v[i]) & 0xffffu, 0u) << "bf16_weight value is not bf16";
    std::memcpy(d + 2 * i, &h, 2);
    t.ref.push_back(v[i]);
  }
  t.w.data = d;
  return t;
}

// FP8 e4m3 weight with one e8m0 scale per block×block tile. Codes have an
// exponent field in [e_lo, e_hi] and random sign/mantissa (never NaN); scale
// bytes are uniform in [s_lo, s_hi].
inline TestWeight fp8_weight(Arena& arena, Rng& rng, int64_t out, int64_t in, int block, int e_lo = 0, int e_hi = 15,
                      int s_lo = 120, int s_hi = 130) {
  TestWeight t;
  t.w.kind = Weight::Kind::kFP8;
  t.w.out = out;
  t.w.in = in;
  t.w.block = block;
  const int64_t sr = (out + block - 1) / block, sc = (in + block - 1) / block;
  uint8_t* d = arena.bytes(size_t(out * in));
  uint8_t* s = arena.bytes(size_t(sr * sc));
  for (int64_t i = 0; i < sr * sc; ++i) s[i] = uint8_t(rng.integer(s_lo, s_hi));
  t.ref.resize(size_t(out * in));
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) {
      int code;
      do code = (rng.integer(0, 1) << 7) | (rng.integer(e_lo, e_hi) << 3) | rng.integer(0, 7);
      while ((code & 0x7f) == 0x7f);
      d[o * in + i] = uint8_t(code);
      t.ref[size_t(o * in + i)] = e4m3_value(code) * e8m0_value(s[(o / block) * sc + i / block]);
    }
  t.w.data = d;
  t.w.scale = s;
  return t;
}

// FP4 e2m1 weight: two codes per byte along `in`, the LOW nibble holding the
// even index; one e8m0 scale per 32 inputs, bytes uniform in [s_lo, s_hi].
inline TestWeight fp4_weight(Arena& arena, Rng& rng, int64_t out, int64_t in, int s_lo = 124, int s_hi = 127) {
  TestWeight t;
  t.w.kind = Weight::Kind::kFP4;
  t.w.out = out;
  t.w.in = in;
  uint8_t* d = arena.bytes(size_t(out * in / 2));
  uint8_t* s = arena.bytes(size_t(out * in / 32));
  for (int64_t i = 0; i < out * in / 32; ++i) s[i] = uint8_t(rng.integer(s_lo, s_hi));
  t.ref.resize(size_t(out * in));
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; i += 2) {
      const int c0 = rng.integer(0, 15), c1 = rng.integer(0, 15);
      d[o * (in / 2) + i / 2] = uint8_t(c0 | (c1 << 4));
      const double sc = e8m0_value(s[o * (in / 32) + i / 32]);
      t.ref[size_t(o * in + i)] = e2m1_value(c0) * sc;
      t.ref[size_t(o * in + i + 1)] = e2m1_value(c1) * sc;
    }
  t.w.data = d;
  t.w.scale = s;
  return t;
}

// Σ_i x[i]·W[o][i] in double, and Σ_i |x[i]·W[o][i]|.
struct Dot {
  double sum = 0, abs_sum = 0;
};
inline Dot ref_dot(const TestWeight& W, int64_t o, const float* x) {
  Dot d;
  for (int64_t i = 0; i < W.w.in; ++i) {
    const double p = W.at(o, i) * x[i];
    d.sum += p;
    d.abs_sum += std::fabs(p);
  }
  return d;
}

}  // namespace dsv4::testing
