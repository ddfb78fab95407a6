// The bytes a decode step reads (src/engine/decode_bytes.h), against a hand
// count on the tiny preset: D 256, layers SWA/CSA/HCA/CSA, H 4, d 128,
// q_lora = o_lora 128, G 2, W 128, Hi 4, di 128, top-k 16, E 8, k 2, I 128,
// one hash layer, hc 4, vocab 1024, FP8 blocks of 128.
#include <gtest/gtest.h>

#include "engine/decode_bytes.h"
#include "io/synthetic.h"

namespace dsv4 {
namespace {

ModelConfig tiny() {
  SyntheticOptions o;
  o.preset = "tiny";
  return synthetic_config(o);
}

TEST(DecodeBytes, MatrixFormats) {
  EXPECT_EQ(matrix_bytes(WeightFormat::kFP8, 128, 256, 128), 32768 + 1 * 2);
  EXPECT_EQ(matrix_bytes(WeightFormat::kFP8, 129, 256, 128), 129 * 256 + 2 * 2);  // partial blocks count whole
  EXPECT_EQ(matrix_bytes(WeightFormat::kFP4, 128, 256, 128), 16384 + 1024);       // two per byte, a scale per 32
  EXPECT_EQ(matrix_bytes(WeightFormat::kBF16, 4, 256, 128), 2048);
  EXPECT_EQ(matrix_bytes(WeightFormat::kF32, 4, 256, 128), 4096);
}

// The parts that do not depend on the position.
void expect_fixed_parts(const DecodeBytes& b) {
  // wq_a 32770, wq_b 65540, wkv 32770, wo_a 65540, wo_b 65540 (FP8 + scales),
  // q_norm, kv_norm, attn_sink 4·(128 + 128 + 4): 263200 per layer.
  EXPECT_EQ(b.attention, 4 * 263200.0);
  // hc_attn, hc_ffn: 4·(24·1024 + 24 + 3) each, attn_norm, ffn_norm 4·256 each.
  EXPECT_EQ(b.hc, 4 * (2 * 98412.0 + 2048));
  // gate 2·8·256; the hash layer's tid2eid row 2·4, the others' bias 8·4.
  EXPECT_EQ(b.gate, 4 * 4096.0 + 8 + 3 * 32);
  // Two FP4 experts a layer, each 3 · (16384 + 1024).
  EXPECT_EQ(b.routed_experts, 4 * 2 * 52224.0);
  // FP8 w1, w3 [128][256] and w2 [256][128]: 3 · 32770.
  EXPECT_EQ(b.shared_experts, 4 * 98310.0);
  // Embedding row 512, hc_head 4·(4·1024 + 4 + 1), norm 1024, head 2·1024·256.
  EXPECT_EQ(b.head, 512 + 16404 + 1024 + 524288.0);
  // Per CSA layer indexer wq_b 65540 + weights_proj 2·4·256.
  EXPECT_EQ(b.indexer, 2 * 67588.0);
}

// Compressor matrices: CSA wkv + wgate BF16 [256][256] for the main and the
// indexer compressor, each with an ape row of 256 floats; HCA [128][256]
// and 128 floats.
constexpr double kCompressorMatrices = 2 * 2 * (262144.0 + 1024) + (131072.0 + 512);

TEST(DecodeBytes, TinyHandCountNoRowEmitted) {
  const DecodeBytes b = decode_step_bytes(tiny(), WeightFormats{}, 200);
  expect_fixed_parts(b);
  EXPECT_EQ(b.compressors, kCompressorMatrices);
  EXPECT_EQ(b.window, 4 * 127 * 256.0);           // W − 1 older rows of bf16 [128]
  EXPECT_EQ(b.compressed, 2 * 16 * 256.0 + 256);  // CSA: top-16 of 50 rows; HCA: 201 div 128 = 1 row
  EXPECT_EQ(b.indexer_rows, 2 * 50 * 256.0);      // CSA: all 50 visible rows scored
  EXPECT_EQ(b.compressor_ring, 0.0);
  EXPECT_EQ(b.total(), b.attention + b.compressors + b.indexer + b.hc + b.gate + b.routed_experts +
                           b.shared_experts + b.head + b.window + b.compressed + b.indexer_rows);
  EXPECT_EQ(b.weights(), b.shared_weights() + b.routed_experts);
}

TEST(DecodeBytes, TinyHandCountRowsEmitted) {
  // t = 255 completes CSA row 63 and HCA row 1.
  const DecodeBytes b = decode_step_bytes(tiny(), WeightFormats{}, 255);
  expect_fixed_parts(b);
  EXPECT_EQ(b.compressors, kCompressorMatrices + 2 * 2 * 512 + 512);  // each emitting compressor's norm
  EXPECT_EQ(b.compressed, 2 * 16 * 256.0 + 2 * 256);
  EXPECT_EQ(b.indexer_rows, 2 * 64 * 256.0);
  // CSA: 8 slots (blocks 62 and 63) of 2·128 floats, two compressors, two
  // layers; HCA row 1: 128 slots of 2·128 floats.
  EXPECT_EQ(b.compressor_ring, 2 * 2 * 8 * 1024.0 + 128 * 1024.0);
}

TEST(DecodeBytes, TinyHandCountEarlyPosition) {
  // t = 3: three older window rows; CSA row 0 completes (pooling block 0
  // alone) and is the only visible one, so nothing is scored.
  const DecodeBytes b = decode_step_bytes(tiny(), WeightFormats{}, 3);
  EXPECT_EQ(b.window, 4 * 3 * 256.0);
  EXPECT_EQ(b.compressed, 2 * 256.0);
  EXPECT_EQ(b.indexer_rows, 0.0);
  EXPECT_EQ(b.compressor_ring, 2 * 2 * 4 * 1024.0);
}

TEST(DecodeBytes, FollowsTheWeightFormats) {
  WeightFormats f;
  f.routed_experts = WeightFormat::kFP8;
  EXPECT_EQ(routed_expert_bytes(tiny(), f), 3 * 32770.0);
  EXPECT_EQ(routed_expert_bytes(tiny(), WeightFormats{}), 52224.0);
  f.head = WeightFormat::kF32;
  EXPECT_EQ(decode_step_bytes(tiny(), f, 10).head, 512 + 16404 + 1024 + 4 * 1024 * 256.0);
}

}  // namespace
}  // namespace dsv4
