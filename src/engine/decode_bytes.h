// Bytes one decode step reads (docs/PERFORMANCE.md, "Decode"), from the
// ModelConfig, the formats of the weights and the position alone, beside
// the FLOP counts of engine/flops.h. A decode step does a few FLOPs per
// weight byte, so its limit is these bytes over the machine's read
// bandwidth (core/bandwidth.h).
//
// Counted: every weight the step uses, once, in the format the engine reads
// it (matrices as stored in the checkpoint with their e8m0 scales; the small
// vectors the loader copies to fp32 as fp32), and the cache rows the step
// needs at its position. Not counted: activations (a few rows, in cache),
// the rows the step writes, and work the engine does beyond what the model
// needs (it is a limit, not a trace of the code).
#pragma once
#include <cstdint>

#include "io/config.h"

namespace dsv4 {

// How a matrix is stored (MODEL.md §3, CHECKPOINT.md): FP8 e4m3 with one
// e8m0 scale per weight_block_size² block, packed FP4 e2m1 with one e8m0
// scale per 32 inputs, or plain BF16 / F32.
enum class WeightFormat { kFP8, kFP4, kBF16, kF32 };

// The formats of each family of matrices; the defaults are those of the
// official checkpoint (and what the loader accepts today).
struct WeightFormats {
  WeightFormat attention = WeightFormat::kFP8;        // wq_a, wq_b, wkv, wo_a, wo_b, indexer.wq_b
  WeightFormat compressor = WeightFormat::kBF16;      // compressor wkv, wgate (main and indexer)
  WeightFormat indexer_proj = WeightFormat::kBF16;    // indexer.weights_proj
  WeightFormat gate = WeightFormat::kBF16;            // ffn.gate
  WeightFormat routed_experts = WeightFormat::kFP4;   // experts.e.w1/w2/w3
  WeightFormat shared_experts = WeightFormat::kFP8;   // shared_experts.w1/w2/w3
  WeightFormat embed = WeightFormat::kBF16;
  WeightFormat head = WeightFormat::kBF16;
};

// Bytes of a matrix [out][in] in format f with its scales (FP8 blocks of
// block × block inputs and outputs, rounded up; FP4 one scale per 32 inputs).
double matrix_bytes(WeightFormat f, int64_t out, int64_t in, int block);

struct DecodeBytes {
  // Weights, read once per step however many sessions share it.
  double attention = 0;     // wq_a, wq_b, wkv, wo_a, wo_b with scales; q_norm, kv_norm, attn_sink
  double compressors = 0;   // wkv, wgate, one ape row (+ norm when a row is emitted), main and indexer's
  double indexer = 0;       // indexer wq_b (with scales), weights_proj
  double hc = 0;            // hc_attn and hc_ffn fn, base, scale; attn_norm, ffn_norm
  double gate = 0;          // gate matrix, then its bias (non-hash layers) or one tid2eid row (hash layers)
  double shared_experts = 0;
  double head = 0;          // one embedding row, hc_head fn/base/scale, the final norm, the head matrix
  // num_experts_per_tok routed experts (w1, w3, w2 with scales) per layer:
  // one session's. Sessions that share a step share the experts they both
  // chose (routed_expert_bytes() is one expert of one layer).
  double routed_experts = 0;
  // The session's cache rows: per session, however many share the step.
  double window = 0;           // the min(W − 1, t) older raw rows of every layer (bf16 [d])
  double compressed = 0;       // compressed rows attended: all visible (HCA), the top-k chosen (CSA)
  double indexer_rows = 0;     // indexer rows scored (CSA; none while every visible row is chosen)
  double compressor_ring = 0;  // ring slots pooled into a row emitted at this step (fp32)

  double shared_weights() const {
    return attention + compressors + indexer + hc + gate + shared_experts + head;
  }
  double weights() const { return shared_weights() + routed_experts; }
  double cache() const { return window + compressed + indexer_rows + compressor_ring; }
  double total() const { return weights() + cache(); }
};

// The step that appends the token at position t (t tokens already in the
// caches): what one session alone reads.
DecodeBytes decode_step_bytes(const ModelConfig& c, const WeightFormats& f, int64_t t);

// One routed expert of one layer: w1, w3 [I][D] and w2 [D][I] with scales.
double routed_expert_bytes(const ModelConfig& c, const WeightFormats& f);

}  // namespace dsv4
