// Model FLOPs of a prefill, from the ModelConfig alone (docs/PERFORMANCE.md,
// "FLOPs per token and layer"). Counted as 2 flops per multiply-add of the
// matrix products of MODEL.md; element-wise work (norms, RoPE, softmax,
// Hadamard, FP8/FP4 simulation, SwiGLU, the compressor pooling) is not
// counted. Attention and indexer counts are exact per position: query t sees
// min(W, t+1) window rows plus, on compressed layers, the compressed rows
// visible to it ((t+1) div r): all of them on HCA-like layers, the
// min(index_topk, visible) the indexer selects on CSA (ratio 4) layers,
// where the indexer scores every visible indexer row.
#pragma once
#include <cstdint>

#include "core/stage_timer.h"
#include "io/config.h"

namespace dsv4 {

struct FlopCounts {
  double projections = 0;     // wq_a, wq_b, wkv, wo_a (grouped), wo_b
  double compressors = 0;     // main compressor wkv + wgate (+ the indexer's compressor on CSA)
  double indexer_proj = 0;    // indexer wq_b and weights_proj (CSA)
  double indexer_scores = 0;  // qi_h · k_c over every visible indexer row, all heads (CSA)
  double attention = 0;       // QK and PV over the keys each query sees, all heads
  double gate = 0;            // MoE gate
  double routed_experts = 0;  // num_experts_per_tok SwiGLU experts (w1, w3, w2)
  double shared_experts = 0;  // n_shared_experts SwiGLU experts
  double hc = 0;              // hc_pre (fn product, weighted sum) and hc_post mixes, twice per layer
  double head = 0;            // hc_head + the vocabulary head, for the rows that get logits

  double total() const {
    return projections + compressors + indexer_proj + indexer_scores + attention + gate + routed_experts +
           shared_experts + hc + head;
  }
  // The FLOPs attributed to an engine stage (indexer = its projections and
  // its scores; experts = routed + shared).
  double stage(Stage s) const;
  FlopCounts& operator+=(const FlopCounts& o);
};

// The compressed rows of layer `layer` query t can see: (t+1) div ratio, 0 on
// SWA layers.
int64_t visible_compressed_rows(const ModelConfig& c, int layer, int64_t t);
// Keys attention takes for query t: window rows plus selected compressed rows.
int64_t attention_keys(const ModelConfig& c, int layer, int64_t t);

// One token at position t of layer `layer` (no head).
FlopCounts token_flops(const ModelConfig& c, int layer, int64_t t);
// Every position 0..n_tokens-1 of one layer (no head).
FlopCounts layer_flops(const ModelConfig& c, int layer, int64_t n_tokens);
// A whole prefill of n_tokens from empty state: every layer, plus hc_head and
// the head for `head_rows` rows (the engine computes logits for the last row).
FlopCounts prefill_flops(const ModelConfig& c, int64_t n_tokens, int64_t head_rows = 1);

}  // namespace dsv4
