// End-to-end and per-layer agreement with the official reference forward
// (shared/golden/tiny-a), with the tolerances its README recommends.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/formats.h"
#include "io/npy.h"
#include "io/safetensors.h"
#include "kernels/dot.h"
#include "test_util.h"

namespace dsv4 {
namespace {

using testing::golden_dir;
using testing::rel_l2;
using testing::run_dsv4;
using testing::TempDir;

std::string case_dir(int n) { return golden_dir() + "/cases/" + std::to_string(n); }

// Argmax of hidden_row · headᵀ for every row (ties to the lower id).
std::vector<int> row_argmax(const std::vector<float>& hidden, int64_t rows, int64_t D, const std::vector<float>& head,
                            int64_t V) {
  std::vector<int> out(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    int best = 0;
    float bv = -INFINITY;
    for (int64_t v = 0; v < V; ++v) {
      float s = dot_f32(hidden.data() + r * D, head.data() + v * D, D);
      if (s > bv) { bv = s; best = int(v); }
    }
    out[size_t(r)] = best;
  }
  return out;
}

std::vector<float> load_head(int64_t* V, int64_t* D) {
  Checkpoint ck = Checkpoint::open(golden_dir());
  const TensorView* t = ck.find("head.weight");
  *V = t->shape[0];
  *D = t->shape[1];
  std::vector<float> h(static_cast<size_t>(t->numel()));
  for (size_t i = 0; i < h.size(); ++i) {
    uint16_t b;
    std::memcpy(&b, t->data + 2 * i, 2);
    h[i] = bf16_to_f32(b);
  }
  return h;
}

struct CaseResult {
  std::vector<float> logits, hidden, golden_logits, golden_hidden;
  int64_t n = 0, D = 0;
};

CaseResult run_case(int n) {
  TempDir tmp;
  const std::string dir = case_dir(n);
  auto r = run_dsv4("prefill --model " + golden_dir() + " --tokens " + dir + "/input_ids.json --dump-logits " +
                    (tmp / "l.npy") + " --dump-hidden " + (tmp / "h.npy") + " --json");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  CaseResult c;
  c.logits = read_npy(tmp / "l.npy").data;
  NpyArray h = read_npy(tmp / "h.npy");
  c.hidden = h.data;
  c.n = h.shape[0];
  c.D = h.shape[1];
  c.golden_logits = read_npy(dir + "/logits_last.npy").data;
  c.golden_hidden = read_npy(dir + "/hidden_final.npy").data;
  return c;
}

class GoldenEndToEnd : public ::testing::TestWithParam<int> {};

// README tolerance set 3: every case, end to end.
TEST_P(GoldenEndToEnd, MeetsTolerances) {
  const int n = GetParam();
  CaseResult c = run_case(n);
  ASSERT_EQ(c.n, n);
  EXPECT_LE(rel_l2(c.logits, c.golden_logits), 3e-2);
  EXPECT_LE(rel_l2(c.hidden, c.golden_hidden), 5e-2);
  double worst = 0;
  for (int64_t r = 0; r < c.n; ++r)
    worst = std::max(worst, rel_l2(c.hidden.data() + r * c.D, c.golden_hidden.data() + r * c.D, size_t(c.D)));
  EXPECT_LE(worst, 0.3);

  // The last argmax must match where the golden top-2 gap is >= 0.1.
  std::vector<float> g = c.golden_logits;
  const int gbest = int(std::max_element(g.begin(), g.end()) - g.begin());
  std::vector<float> sorted = g;
  std::sort(sorted.rbegin(), sorted.rend());
  if (sorted[0] - sorted[1] >= 0.1f) {
    const int best = int(std::max_element(c.logits.begin(), c.logits.end()) - c.logits.begin());
    EXPECT_EQ(best, gbest);
  }
  if (n >= 100) {
    int64_t V, D;
    std::vector<float> head = load_head(&V, &D);
    auto a = row_argmax(c.hidden, c.n, D, head, V);
    auto b = row_argmax(c.golden_hidden, c.n, D, head, V);
    int64_t agree = 0;
    for (size_t i = 0; i < a.size(); ++i) agree += a[i] == b[i];
    EXPECT_GE(double(agree) / double(a.size()), 0.94);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, GoldenEndToEnd, ::testing::Values(127, 128, 129, 300, 777, 2100));

// README tolerance set 2 (N = 1, 5): these goldens are causal prefixes of
// longer runs (the reference rounds differently inside attention for prompts
// under 8 tokens; its README says why), so a causal engine must meet them as
// tightly as summation-order changes allow: rel L2 <= 1e-3, argmax equal.
TEST(GoldenShortPrompts, MeetTightTolerances) {
  for (int n : {1, 5}) {
    CaseResult c = run_case(n);
    ASSERT_EQ(c.n, n);
    EXPECT_LE(rel_l2(c.hidden, c.golden_hidden), 1e-3) << "N=" << n;
    EXPECT_LE(rel_l2(c.logits, c.golden_logits), 1e-3) << "N=" << n;
    const auto best = std::max_element(c.logits.begin(), c.logits.end()) - c.logits.begin();
    const auto gbest = std::max_element(c.golden_logits.begin(), c.golden_logits.end()) - c.golden_logits.begin();
    EXPECT_EQ(best, gbest) << "N=" << n;
  }
}

// The engine itself is causal: row 0 does not depend on what follows.
TEST(GoldenEndToEndShort, RowZeroMatchesLongerPrompts) {
  CaseResult c1 = run_case(1), c300 = run_case(300);
  EXPECT_EQ(rel_l2(c1.hidden.data(), c300.golden_hidden.data(), size_t(c1.D)), 0.0);
  EXPECT_EQ(rel_l2(c1.hidden.data(), c300.hidden.data(), size_t(c1.D)), 0.0);
}

// README tolerance set 1: each layer fed the reference input (case 300).
TEST(GoldenTeacherForced, EveryLayerWithinTolerance) {
  TempDir tmp;
  const std::string dir = case_dir(300);
  auto r = run_dsv4("prefill --model " + golden_dir() + " --tokens " + dir + "/input_ids.json --teacher-force " + dir +
                    "/residual_layers.npy --dump-residuals " + (tmp / "r.npy"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  NpyArray mine = read_npy(tmp / "r.npy"), gold = read_npy(dir + "/residual_layers.npy");
  ASSERT_EQ(mine.shape, gold.shape);
  const size_t per_layer = gold.data.size() / size_t(gold.shape[0]);
  for (int64_t l = 0; l < gold.shape[0]; ++l) {
    double e = rel_l2(mine.data.data() + l * per_layer, gold.data.data() + l * per_layer, per_layer);
    EXPECT_LE(e, 3e-3) << "layer " << l;
    std::printf("teacher-forced layer %lld: rel L2 %.3g\n", (long long)l, e);
  }
}

}  // namespace
}  // namespace dsv4
