// Model FLOP counts (src/engine/flops.h) against the table in
// docs/PERFORMANCE.md and against a hand count on a tiny config.
#include <gtest/gtest.h>

#include <algorithm>

#include "engine/flops.h"
#include "io/synthetic.h"

namespace dsv4 {
namespace {

ModelConfig flash() {
  SyntheticOptions o;
  o.preset = "flash";
  return synthetic_config(o);
}

// Mean per token of one layer over a prefill of n tokens.
FlopCounts mean_per_token(const ModelConfig& c, int layer, int64_t n) {
  FlopCounts f = layer_flops(c, layer, n);
  const double s = 1.0 / double(n);
  for (double* v : {&f.projections, &f.compressors, &f.indexer_proj, &f.indexer_scores, &f.attention, &f.gate,
                    &f.routed_experts, &f.shared_experts, &f.hc, &f.head})
    *v *= s;
  return f;
}

// Within `rel` of the table, or within the table's rounding (whole M) for
// its small entries.
void expect_near_rel(double got, double want, double rel, const char* what) {
  EXPECT_NEAR(got, want, std::max(rel * want, 0.5e6)) << what << ": " << got / 1e6 << " M against " << want / 1e6 << " M";
}

// docs/PERFORMANCE.md, "FLOPs per token and layer (Flash shapes)": the
// sparse-attention row is the count at the last position of an 8192-token
// prompt (≤ 128 + 512 keys on CSA, ≤ 128 + N/128 on HCA), the indexer row the
// mean over that prompt; the other rows do not depend on the position.
TEST(Flops, FlashMatchesDocsTable) {
  const ModelConfig c = flash();
  ASSERT_EQ(c.ratio(0), 0);
  ASSERT_EQ(c.ratio(2), 4);
  ASSERT_EQ(c.ratio(3), 128);
  const int64_t N = 8192;
  struct Row {
    int layer;
    const char* name;
    double attention, compressors, indexer, total;
  };
  const Row rows[] = {{0, "SWA", 17e6, 0, 0, 585e6}, {2, "CSA", 84e6, 38e6, 17e6, 707e6}, {3, "HCA", 25e6, 8e6, 0, 601e6}};
  for (const Row& r : rows) {
    SCOPED_TRACE(r.name);
    const FlopCounts last = token_flops(c, r.layer, N - 1);
    const FlopCounts mean = mean_per_token(c, r.layer, N);
    expect_near_rel(last.projections, 214e6, 0.02, "projections");
    expect_near_rel(last.gate, 2e6, 0.02, "gate");
    expect_near_rel(last.routed_experts, 302e6, 0.02, "routed experts");
    expect_near_rel(last.shared_experts, 50e6, 0.02, "shared expert");
    expect_near_rel(last.gate + last.routed_experts + last.shared_experts, 354e6, 0.02, "MoE");
    expect_near_rel(last.attention, r.attention, 0.02, "sparse attention");
    if (r.compressors > 0) {
      expect_near_rel(last.compressors + last.indexer_proj, r.compressors, 0.02, "compressors + indexer q/weights");
    } else {
      EXPECT_EQ(last.compressors + last.indexer_proj, 0.0);
    }
    if (r.indexer > 0) {
      expect_near_rel(mean.indexer_scores, r.indexer, 0.02, "indexer scores (mean)");
    } else {
      EXPECT_EQ(mean.indexer_scores, 0.0);
    }
    // The table's total leaves out hc (about 2 M per token and layer).
    const double table_parts = last.total() - last.hc - last.indexer_scores + mean.indexer_scores;
    expect_near_rel(table_parts, r.total, 0.02, "total");
    EXPECT_LT(last.hc, 0.01 * last.total());
    EXPECT_EQ(last.head, 0.0);
  }
}

// docs/PERFORMANCE.md: the 4-layer cut (SWA/CSA/HCA/CSA) at N = 8192 is
// about 21.3 TFLOP.
TEST(Flops, FlashFourLayerCut) {
  SyntheticOptions o;
  o.preset = "flash";
  o.layers = 4;
  const ModelConfig c = synthetic_config(o);
  const double t = prefill_flops(c, 8192).total();
  EXPECT_NEAR(t, 21.3e12, 0.02 * 21.3e12) << t / 1e12 << " TFLOP";
}

// A hand count on a small config: 2 layers (CSA, HCA), every width distinct.
TEST(Flops, TinyHandCount) {
  ModelConfig c;
  c.hidden_size = 8;        // D
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;  // H
  c.head_dim = 6;           // d
  c.qk_rope_head_dim = 2;
  c.q_lora_rank = 4;        // ql
  c.o_lora_rank = 3;        // ol
  c.o_groups = 2;           // G
  c.sliding_window = 3;     // W
  c.compress_ratios = {4, 128, 0};
  c.index_n_heads = 2;      // Hi
  c.index_head_dim = 5;     // di
  c.index_topk = 2;
  c.n_routed_experts = 5;   // E
  c.num_experts_per_tok = 2;
  c.n_shared_experts = 1;
  c.moe_intermediate_size = 7;  // I
  c.hc_mult = 2;
  c.vocab_size = 11;

  // Per token and layer, multiply-adds:
  //   projections: wq_a 8·4 + wq_b 4·12 + wkv 8·6 + wo_a 3·12 + wo_b 6·8 = 32+48+48+36+48 = 212
  //   gate 8·5 = 40; routed 2 · 3·8·7 = 336; shared 168
  //   hc: 2 · ((2+2)·2·2·8 + 2·8 + 2·3·8) = 2 · (128 + 16 + 48) = 384
  //   CSA compressors: main 2·(2·6)·8 = 192, indexer 2·(2·5)·8 = 160; indexer q/weights 4·10 + 8·2 = 56
  //   HCA compressor: 2·6·8 = 96
  const FlopCounts csa0 = token_flops(c, 0, 0);
  EXPECT_EQ(csa0.projections, 2 * 212.0);
  EXPECT_EQ(csa0.gate, 2 * 40.0);
  EXPECT_EQ(csa0.routed_experts, 2 * 336.0);
  EXPECT_EQ(csa0.shared_experts, 2 * 168.0);
  EXPECT_EQ(csa0.hc, 2 * 384.0);
  EXPECT_EQ(csa0.compressors, 2 * 352.0);
  EXPECT_EQ(csa0.indexer_proj, 2 * 56.0);
  EXPECT_EQ(token_flops(c, 1, 0).compressors, 2 * 96.0);
  EXPECT_EQ(token_flops(c, 1, 0).indexer_proj, 0.0);

  // Keys per query t (W = 3; CSA: min(topk 2, (t+1) div 4) selected rows;
  // HCA: (t+1) div 128 rows), for t = 0..9:
  //   CSA: window 1,2,3,3,3,3,3,3,3,3 + selected 0,0,0,1,1,1,1,2,2,2 -> 1,2,3,4,4,4,4,5,5,5 = 37
  //   HCA: window only (no block of 128 complete)                    -> 1,2,3,3,...      = 27
  //   indexer candidates (CSA): (t+1) div 4 = 0,0,0,1,1,1,1,2,2,2 = 10
  const int64_t N = 10;
  const int csa_keys[N] = {1, 2, 3, 4, 4, 4, 4, 5, 5, 5};
  for (int64_t t = 0; t < N; ++t) {
    EXPECT_EQ(attention_keys(c, 0, t), csa_keys[t]) << t;
    EXPECT_EQ(token_flops(c, 0, t).attention, 2.0 * 2 * csa_keys[t] * 2 * 6) << t;  // QK + PV, H·d each
  }
  const FlopCounts l0 = layer_flops(c, 0, N), l1 = layer_flops(c, 1, N);
  EXPECT_EQ(l0.attention, 2.0 * 2 * 37 * 2 * 6);
  EXPECT_EQ(l1.attention, 2.0 * 2 * 27 * 2 * 6);
  EXPECT_EQ(l0.indexer_scores, 2.0 * 10 * 2 * 5);  // candidates · Hi · di
  EXPECT_EQ(l1.indexer_scores, 0.0);
  EXPECT_EQ(l0.projections, N * 2 * 212.0);

  // The whole prefill: both layers plus hc_head (2·2·8 + 2·8 = 48) and the
  // head (11·8 = 88) for one row.
  const FlopCounts all = prefill_flops(c, N);
  EXPECT_EQ(all.head, 2 * (48.0 + 88.0));
  EXPECT_DOUBLE_EQ(all.total(), l0.total() + l1.total() + all.head);
  // Per stage: the indexer takes its projections and its scores.
  EXPECT_EQ(all.stage(Stage::kIndexer), l0.indexer_proj + l0.indexer_scores);
  EXPECT_EQ(all.stage(Stage::kExperts), all.routed_experts + all.shared_experts);
  double sum = 0;
  for (int s = 0; s < int(Stage::kCount); ++s) sum += all.stage(Stage(s));
  EXPECT_DOUBLE_EQ(sum, all.total());
  // HCA over 300 tokens: queries t >= 127 see (t+1) div 128 compressed rows.
  int64_t keys = 0;
  for (int64_t t = 0; t < 300; ++t) keys += std::min<int64_t>(3, t + 1) + (t + 1) / 128;
  EXPECT_EQ(layer_flops(c, 1, 300).attention, 2.0 * 2 * double(keys) * 2 * 6);
}

}  // namespace
}  // namespace dsv4
