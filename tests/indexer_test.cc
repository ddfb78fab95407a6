// §8.3–8.4 Indexer: the score kernel (kernels/indexer_score.h) against its
// plain reference, and the selection (model/attention.h) against the spec's
// rounding points and tie order. References: stage_util.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "core/cpu.h"
#include "core/formats.h"
#include "kernels/indexer_score.h"
#include "model/attention.h"
#include "stage_util.h"

namespace {

using namespace dsv4::testing;

// ===========================================================================
// §8.3 Indexer scores (kernels/indexer_score.h)
// ===========================================================================

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

}  // namespace
