// The KV compressor (MODEL.md §7): pools every r source tokens into one
// compressed row with a per-channel softmax over slots. Its state carries the
// source rows of blocks that are not yet complete (and, for r = 4, the
// previous block) from one tile to the next (PREFILL.md §2).
#pragma once
#include <cstdint>
#include <vector>

#include "io/config.h"
#include "kernels/rope.h"
#include "model/weights.h"

namespace dsv4 {

struct CompressorState {
  // Source rows of the last coff·r tokens, slot t mod (coff·r): a_t and
  // g_t + ape[t mod r], each coff·hd wide.
  std::vector<float> a, g;
  // Emitted compressed rows [rows][hd]: the compressed KV (or indexer KV).
  std::vector<float> rows;
  int64_t n_rows = 0;

  void reset(const CompressorWeights& w);
};

// Feeds the tile's normalised sublayer inputs x [n][D] at positions
// [p0, p0 + n) and appends every compressed row completed inside the tile.
void compressor_forward(const CompressorWeights& w, const ModelConfig& c, const RopeTable& rope, const float* x,
                        int64_t p0, int64_t n, CompressorState& st);

// Emits row `c_idx` from the state's ring (all its source tokens present).
void compressor_emit_row(const CompressorWeights& w, const ModelConfig& c, const RopeTable& rope,
                         const CompressorState& st, int64_t c_idx, float* out);

}  // namespace dsv4
