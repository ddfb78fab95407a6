// §5 RoPE with YaRN (kernels/rope.h): the frequency tables, cos/sin and the
// rotation against the spec's fp32 formula. References: stage_util.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "io/config.h"
#include "kernels/rope.h"
#include "model/model.h"
#include "stage_util.h"

namespace {

using namespace dsv4::testing;
using dsv4::ModelConfig;

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

}  // namespace
