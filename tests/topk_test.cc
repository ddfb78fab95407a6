// top-k (§8.4, §9.2; kernels/topk.h): ties to the lower index, NaN below
// every number, topk_set against topk_indices.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/topk.h"
#include "stage_util.h"

namespace {

using namespace dsv4::testing;

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

}  // namespace
