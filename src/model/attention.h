// The attention sublayer of every layer (MODEL.md §6): low-rank q, one shared
// latent kv row per token (K = V), the sliding window, the compressed rows of
// CSA/HCA layers (on CSA those the lightning indexer chooses, §8; see
// model/indexer.h), the attention sink and
// the grouped low-rank output.
#pragma once
#include <cstdint>
#include <vector>

#include "io/config.h"
#include "kernels/rope.h"
#include "model/compressor.h"
#include "model/indexer.h"
#include "model/weights.h"

namespace dsv4 {

// One layer's share of a request's caches (PREFILL.md §2), in pool pages.
struct AttentionState {
  LayerKind kind;
  int64_t window_rows = 0;  // sliding_window: position t lives in slot t % window_rows
  PagedRows window;         // raw kv rows, bf16 [d]
  CompressorState comp;     // main compressor (kind.has_compressor())
  IndexerState indexer;     // the lightning indexer's rows (kind.has_indexer())

  void init(CachePool* pool, const ModelConfig& c, const AttentionWeights& w, LayerKind kind);
  // Pages missing to hold the state of the first n_tokens positions.
  size_t pages_missing(const AttentionWeights& w, int64_t n_tokens) const;
  void reserve(const AttentionWeights& w, int64_t n_tokens);
  size_t bytes_held() const;
  // This freshly initialised state (same layer) becomes a copy of `src`,
  // in pages of its own.
  void copy_from(const AttentionState& src);
};

// attention_forward's buffers (model/activations.h), over the n rows of a call
// (16 MB for q alone per 128 Flash rows).
struct AttentionActivations {
  std::vector<float> cs;                 // the rows' rotation tables [n][rd]
  std::vector<float> qr, q, kv;          // q latent, query heads, raw kv rows
  std::vector<float> qi, wts;            // indexer queries and head weights
  std::vector<float> o, u;               // attention output, grouped low-rank output
  std::vector<uint32_t> window_keys, compressed_keys;  // a tile's keys as pair rows
  std::vector<int> window_exp, compressed_exp;         // their smallest exponents
  std::vector<std::vector<int32_t>> chosen;            // a tile's indexer choices
  CompressorActivations compressor, indexer_compressor;  // the call's rows through each compressor
  IndexerActivations indexer;
};

// x: the normalised sublayer input [n][D] (bf16) of positions [p0, p0 + n).
// Writes the sublayer output [n][D] (bf16) to out. The projections run over
// all n rows at once; the cache-reading part (window, compressors, indexer,
// sparse attention) runs tile by tile, `tile` rows at a time in position
// order (tile <= 0: all n). The result does not depend on n or tile.
// Rows [row0, row0 + n) of an attention call: one request's positions
// [p0, p0 + n), walked in tiles of `tile` positions against its state.
struct AttentionSpan {
  int64_t row0 = 0, p0 = 0, n = 0, tile = 0;
  AttentionState* st = nullptr;
};

// §6 for `rows` sublayer inputs x [rows][D] made of `spans` (consecutive,
// covering every row; several requests may share one call): out [rows][D].
// The projections run over all rows at once, so requests that decode
// together read each weight once; the part that reads caches goes request
// by request, tile by tile. Every row's result is the same whoever shares
// the call.
void attention_forward(const AttentionWeights& w, const ModelConfig& c, LayerKind kind, const RopeTable& rope,
                       const float* x, int64_t rows, const std::vector<AttentionSpan>& spans,
                       AttentionActivations& act, float* out);

}  // namespace dsv4
