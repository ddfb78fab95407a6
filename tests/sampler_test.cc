// The token sampler: greedy, the filters, the counter-based draw and its
// distribution.
#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "core/error.h"

namespace dsv4 {
namespace {

SamplingParams warm(float t, uint64_t seed = 1) {
  SamplingParams s;
  s.temperature = t;
  s.seed = seed;
  return s;
}

// Counts of the draws at positions 0..n-1.
std::vector<int> histogram(const std::vector<float>& logits, const SamplingParams& s, int n) {
  std::vector<int> counts(logits.size());
  for (int p = 0; p < n; ++p) ++counts[size_t(sample(logits, s, p))];
  return counts;
}

TEST(Sampler, TemperatureZeroIsArgmaxTiesToLowerId) {
  EXPECT_EQ(sample({1, 3, 2, 3}, SamplingParams{}, 0), 1);
  EXPECT_EQ(sample({5, 5, 5}, SamplingParams{}, 9), 0);
  EXPECT_EQ(sample({-2, -1, -7}, SamplingParams{}, 3), 1);
}

TEST(Sampler, TopKOneIsArgmaxAtAnyTemperature) {
  const std::vector<float> logits = {0.5f, 2, 1, 2, -1};
  for (float t : {0.1f, 1.f, 10.f, 1000.f}) {
    SamplingParams s = warm(t);
    s.top_k = 1;
    for (int p = 0; p < 200; ++p) ASSERT_EQ(sample(logits, s, p), 1) << t << " " << p;
  }
}

TEST(Sampler, SameSeedAndPositionSameToken) {
  const std::vector<float> flat(64, 0.f);
  int differ = 0;
  for (int p = 0; p < 500; ++p) {
    EXPECT_EQ(sample(flat, warm(1, 7), p), sample(flat, warm(1, 7), p));
    EXPECT_EQ(counter_uniform(7, p), counter_uniform(7, p));
    differ += sample(flat, warm(1, 7), p) != sample(flat, warm(1, 8), p);
  }
  // Independent draws from 64 tokens agree 1 time in 64: ~8 of 500.
  EXPECT_GT(differ, 450);
}

TEST(Sampler, UniformIsInUnitIntervalAndVariesWithPosition) {
  std::set<double> seen;
  for (int p = 0; p < 1000; ++p) {
    const double u = counter_uniform(3, p);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    seen.insert(u);
  }
  EXPECT_EQ(seen.size(), 1000u);
}

TEST(Sampler, FrequenciesFollowTheDistribution) {
  const std::vector<double> want = {0.1, 0.2, 0.3, 0.4};
  std::vector<float> logits;
  for (double w : want) logits.push_back(float(std::log(w)));
  const int n = 20000;
  const std::vector<int> counts = histogram(logits, warm(1, 42), n);
  double chi2 = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double e = want[i] * n;
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
    EXPECT_NEAR(counts[i] / double(n), want[i], 0.015) << i;
  }
  EXPECT_LT(chi2, 16.27);  // 3 degrees of freedom, p = 0.001
  // Temperature 2 flattens: p ~ sqrt(w).
  const std::vector<int> hot = histogram(logits, warm(2, 42), n);
  double z = 0;
  for (double w : want) z += std::sqrt(w);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(hot[i] / double(n), std::sqrt(want[i]) / z, 0.015) << i;
}

TEST(Sampler, TopPKeepsTheSmallestPrefixReachingP) {
  std::vector<float> logits;
  for (double w : {0.1, 0.4, 0.2, 0.3}) logits.push_back(float(std::log(w)));
  SamplingParams s = warm(1, 5);
  s.top_p = 0.65f;  // 0.4 + 0.3 = 0.7 >= 0.65: ids 1 and 3
  std::vector<int> c = histogram(logits, s, 4000);
  EXPECT_EQ(c[0], 0);
  EXPECT_EQ(c[2], 0);
  EXPECT_NEAR(c[1] / 4000.0, 0.4 / 0.7, 0.03);
  s.top_p = 0.35f;  // the first token alone reaches it
  c = histogram(logits, s, 500);
  EXPECT_EQ(c[1], 500);
}

TEST(Sampler, MinPDropsTheUnlikely) {
  std::vector<float> logits;
  for (double w : {0.1, 0.4, 0.2, 0.3}) logits.push_back(float(std::log(w)));
  SamplingParams s = warm(1, 5);
  s.min_p = 0.6f;  // floor 0.24: keeps 0.4 and 0.3
  std::vector<int> c = histogram(logits, s, 4000);
  EXPECT_EQ(c[0], 0);
  EXPECT_EQ(c[2], 0);
  EXPECT_GT(c[1], 0);
  EXPECT_GT(c[3], 0);
  s.min_p = 0.45f;  // floor 0.18: keeps 0.2 too
  c = histogram(logits, s, 4000);
  EXPECT_EQ(c[0], 0);
  EXPECT_GT(c[2], 0);
}

TEST(Sampler, TopKBreaksTiesByLowerId) {
  SamplingParams s = warm(1, 2);
  s.top_k = 2;
  const std::vector<int> c = histogram({1, 3, 3, 3}, s, 2000);
  EXPECT_EQ(c[0], 0);
  EXPECT_EQ(c[3], 0);
  EXPECT_NEAR(c[1] / 2000.0, 0.5, 0.05);
}

TEST(Sampler, InvalidParamsThrowNamingTheOption) {
  auto message = [](SamplingParams s) -> std::string {
    try {
      s.check();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(message(SamplingParams{}), "");
  SamplingParams s;
  s.temperature = -1;
  EXPECT_NE(message(s).find("--temp"), std::string::npos);
  s.temperature = INFINITY;
  EXPECT_NE(message(s).find("--temp"), std::string::npos);
  s.temperature = NAN;
  EXPECT_NE(message(s).find("--temp"), std::string::npos);
  s = {};
  s.top_k = -1;
  EXPECT_NE(message(s).find("--top-k"), std::string::npos);
  for (float p : {0.f, 1.5f, NAN}) {
    s = {};
    s.top_p = p;
    EXPECT_NE(message(s).find("--top-p"), std::string::npos) << p;
    s = {};
    s.min_p = p == 0 ? -0.1f : p;
    EXPECT_NE(message(s).find("--min-p"), std::string::npos) << p;
  }
}

}  // namespace
}  // namespace dsv4
