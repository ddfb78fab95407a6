// §7 Hadamard (kernels/hadamard.h) against the explicit Sylvester matrix.
// References and tolerances: stage_util.h.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/hadamard.h"
#include "stage_util.h"

namespace {

using namespace dsv4::testing;

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

}  // namespace
