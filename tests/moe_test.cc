// §9 MoE (model/moe.h, kernels/swiglu.h): routing, experts with the SwiGLU
// clamp and the sum order, against weights built and decoded here. References
// and tolerances: stage_util.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "io/config.h"
#include "kernels/linear.h"
#include "kernels/swiglu.h"
#include "model/moe.h"
#include "model/weights.h"
#include "stage_util.h"

namespace {

using namespace dsv4::testing;
using dsv4::ModelConfig;
using dsv4::Weight;

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
