// The lightning indexer of CSA layers (MODEL.md §8): its queries qi and head
// weights from the layer's q latent and input, its own compressor's rows
// (index_head_dim wide, Hadamard + FP4), and each query's top-k choice of
// the main compressor's rows. The per-row score itself is the vectorised
// kernel of kernels/indexer_score.h.
#pragma once
#include <cstdint>
#include <vector>

#include "io/config.h"
#include "kernels/rope.h"
#include "model/compressor.h"
#include "model/weights.h"

namespace dsv4 {

// The indexer's share of a request's caches: its compressor's ring and rows.
struct IndexerState {
  CompressorState comp;

  void init(CachePool* pool, const IndexerWeights& w) { comp.init(pool, w.compressor); }
  size_t pages_missing(const IndexerWeights& w, int64_t n_tokens) const {
    return comp.pages_missing(w.compressor, n_tokens);
  }
  void reserve(const IndexerWeights& w, int64_t n_tokens) { comp.reserve(w.compressor, n_tokens); }
  size_t bytes_held() const { return comp.bytes_held(); }
  void copy_from(const IndexerState& src) { comp.copy_from(src.comp); }
};

// The indexer rows visible to a tile [n][di], also packed once as gemm
// pair panels (kernels/gemm.h PairSource) that every query's score product
// reads, so that the queries do not each pack the same rows again.
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

// One indexer_select's buffers: the query's per-head dots and row scores.
struct IndexerQueryBuffers {
  std::vector<float> dots, score;
};

// indexer_choose's buffers (model/activations.h).
struct IndexerActivations {
  std::vector<float> rows;                      // the tile's visible indexer rows, fp32
  IndexerRows packed;                           // the same rows packed
  std::vector<IndexerQueryBuffers> per_worker;  // by parallel_for worker id
};

// §8.1–8.2 for rows [0, n): qi [n][Hi][di] from the q latent qr [n][q_lora_rank]
// (rotated with the rows' tables cs [n][rd], Hadamard, FP4) and the head
// weights wts [n][Hi] from the sublayer input x [n][D].
void indexer_queries(const IndexerWeights& w, const ModelConfig& c, const RopeTable& rope, const float* x,
                     const float* qr, const float* cs, int64_t n, float* qi, float* wts);

// Lightning indexer selection for one query (MODEL.md §8.3–8.4): scores the
// first n_visible (<= rows.n) indexer rows with the query's prepared heads
// qi [Hi][di] and weights wts [Hi], and returns the chosen row indices in
// ascending order.
void indexer_select(const float* qi, const float* wts, const IndexerRows& rows, int64_t n_visible, int Hi, int topk,
                    IndexerQueryBuffers& buf, std::vector<int32_t>* chosen);

// The choice of every query of a tile at positions [p0, p0 + n), from the
// indexer rows in `st` (those of the tile included) and the queries' qi and
// wts (first rows of the tile): chosen[i] for position p0 + i.
void indexer_choose(const ModelConfig& c, LayerKind kind, const IndexerState& st, const float* qi, const float* wts,
                    int64_t p0, int64_t n, IndexerActivations& act, std::vector<std::vector<int32_t>>* chosen);

}  // namespace dsv4
