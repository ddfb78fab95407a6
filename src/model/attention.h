// The attention sublayer of every layer (MODEL.md §6): low-rank q, one shared
// latent kv row per token (K = V), the sliding window, the compressed rows of
// CSA/HCA layers chosen by the lightning indexer (§8), the attention sink and
// the grouped low-rank output.
#pragma once
#include <cstdint>
#include <vector>

#include "io/config.h"
#include "kernels/rope.h"
#include "model/compressor.h"
#include "model/weights.h"

namespace dsv4 {

// One layer's share of a request's caches (PREFILL.md §2), in pool pages.
struct AttentionState {
  LayerKind kind;
  int64_t window_rows = 0;  // sliding_window: position t lives in slot t % window_rows
  PagedRows window;         // raw kv rows, bf16 [d]
  CompressorState comp;     // main compressor (kind.has_compressor())
  CompressorState idx_comp; // indexer compressor (kind.has_indexer())

  void init(CachePool* pool, const ModelConfig& c, const AttentionWeights& w, LayerKind kind);
  // Pages missing to hold the state of the first n_tokens positions.
  size_t pages_missing(const AttentionWeights& w, int64_t n_tokens) const;
  void reserve(const AttentionWeights& w, int64_t n_tokens);
  size_t bytes_held() const;
};

// x: the normalised sublayer input [n][D] (bf16) of positions [p0, p0 + n).
// Writes the sublayer output [n][D] (bf16) to out. The projections run over
// all n rows at once; the cache-reading part (window, compressors, indexer,
// sparse attention) runs tile by tile, `tile` rows at a time in position
// order (tile <= 0: all n). The result does not depend on n or tile.
void attention_forward(const AttentionWeights& w, const ModelConfig& c, LayerKind kind, const RopeTable& rope,
                       const float* x, int64_t p0, int64_t n, int64_t tile, AttentionState& st, float* out);

// The indexer rows visible to a tile [n][di], also packed once as gemm
// pair panels (kernels/gemm.h PairSource) for every query's score product:
// packing them per query cost as much as ~15% of the indexer's products.
struct IndexerRows {
  const float* rows = nullptr;
  int64_t n = 0;
  int di = 0;
  std::vector<uint32_t> pairs;  // panel p: [ceil(di/2)][16] pairs of rows [16p, 16p + 16)
  std::vector<int> min_exponent;
  std::vector<uint8_t> exact;  // 0: that panel is loaded as fp32 per query
  void pack(const float* rows, int64_t n, int di);
  // The PairSource answer for the panel of rows [n0, n0 + 16).
  const uint32_t* panel(int64_t n0, int* min_exponent) const;
};

// Lightning indexer selection for one query (MODEL.md §8.3–8.4): scores the
// first n_visible (<= rows.n) indexer rows with the query's prepared heads
// qi [Hi][di] and weights wts [Hi], and returns the chosen row indices in
// ascending order.
void indexer_select(const float* qi, const float* wts, const IndexerRows& rows, int64_t n_visible, int Hi, int topk,
                    std::vector<int32_t>* chosen);

}  // namespace dsv4
