// The KV compressor (MODEL.md §7): pools every r source tokens into one
// compressed row with a per-channel softmax over slots. Its state carries the
// source rows of blocks that are not yet complete (and, with CSA's
// overlapping windows, the previous block) from one tile to the next (PREFILL.md §2).
#pragma once
#include <cstdint>
#include <vector>

#include "core/cache_pool.h"
#include "io/config.h"
#include "kernels/rope.h"
#include "model/weights.h"

namespace dsv4 {

struct CompressorState {
  // Source rows of the last coff·r tokens, slot t mod (coff·r), fp32:
  // [a_t (coff·hd) | g_t + ape[t mod r] (coff·hd)].
  PagedRows ring;
  // Emitted compressed rows (the compressed KV or the indexer KV), bf16 [hd]:
  // every value is exactly representable (bf16 rows, FP8/FP4-simulated).
  PagedRows rows;
  int64_t n_rows = 0;

  // Empty state taking its pages from `pool`.
  void init(CachePool* pool, const CompressorWeights& w);
  // Pages missing to process the first n_tokens positions; reserve() takes them.
  size_t pages_missing(const CompressorWeights& w, int64_t n_tokens) const;
  void reserve(const CompressorWeights& w, int64_t n_tokens);
  size_t bytes_held() const { return ring.bytes_held() + rows.bytes_held(); }
  // This freshly initialised state becomes a copy of `src` (its own pages).
  void copy_from(const CompressorState& src) {
    ring.copy_from(src.ring);
    rows.copy_from(src.rows);
    n_rows = src.n_rows;
  }
  // Rows [0, n) widened to fp32 [n][hd].
  void read_rows(int64_t n, int hd, float* dst) const;
};

// The wkv and wgate products [n][coff·hd] of a call's rows
// (compressor_project; model/activations.h).
struct CompressorActivations {
  std::vector<float> a, g;
};

// The products of normalised sublayer inputs x [n][D]. They read only x, so
// a call computes them for all its rows at once (every request decoding
// together: each weight read once), whatever tiles the rows are fed in.
void compressor_project(const CompressorWeights& w, const float* x, int64_t n, CompressorActivations& act);

// Feeds rows [i0, i0 + n) of `act` (compressor_project), at positions
// [p0, p0 + n), and appends every compressed row completed among them.
void compressor_update(const CompressorWeights& w, const ModelConfig& c, const RopeTable& rope,
                       const CompressorActivations& act, int64_t i0, int64_t p0, int64_t n, CompressorState& st);

// Emits row `c_idx` from the state's ring (all its source tokens present).
void compressor_emit_row(const CompressorWeights& w, const ModelConfig& c, const RopeTable& rope,
                         const CompressorState& st, int64_t c_idx, float* out);

}  // namespace dsv4
