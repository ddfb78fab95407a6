// Stage tests: every stage of the forward (MODEL.md §2–§9) against a small
// reference written in this file directly from the spec — plain loops, double
// precision where the spec accumulates in fp32, and the spec's rounding
// points. Inputs are small and random (fixed-seed std::mt19937), weights are
// built here byte by byte; no checkpoint is needed.
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
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "io/config.h"
#include "core/cpu.h"
#include "core/formats.h"
#include "kernels/dot.h"
#include "kernels/exp.h"
#include "kernels/hadamard.h"
#include "kernels/indexer_score.h"
#include "kernels/linear.h"
#include "kernels/norm.h"
#include "kernels/rope.h"
#include "kernels/sparse_attention.h"
#include "kernels/swiglu.h"
#include "kernels/topk.h"
#include "model/attention.h"
#include "model/compressor.h"
#include "model/hc.h"
#include "model/model.h"
#include "model/moe.h"
#include "model/weights.h"

namespace {

using dsv4::ModelConfig;
using dsv4::Weight;

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInfF = std::numeric_limits<float>::infinity();

// ===========================================================================
// Bits, a reference bf16 rounding, and comparisons
// ===========================================================================

uint32_t to_bits(float f) { return std::bit_cast<uint32_t>(f); }
float from_bits(uint32_t u) { return std::bit_cast<float>(u); }

// Round-to-nearest-even to bf16, written independently of core/formats.h: the
// nearer of the two bf16 values that bracket f; on a tie the one whose last
// mantissa bit is even.
float bf(float f) {
  if (!std::isfinite(f)) return f;
  const uint32_t lo_bits = to_bits(f) & 0xffff0000u;
  const float lo = from_bits(lo_bits);  // toward zero
  if (lo == f) return f;
  const float hi = from_bits(lo_bits + 0x10000u);  // away from zero
  const double dl = std::fabs(double(f) - lo), dh = std::fabs(double(hi) - f);
  if (dl != dh) return dl < dh ? lo : hi;
  return ((lo_bits >> 16) & 1u) ? hi : lo;
}
// bf16 of a value the spec computes in fp32 and this file in double.
float bfd(double x) { return bf(float(x)); }

// One bf16 step at the magnitude of v.
double bf16_step(double v) {
  v = std::fabs(v);
  if (v < 0x1p-126) return 0x1p-133;
  int e;
  std::frexp(v, &e);  // v in [2^(e-1), 2^e)
  return std::ldexp(1.0, e - 8);
}

std::string fmt(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.9g", v);
  return b;
}

// got: an engine value rounded to bf16 after fp32 arithmetic; ref: the exact
// value before that rounding. Passes when |got − ref| ≤ one bf16 step (got is
// one of the two bf16 values around ref) plus n·2^-24·abs_sum, the worst-case
// fp32 error of a sum of n terms whose magnitudes add up to abs_sum.
::testing::AssertionResult NearBf16(float got, double ref, double abs_sum = 0.0, int64_t n = 0) {
  const double tol = bf16_step(ref) + double(n) * 0x1p-24 * abs_sum;
  if (std::fabs(double(got) - ref) <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "got " << fmt(got) << ", reference " << fmt(ref) << ", tolerance "
                                       << fmt(tol);
}

// Same for an fp32 result (no bf16 rounding): a few fp32 steps plus the sum bound.
::testing::AssertionResult NearF32(float got, double ref, double abs_sum = 0.0, int64_t n = 0) {
  const double tol = 4 * 0x1p-24 * std::fabs(ref) + double(n) * 0x1p-24 * abs_sum + 1e-30;
  if (std::fabs(double(got) - ref) <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "got " << fmt(got) << ", reference " << fmt(ref) << ", tolerance "
                                       << fmt(tol);
}

bool same_value(float a, float b) { return a == b || (std::isnan(a) && std::isnan(b)); }

// Values behind several rounding points (see the header): at least min_exact
// of the elements equal, every other one within tol(i).
void ExpectMostlyExact(const std::vector<float>& got, const std::vector<float>& ref, double min_exact,
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

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
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

double e4m3_value(int code) {
  const int e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return std::nan("");
  const double mag = e == 0 ? (m / 8.0) * 0x1p-6 : (1.0 + m / 8.0) * std::ldexp(1.0, e - 7);
  return (code & 0x80) ? -mag : mag;
}
double e2m1_value(int code) {
  const int e = (code >> 1) & 3, m = code & 1;
  const double mag = e == 0 ? 0.5 * m : (1.0 + 0.5 * m) * std::ldexp(1.0, e - 1);
  return (code & 8) ? -mag : mag;
}
double e8m0_value(int b) { return std::ldexp(1.0, b - 127); }

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
float e4m3_round(float v) {  // |v| ≤ 448
  const double r = nearest_code_value(std::fabs(v), 0x7f, e4m3_value);
  return float(v < 0 ? -r : r);
}
float e2m1_round(float v) {  // |v| ≤ 6
  const double r = nearest_code_value(std::fabs(v), 8, e2m1_value);
  return float(v < 0 ? -r : r);
}

// 2^ceil(log2(max(amax, floor)·(1/qmax))), the product in fp32, the ceil exact.
float pow2_scale(float amax, float floor_v, float qmax) {
  const float x = std::max(amax, floor_v) * (1.0f / qmax);
  int e;
  const double m = std::frexp(double(x), &e);  // x = m·2^e, m in [0.5, 1)
  return std::ldexp(1.0f, m == 0.5 ? e - 1 : e);
}

// q8(x, B) of §2 (pow2 = false: amax/448 scales, scale_fmt != ue8m0).
void ref_q8(float* x, size_t n, size_t block, bool pow2 = true) {
  for (size_t b0 = 0; b0 < n; b0 += block) {
    const size_t b1 = std::min(n, b0 + block);
    float amax = 0.f;
    for (size_t i = b0; i < b1; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float s = pow2 ? pow2_scale(amax, 1e-4f, 448.0f) : std::max(amax, 1e-4f) / 448.0f;
    for (size_t i = b0; i < b1; ++i) x[i] = e4m3_round(std::clamp(x[i] / s, -448.0f, 448.0f)) * s;
  }
}
// q4(x) of §2, blocks of 32.
void ref_q4(float* x, size_t n) {
  for (size_t b0 = 0; b0 < n; b0 += 32) {
    const size_t b1 = std::min(n, b0 + 32);
    float amax = 0.f;
    for (size_t i = b0; i < b1; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float s = pow2_scale(amax, 6.0f * 0x1p-126f, 6.0f);
    for (size_t i = b0; i < b1; ++i) x[i] = e2m1_round(std::clamp(x[i] / s, -6.0f, 6.0f)) * s;
  }
}

// Tolerances of one step of the FP8 / FP4 grids around a value (for
// ExpectMostlyExact): neighbouring e4m3 values differ by ≤ 1/8 of the larger,
// e2m1 values by ≤ 1/2 of the larger; blk_amax covers the subnormal / zero steps.
double e4m3_step_tol(float a, float b, float blk_amax) {
  return std::max(std::fabs(a), std::fabs(b)) / 8 + blk_amax * 0x1p-16;
}
double e2m1_step_tol(float a, float b, float blk_amax) {
  return std::max(std::fabs(a), std::fabs(b)) / 2 + blk_amax / 6;
}

// Sylvester–Hadamard transform by the explicit matrix H[i][j] = (−1)^popcount(i&j),
// scale n^-1/2, in double, bf16 out.
std::vector<float> ref_hadamard(const float* x, int n) {
  std::vector<float> y(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    double s = 0;
    for (int j = 0; j < n; ++j) s += (std::popcount(unsigned(i & j)) & 1 ? -1.0 : 1.0) * x[j];
    y[size_t(i)] = bfd(s / std::sqrt(double(n)));
  }
  return y;
}

// RMSNorm of §4 in double: bf16(w · (v · r)), w may be null.
void ref_rms_norm(const float* v, const float* w, int64_t n, double eps, float* y) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += double(v[i]) * v[i];
  const double r = 1.0 / std::sqrt(ss / double(n) + eps);
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = bfd((w ? double(w[i]) : 1.0) * (double(v[i]) * r));
  std::copy(out.begin(), out.end(), y);
}

// ===========================================================================
// Reference RoPE (MODEL.md §5), fp32 exactly as the spec writes it
// ===========================================================================

ModelConfig rope_config(int rd) {
  ModelConfig c;
  c.qk_rope_head_dim = rd;
  c.rope_theta = 10000.f;
  c.compress_rope_theta = 160000.f;
  c.rope_factor = 16.f;
  c.rope_original_max_position = 65536;
  c.rope_beta_fast = 32.f;
  c.rope_beta_slow = 1.f;
  c.rms_norm_eps = 1e-6f;
  return c;
}

struct YarnRange {
  double low, high;
};
YarnRange yarn_range(const ModelConfig& c, float base) {
  const int rd = c.qk_rope_head_dim;
  auto cd = [&](double n) {
    return rd * std::log(double(c.rope_original_max_position) / (2 * M_PI * n)) / (2 * std::log(double(base)));
  };
  YarnRange y{std::max(std::floor(cd(c.rope_beta_fast)), 0.0), std::min(std::ceil(cd(c.rope_beta_slow)), double(rd - 1))};
  if (y.high == y.low) y.high += 0.001;
  return y;
}

std::vector<float> ref_freqs(const ModelConfig& c, bool compressed) {
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
void ref_rope(float* x, const std::vector<float>& freqs, int64_t pos, bool inverse = false) {
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

TestWeight bf16_weight(Arena& arena, const std::vector<float>& v, int64_t out, int64_t in) {
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

TestWeight f32_weight(Arena& arena, const std::vector<float>& v, int64_t out, int64_t in) {
  TestWeight t;
  t.w.kind = Weight::Kind::kF32;
  t.w.out = out;
  t.w.in = in;
  uint8_t* d = arena.bytes(size_t(out * in * 4));
  std::memcpy(d, v.data(), v.size() * 4);
  t.w.data = d;
  t.ref.assign(v.begin(), v.end());
  return t;
}

// FP8 e4m3 weight with one e8m0 scale per block×block tile. Codes have an
// exponent field in [e_lo, e_hi] and random sign/mantissa (never NaN); scale
// bytes are uniform in [s_lo, s_hi].
TestWeight fp8_weight(Arena& arena, Rng& rng, int64_t out, int64_t in, int block, int e_lo = 0, int e_hi = 15,
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
TestWeight fp4_weight(Arena& arena, Rng& rng, int64_t out, int64_t in, int s_lo = 124, int s_hi = 127) {
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

// FP4 weight from explicit codes [out][in] and scale bytes [out][in/32].
TestWeight fp4_weight_from(Arena& arena, const std::vector<int>& codes, const std::vector<uint8_t>& scales,
                           int64_t out, int64_t in) {
  TestWeight t;
  t.w.kind = Weight::Kind::kFP4;
  t.w.out = out;
  t.w.in = in;
  uint8_t* d = arena.bytes(size_t(out * in / 2));
  uint8_t* s = arena.bytes(scales.size());
  std::copy(scales.begin(), scales.end(), s);
  for (int64_t i = 0; i < out * in; i += 2) d[i / 2] = uint8_t(codes[size_t(i)] | (codes[size_t(i + 1)] << 4));
  for (int64_t i = 0; i < out * in; ++i)
    t.ref.push_back(e2m1_value(codes[size_t(i)]) * e8m0_value(s[(i / in) * (in / 32) + (i % in) / 32]));
  t.w.data = d;
  t.w.scale = s;
  return t;
}

// Σ_i x[i]·W[o][i] in double, and Σ_i |x[i]·W[o][i]|.
struct Dot {
  double sum = 0, abs_sum = 0;
};
Dot ref_dot(const TestWeight& W, int64_t o, const float* x) {
  Dot d;
  for (int64_t i = 0; i < W.w.in; ++i) {
    const double p = W.at(o, i) * x[i];
    d.sum += p;
    d.abs_sum += std::fabs(p);
  }
  return d;
}

// ===========================================================================
// §4 Hyper-connections
// ===========================================================================

struct HcCase {
  int hc;
  int64_t D;
  int64_t n;
  std::vector<float> X;  // [n][hc][D], bf16
  dsv4::HcWeights w;
};

HcCase make_hc_case(uint32_t seed, int hc, int64_t D, int64_t n) {
  Rng rng(seed);
  HcCase k{hc, D, n, rng.bf16_vec(size_t(n * hc * D), -2, 2), {}};
  const int rows = (2 + hc) * hc;
  for (int64_t i = 0; i < rows * hc * D; ++i) k.w.fn.push_back(float(rng.uniform(-0.1, 0.1)));
  for (int i = 0; i < rows; ++i) k.w.base.push_back(float(rng.uniform(-1, 1)));
  k.w.scale = {0.7f, 1.3f, 2.0f};
  return k;
}

struct HcPreRef {
  std::vector<float> y;                  // [D]
  std::vector<double> pre, post, comb;   // [hc], [hc], [hc][hc]
};

// §4 hc_pre for one token, in double.
HcPreRef ref_hc_pre(const float* X, int hc, int64_t D, const dsv4::HcWeights& w, int iters, double hc_eps,
                    double norm_eps) {
  const int64_t len = hc * D;
  const int rows = (2 + hc) * hc;
  double ss = 0;
  for (int64_t i = 0; i < len; ++i) ss += double(X[i]) * X[i];
  const double r = 1.0 / std::sqrt(ss / double(len) + norm_eps);
  std::vector<double> m(static_cast<size_t>(rows));
  for (int i = 0; i < rows; ++i) {
    double s = 0;
    for (int64_t j = 0; j < len; ++j) s += double(w.fn[size_t(i * len + j)]) * X[j];
    m[size_t(i)] = s * r;
  }
  auto sigmoid = [](double v) { return 1.0 / (1.0 + std::exp(-v)); };
  HcPreRef out;
  for (int i = 0; i < hc; ++i) out.pre.push_back(sigmoid(m[size_t(i)] * w.scale[0] + w.base[size_t(i)]) + hc_eps);
  for (int i = 0; i < hc; ++i) out.post.push_back(2 * sigmoid(m[size_t(hc + i)] * w.scale[1] + w.base[size_t(hc + i)]));
  std::vector<double>& C = out.comb;
  C.resize(size_t(hc * hc));
  auto at = [&](int j, int k) -> double& { return C[size_t(j * hc + k)]; };
  for (int j = 0; j < hc; ++j) {
    double mx = -INFINITY, s = 0;
    for (int k = 0; k < hc; ++k) {
      at(j, k) = m[size_t(2 * hc + j * hc + k)] * w.scale[2] + w.base[size_t(2 * hc + j * hc + k)];
      mx = std::max(mx, at(j, k));
    }
    for (int k = 0; k < hc; ++k) s += std::exp(at(j, k) - mx);
    for (int k = 0; k < hc; ++k) at(j, k) = std::exp(at(j, k) - mx) / s + hc_eps;
  }
  auto col_norm = [&] {
    for (int k = 0; k < hc; ++k) {
      double s = 0;
      for (int j = 0; j < hc; ++j) s += at(j, k);
      for (int j = 0; j < hc; ++j) at(j, k) /= (s + hc_eps);
    }
  };
  auto row_norm = [&] {
    for (int j = 0; j < hc; ++j) {
      double s = 0;
      for (int k = 0; k < hc; ++k) s += at(j, k);
      for (int k = 0; k < hc; ++k) at(j, k) /= (s + hc_eps);
    }
  };
  col_norm();
  for (int it = 1; it < iters; ++it) {
    row_norm();
    col_norm();
  }
  for (int64_t c = 0; c < D; ++c) {
    double s = 0;
    for (int i = 0; i < hc; ++i) s += out.pre[size_t(i)] * X[i * D + c];
    out.y.push_back(bfd(s));
  }
  return out;
}

TEST(StageHc, PreMatchesReference) {
  for (int hc : {4, 3}) {
    SCOPED_TRACE("hc = " + std::to_string(hc));
    HcCase k = make_hc_case(11 + hc, hc, 64, 3);
    std::vector<float> y(size_t(k.n * k.D));
    dsv4::HcMix mix;
    dsv4::hc_pre(k.X.data(), k.n, hc, k.D, k.w, 20, 1e-6f, 1e-6f, y.data(), &mix);
    ASSERT_EQ(mix.post.size(), size_t(k.n * hc));
    ASSERT_EQ(mix.comb.size(), size_t(k.n * hc * hc));
    for (int64_t t = 0; t < k.n; ++t) {
      HcPreRef r = ref_hc_pre(k.X.data() + t * hc * k.D, hc, k.D, k.w, 20, 1e-6, 1e-6);
      // post and comb are fp32 values from an (hc·D)-term dot, a sigmoid /
      // softmax and 20 Sinkhorn rounds: they come out ≤ 3e-7 from the double
      // reference; 2e-6 leaves margin and still sees a dropped hc_eps.
      for (int i = 0; i < hc; ++i) EXPECT_NEAR(mix.post[size_t(t * hc + i)], r.post[size_t(i)], 2e-6) << "post " << i;
      for (int i = 0; i < hc * hc; ++i) EXPECT_NEAR(mix.comb[size_t(t * hc * hc + i)], r.comb[size_t(i)], 2e-6) << "comb " << i;
      for (int64_t c = 0; c < k.D; ++c) {
        double s = 0, a = 0;
        for (int i = 0; i < hc; ++i) {
          s += r.pre[size_t(i)] * k.X[size_t((t * hc + i) * k.D + c)];
          a += std::fabs(r.pre[size_t(i)] * k.X[size_t((t * hc + i) * k.D + c)]);
        }
        // pre itself carries ~1e-6 relative error (allowed through abs_sum).
        EXPECT_TRUE(NearBf16(y[size_t(t * k.D + c)], s, a * 16, 1)) << "y token " << t << " ch " << c;
      }
    }
  }
}

// Largest |row sum − 1| and |column sum − 1| of a token's comb matrix.
template <class T>
std::pair<double, double> stochastic_error(const T* C, int hc) {
  double row_err = 0, col_err = 0;
  for (int j = 0; j < hc; ++j) {
    double row = 0, col = 0;
    for (int i = 0; i < hc; ++i) {
      row += C[j * hc + i];
      col += C[i * hc + j];
    }
    row_err = std::max(row_err, std::fabs(row - 1));
    col_err = std::max(col_err, std::fabs(col - 1));
  }
  return {row_err, col_err};
}

TEST(StageHc, CombIsDoublyStochasticAfterSinkhorn) {
  // The last Sinkhorn step normalises columns, so they sum to 1 (up to eps).
  // Rows converge at a rate that depends on how peaked the logits are: with
  // mild logits they are 1 to 1e-4 after 20 rounds; with peaked ones (scale 6)
  // 20 rounds leave up to ~2% (the double reference does the same; the row
  // error is not even monotone in the number of rounds).
  for (float comb_scale : {1.0f, 6.0f}) {
    SCOPED_TRACE("comb scale " + fmt(comb_scale));
    HcCase k = make_hc_case(21, 4, 64, 4);
    k.w.scale[2] = comb_scale;
    std::vector<float> y(size_t(k.n * k.D));
    dsv4::HcMix mix;
    dsv4::hc_pre(k.X.data(), k.n, 4, k.D, k.w, 20, 1e-6f, 1e-6f, y.data(), &mix);
    double worst_row_one = 0;
    for (int64_t t = 0; t < k.n; ++t) {
      const float* C = mix.comb.data() + t * 16;
      for (int i = 0; i < 16; ++i) EXPECT_GT(C[i], 0.f);
      const auto [row_err, col_err] = stochastic_error(C, 4);
      EXPECT_LT(col_err, 1e-5) << "token " << t;
      EXPECT_LT(row_err, comb_scale == 1.0f ? 1e-4 : 0.05) << "token " << t;
      const HcPreRef one = ref_hc_pre(k.X.data() + t * 4 * k.D, 4, k.D, k.w, 1, 1e-6, 1e-6);
      worst_row_one = std::max(worst_row_one, stochastic_error(one.comb.data(), 4).first);
    }
    // The softmax rows with a single column pass are far from balanced: the
    // row check above is not vacuous.
    EXPECT_GT(worst_row_one, 0.02);
  }
}

TEST(StageHc, PostMatchesReference) {
  Rng rng(31);
  const int hc = 4;
  const int64_t D = 48, n = 3;
  std::vector<float> X = rng.bf16_vec(size_t(n * hc * D), -3, 3), f = rng.bf16_vec(size_t(n * D), -2, 2);
  dsv4::HcMix mix;
  for (int64_t i = 0; i < n * hc; ++i) mix.post.push_back(float(rng.uniform(0, 2)));
  // A deliberately asymmetric C, so C[j][k] and C[k][j] cannot be confused.
  for (int64_t i = 0; i < n * hc * hc; ++i) mix.comb.push_back(float(rng.uniform(0, 1)));
  std::vector<float> X0 = X;
  dsv4::HcActivations act;
  dsv4::hc_post(f.data(), X.data(), n, hc, D, mix, act);
  for (int64_t t = 0; t < n; ++t)
    for (int k = 0; k < hc; ++k)
      for (int64_t c = 0; c < D; ++c) {
        double s = double(mix.post[size_t(t * hc + k)]) * f[size_t(t * D + c)];
        double a = std::fabs(s);
        for (int j = 0; j < hc; ++j) {
          const double v = double(mix.comb[size_t(t * hc * hc + j * hc + k)]) * X0[size_t((t * hc + j) * D + c)];
          s += v;
          a += std::fabs(v);
        }
        EXPECT_TRUE(NearBf16(X[size_t((t * hc + k) * D + c)], s, a, hc + 1))
            << "token " << t << " stream " << k << " ch " << c;
      }
}

// The fast hc paths against plain loops, bit for bit: dot4_f32 against
// dot_f32 (mixes takes four tokens at once), a token's hc_pre output the same
// alone as in a block of 8 or in a partial block, and hc_post (16 channels at
// a time) against its definition in fp32, D with a tail past the last 16.
TEST(StageHc, FastPathsEqualPlainLoopsBitwise) {
  Rng rng(53);
  for (int64_t len : {1, 15, 16, 17, 100, 1040}) {
    std::vector<float> a = rng.bf16_vec(size_t(len), -2, 2);
    std::vector<std::vector<float>> b;
    for (int t = 0; t < 4; ++t) b.push_back(rng.bf16_vec(size_t(len), -2, 2));
    const float* bs[4] = {b[0].data(), b[1].data(), b[2].data(), b[3].data()};
    float out[4];
    dsv4::dot4_f32(a.data(), bs, len, out);
    for (int t = 0; t < 4; ++t)
      EXPECT_EQ(std::bit_cast<uint32_t>(out[t]), std::bit_cast<uint32_t>(dsv4::dot_f32(a.data(), bs[t], len)))
          << "len " << len << " t " << t;
  }
  const int hc = 4;
  const int64_t D = 40;
  HcCase k = make_hc_case(61, hc, D, 11);
  std::vector<float> y(size_t(k.n * D));
  dsv4::HcMix mix;
  dsv4::hc_pre(k.X.data(), k.n, hc, D, k.w, 20, 1e-6f, 1e-6f, y.data(), &mix);
  for (int64_t t = 0; t < k.n; ++t) {
    std::vector<float> y1(static_cast<size_t>(D));
    dsv4::HcMix mix1;
    dsv4::hc_pre(k.X.data() + t * hc * D, 1, hc, D, k.w, 20, 1e-6f, 1e-6f, y1.data(), &mix1);
    EXPECT_TRUE(std::equal(y1.begin(), y1.end(), y.begin() + t * D)) << "token " << t;
    EXPECT_TRUE(std::equal(mix1.post.begin(), mix1.post.end(), mix.post.begin() + t * hc)) << "token " << t;
    EXPECT_TRUE(std::equal(mix1.comb.begin(), mix1.comb.end(), mix.comb.begin() + t * hc * hc)) << "token " << t;
  }
  // hc_post on inputs where the order of the sum shows in the bf16 result:
  // streams 0 and 1 cancel exactly in ascending order (equal weights,
  // opposite values of ~2^20), so the result is streams 2 and 3 alone; any
  // other order first rounds them away against ±2^20.
  std::vector<float> f = rng.bf16_vec(size_t(k.n * D), -2, 2), X0 = k.X;
  for (int64_t t = 0; t < k.n; ++t) {
    for (int kk = 0; kk < hc; ++kk)
      mix.comb[size_t(t * hc * hc + hc + kk)] = mix.comb[size_t(t * hc * hc + kk)];
    for (int64_t c = 0; c < D; ++c) {
      const float big = dsv4::bf16r(float(rng.uniform(1, 2)) * 0x1p20f);
      X0[size_t((t * hc + 0) * D + c)] = big;
      X0[size_t((t * hc + 1) * D + c)] = -big;
    }
  }
  std::vector<float> X = X0;
  dsv4::HcActivations act;
  dsv4::hc_post(f.data(), X.data(), k.n, hc, D, mix, act);
  for (int64_t t = 0; t < k.n; ++t)
    for (int kk = 0; kk < hc; ++kk)
      for (int64_t c = 0; c < D; ++c) {
        float s = 0.f;
        for (int j = 0; j < hc; ++j)
          s += mix.comb[size_t(t * hc * hc + j * hc + kk)] * X0[size_t((t * hc + j) * D + c)];
        const float want = dsv4::bf16r(mix.post[size_t(t * hc + kk)] * f[size_t(t * D + c)] + s);
        ASSERT_EQ(std::bit_cast<uint32_t>(X[size_t((t * hc + kk) * D + c)]), std::bit_cast<uint32_t>(want))
            << "token " << t << " stream " << kk << " ch " << c;
      }
}

TEST(StageHc, HeadMatchesReference) {
  Rng rng(41);
  const int hc = 4;
  const int64_t D = 64, n = 2;
  std::vector<float> X = rng.bf16_vec(size_t(n * hc * D), -2, 2);
  dsv4::HcHeadWeights w;
  for (int64_t i = 0; i < hc * hc * D; ++i) w.fn.push_back(float(rng.uniform(-0.1, 0.1)));
  for (int i = 0; i < hc; ++i) w.base.push_back(float(rng.uniform(-1, 1)));
  w.scale = {1.7f};
  std::vector<float> y(size_t(n * D));
  dsv4::hc_head(X.data(), n, hc, D, w, 1e-6f, 1e-6f, y.data());
  for (int64_t t = 0; t < n; ++t) {
    const float* x = X.data() + t * hc * D;
    double ss = 0;
    for (int64_t i = 0; i < hc * D; ++i) ss += double(x[i]) * x[i];
    const double r = 1.0 / std::sqrt(ss / double(hc * D) + 1e-6);
    double pre[4];
    for (int i = 0; i < hc; ++i) {
      double m = 0;
      for (int64_t j = 0; j < hc * D; ++j) m += double(w.fn[size_t(i * hc * D + j)]) * x[j];
      pre[i] = 1.0 / (1.0 + std::exp(-(m * r * w.scale[0] + w.base[size_t(i)]))) + 1e-6;
    }
    for (int64_t c = 0; c < D; ++c) {
      double s = 0, a = 0;
      for (int i = 0; i < hc; ++i) {
        s += pre[i] * x[i * D + c];
        a += std::fabs(pre[i] * x[i * D + c]);
      }
      EXPECT_TRUE(NearBf16(y[size_t(t * D + c)], s, a * 16, 1)) << "token " << t << " ch " << c;
    }
  }
}

// ===========================================================================
// §4 RMSNorm, §6.2 per-head q normalisation
// ===========================================================================

TEST(StageNorm, RmsNormMatchesReference) {
  Rng rng(51);
  const int64_t n = 300;  // not a multiple of the 16 lanes
  std::vector<float> v = rng.bf16_vec(size_t(n), -3, 3), w = rng.bf16_vec(size_t(n), 0.2, 1.8);
  for (const float* wp : {static_cast<const float*>(w.data()), static_cast<const float*>(nullptr)}) {
    std::vector<float> y(static_cast<size_t>(n));
    dsv4::rms_norm_bf16(v.data(), wp, n, 1e-6f, y.data());
    double ss = 0;
    for (float x : v) ss += double(x) * x;
    const double r = 1.0 / std::sqrt(ss / double(n) + 1e-6);
    for (int64_t i = 0; i < n; ++i)
      EXPECT_TRUE(NearBf16(y[size_t(i)], (wp ? double(wp[i]) : 1.0) * v[size_t(i)] * r)) << "i " << i;
    // In place gives the same.
    std::vector<float> z = v;
    dsv4::rms_norm_bf16(z.data(), wp, n, 1e-6f, z.data());
    EXPECT_TRUE(same_bits(z, y));
  }
}

TEST(StageNorm, RmsNormEpsMatters) {
  // mean(v²) ≈ 1e-6 = eps: the result is ~1/√2 of the eps-free one.
  std::vector<float> v(64, 0.f);
  for (size_t i = 0; i < v.size(); ++i) v[i] = bfd((i % 2 ? -1e-3 : 1e-3) * (1 + 0.01 * double(i)));
  std::vector<float> y(v.size());
  dsv4::rms_norm_bf16(v.data(), nullptr, int64_t(v.size()), 1e-6f, y.data());
  double ss = 0;
  for (float x : v) ss += double(x) * x;
  const double r = 1.0 / std::sqrt(ss / double(v.size()) + 1e-6);
  for (size_t i = 0; i < v.size(); ++i) EXPECT_TRUE(NearBf16(y[i], v[i] * r)) << i;
}

// §6.2 op by op: sq = bf16(q²), m = bf16(mean(sq)), r = bf16(1/sqrt(bf16(m +
// bf16(eps)))), q = bf16(q·r).
std::vector<float> ref_q_head_norm(const std::vector<float>& q, float eps) {
  double sum = 0;
  for (float x : q) sum += bf(x * x);  // q² of a bf16 is exact in fp32
  const float m = bfd(sum / double(q.size()));
  const float r = bfd(1.0 / std::sqrt(double(bfd(double(m) + double(bf(eps))))));
  std::vector<float> out;
  for (float x : q) out.push_back(bf(x * r));  // bf16·bf16 is exact in fp32
  return out;
}

TEST(StageNorm, QHeadNormFollowsBf16RoundingPoints) {
  // 64 random bf16 heads per regime, compared bitwise; in each regime Σ bf16(q²)
  // is exact in fp32 in any order.
  // - |q| in [0.5, 4), n = 512: eps is negligible.
  // - |q| in [2^-11, 2^-9), n = 72: mean(q²) ~ eps, so bf16(m + bf16(eps)) matters.
  // - |q| in [1, 2), n = 512, only values whose square bf16 rounds down by ≥ 0.3
  //   of a step: bf16(q²) biases the mean visibly.
  // A single head rarely shows a dropped rounding point (each moves m by a
  // fraction of a bf16 step); 64 heads do.
  struct Case {
    int64_t n;
    double lo, hi;
    bool biased;
  };
  for (Case cs : {Case{512, 0.5, 4.0, false}, Case{72, 0x1p-11, 0x1p-9, false}, Case{512, 1.0, 2.0, true}}) {
    SCOPED_TRACE("n = " + std::to_string(cs.n) + (cs.biased ? " biased" : ""));
    Rng rng(61);
    int differs_from_plain = 0;
    for (int head = 0; head < 64; ++head) {
      std::vector<float> q;
      while (int64_t(q.size()) < cs.n) {
        const float v = rng.bf16(cs.lo, cs.hi);
        if (cs.biased && double(bf(v * v)) - double(v) * v > -0.3 * bf16_step(double(v) * v)) continue;
        q.push_back((rng.integer(0, 1) ? 1 : -1) * v);
      }
      const std::vector<float> ref = ref_q_head_norm(q, 1e-6f);
      std::vector<float> got = q;
      dsv4::q_head_norm_bf16(got.data(), cs.n, 1e-6f);
      for (int64_t i = 0; i < cs.n; ++i) ASSERT_EQ(got[size_t(i)], ref[size_t(i)]) << "head " << head << " i " << i;
      // The same normalisation in plain fp32 (as RMSNorm does it).
      std::vector<float> plain(q.size());
      dsv4::rms_norm_bf16(q.data(), nullptr, cs.n, 1e-6f, plain.data());
      differs_from_plain += !same_bits(plain, got);
    }
    EXPECT_GT(differs_from_plain, 16) << "test input does not discriminate the rounding points";
  }
}

// ===========================================================================
// §5 RoPE with YaRN
// ===========================================================================

TEST(StageRope, SwaFrequenciesArePlainPowers) {
  const ModelConfig c = rope_config(16);  // YaRN fields set, but SWA tables ignore them
  dsv4::RopeTable t(dsv4::rope_params(c, /*compressed=*/false));
  ASSERT_EQ(t.rd(), 16);
  ASSERT_EQ(t.freqs().size(), 8u);
  const std::vector<float> ref = ref_freqs(c, false);
  for (int p = 0; p < 8; ++p) {
    EXPECT_EQ(t.freqs()[size_t(p)], ref[size_t(p)]) << "p " << p;
    EXPECT_NEAR(t.freqs()[size_t(p)] / std::pow(10000.0, -2.0 * p / 16), 1.0, 1e-6) << "p " << p;
  }
}

TEST(StageRope, YarnFrequenciesFollowTheRamp) {
  // rd = 16, compress_rope_theta 160000, orig 65536, beta 32 / 1:
  // cd(32) = 3.86 → low = 3, cd(1) = 6.18 → high = 7; for Flash's rd = 64: 15 and 25.
  struct Case {
    int rd;
    double low, high;
  };
  for (Case k : {Case{16, 3, 7}, Case{64, 15, 25}}) {
    SCOPED_TRACE("rd = " + std::to_string(k.rd));
    const ModelConfig c = rope_config(k.rd);
    const YarnRange y = yarn_range(c, c.compress_rope_theta);
    ASSERT_EQ(y.low, k.low);
    ASSERT_EQ(y.high, k.high);
    dsv4::RopeTable t(dsv4::rope_params(c, /*compressed=*/true));
    const std::vector<float> ref = ref_freqs(c, true);
    ASSERT_EQ(t.freqs().size(), ref.size());
    for (int p = 0; p < k.rd / 2; ++p) {
      EXPECT_EQ(t.freqs()[size_t(p)], ref[size_t(p)]) << "p " << p;
      const double plain = std::pow(160000.0, -2.0 * p / k.rd);
      const double ramp = std::clamp((p - k.low) / (k.high - k.low), 0.0, 1.0);
      // High frequencies (p ≤ low) unchanged, low ones (p ≥ high) divided by the factor.
      EXPECT_NEAR(t.freqs()[size_t(p)] / (plain / 16 * ramp + plain * (1 - ramp)), 1.0, 2e-6) << "p " << p;
    }
  }
}

TEST(StageRope, YarnDegenerateRangeUsesHighPlusMilli) {
  // beta_fast < beta_slow chosen so that cd(beta_fast) = 5.5 and cd(beta_slow) =
  // 4.5: low = floor(5.5) = 5 = ceil(4.5) = high, so high becomes 5.001.
  ModelConfig c = rope_config(16);
  auto beta_for = [&](double cd) {
    return float(c.rope_original_max_position / (2 * M_PI * std::exp(cd * 2 * std::log(160000.0) / 16)));
  };
  c.rope_beta_fast = beta_for(5.5);
  c.rope_beta_slow = beta_for(4.5);
  const YarnRange y = yarn_range(c, c.compress_rope_theta);
  ASSERT_EQ(y.low, 5.0);
  ASSERT_DOUBLE_EQ(y.high, 5.001);
  dsv4::RopeTable t(dsv4::rope_params(c, true));
  for (int p = 0; p < 8; ++p) {
    const float f = 1.0f / powf(160000.f, float(2 * p) / 16.f);
    EXPECT_FALSE(std::isnan(t.freqs()[size_t(p)])) << "p " << p;
    EXPECT_EQ(t.freqs()[size_t(p)], p <= 5 ? f : f / 16.f) << "p " << p;
  }
}

TEST(StageRope, YarnOnlyWithOriginalMaxPosition) {
  ModelConfig c = rope_config(16);
  c.rope_original_max_position = 0;
  dsv4::RopeTable t(dsv4::rope_params(c, true));
  for (int p = 0; p < 8; ++p) EXPECT_EQ(t.freqs()[size_t(p)], 1.0f / powf(160000.f, float(2 * p) / 16.f)) << p;
}

TEST(StageRope, CosSinAndRotationFollowTheFp32Formula) {
  Rng rng(71);
  for (bool compressed : {false, true}) {
    const ModelConfig c = rope_config(16);
    dsv4::RopeTable t(dsv4::rope_params(c, compressed));
    const std::vector<float> f = ref_freqs(c, compressed);
    for (int64_t pos : {0, 1, 7, 100, 4097, 8191, 65535, 1000003}) {
      SCOPED_TRACE("compressed " + std::to_string(compressed) + " pos " + std::to_string(pos));
      std::vector<float> cs(16);
      t.cos_sin(pos, cs.data());
      for (int p = 0; p < 8; ++p) {
        const float th = float(pos) * f[size_t(p)];
        EXPECT_EQ(cs[size_t(2 * p)], std::cos(th)) << "p " << p;
        EXPECT_EQ(cs[size_t(2 * p + 1)], std::sin(th)) << "p " << p;
      }
      for (bool inverse : {false, true}) {
        std::vector<float> x = rng.bf16_vec(16, -4, 4), ref = x;
        t.rotate(x.data(), cs.data(), inverse);
        ref_rope(ref.data(), f, pos, inverse);
        for (int i = 0; i < 16; ++i) EXPECT_EQ(x[size_t(i)], ref[size_t(i)]) << "inverse " << inverse << " i " << i;
      }
    }
  }
}

TEST(StageRope, InverseUndoesRotation) {
  Rng rng(81);
  const ModelConfig c = rope_config(16);
  dsv4::RopeTable t(dsv4::rope_params(c, true));
  for (int64_t pos : {0, 3, 777, 8191, 123456}) {
    std::vector<float> cs(16);
    t.cos_sin(pos, cs.data());
    // Only the rope part is touched: the pointer is to the last rd dims.
    std::vector<float> v = rng.bf16_vec(24, -4, 4), orig = v;
    t.rotate(v.data() + 8, cs.data());
    for (int i = 0; i < 8; ++i) EXPECT_EQ(v[size_t(i)], orig[size_t(i)]);
    if (pos != 0) {
      EXPECT_FALSE(same_bits(v, orig));
    }
    t.rotate(v.data() + 8, cs.data(), /*inverse=*/true);
    for (int p = 0; p < 8; ++p) {
      const double norm = std::hypot(orig[size_t(8 + 2 * p)], orig[size_t(9 + 2 * p)]);
      // Two bf16 roundings of a rotated pair: each moves it by ≤ 2^-9·√2·|pair|.
      for (int i : {8 + 2 * p, 9 + 2 * p})
        EXPECT_NEAR(v[size_t(i)], orig[size_t(i)], norm * 0x1p-7) << "pos " << pos << " i " << i;
      if (pos == 0) {
        EXPECT_EQ(v[size_t(8 + 2 * p)], orig[size_t(8 + 2 * p)]);
      }
    }
  }
}

// ===========================================================================
// §7 Hadamard
// ===========================================================================

TEST(StageHadamard, HandCheckedSylvesterOrder) {
  // Sylvester H4 rows: ++++, +−+−, ++−−, +−−+; scale 1/2.
  std::vector<float> x = {1, 2, 3, 4};
  dsv4::hadamard_bf16(x.data(), 4);
  EXPECT_EQ(x, (std::vector<float>{5, -1, -2, 0}));
  std::vector<float> y = {1, 0.5f};
  dsv4::hadamard_bf16(y.data(), 2);
  EXPECT_EQ(y[0], bfd(1.5 / std::sqrt(2.0)));
  EXPECT_EQ(y[1], bfd(0.5 / std::sqrt(2.0)));
}

TEST(StageHadamard, MatchesExplicitMatrix) {
  Rng rng(91);
  // n = 64, 256: the scale 1/8, 1/16 is exact and grid inputs give exact
  // sums, so the result is bitwise the reference. n = 128: scale 2^-3.5 is
  // rounded to fp32 first, so one bf16 step either way.
  for (int n : {64, 256, 128}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    std::vector<float> x = n == 128 ? rng.bf16_vec(size_t(n), -3, 3) : rng.grid_vec(size_t(n), 256, 7);
    std::vector<float> ref = ref_hadamard(x.data(), n);
    std::vector<float> got = x;
    dsv4::hadamard_bf16(got.data(), n);
    for (int i = 0; i < n; ++i) {
      if (n == 128) {
        double s = 0, a = 0;
        for (int j = 0; j < n; ++j) {
          s += (std::popcount(unsigned(i & j)) & 1 ? -1.0 : 1.0) * x[size_t(j)];
          a += std::fabs(x[size_t(j)]);
        }
        EXPECT_TRUE(NearBf16(got[size_t(i)], s / std::sqrt(128.0), a / std::sqrt(128.0), n)) << "i " << i;
      } else {
        EXPECT_EQ(got[size_t(i)], ref[size_t(i)]) << "i " << i;
      }
    }
  }
}

// ===========================================================================
// top-k (§8.4, §9.2)
// ===========================================================================

std::vector<int32_t> topk(const std::vector<float>& s, int64_t k) {
  std::vector<int32_t> out;
  dsv4::topk_indices(s.data(), int64_t(s.size()), k, &out);
  return out;
}

TEST(StageTopk, TiesGoToTheLowerIndex) {
  const std::vector<float> s = {1, 3, 3, 2, 3, -0.0f, 0.0f};
  EXPECT_EQ(topk(s, 2), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(topk(s, 4), (std::vector<int32_t>{1, 2, 4, 3}));
  EXPECT_EQ(topk(s, 7), (std::vector<int32_t>{1, 2, 4, 3, 0, 5, 6}));  // −0 == +0: index order
}

TEST(StageTopk, NanRanksBelowEveryNumber) {
  const std::vector<float> s = {kNaN, 1, kNaN, -kInfF, 0};
  EXPECT_EQ(topk(s, 3), (std::vector<int32_t>{1, 4, 3}));
  const std::vector<int32_t> all = topk(s, 5);
  ASSERT_EQ(all.size(), 5u);
  EXPECT_EQ(std::vector<int32_t>(all.begin(), all.begin() + 3), (std::vector<int32_t>{1, 4, 3}));
  EXPECT_EQ((std::vector<int32_t>{std::min(all[3], all[4]), std::max(all[3], all[4])}), (std::vector<int32_t>{0, 2}));
}

// topk_set (the indexer's selection) is topk_indices' set in index order:
// many ties, NaNs, ±0 and every k from 0 past n.
TEST(StageTopk, SetEqualsSortedIndices) {
  std::mt19937 rng(29);
  for (int64_t n : {1, 7, 64, 333}) {
    std::vector<float> s(static_cast<size_t>(n));
    for (float& v : s) {
      const uint32_t u = uint32_t(rng()) % 10;
      v = u == 0 ? kNaN : u == 1 ? -0.0f : u == 2 ? 0.0f : float(int(rng() % 7) - 3);
    }
    for (int64_t k = 0; k <= n + 2; k += (n > 64 ? 17 : 1)) {
      std::vector<int32_t> want = topk(s, k), got;
      std::sort(want.begin(), want.end());
      dsv4::topk_set(s.data(), n, k, &got);
      ASSERT_EQ(got, want) << "n " << n << " k " << k;
    }
  }
}

// indexer_scores (vectorised) against its plain reference, bit for bit:
// negative, ±0, NaN, infinite and rounding-tie products, row counts around
// the 32-row blocks, a row stride above n.
TEST(StageIndexerScores, FastEqualsReferenceBitwise) {
  std::mt19937 rng(31);
  for (int64_t n : {0, 5, 32, 63, 100}) {
    const int heads = 7;
    const int64_t ld = n + 3;
    std::vector<float> dots(static_cast<size_t>(heads * ld)), w(heads);
    for (float& v : dots) {
      const uint32_t kind = uint32_t(rng()) % 12;
      v = kind == 0 ? kNaN : kind == 1 ? -0.0f : kind == 2 ? kInfF : kind == 3 ? -kInfF
          : dsv4::bits_f32((uint32_t(rng()) & 0xbfff0000u) | 0x3f000000u);  // bf16 values of either sign
    }
    for (float& v : w) v = dsv4::bits_f32((uint32_t(rng()) & 0x807f8000u) | 0x3e000000u);
    std::vector<float> fast(static_cast<size_t>(n) + 1, 7.f), ref(static_cast<size_t>(n) + 1, 7.f);
    dsv4::indexer_scores(dots.data(), ld, heads, w.data(), n, fast.data());
    dsv4::indexer_scores_reference(dots.data(), ld, heads, w.data(), n, ref.data());
    for (int64_t r = 0; r <= n; ++r)
      ASSERT_EQ(dsv4::f32_bits(fast[size_t(r)]), dsv4::f32_bits(ref[size_t(r)])) << "n " << n << " row " << r;
  }
}

TEST(StageTopk, KBeyondNAndZero) {
  const std::vector<float> s = {0.5f, 2, 0.5f};
  EXPECT_EQ(topk(s, 10), (std::vector<int32_t>{1, 0, 2}));
  EXPECT_TRUE(topk(s, 0).empty());
  EXPECT_TRUE(topk({}, 3).empty());
}

TEST(StageTopk, MatchesStableSortWithManyTies) {
  Rng rng(101);
  std::vector<float> s(1000);
  for (float& v : s) v = float(rng.integer(0, 9));
  std::vector<int32_t> ref(s.size());
  std::iota(ref.begin(), ref.end(), 0);
  std::stable_sort(ref.begin(), ref.end(), [&](int32_t a, int32_t b) { return s[size_t(a)] > s[size_t(b)]; });
  ref.resize(137);
  EXPECT_EQ(topk(s, 137), ref);
}

// ===========================================================================
// §3 Linear layers
// ===========================================================================

TEST(StageLinear, ActivationQuantisationIsQ8) {
  // An F32 identity weight makes y = q8(x) visible directly (every other term is 0).
  Arena arena;
  const int64_t K = 200;  // blocks of 128: one full, one of 72
  std::vector<float> eye(size_t(K * K), 0.f);
  for (int64_t i = 0; i < K; ++i) eye[size_t(i * K + i)] = 1.f;
  TestWeight W = f32_weight(arena, eye, K, K);
  Rng rng(111);
  std::vector<float> x(size_t(3 * K));
  // Row 0: amax 300 → scale 1; 17 and 19 are ties on the e4m3 grid (step 2 in
  // [16, 32)) going to the even mantissa (16, 20); 3.5·2^-9 is a subnormal tie
  // (→ 4·2^-9). Second block far below the 1e-4 amax floor (scale 2^-22, not 2^-24).
  for (int64_t i = 0; i < 128; ++i) x[size_t(i)] = float(rng.uniform(-250, 250));
  x[0] = 300.f;
  x[1] = 17.f;
  x[2] = 19.f;
  x[3] = -17.f;
  x[4] = 3.5f * 0x1p-9f;
  x[5] = 1e-5f;
  for (int64_t i = 128; i < K; ++i) x[size_t(i)] = float(rng.uniform(-2e-5, 2e-5));
  x[130] = 1e-8f;  // e4m3 subnormals at the floored scale 2^-22, normal at 2^-24
  x[131] = -3e-9f;
  x[132] = 5e-10f;
  // Row 1: wide magnitudes; an exact power-of-two amax (448) in the second block.
  for (int64_t i = 0; i < K; ++i) x[size_t(K + i)] = float(rng.uniform(-1, 1) * std::pow(10.0, rng.uniform(-6, 2)));
  x[size_t(K + 150)] = -448.f;
  // Row 2: zeros.
  for (bool pow2 : {true, false}) {
    SCOPED_TRACE(pow2 ? "pow2 scales" : "amax/448 scales");
    dsv4::LinearOpts o = dsv4::quant_linear_opts(128, pow2);
    o.out_bf16 = false;
    std::vector<float> y(size_t(3 * K));
    dsv4::linear(W.w, x.data(), 3, y.data(), o);
    std::vector<float> ref = x;
    for (int m = 0; m < 3; ++m) ref_q8(ref.data() + m * K, size_t(K), 128, pow2);
    for (int64_t i = 0; i < 3 * K; ++i) EXPECT_EQ(y[size_t(i)], ref[size_t(i)]) << "row " << i / K << " i " << i % K;
    if (pow2) {
      EXPECT_EQ(y[1], 16.f);
      EXPECT_EQ(y[2], 20.f);
      EXPECT_EQ(y[3], -16.f);
      EXPECT_EQ(y[4], 4 * 0x1p-9f);
    }
  }
}

TEST(StageLinear, ActivationQ8KeepsFirstNormalE4m3Binade) {
  // Hand-checked, scale 1 (block amax 300): in e4m3's first normal binade
  // [2^-6, 2^-5) the grid step is 2^-9, as in the subnormals below it.
  Arena arena;
  std::vector<float> eye(128 * 128, 0.f);
  for (int i = 0; i < 128; ++i) eye[size_t(i * 128 + i)] = 1.f;
  TestWeight W = f32_weight(arena, eye, 128, 128);
  std::vector<float> x(128, 0.f);
  x[0] = 300.f;
  const std::vector<std::pair<float, float>> cases = {
      {0x1p-6f, 0x1p-6f},                 // 2^-6, code 0x08
      {15 * 0x1p-9f, 15 * 0x1p-9f},       // 1.875·2^-6, code 0x0f: exact
      {0.0292968f, 15 * 0x1p-9f},         // 14.99996·2^-9 → 15·2^-9
      {0.02f, 10 * 0x1p-9f},              // 10.24·2^-9 → 10·2^-9
      {17 * 0x1p-10f, 0x1p-6f},           // 8.5·2^-9: tie → even mantissa (8)
      {-19 * 0x1p-10f, -10 * 0x1p-9f},    // 9.5·2^-9: tie → even mantissa (10)
      {7.5f * 0x1p-9f, 0x1p-6f},          // subnormal 7.5·2^-9: tie → code 8
  };
  for (size_t i = 0; i < cases.size(); ++i) x[i + 1] = cases[i].first;
  dsv4::LinearOpts o = dsv4::quant_linear_opts(128, true);
  o.out_bf16 = false;
  std::vector<float> y(128);
  dsv4::linear(W.w, x.data(), 1, y.data(), o);
  EXPECT_EQ(y[0], 288.f);  // step 32 in [256, 448]: 300 → 288
  for (size_t i = 0; i < cases.size(); ++i)
    EXPECT_EQ(y[i + 1], cases[i].second) << "x = " << fmt(cases[i].first);
}

// y = bf16(Σ q8(x)·W) against the reference; exact when the data is on grids.
void check_linear(const TestWeight& W, const std::vector<float>& x, int64_t M, const dsv4::LinearOpts& o, bool exact,
                  const std::string& what) {
  std::vector<float> y(size_t(M * W.w.out));
  dsv4::linear(W.w, x.data(), M, y.data(), o);
  for (int64_t m = 0; m < M; ++m) {
    std::vector<float> xr(x.begin() + m * W.w.in, x.begin() + (m + 1) * W.w.in);
    if (o.act_quant) ref_q8(xr.data(), xr.size(), size_t(o.act_block), o.act_pow2);
    for (int64_t r = 0; r < W.w.out; ++r) {
      const Dot d = ref_dot(W, r, xr.data());
      const float got = y[size_t(m * W.w.out + r)];
      if (exact)
        EXPECT_EQ(got, o.out_bf16 ? bfd(d.sum) : float(d.sum)) << what << " row " << m << " out " << r;
      else if (o.out_bf16)
        EXPECT_TRUE(NearBf16(got, d.sum, d.abs_sum, W.w.in)) << what << " row " << m << " out " << r;
      else
        EXPECT_TRUE(NearF32(got, d.sum, d.abs_sum, W.w.in)) << what << " row " << m << " out " << r;
    }
  }
}

TEST(StageLinear, Fp8WeightBlocksExactOnGrid) {
  // out = 200 and in = 320: partial 128×128 blocks in both directions (scale
  // grid 2×3). x on a grid that q8 keeps exactly; weight exponents limited so
  // all fp32 sums are exact.
  Arena arena;
  Rng rng(121);
  TestWeight W = fp8_weight(arena, rng, 200, 320, 128, 6, 9, 124, 127);
  std::vector<float> x = rng.grid_vec(size_t(3 * 320), 8, 3);
  check_linear(W, x, 3, dsv4::quant_linear_opts(128, true), /*exact=*/true, "fp8 grid");
}

TEST(StageLinear, Fp8WeightWideRange) {
  // Any e4m3 code, scales 2^-7..2^3, activations over many magnitudes per block.
  Arena arena;
  Rng rng(131);
  TestWeight W = fp8_weight(arena, rng, 200, 320, 128);
  std::vector<float> x(size_t(2 * 320));
  for (int64_t i = 0; i < 640; ++i) {
    const int64_t blk = (i % 320) / 128;
    const double mag = blk == 0 ? 1 : blk == 1 ? 300 : 1e-3;
    x[size_t(i)] = float(rng.uniform(-mag, mag));
  }
  check_linear(W, x, 2, dsv4::quant_linear_opts(128, true), false, "fp8 wide");
  check_linear(W, x, 2, dsv4::quant_linear_opts(128, false), false, "fp8 wide, amax/448");
}

TEST(StageLinear, Fp4WeightLowNibbleFirst) {
  Arena arena;
  // Hand case: one output, in = 32, codes 0..15 then 15..0, scale 2^0: W row =
  // e2m1 values in that order; with x = one-hot at i, y = W[0][i].
  {
    TestWeight W;
    W.w.kind = Weight::Kind::kFP4;
    W.w.out = 1;
    W.w.in = 32;
    uint8_t* d = arena.bytes(16);
    uint8_t* s = arena.bytes(1);
    s[0] = 127;
    int codes[32];
    for (int i = 0; i < 16; ++i) codes[i] = i, codes[16 + i] = 15 - i;
    for (int j = 0; j < 16; ++j) d[j] = uint8_t(codes[2 * j] | (codes[2 * j + 1] << 4));
    W.w.data = d;
    W.w.scale = s;
    for (int i = 0; i < 32; ++i) {
      std::vector<float> x(32, 0.f);
      x[size_t(i)] = 1.f;
      float y;
      dsv4::linear(W.w, x.data(), 1, &y, dsv4::quant_linear_opts(128, true));
      EXPECT_EQ(y, float(e2m1_value(codes[i]))) << "i " << i;
    }
  }
  // Random weight, in = 192 (six scale groups, activation blocks 128 + 64).
  Rng rng(141);
  TestWeight W = fp4_weight(arena, rng, 40, 192);
  check_linear(W, rng.grid_vec(size_t(3 * 192), 8, 3), 3, dsv4::quant_linear_opts(128, true), true, "fp4 grid");
  std::vector<float> x(size_t(2 * 192));
  for (float& v : x) v = float(rng.uniform(-1, 1) * std::pow(10.0, rng.uniform(-3, 2)));
  check_linear(W, x, 2, dsv4::quant_linear_opts(128, true), false, "fp4 wide");
}

TEST(StageLinear, Bf16AndF32Weights) {
  Arena arena;
  Rng rng(151);
  TestWeight B = bf16_weight(arena, rng.bf16_vec(24 * 50, -1, 1), 24, 50);
  TestWeight F;
  {
    std::vector<float> v(10 * 33);
    for (float& e : v) e = float(rng.uniform(-1, 1));
    F = f32_weight(arena, v, 10, 33);
  }
  std::vector<float> xb = rng.bf16_vec(3 * 50, -2, 2);
  std::vector<float> xf(3 * 33);
  for (float& e : xf) e = float(rng.uniform(-2, 2));
  dsv4::LinearOpts bf_out, f32_out;
  f32_out.out_bf16 = false;
  check_linear(B, xb, 3, bf_out, false, "bf16 weight, bf16 out");
  check_linear(B, xb, 3, f32_out, false, "bf16 weight, fp32 out");
  check_linear(F, xf, 3, f32_out, false, "f32 weight, fp32 out");
  check_linear(F, xf, 3, bf_out, false, "f32 weight, bf16 out");
}

TEST(StageLinear, RowRangeAndStrides) {
  // Rows [70, 190) of an FP8 weight (crossing the 128-row scale boundary),
  // input rows with stride in+7 whose padding is NaN (must never be read),
  // output stride 150 whose padding must stay untouched.
  Arena arena;
  Rng rng(161);
  const int64_t out = 200, in = 320, M = 3, ldx = in + 7, rb = 70, re = 190, ldy = 150;
  TestWeight W = fp8_weight(arena, rng, out, in, 128);
  std::vector<float> x(size_t(M * ldx), kNaN), xd(size_t(M * in));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t i = 0; i < in; ++i) x[size_t(m * ldx + i)] = xd[size_t(m * in + i)] = float(rng.uniform(-3, 3));
  for (bool quant : {true, false}) {
    SCOPED_TRACE(quant ? "fp8 activations" : "plain activations");
    dsv4::LinearOpts o = quant ? dsv4::quant_linear_opts(128, true) : dsv4::LinearOpts{};
    std::vector<float> full(size_t(M * out)), sub(size_t(M * ldy), -777.f);
    dsv4::linear(W.w, xd.data(), M, full.data(), o);
    dsv4::linear(W.w, x.data(), M, sub.data(), o, rb, re, ldx, ldy);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t j = 0; j < ldy; ++j) {
        const float got = sub[size_t(m * ldy + j)];
        if (j < re - rb)
          EXPECT_EQ(got, full[size_t(m * out + rb + j)]) << "row " << m << " out " << rb + j;
        else
          EXPECT_EQ(got, -777.f) << "padding row " << m << " col " << j;
      }
    check_linear(W, xd, M, o, false, "full");
  }
}

// ===========================================================================
// §7 Compressor
// ===========================================================================

struct CompFixture {
  ModelConfig c;
  Arena arena;
  dsv4::CompressorWeights w;
  TestWeight wkv, wgate;
  std::vector<float> x;  // [T][D]
  int64_t T = 0, D = 32;

  // Every input on a grid: the a_t and g_t sums are exact in fp32.
  CompFixture(uint32_t seed, int ratio, int hd, int rd, bool indexer, int64_t tokens) : c(rope_config(rd)), T(tokens) {
    Rng rng(seed);
    c.hidden_size = int(D);
    c.scale_pow2 = true;
    w.ratio = ratio;
    w.coff = ratio == 4 ? 2 : 1;
    w.head_dim = hd;
    w.indexer = indexer;
    const int64_t width = w.coff * hd;
    wkv = bf16_weight(arena, rng.grid_vec(size_t(width * D), 128, 8), width, D);
    wgate = bf16_weight(arena, rng.grid_vec(size_t(width * D), 128, 8), width, D);
    w.wkv = wkv.w;
    w.wgate = wgate.w;
    w.ape = rng.grid_vec(size_t(ratio * width), 64, 6);
    w.norm = rng.bf16_vec(size_t(hd), 0.5, 1.5);
    // Channels 64..127, the second q8 block of 64 when there are ≥ 128 nope
    // dims, get a 2^12 times larger norm weight: quantised with one scale for
    // both blocks, the first block's values would fall into e4m3's subnormals.
    if (!indexer)
      for (int ch = 64; ch < std::min(hd - rd, 128); ++ch) w.norm[size_t(ch)] *= 4096;
    x = rng.grid_vec(size_t(T * D), 128, 6);
  }
};

// §7 directly over the whole sequence: rows [T div r][hd].
std::vector<float> ref_compress(const CompFixture& f) {
  const int r = f.w.ratio, hd = f.w.head_dim, coff = f.w.coff, rd = f.c.qk_rope_head_dim;
  const int64_t width = coff * hd;
  std::vector<double> A(size_t(f.T * width)), G(size_t(f.T * width));
  for (int64_t t = 0; t < f.T; ++t)
    for (int64_t k = 0; k < width; ++k) {
      A[size_t(t * width + k)] = ref_dot(f.wkv, k, f.x.data() + t * f.D).sum;
      G[size_t(t * width + k)] = ref_dot(f.wgate, k, f.x.data() + t * f.D).sum + f.w.ape[size_t((t % r) * width + k)];
    }
  const std::vector<float> freqs = ref_freqs(f.c, true);
  const int64_t rows = f.T / r;
  std::vector<float> out(size_t(rows * hd));
  for (int64_t c = 0; c < rows; ++c) {
    float* v = out.data() + c * hd;
    for (int ch = 0; ch < hd; ++ch) {
      std::vector<std::pair<double, double>> slots;  // (score, value)
      if (coff == 2) {
        for (int s = 0; s < r; ++s) {
          const int64_t t = (c - 1) * r + s;
          if (t < 0)
            slots.push_back({-INFINITY, 0.0});
          else
            slots.push_back({G[size_t(t * width + ch)], A[size_t(t * width + ch)]});
        }
        for (int s = 0; s < r; ++s) {
          const int64_t t = c * r + s;
          slots.push_back({G[size_t(t * width + hd + ch)], A[size_t(t * width + hd + ch)]});
        }
      } else {
        for (int s = 0; s < r; ++s) {
          const int64_t t = c * r + s;
          slots.push_back({G[size_t(t * width + ch)], A[size_t(t * width + ch)]});
        }
      }
      double mx = -INFINITY, den = 0, num = 0;
      for (auto& sv : slots) mx = std::max(mx, sv.first);
      for (auto& sv : slots) {
        const double e = std::exp(sv.first - mx);
        den += e;
        num += e * sv.second;
      }
      v[ch] = bfd(num / den);
    }
    ref_rms_norm(v, f.w.norm.data(), hd, f.c.rms_norm_eps, v);
    ref_rope(v + hd - rd, freqs, c * r);
    if (f.w.indexer) {
      std::vector<float> h = ref_hadamard(v, hd);
      ref_q4(h.data(), size_t(hd));
      std::copy(h.begin(), h.end(), v);
    } else {
      ref_q8(v, size_t(hd - rd), 64);
    }
  }
  return out;
}

// Feeds the fixture's tokens in tiles starting at the given split points.
dsv4::CompressorState run_compressor(const CompFixture& f, std::vector<int64_t> splits) {
  const dsv4::RopeTable rope(dsv4::rope_params(f.c, true));
  // Pages for the compressor state; the pool outlives every state made here.
  static dsv4::CachePool pool(size_t(256) << 20);
  dsv4::CompressorState st;
  st.init(&pool, f.w);
  st.reserve(f.w, f.T);
  splits.insert(splits.begin(), 0);
  splits.push_back(f.T);
  dsv4::CompressorActivations act;
  for (size_t i = 0; i + 1 < splits.size(); ++i)
    dsv4::compressor_forward(f.w, f.c, rope, f.x.data() + splits[i] * f.D, splits[i], splits[i + 1] - splits[i], st,
                             act);
  return st;
}

// The emitted rows, widened to fp32.
std::vector<float> state_rows(const dsv4::CompressorState& st, int hd) {
  std::vector<float> v(size_t(st.n_rows * hd));
  st.read_rows(st.n_rows, hd, v.data());
  return v;
}

// The source-row ring (a | g + ape per slot), as stored.
std::vector<float> state_ring(const dsv4::CompressorState& st, const dsv4::CompressorWeights& w, int64_t T) {
  const int64_t slots = std::min<int64_t>(T, w.coff * w.ratio), width = 2 * w.coff * w.head_dim;
  std::vector<float> v;
  for (int64_t s = 0; s < slots; ++s) v.insert(v.end(), st.ring.row_f32(s), st.ring.row_f32(s) + width);
  return v;
}

void check_compressor_rows(const CompFixture& f, const dsv4::CompressorState& st) {
  const int hd = f.w.head_dim, rd = f.c.qk_rope_head_dim;
  const int64_t rows = f.T / f.w.ratio;
  ASSERT_EQ(st.n_rows, rows);
  std::vector<float> got(size_t(rows * hd));
  st.read_rows(rows, hd, got.data());
  const std::vector<float> ref = ref_compress(f);
  auto tol = [&](size_t i) {
    const int ch = int(i % size_t(hd));
    const float* row = ref.data() + (i / size_t(hd)) * size_t(hd);
    float amax = 0;
    if (f.w.indexer) {
      for (int j = ch / 32 * 32; j < ch / 32 * 32 + 32; ++j) amax = std::max(amax, std::fabs(row[j]));
      return e2m1_step_tol(got[i], ref[i], amax);
    }
    if (ch >= hd - rd) return bf16_step(ref[i]);
    for (int j = ch / 64 * 64; j < std::min(hd - rd, ch / 64 * 64 + 64); ++j) amax = std::max(amax, std::fabs(row[j]));
    return e4m3_step_tol(got[i], ref[i], amax);
  };
  ExpectMostlyExact(got, ref, 0.98, tol, "compressed rows");
}

TEST(StageCompressor, Ratio4OverlappingMatchesReference) {
  // hd = 144, rd = 16: nope dims 128 = two q8 blocks of 64. 22 tokens: rows 0..4,
  // tokens 20, 21 left pending. Row 0's first four slots are value 0 / score −∞.
  CompFixture f(171, 4, 144, 16, false, 22);
  check_compressor_rows(f, run_compressor(f, {}));
}

TEST(StageCompressor, Ratio8NonOverlappingMatchesReference) {
  CompFixture f(181, 8, 144, 16, false, 21);
  check_compressor_rows(f, run_compressor(f, {}));
}

TEST(StageCompressor, Ratio128MatchesReference) {
  CompFixture f(191, 128, 80, 16, false, 300);
  check_compressor_rows(f, run_compressor(f, {}));
}

TEST(StageCompressor, IndexerRowsHadamardAndFp4) {
  // 40 rows: enough elements that some land exactly on e2m1 rounding ties.
  CompFixture f(201, 4, 64, 16, true, 162);
  check_compressor_rows(f, run_compressor(f, {}));
}

TEST(StageCompressor, TilesGiveBitwiseSameRowsAndState) {
  struct Case {
    int ratio, hd;
    bool indexer;
    int64_t T;
    std::vector<std::vector<int64_t>> splits;
  };
  const std::vector<Case> cases = {
      {4, 144, false, 22, {{5}, {13}, {1, 2, 3, 4, 8, 9}}},
      {4, 64, true, 22, {{6}, {11}}},
      {8, 144, false, 21, {{3}, {12}, {8}}},
      {128, 80, false, 300, {{100}, {129}, {255, 256}}},
  };
  for (const Case& k : cases) {
    CompFixture f(211 + uint32_t(k.ratio), k.ratio, k.hd, 16, k.indexer, k.T);
    const dsv4::CompressorState whole = run_compressor(f, {});
    for (const auto& sp : k.splits) {
      std::string name = "ratio " + std::to_string(k.ratio) + (k.indexer ? " indexer" : "") + ", splits";
      for (int64_t s : sp) name += " " + std::to_string(s);
      SCOPED_TRACE(name);
      const dsv4::CompressorState tiled = run_compressor(f, sp);
      EXPECT_EQ(tiled.n_rows, whole.n_rows);
      EXPECT_TRUE(same_bits(state_rows(tiled, f.w.head_dim), state_rows(whole, f.w.head_dim)));
      EXPECT_TRUE(same_bits(state_ring(tiled, f.w, f.T), state_ring(whole, f.w, f.T)));
    }
  }
}

TEST(StageCompressor, EmitRowFromStateMatchesForward) {
  // compressor_emit_row on the final state re-emits the last complete row.
  CompFixture f(221, 4, 144, 16, false, 24);
  const dsv4::CompressorState st = run_compressor(f, {});
  ASSERT_EQ(st.n_rows, 6);
  std::vector<float> row(144);
  dsv4::compressor_emit_row(f.w, f.c, dsv4::RopeTable(dsv4::rope_params(f.c, true)), st, 5, row.data());
  const std::vector<float> rows = state_rows(st, 144);
  EXPECT_TRUE(same_bits(row, std::vector<float>(rows.begin() + 5 * 144, rows.begin() + 6 * 144)));
}

// ===========================================================================
// §8.3–8.4 Indexer selection
// ===========================================================================

// §8.3 with its rounding points; the sum over heads in fp32, ascending h.
std::vector<float> ref_index_scores(const std::vector<float>& qi, const std::vector<float>& w,
                                    const std::vector<float>& rows, int64_t n, int Hi, int di) {
  std::vector<float> score;
  for (int64_t c = 0; c < n; ++c) {
    float sum = 0.f;
    for (int h = 0; h < Hi; ++h) {
      double d = 0;
      for (int i = 0; i < di; ++i) d += double(qi[size_t(h * di + i)]) * rows[size_t(c * di + i)];
      const float dh = bfd(d);
      const float e = bfd(double(std::max(dh, 0.f)) * w[size_t(h)]);
      sum += e;
    }
    score.push_back(bf(sum));
  }
  return score;
}

std::vector<int32_t> index_select(const std::vector<float>& qi, const std::vector<float>& w, const std::vector<float>& rows,
                            int64_t n_visible, int Hi, int di, int topk_n) {
  std::vector<int32_t> chosen;
  dsv4::IndexerRows packed;
  packed.pack(rows.data(), int64_t(rows.size()) / di, di);
  dsv4::IndexerQueryBuffers buf;
  dsv4::indexer_select(qi.data(), w.data(), packed, n_visible, Hi, topk_n, buf, &chosen);
  return chosen;
}

TEST(StageIndexer, MatchesReferenceWithTies) {
  // Grid values: every dot is exact in fp32; coarse values make many scores tie.
  const int Hi = 4, di = 32;
  for (uint32_t seed : {231u, 232u, 233u}) {
    Rng rng(seed);
    const int64_t n = 40;
    std::vector<float> qi = rng.grid_vec(size_t(Hi * di), 8, 2), rows = rng.grid_vec(size_t(n * di), 8, 2);
    std::vector<float> w = rng.bf16_vec(size_t(Hi), -1, 1);
    for (int64_t c = 10; c < 20; ++c)  // duplicated rows: exact ties across the cut
      std::copy(rows.begin() + (c - 10) * di, rows.begin() + (c - 9) * di, rows.begin() + c * di);
    const std::vector<float> score = ref_index_scores(qi, w, rows, n, Hi, di);
    for (int k : {1, 7, 10, 25, 40}) {
      std::vector<int32_t> ref(static_cast<size_t>(n));
      std::iota(ref.begin(), ref.end(), 0);
      std::stable_sort(ref.begin(), ref.end(), [&](int32_t a, int32_t b) { return score[size_t(a)] > score[size_t(b)]; });
      ref.resize(size_t(k));
      std::sort(ref.begin(), ref.end());
      EXPECT_EQ(index_select(qi, w, rows, n, Hi, di, k), ref) << "seed " << seed << " k " << k;
    }
  }
}

TEST(StageIndexer, RoundingPointsCreateTiesThatGoToTheLowerIndex) {
  // Each case is built so that dropping one rounding point of §8.3 flips the
  // pick between row 0 and row 1. Heads: h0 = e0, h1 = e1 (di = 4).
  const int di = 4;
  const std::vector<float> q1 = {1, 0, 0, 0}, q2 = {1, 0, 0, 0, 0, 1, 0, 0};
  // d_h = bf16(fp32 dot): row 0's dot 1 + 3·2^-9 → 1 + 2^-7 = row 1's; with
  // w = 1.5 both score bf16(1.515625) and the tie goes to row 0. Unrounded,
  // row 0 would score bf16(1.5 + 4.5·2^-9) = 1.5078125 and lose.
  EXPECT_EQ(index_select(q1, {1.5f}, {1 + 3 * 0x1p-9f, 0, 0, 0, 1 + 0x1p-7f, 0, 0, 0}, 2, 1, di, 1),
            (std::vector<int32_t>{0}));
  // e_h = bf16(relu(d)·w): row 0 has e0 = bf16((1 + 2^-7)(1 − 2^-8)) = 1 and
  // e1 = 2^-8, score bf16(1 + 2^-8) = 1; row 1 has e0 = relu(−1)·w = 0 and
  // e1 = 258·2^-8 = 1 + 2^-7, so row 1 wins. Unrounded e_h, row 0 would score
  // bf16(1 + 2^-7 − 2^-15) = 1 + 2^-7, tie, and row 0 would win.
  EXPECT_EQ(index_select(q2, {1 - 0x1p-8f, 0x1p-8f}, {1 + 0x1p-7f, 1, 0, 0, -1, 258, 0, 0}, 2, 2, di, 1),
            (std::vector<int32_t>{1}));
  // score = bf16(Σ_h e_h): 1 + 2^-9 → 1 ties row 0 (exactly 1); row 0 wins.
  // Unrounded, row 1 would be larger.
  EXPECT_EQ(index_select(q2, {1, 0x1p-9f}, {1, 0, 0, 0, 1, 1, 0, 0}, 2, 2, di, 1), (std::vector<int32_t>{0}));
  // relu before the weight: a negative dot with a negative weight adds nothing
  // (row 1 would score 0.5 + 4 without it).
  EXPECT_EQ(index_select(q2, {1, -1}, {1, 0, 0, 0, 0.5f, -4, 0, 0}, 2, 2, di, 1), (std::vector<int32_t>{0}));
}

TEST(StageIndexer, NeverSelectsBeyondVisibleRows) {
  Rng rng(241);
  const int Hi = 2, di = 32;
  const int64_t visible = 5, stored = 12;
  std::vector<float> qi = rng.grid_vec(size_t(Hi * di), 8, 2), w = {0.5f, 0.25f};
  std::vector<float> rows = rng.grid_vec(size_t(stored * di), 8, 2);
  for (int64_t c = visible; c < stored; ++c)  // future rows that would win every comparison
    for (int i = 0; i < di; ++i) rows[size_t(c * di + i)] = qi[size_t(i)] * 100;
  EXPECT_EQ(index_select(qi, w, rows, visible, Hi, di, 8), (std::vector<int32_t>{0, 1, 2, 3, 4}));
  const std::vector<int32_t> three = index_select(qi, w, rows, visible, Hi, di, 3);
  ASSERT_EQ(three.size(), 3u);
  EXPECT_TRUE(std::is_sorted(three.begin(), three.end()));
  for (int32_t c : three) EXPECT_LT(c, visible);
  EXPECT_TRUE(index_select(qi, w, rows, 0, Hi, di, 3).empty());
}

// The tile's rows are packed once for all its queries, so a query's panels
// also hold rows past its n_visible: they must change nothing, whether they
// are bf16 values (the BF16 kernel), not bf16 values (that panel goes to the
// fp32 kernel) or tiny (the BF16 kernel declines for lack of exponent
// range). Every kernel variant against the rows cut at n_visible.
TEST(StageIndexer, PackedRowsPastVisibleChangeNothing) {
  const dsv4::Isa best = dsv4::kernel_isa();
  Rng rng(251);
  const int Hi = 8, di = 64;
  const int64_t stored = 70;
  const std::vector<float> qi = rng.bf16_vec(size_t(Hi * di), -1, 1), w = rng.bf16_vec(size_t(Hi), -1, 1);
  for (int hidden_row : {0, 1, 2}) {  // 0: bf16, 1: not bf16, 2: tiny
    for (int64_t visible : {17, 33, 50, 64}) {
      std::vector<float> rows = rng.bf16_vec(size_t(stored * di), -1, 1);
      if (hidden_row == 1) rows[size_t(visible * di + 3)] = 0.1f;
      if (hidden_row == 2) rows[size_t(visible * di + 3)] = 0x1p-120f;
      const std::vector<float> cut(rows.begin(), rows.begin() + visible * di);
      for (dsv4::Isa isa : dsv4::supported_isas()) {
        dsv4::set_kernel_isa(isa);
        for (int k : {1, 5, int(visible / 2)})
          EXPECT_EQ(index_select(qi, w, rows, visible, Hi, di, k), index_select(qi, w, cut, visible, Hi, di, k))
              << dsv4::isa_name(isa) << " hidden row kind " << hidden_row << " visible " << visible << " k " << k;
      }
      dsv4::set_kernel_isa(best);
    }
  }
}

// ===========================================================================
// §6.5 Attention with sink
// ===========================================================================

std::vector<float> attend(const std::vector<float>& q, const std::vector<std::vector<float>>& keys, float sink) {
  std::vector<const float*> kp;
  for (const auto& k : keys) kp.push_back(k.data());
  std::vector<float> out(q.size());
  dsv4::attend_head(q.data(), kp.data(), int64_t(kp.size()), int64_t(q.size()), sink, out.data());
  return out;
}

// attend_query (every kernel variant) against the per-head definition, bit
// for bit: head counts off the 16-lane and 64-head tiles, odd d (a padded
// last pair), key counts off the 6-key tiles, keys in any order; scores
// wide enough that exp underflows to subnormals and zero, sinks that
// dominate or overflow. The BF16 kernel must decline (and the fp32 one give
// the same bits) for tiny keys or one tiny q value (products near the
// subnormal range) and for a q that is not bf16; the large cases are the
// ones where a one-ulp change inside shows through the bf16 outputs.
TEST(StageAttention, AllHeadsEqualPerHeadDefinitionBitwise) {
  Rng rng(251);
  const dsv4::Isa best = dsv4::kernel_isa();
  struct Case {
    int64_t H, d, nkeys;
    double q_range, key_scale, q0;  // q0: q's first value, when not 0
    bool q_bf16;
  };
  const Case cases[] = {
      {1, 4, 1, 1, 1, 0, true},     {8, 64, 5, 1, 1, 0, true},    {16, 64, 17, 1, 1, 0, true},
      {20, 30, 200, 1, 1, 0, true}, {64, 512, 37, 1, 1, 0, true}, {70, 33, 9, 1, 1, 0, true},
      {3, 7, 100, 1, 1, 0, true},   {64, 128, 23, 40, 1, 0, true}, {17, 48, 31, 1, 0x1p-110, 0, true},
      {64, 512, 41, 1, 1, 0x1p-120, true}, {64, 512, 29, 1, 1, 0, false}, {64, 512, 0, 1, 1, 0, true}};
  for (const Case& k : cases) {
    const std::string what = "H " + std::to_string(k.H) + " d " + std::to_string(k.d) + " nkeys " +
                             std::to_string(k.nkeys);
    std::vector<float> q(size_t(k.H * k.d)), keys = rng.bf16_vec(size_t(k.nkeys * k.d), -1, 1);
    for (float& v : q) v = float(rng.uniform(-k.q_range, k.q_range));
    if (k.q0 != 0) q[0] = float(k.q0);
    if (k.q_bf16) dsv4::bf16r_inplace(q.data(), q.size());
    for (float& v : keys) v = float(v * k.key_scale);  // a power of two: still bf16
    std::vector<float> sinks = rng.bf16_vec(size_t(k.H), -2, 2);
    if (k.H > 2) sinks[0] = 80, sinks[1] = 200;  // sink mass far above the keys', then overflowing
    // Rows in reverse order: the caller's order is the order of the sums.
    std::vector<const float*> rows;
    std::vector<uint32_t> pairs(size_t(k.nkeys * dsv4::key_pair_count(k.d)));
    std::vector<const uint32_t*> pair_rows;
    int min_exp = 255;
    for (int64_t j = k.nkeys - 1; j >= 0; --j) {
      rows.push_back(keys.data() + j * k.d);
      uint32_t* p = pairs.data() + j * dsv4::key_pair_count(k.d);
      min_exp = std::min(min_exp, dsv4::pack_key_row(rows.back(), k.d, p));
      pair_rows.push_back(p);
    }
    std::vector<float> ref(size_t(k.H * k.d));
    for (int64_t h = 0; h < k.H; ++h)
      dsv4::attend_head(q.data() + h * k.d, rows.data(), k.nkeys, k.d, sinks[size_t(h)], ref.data() + h * k.d);
    for (dsv4::Isa isa : dsv4::supported_isas()) {
      dsv4::set_kernel_isa(isa);
      std::vector<float> fast(ref.size(), -1.f);
      dsv4::attend_query(q.data(), k.H, pair_rows.data(), k.nkeys, k.d, min_exp, sinks.data(), fast.data());
      EXPECT_EQ(std::memcmp(fast.data(), ref.data(), ref.size() * 4), 0) << what << " " << dsv4::isa_name(isa);
    }
    dsv4::set_kernel_isa(best);
  }
}

// The softmax's exp (kernels/exp.h) against double precision: within one
// fp32 ulp of the rounded value, and exact at the edges.
TEST(StageAttention, ExpWithinOneUlp) {
  auto ulps = [](float a, float b) { return std::llabs(int64_t(to_bits(a)) - int64_t(to_bits(b))); };
  for (float x = -104.f; x < 89.f; x += 0.0137f)
    EXPECT_LE(ulps(dsv4::exp_f32(x), float(std::exp(double(x)))), 1) << fmt(x);
  EXPECT_EQ(dsv4::exp_f32(0.f), 1.f);
  EXPECT_EQ(dsv4::exp_f32(-kInfF), 0.f);
  EXPECT_EQ(dsv4::exp_f32(-200.f), 0.f);
  EXPECT_EQ(dsv4::exp_f32(kInfF), kInfF);
  EXPECT_EQ(dsv4::exp_f32(100.f), kInfF);
  EXPECT_TRUE(std::isnan(dsv4::exp_f32(std::nanf(""))));
  EXPECT_EQ(dsv4::exp_f32(-103.5f), float(std::exp(-103.5)));  // a subnormal result, rounded once
}

TEST(StageAttention, SingleKeyHandChecked) {
  // s = (q·k)/√d. d = 4, q = 1: s = (2 − 4 + 0.5)/2 = −0.75.
  const std::vector<float> q = {1, 1, 1, 1};
  const std::vector<std::vector<float>> key = {{2, -4, 0.5f, 0}};
  // sink = s: p = 1/2.
  EXPECT_EQ(attend(q, key, -0.75f), (std::vector<float>{1, -2, 0.25f, 0}));
  // sink = s − ln 3: p = 3/4 (the fp32 error of ln 3 vanishes in the bf16 output).
  EXPECT_EQ(attend(q, key, float(-0.75 - std::log(3.0))), (std::vector<float>{1.5f, -3, 0.375f, 0}));
  // No sink mass: p = 1.
  EXPECT_EQ(attend(q, key, -kInfF), key[0]);
  // General: p = 1/(1 + exp(sink − s)).
  for (float sink : {-3.f, 0.1f, 2.5f, 9.f}) {
    const std::vector<float> o = attend(q, key, sink);
    const double p = 1.0 / (1.0 + std::exp(double(sink) + 0.75));
    for (int i = 0; i < 4; ++i) EXPECT_TRUE(NearBf16(o[size_t(i)], p * key[0][size_t(i)])) << "sink " << sink << " i " << i;
  }
}

TEST(StageAttention, MatchesDoubleReference) {
  Rng rng(251);
  const int64_t d = 64;
  for (int64_t nkeys : {1, 3, 20, 77}) {
    std::vector<float> q = rng.bf16_vec(size_t(d), -2, 2);
    std::vector<std::vector<float>> keys;
    for (int64_t j = 0; j < nkeys; ++j) keys.push_back(rng.bf16_vec(size_t(d), -2, 2));
    for (float sink : {-1.5f, 0.3f, 4.f}) {
      SCOPED_TRACE("nkeys " + std::to_string(nkeys) + " sink " + fmt(sink));
      const std::vector<float> o = attend(q, keys, sink);
      std::vector<double> s;
      for (const auto& k : keys) {
        double v = 0;
        for (int64_t i = 0; i < d; ++i) v += double(q[size_t(i)]) * k[size_t(i)];
        s.push_back(v / std::sqrt(double(d)));
      }
      const double M = *std::max_element(s.begin(), s.end());
      double den = std::exp(double(sink) - M);
      for (double v : s) den += std::exp(v - M);
      for (int64_t i = 0; i < d; ++i) {
        double ref = 0, a = 0;
        for (size_t j = 0; j < keys.size(); ++j) {
          const double p = std::exp(s[j] - M) / den;
          ref += p * keys[j][size_t(i)];
          a += p * std::fabs(keys[j][size_t(i)]);
        }
        // fp32 scores (64-term dots) and exps carry ~1e-6 relative error into p.
        EXPECT_TRUE(NearBf16(o[size_t(i)], ref, a * 16, nkeys + 1)) << "dim " << i;
      }
    }
  }
}

// ===========================================================================
// §9 MoE
// ===========================================================================

struct TestExpert {
  TestWeight w1, w2, w3;
  dsv4::ExpertWeights weights() const { return {w1.w, w2.w, w3.w}; }
};

struct MoeFixture {
  ModelConfig c;
  Arena arena;
  TestWeight gate;
  std::vector<TestExpert> experts;
  TestExpert shared;
  dsv4::MoeWeights w;
  mutable dsv4::MoeActivations act;

  // D = 64, E = 8, k = 3, I = 32; routed experts FP4, shared FP8 (partial
  // 128-blocks). Every weight is on a grid that keeps the first linears exact.
  explicit MoeFixture(uint32_t seed, dsv4::ScoringFunc sf = dsv4::ScoringFunc::kSqrtSoftplus, float limit = 2.f) {
    Rng rng(seed);
    c.hidden_size = 64;
    c.n_routed_experts = 8;
    c.num_experts_per_tok = 3;
    c.moe_intermediate_size = 32;
    c.num_hash_layers = 1;
    c.scoring_func = sf;
    c.routed_scaling_factor = 1.5f;
    c.swiglu_limit = limit;
    c.weight_block_size = 128;
    c.scale_pow2 = true;
    c.vocab_size = 16;
    const int64_t D = 64, E = 8, I = 32;
    gate = bf16_weight(arena, rng.grid_vec(size_t(E * D), 64, 8), E, D);
    w.gate = gate.w;
    for (int64_t e = 0; e < E; ++e) w.gate_bias.push_back(float(rng.uniform(-0.3, 0.3)));
    for (int t = 0; t < c.vocab_size; ++t) {  // k distinct ids per token, unsorted
      std::vector<int32_t> ids(static_cast<size_t>(E));
      std::iota(ids.begin(), ids.end(), 0);
      std::shuffle(ids.begin(), ids.end(), rng.gen);
      w.tid2eid.insert(w.tid2eid.end(), ids.begin(), ids.begin() + 3);
    }
    for (int64_t e = 0; e < E; ++e) {
      TestExpert& te = experts.emplace_back();
      te.w1 = fp4_weight(arena, rng, I, D);
      te.w3 = fp4_weight(arena, rng, I, D);
      te.w2 = fp4_weight(arena, rng, D, I);
      w.experts.push_back(te.weights());
    }
    shared.w1 = fp8_weight(arena, rng, I, D, 128, 6, 9, 124, 127);
    shared.w3 = fp8_weight(arena, rng, I, D, 128, 6, 9, 124, 127);
    shared.w2 = fp8_weight(arena, rng, D, I, 128, 6, 9, 124, 127);
    w.shared = shared.weights();
  }
};

struct RefRoute {
  std::vector<int32_t> expert;  // ascending
  std::vector<double> weight;
};

// §9.1–9.2 for one token.
RefRoute ref_route(const MoeFixture& f, int layer, const float* x, int32_t token) {
  const int E = f.c.n_routed_experts, k = f.c.num_experts_per_tok;
  std::vector<double> l(static_cast<size_t>(E)), s(static_cast<size_t>(E));
  for (int e = 0; e < E; ++e) l[size_t(e)] = ref_dot(f.gate, e, x).sum;
  switch (f.c.scoring_func) {
    case dsv4::ScoringFunc::kSqrtSoftplus:
      for (int e = 0; e < E; ++e) s[size_t(e)] = std::sqrt(l[size_t(e)] > 20 ? l[size_t(e)] : std::log1p(std::exp(l[size_t(e)])));
      break;
    case dsv4::ScoringFunc::kSigmoid:
      for (int e = 0; e < E; ++e) s[size_t(e)] = 1 / (1 + std::exp(-l[size_t(e)]));
      break;
    case dsv4::ScoringFunc::kSoftmax: {
      const double mx = *std::max_element(l.begin(), l.end());
      double sum = 0;
      for (int e = 0; e < E; ++e) sum += std::exp(l[size_t(e)] - mx);
      for (int e = 0; e < E; ++e) s[size_t(e)] = std::exp(l[size_t(e)] - mx) / sum;
      break;
    }
  }
  std::vector<int32_t> sel;
  if (layer < f.c.num_hash_layers) {
    sel.assign(f.w.tid2eid.begin() + token * k, f.w.tid2eid.begin() + (token + 1) * k);
  } else {
    std::vector<int32_t> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return s[size_t(a)] + f.w.gate_bias[size_t(a)] > s[size_t(b)] + f.w.gate_bias[size_t(b)];
    });
    sel.assign(order.begin(), order.begin() + k);
  }
  std::sort(sel.begin(), sel.end());
  double sum = 0;
  for (int32_t e : sel) sum += s[size_t(e)];
  RefRoute r;
  r.expert = sel;
  for (int32_t e : sel)
    r.weight.push_back((f.c.scoring_func == dsv4::ScoringFunc::kSoftmax ? s[size_t(e)] : s[size_t(e)] / sum) *
                       f.c.routed_scaling_factor);
  return r;
}

void check_route(const MoeFixture& f, int layer, const std::vector<float>& x, const std::vector<int32_t>& tokens) {
  const int64_t n = int64_t(tokens.size()), D = f.c.hidden_size, k = f.c.num_experts_per_tok;
  const dsv4::Routing r = dsv4::moe_route(f.w, f.c, layer, x.data(), tokens.data(), n, f.act);
  ASSERT_EQ(r.expert.size(), size_t(n * k));
  ASSERT_EQ(r.weight.size(), size_t(n * k));
  for (int64_t t = 0; t < n; ++t) {
    const RefRoute ref = ref_route(f, layer, x.data() + t * D, tokens[size_t(t)]);
    EXPECT_EQ(std::vector<int32_t>(r.expert.begin() + t * k, r.expert.begin() + (t + 1) * k), ref.expert)
        << "token " << t;
    for (int64_t j = 0; j < k; ++j)
      EXPECT_NEAR(r.weight[size_t(t * k + j)], ref.weight[size_t(j)], 4e-6 * std::fabs(ref.weight[size_t(j)]))
          << "token " << t << " slot " << j;
  }
}

TEST(StageMoe, RouteScoringFunctionsWithBias) {
  for (auto sf : {dsv4::ScoringFunc::kSqrtSoftplus, dsv4::ScoringFunc::kSoftmax, dsv4::ScoringFunc::kSigmoid}) {
    SCOPED_TRACE("scoring " + std::to_string(int(sf)));
    MoeFixture f(261, sf);
    Rng rng(262);
    std::vector<float> x = rng.grid_vec(size_t(6 * 64), 8, 3);
    check_route(f, /*layer=*/1, x, {0, 1, 2, 3, 4, 5});
  }
}

TEST(StageMoe, RouteHashLayerUsesTid2eid) {
  MoeFixture f(271);
  Rng rng(272);
  std::vector<float> x = rng.grid_vec(size_t(4 * 64), 8, 3);
  const std::vector<int32_t> tokens = {3, 0, 15, 3};
  check_route(f, /*layer=*/0, x, tokens);
  // The ids are the token's tid2eid row, sorted; the bias plays no part.
  const dsv4::Routing r = dsv4::moe_route(f.w, f.c, 0, x.data(), tokens.data(), 4, f.act);
  std::vector<int32_t> ids(f.w.tid2eid.begin() + 15 * 3, f.w.tid2eid.begin() + 16 * 3);
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(std::vector<int32_t>(r.expert.begin() + 6, r.expert.begin() + 9), ids);
}

TEST(StageMoe, RouteTiesGoToTheLowerExpertId) {
  // All logits 0 (zero gate): s equal everywhere, the bias alone decides, and
  // experts 1, 4, 6 tie on top.
  MoeFixture f(281);
  Arena arena;
  TestWeight zero = bf16_weight(arena, std::vector<float>(8 * 64, 0.f), 8, 64);
  f.w.gate = zero.w;
  f.w.gate_bias = {0, 0.5f, 0, 0, 0.5f, 0, 0.5f, 0};
  std::vector<float> x(64, 1.f);
  const int32_t tok = 0;
  for (int k : {2, 3, 4}) {
    f.c.num_experts_per_tok = k;
    const dsv4::Routing r = dsv4::moe_route(f.w, f.c, 1, x.data(), &tok, 1, f.act);
    const std::vector<std::vector<int32_t>> want = {{1, 4}, {1, 4, 6}, {0, 1, 4, 6}};
    EXPECT_EQ(r.expert, want[size_t(k - 2)]) << "k " << k;
    for (float wt : r.weight) EXPECT_FLOAT_EQ(wt, 1.5f / float(k));  // equal s: rsf / k each
  }
}

TEST(StageMoe, RouteLargeLogitUsesSoftplusThreshold) {
  // l = 200 overflows exp in fp32; softplus(l) = l above 20 keeps s = √200.
  MoeFixture f(291);
  Arena arena;
  std::vector<float> g(8 * 64, 0.f);
  const float l[8] = {200, 2, -3, 21, 0.5f, -40, 19.5f, 7};
  for (int e = 0; e < 8; ++e) g[size_t(e * 64)] = l[e];
  TestWeight gate = bf16_weight(arena, g, 8, 64);
  f.w.gate = gate.w;
  f.gate = std::move(gate);
  f.w.gate_bias.assign(8, 0.f);
  std::vector<float> x(64, 0.f);
  x[0] = 1.f;
  check_route(f, 1, x, {0});
  const int32_t tok = 0;
  const dsv4::Routing r = dsv4::moe_route(f.w, f.c, 1, x.data(), &tok, 1, f.act);
  EXPECT_EQ(r.expert, (std::vector<int32_t>{0, 3, 6}));
  for (float wt : r.weight) EXPECT_TRUE(std::isfinite(wt));
  EXPECT_NEAR(r.weight[0], 1.5 * std::sqrt(200.0) / (std::sqrt(200.0) + std::sqrt(21.0) + std::sqrt(std::log1p(std::exp(19.5)))), 1e-6);
}

struct ClampStats {
  int g_hi = 0, g_lo = 0, u_hi = 0, u_lo = 0;
};

// §9.3 for one row: y = bf16(w2 · q8(bf16(silu(min(g, L)) · clamp(u, ±L) · w_e))).
std::vector<float> ref_expert(const TestExpert& e, const ModelConfig& c, const float* x, const float* row_weight,
                              ClampStats* st = nullptr) {
  const int64_t D = c.hidden_size, I = c.moe_intermediate_size;
  const double L = c.swiglu_limit;
  std::vector<float> xq(x, x + D), h(static_cast<size_t>(I)), y(static_cast<size_t>(D));
  ref_q8(xq.data(), size_t(D), size_t(c.weight_block_size));
  for (int64_t i = 0; i < I; ++i) {
    double g = bfd(ref_dot(e.w1, i, xq.data()).sum), u = bfd(ref_dot(e.w3, i, xq.data()).sum);
    if (st) {
      st->g_hi += g > L;
      st->g_lo += g < -L;
      st->u_hi += u > L;
      st->u_lo += u < -L;
    }
    if (L > 0) {
      u = std::clamp(u, -L, L);
      g = std::min(g, L);
    }
    double v = g / (1 + std::exp(-g)) * u;
    if (row_weight) v *= *row_weight;
    h[size_t(i)] = bfd(v);
  }
  ref_q8(h.data(), size_t(I), size_t(c.weight_block_size));
  for (int64_t d = 0; d < D; ++d) y[size_t(d)] = bfd(ref_dot(e.w2, d, h.data()).sum);
  return y;
}

TEST(StageMoe, ExpertSwiGluWithClamp) {
  for (float limit : {2.f, 0.f}) {
    SCOPED_TRACE("swiglu_limit " + fmt(limit));
    MoeFixture f(301, dsv4::ScoringFunc::kSqrtSoftplus, limit);
    Rng rng(302);
    const int64_t m = 5, D = 64;
    std::vector<float> x = rng.grid_vec(size_t(m * D), 8, 3);
    std::vector<float> rw = {0.25f, 1.5f, 0.7f, 1.f, 0.01f};
    ClampStats stats;
    for (int which = 0; which < 3; ++which) {  // routed with weights, routed without, shared
      const TestExpert& te = which < 2 ? f.experts[size_t(which + 2)] : f.shared;
      const float* wts = which == 0 ? rw.data() : nullptr;
      std::vector<float> y(size_t(m * D)), ref;
      dsv4::expert_forward(te.weights(), f.c, x.data(), m, wts, f.act.shared, y.data());
      for (int64_t r = 0; r < m; ++r) {
        std::vector<float> yr = ref_expert(te, f.c, x.data() + r * D, wts ? wts + r : nullptr, &stats);
        ref.insert(ref.end(), yr.begin(), yr.end());
      }
      ExpectMostlyExact(y, ref, 0.97, [&](size_t i) { return bf16_step(ref[i]) + 1e-30; },
                        "expert " + std::to_string(which));
    }
    // The data exercises every side of the clamp (g has no lower clamp).
    EXPECT_GT(stats.g_hi, 5);
    EXPECT_GT(stats.g_lo, 5);
    EXPECT_GT(stats.u_hi, 5);
    EXPECT_GT(stats.u_lo, 5);
  }
}

// The vectorised SwiGLU against its one-element definition, bit for bit:
// values on both sides of the limit, exp over- and underflowing (|g| up to
// 200), NaN, infinities and signed zeros, with and without the limit and
// the routing weight, and lengths with a scalar tail.
TEST(StageMoe, SwigluEqualsDefinitionBitwise) {
  Rng rng(977);
  const float specials[] = {0.f, -0.f, kInfF, -kInfF, kNaN, 10.f, -10.f, 10.000001f, 88.f, -88.f, 104.f, -104.f};
  for (int64_t n : {1, 8, 13, 1003}) {
    std::vector<float> g(static_cast<size_t>(n)), u(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      g[size_t(i)] = float(rng.uniform(-200, 200) * (i % 3 == 0 ? 0.05 : 1));
      u[size_t(i)] = float(rng.uniform(-30, 30));
    }
    for (size_t i = 0; i < std::size(specials) && i < size_t(n); ++i) {
      g[i] = specials[i];
      u[(i * 5) % size_t(n)] = specials[(i + 3) % std::size(specials)];
    }
    for (float limit : {10.f, 0.f})
      for (float weight : {1.f, 0.37f}) {
        std::vector<float> ref(static_cast<size_t>(n)), fast(static_cast<size_t>(n));
        dsv4::swiglu_bf16_reference(g.data(), u.data(), n, limit, weight, ref.data());
        dsv4::swiglu_bf16(g.data(), u.data(), n, limit, weight, fast.data());
        for (int64_t i = 0; i < n; ++i)
          ASSERT_EQ(to_bits(fast[size_t(i)]), to_bits(ref[size_t(i)]))
              << "n " << n << " limit " << limit << " weight " << weight << " g " << fmt(g[size_t(i)]) << " u "
              << fmt(u[size_t(i)]);
      }
  }
  // In place (h = g), as the experts call it.
  std::vector<float> g = {1.f, -3.f, 12.f}, u = {2.f, 0.5f, 20.f}, ref(3);
  dsv4::swiglu_bf16_reference(g.data(), u.data(), 3, 10.f, 1.f, ref.data());
  dsv4::swiglu_bf16(g.data(), u.data(), 3, 10.f, 1.f, g.data());
  EXPECT_EQ(g, ref);
  EXPECT_TRUE(NearBf16(ref[0], 2.0 / (1.0 + std::exp(-1.0))));
  EXPECT_TRUE(NearBf16(ref[2], 10.0 * 10.0 / (1.0 + std::exp(-10.0))));  // both clamped to 10
}

TEST(StageMoe, ForwardSumsRoutedInIdOrderPlusShared) {
  // Composition, bitwise: out = bf16(Σ_{ascending id} y_e + y_shared) with the
  // engine's own routing and experts (one row at a time).
  MoeFixture f(311);
  Rng rng(312);
  const int64_t n = 6, D = 64, k = 3;
  std::vector<float> x = rng.grid_vec(size_t(n * D), 8, 3);
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6};
  for (int layer : {0, 1}) {
    SCOPED_TRACE(layer == 0 ? "hash layer" : "biased top-k layer");
    std::vector<float> out(size_t(n * D));
    dsv4::moe_forward(f.w, f.c, layer, x.data(), tokens.data(), n, f.act, out.data());
    const dsv4::Routing r = dsv4::moe_route(f.w, f.c, layer, x.data(), tokens.data(), n, f.act);
    for (int64_t t = 0; t < n; ++t) {
      std::vector<float> acc(static_cast<size_t>(D), 0.f), y(static_cast<size_t>(D));
      for (int64_t j = 0; j < k; ++j) {
        if (j > 0) {
          ASSERT_LT(r.expert[size_t(t * k + j - 1)], r.expert[size_t(t * k + j)]);
        }
        const int32_t e = r.expert[size_t(t * k + j)];
        dsv4::expert_forward(f.w.experts[size_t(e)], f.c, x.data() + t * D, 1, &r.weight[size_t(t * k + j)],
                             f.act.shared, y.data());
        for (int64_t d = 0; d < D; ++d) acc[size_t(d)] += y[size_t(d)];
      }
      dsv4::expert_forward(f.w.shared, f.c, x.data() + t * D, 1, nullptr, f.act.shared, y.data());
      for (int64_t d = 0; d < D; ++d) EXPECT_EQ(out[size_t(t * D + d)], bf(acc[size_t(d)] + y[size_t(d)])) << t << " " << d;
    }
  }
}

TEST(StageMoe, ForwardSumOrderIsAscendingExpertId) {
  // Hash layer, token 0 → experts {2, 1, 0}. Experts 0 and 1 share w1, w3 and
  // their gate row (so h and the routing weight are the same); expert 1's w2
  // is expert 0's with every sign flipped, both scaled by 2^20: y_1 = −y_0
  // exactly, |y_0| ~ 1e6. In ascending id, (y_0 + y_1) cancels exactly before
  // y_2 is added; any order that adds y_2 to y_0 or y_1 first drops y_2's low
  // bits (descending, the tid2eid order, ...).
  MoeFixture f(331);
  Arena arena;
  Rng rng(332);
  const int64_t D = 64, I = 32;
  std::vector<float> g(f.gate.ref.begin(), f.gate.ref.end());
  std::copy(g.begin(), g.begin() + D, g.begin() + D);
  f.gate = bf16_weight(arena, g, 8, D);
  f.w.gate = f.gate.w;
  std::vector<int> codes(size_t(D * I));
  for (int& c : codes) c = rng.integer(0, 15);
  const std::vector<uint8_t> big(size_t(D * I / 32), uint8_t(127 + 20));
  f.experts[0].w2 = fp4_weight_from(arena, codes, big, D, I);
  for (int& c : codes) c ^= 8;
  f.experts[1].w2 = fp4_weight_from(arena, codes, big, D, I);
  f.experts[1].w1 = f.experts[0].w1;
  f.experts[1].w3 = f.experts[0].w3;
  for (int e : {0, 1}) f.w.experts[size_t(e)] = f.experts[size_t(e)].weights();
  f.w.tid2eid[0] = 2, f.w.tid2eid[1] = 1, f.w.tid2eid[2] = 0;
  const std::vector<float> x = rng.grid_vec(size_t(D), 8, 3);
  const int32_t tok = 0;
  const dsv4::Routing r = dsv4::moe_route(f.w, f.c, 0, x.data(), &tok, 1, f.act);
  ASSERT_EQ(r.expert, (std::vector<int32_t>{0, 1, 2}));
  ASSERT_EQ(r.weight[0], r.weight[1]);
  std::vector<std::vector<float>> y(4, std::vector<float>(static_cast<size_t>(D)));
  for (int j = 0; j < 3; ++j)
    dsv4::expert_forward(f.w.experts[size_t(j)], f.c, x.data(), 1, &r.weight[size_t(j)], f.act.shared,
                         y[size_t(j)].data());
  dsv4::expert_forward(f.w.shared, f.c, x.data(), 1, nullptr, f.act.shared, y[3].data());
  std::vector<float> out(static_cast<size_t>(D));
  dsv4::moe_forward(f.w, f.c, 0, x.data(), &tok, 1, f.act, out.data());
  int order_matters = 0;
  for (int64_t d = 0; d < D; ++d) {
    const float y0 = y[0][size_t(d)], y1 = y[1][size_t(d)], y2 = y[2][size_t(d)], ys = y[3][size_t(d)];
    ASSERT_EQ(y1, -y0);
    const float ascending = bf(((0.f + y0) + y1) + y2 + ys);
    const float descending = bf(((0.f + y2) + y1) + y0 + ys);
    EXPECT_EQ(out[size_t(d)], ascending) << "ch " << d;
    order_matters += ascending != descending;
  }
  EXPECT_GT(order_matters, D / 4);
}

TEST(StageMoe, ForwardMatchesReference) {
  MoeFixture f(321);
  Rng rng(322);
  const int64_t n = 6, D = 64;
  std::vector<float> x = rng.grid_vec(size_t(n * D), 8, 3);
  const std::vector<int32_t> tokens = {7, 8, 9, 10, 11, 7};
  for (int layer : {0, 1}) {
    SCOPED_TRACE(layer == 0 ? "hash layer" : "biased top-k layer");
    std::vector<float> out(size_t(n * D)), ref;
    dsv4::moe_forward(f.w, f.c, layer, x.data(), tokens.data(), n, f.act, out.data());
    std::vector<double> tol;
    for (int64_t t = 0; t < n; ++t) {
      const RefRoute rr = ref_route(f, layer, x.data() + t * D, tokens[size_t(t)]);
      std::vector<double> sum(size_t(D), 0.0), mag(size_t(D), 0.0);
      for (size_t j = 0; j < rr.expert.size(); ++j) {
        const float wt = float(rr.weight[j]);
        const std::vector<float> y = ref_expert(f.experts[size_t(rr.expert[j])], f.c, x.data() + t * D, &wt);
        for (int64_t d = 0; d < D; ++d) sum[size_t(d)] += y[size_t(d)], mag[size_t(d)] += bf16_step(y[size_t(d)]);
      }
      const std::vector<float> ys = ref_expert(f.shared, f.c, x.data() + t * D, nullptr);
      for (int64_t d = 0; d < D; ++d) {
        ref.push_back(bfd(sum[size_t(d)] + ys[size_t(d)]));
        // One step of any expert output may move the sum (see ExpectMostlyExact).
        tol.push_back(bf16_step(ref.back()) + mag[size_t(d)] + bf16_step(ys[size_t(d)]));
      }
    }
    ExpectMostlyExact(out, ref, 0.95, [&](size_t i) { return tol[i]; }, "moe output");
  }
}

}  // namespace
