// §6.5 Attention with sink (kernels/sparse_attention.h, kernels/exp.h): every
// kernel variant against the per-head definition, and that against double
// precision. References and tolerances: stage_util.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/cpu.h"
#include "core/formats.h"
#include "kernels/exp.h"
#include "kernels/sparse_attention.h"
#include "stage_util.h"

namespace {

using namespace dsv4::testing;

std::vector<float> attend(const std::vector<float>& q, const std::vector<std::vector<float>>& keys, float sink) {
  std::vector<const float*> kp;
  for (const auto& k : keys) kp.push_back(k.data());
  std::vector<float> out(q.size());
  dsv4::attend_head(q.data(), kp.data(), int64_t(kp.size()), int64_t(q.size()), sink, out.data());
  return out;
}

// attend_query (every kernel variant) against the per-head definition, bit
// for bit: head counts off the 8- and 16-lane vectors and the head tiles,
// odd d (a padded last pair), d off the 8-dword column blocks, key counts
// off the key tiles, keys in any order; scores wide enough that exp
// underflows to subnormals and zero, sinks that dominate or overflow. The
// BF16 kernel must decline (and the fp32 one give the same bits) for tiny
// keys or one tiny q value (products near the subnormal range) and for a q
// that is not bf16; the large cases are the ones where a one-ulp change
// inside shows through the bf16 outputs.
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

}  // namespace
