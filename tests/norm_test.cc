// §4 RMSNorm and §6.2 per-head q normalisation (kernels/norm.h) against the
// spec's formula and rounding points. References and tolerances: stage_util.h.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/norm.h"
#include "stage_util.h"

namespace {

using namespace dsv4::testing;

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

}  // namespace
