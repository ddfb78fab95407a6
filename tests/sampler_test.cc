// The token sampler: greedy, the filters, the counter-based draw and its
// distribution.
#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <vector>

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
  for (int p = 0; p < n; ++p) ++counts[size_t(sample(logits, s, p, {}))];
  return counts;
}

// The definition of sample() (sampler.h), written plainly: every logit
// adjusted by its bias and penalties (counted with std::count), weights
// exp((logit - max) / t) in double, one full sort by (weight descending, id
// ascending), top-k, the top-p prefix (its mass against top-k's, summed by
// ascending id), min-p, and the draw over the kept ids in ascending order.
int32_t sample_by_definition(std::vector<float> logits, const SamplingParams& s, int64_t position,
                             const std::vector<int32_t>& generated) {
  for (size_t i = 0; i < logits.size(); ++i) {
    float bias = 0;
    for (const auto& [id, b] : s.logit_bias)
      if (size_t(id) == i) bias = b;
    const auto count = std::count(generated.begin(), generated.end(), int32_t(i));
    logits[i] = logits[i] + bias;
    logits[i] = logits[i] - (float(count) * s.frequency_penalty + (count > 0 ? s.presence_penalty : 0.f));
  }
  const int32_t best = argmax(logits.data(), int64_t(logits.size()));
  if (s.temperature == 0) return best;
  const double top = double(logits[size_t(best)]);
  std::vector<double> w(logits.size());
  for (size_t i = 0; i < w.size(); ++i) w[i] = std::exp((double(logits[i]) - top) / s.temperature);
  std::vector<int32_t> order(w.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = int32_t(i);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return w[size_t(a)] != w[size_t(b)] ? w[size_t(a)] > w[size_t(b)] : a < b;
  });
  size_t n = order.size();
  if (s.top_k > 0) n = std::min(n, size_t(s.top_k));
  if (s.top_p < 1) {
    std::vector<int32_t> by_id(order.begin(), order.begin() + std::ptrdiff_t(n));
    std::sort(by_id.begin(), by_id.end());
    double kept = 0, cum = 0;
    for (int32_t id : by_id) kept += w[size_t(id)];
    for (size_t i = 0; i < n; ++i)
      if ((cum += w[size_t(order[i])]) >= double(s.top_p) * kept) {
        n = i + 1;
        break;
      }
  }
  std::vector<int32_t> ids;
  for (size_t i = 0; i < n; ++i)
    if (w[size_t(order[i])] >= double(s.min_p) && w[size_t(order[i])] > 0) ids.push_back(order[i]);
  std::sort(ids.begin(), ids.end());
  double mass = 0;
  for (int32_t id : ids) mass += w[size_t(id)];
  const double u = counter_uniform(s.seed, position) * mass;
  double cum = 0;
  for (int32_t id : ids)
    if (u < (cum += w[size_t(id)])) return id;
  return ids.back();
}

// The sampler sorts only what the filters reach; the tokens are the
// definition's: a vocabulary-sized row, rows full of equal logits (ties
// broken by id), -inf logits, and low temperatures where thousands of
// weights round to 0, under every filter, at many positions.
TEST(Sampler, EqualsItsDefinition) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 3.f);
  std::vector<std::vector<float>> rows(4, std::vector<float>(129280));
  for (float& v : rows[0]) v = nd(rng);
  for (float& v : rows[1]) v = std::round(nd(rng) * 2.f) / 2.f;  // ~30 distinct values
  for (size_t i = 0; i < rows[2].size(); ++i) rows[2][i] = i % 7 == 0 ? -INFINITY : nd(rng);
  for (float& v : rows[3]) v = float(int(rng() % 3));
  for (const std::vector<float>& row : rows)
    for (float t : {0.002f, 0.3f, 2.5f})
      for (int k : {0, 40})
        for (float top_p : {1.f, 0.9f})
          for (float min_p : {0.f, 0.05f}) {
            SamplingParams s = warm(t, uint64_t(k) * 31 + 7);
            s.top_k = k;
            s.top_p = top_p;
            s.min_p = min_p;
            for (int64_t pos : {0, 1})
              ASSERT_EQ(sample(row, s, pos, {}), sample_by_definition(row, s, pos, {}))
                  << "t " << t << " top_k " << k << " top_p " << top_p << " min_p " << min_p;
          }
}

// The penalties and biases too: a history holding the row's likeliest ids
// several times each, biases on the likeliest, the least likely and the
// last id; greedy and drawn, with and without the filters.
TEST(Sampler, AdjustedLogitsEqualTheirDefinition) {
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.f, 3.f);
  std::vector<std::vector<float>> rows(3, std::vector<float>(129280));
  for (float& v : rows[0]) v = nd(rng);
  for (float& v : rows[1]) v = std::round(nd(rng) * 2.f) / 2.f;
  for (float& v : rows[2]) v = float(int(rng() % 3));
  for (const std::vector<float>& row : rows) {
    std::vector<int32_t> order(row.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = int32_t(i);
    std::partial_sort(order.begin(), order.begin() + 20, order.end(), [&](int32_t a, int32_t b) {
      return row[size_t(a)] != row[size_t(b)] ? row[size_t(a)] > row[size_t(b)] : a < b;
    });
    std::vector<int32_t> generated;
    for (int i = 0; i < 60; ++i) generated.push_back(order[size_t(i * i % 20)]);
    const int32_t last = int32_t(row.size()) - 1;
    std::vector<SamplingParams> adjusted(3);
    adjusted[0].presence_penalty = 0.7f;
    adjusted[0].frequency_penalty = 1.3f;
    adjusted[1].presence_penalty = -0.5f;
    adjusted[1].logit_bias = {{order[0], -100.f}, {order[5], 2.5f}, {last, 4.f}};
    adjusted[2].frequency_penalty = -2.f;
    adjusted[2].logit_bias = {{order[19], 3.f}};
    for (SamplingParams s : adjusted)
      for (float t : {0.f, 0.3f, 2.5f})
        for (int k : {0, 40}) {
          s.temperature = t;
          s.seed = uint64_t(k) + 3;
          s.top_k = k;
          s.top_p = k ? 0.9f : 1.f;
          for (int64_t pos : {0, 1})
            ASSERT_EQ(sample(row, s, pos, generated), sample_by_definition(row, s, pos, generated))
                << "t " << t << " top_k " << k << " presence " << s.presence_penalty << " frequency "
                << s.frequency_penalty << " biases " << s.logit_bias.size();
        }
  }
}

TEST(Sampler, PenaltiesCountTheAnswersTokens) {
  const std::vector<float> logits = {2, 1.9f, 0};
  SamplingParams s;
  EXPECT_EQ(sample(logits, s, 0, {}), 0);
  s.presence_penalty = 0.2f;  // 2 - 0.2 < 1.9
  EXPECT_EQ(sample(logits, s, 0, {}), 0);
  EXPECT_EQ(sample(logits, s, 0, std::vector<int32_t>{0}), 1);
  s = {};
  s.frequency_penalty = 0.05f;  // once: 1.95 > 1.9; three times: 1.85 < 1.9
  EXPECT_EQ(sample(logits, s, 0, std::vector<int32_t>{0, 2}), 0);
  EXPECT_EQ(sample(logits, s, 0, std::vector<int32_t>{0, 2, 0, 0}), 1);
  s.frequency_penalty = -1;  // a negative penalty favours repeats
  EXPECT_EQ(sample(logits, s, 0, std::vector<int32_t>{2, 2, 2}), 2);
  EXPECT_THROW(sample(logits, s, 0, std::vector<int32_t>{3}), Error);
}

TEST(Sampler, LogitBiasSteersEveryChoice) {
  const std::vector<float> logits = {1, 3, 2};
  SamplingParams s;
  s.logit_bias = {{1, -100}};
  EXPECT_EQ(sample(logits, s, 0, {}), 2);
  s.logit_bias = {{0, 2.5f}};
  EXPECT_EQ(sample(logits, s, 0, {}), 0);
  // At a temperature, +100 leaves the others weights of ~e^-98.
  s = warm(1, 4);
  s.logit_bias = {{2, 100}};
  for (int p = 0; p < 200; ++p) ASSERT_EQ(sample(logits, s, p, {}), 2) << p;
  // An id outside the row is refused, not written past it.
  s.logit_bias = {{3, 1}};
  EXPECT_THROW(sample(logits, s, 0, {}), Error);
}

TEST(Sampler, TemperatureZeroIsArgmaxTiesToLowerId) {
  EXPECT_EQ(sample({1, 3, 2, 3}, SamplingParams{}, 0, {}), 1);
  EXPECT_EQ(sample({5, 5, 5}, SamplingParams{}, 9, {}), 0);
  EXPECT_EQ(sample({-2, -1, -7}, SamplingParams{}, 3, {}), 1);
}

TEST(Sampler, TopKOneIsArgmaxAtAnyTemperature) {
  const std::vector<float> logits = {0.5f, 2, 1, 2, -1};
  for (float t : {0.1f, 1.f, 10.f, 1000.f}) {
    SamplingParams s = warm(t);
    s.top_k = 1;
    for (int p = 0; p < 200; ++p) ASSERT_EQ(sample(logits, s, p, {}), 1) << t << " " << p;
  }
}

TEST(Sampler, SameSeedAndPositionSameToken) {
  const std::vector<float> flat(64, 0.f);
  int differ = 0;
  for (int p = 0; p < 500; ++p) {
    EXPECT_EQ(sample(flat, warm(1, 7), p, {}), sample(flat, warm(1, 7), p, {}));
    EXPECT_EQ(counter_uniform(7, p), counter_uniform(7, p));
    differ += sample(flat, warm(1, 7), p, {}) != sample(flat, warm(1, 8), p, {});
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
      s.check(10);
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
  for (float p : {-2.5f, 2.01f, NAN}) {
    s = {};
    s.presence_penalty = p;
    EXPECT_NE(message(s).find("--presence-penalty"), std::string::npos) << p;
    s = {};
    s.frequency_penalty = p;
    EXPECT_NE(message(s).find("--frequency-penalty"), std::string::npos) << p;
  }
  s = {};
  s.presence_penalty = -2;
  s.frequency_penalty = 2;
  s.logit_bias = {{0, -100}, {9, 100}};
  EXPECT_EQ(message(s), "");
  s.logit_bias = {{10, 1}};
  EXPECT_NE(message(s).find("token 10 is outside the vocabulary [0, 10)"), std::string::npos);
  s.logit_bias = {{-1, 1}};
  EXPECT_NE(message(s).find("--logit-bias"), std::string::npos);
  s.logit_bias = {{3, 101}};
  EXPECT_NE(message(s).find("must be in [-100, 100]"), std::string::npos);
  s.logit_bias = {{3, NAN}};
  EXPECT_NE(message(s).find("must be in [-100, 100]"), std::string::npos);
  s.logit_bias = {{3, 1}, {4, 1}, {3, 2}};
  EXPECT_NE(message(s).find("token 3 is given twice"), std::string::npos);
}

}  // namespace
}  // namespace dsv4
