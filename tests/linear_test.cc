// §3 Linear layers (kernels/linear.h): activation q8, FP8 / FP4 / BF16 / F32
// weights, row ranges and strides, against weights built and decoded here.
// References and tolerances: stage_util.h.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "kernels/linear.h"
#include "stage_util.h"

namespace {

using namespace dsv4::testing;
using dsv4::Weight;

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

// Same for an fp32 result (no bf16 rounding): a few fp32 steps plus the sum bound.
::testing::AssertionResult NearF32(float got, double ref, double abs_sum = 0.0, int64_t n = 0) {
  const double tol = 4 * 0x1p-24 * std::fabs(ref) + double(n) * 0x1p-24 * abs_sum + 1e-30;
  if (std::fabs(double(got) - ref) <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "got " << fmt(got) << ", reference " << fmt(ref) << ", tolerance "
                                       << fmt(tol);
}

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

}  // namespace
