// What one call that appends tokens to a request takes and gives back. Kept
// apart from prefill.h so that the engine's public header (engine.h) can use
// it without seeing the model's internals.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "io/config.h"

namespace dsv4 {

// Called during a long append after each layer of each chunk with the
// positions done so far (a chunk's positions count in proportion to its
// layers done) and the positions of the whole call; on the calling thread.
using ProgressFn = std::function<void(int64_t done, int64_t total)>;

struct PrefillOptions {
  int64_t tile_tokens = 128;      // 0 = the whole prompt in one tile
  // Positions per MoE step and request, rounded up to whole tiles; 0 = the
  // whole prompt. Large chunks let each expert see many rows per weight pass.
  int64_t chunk_tokens = 2048;
  int64_t max_positions = 0;      // longest request in positions; 0 = max_position_embeddings
  bool keep_hidden = false;       // all rows of the final normalised hidden
  bool keep_residuals = false;    // every layer's output residual stream
  // Teacher forcing: [layers][N][hc][D]; layer L > 0 takes IN[L−1] as input.
  const float* teacher = nullptr;
  ProgressFn progress;
  // Called after each chunk round that does not end its request's append:
  // request index, its position before and after the round (the state is
  // then exactly at `to`). The engine takes its periodic snapshots here.
  std::function<void(size_t request, int64_t from, int64_t to)> round_done;
};

// What one append returns besides the last row's logits (dumps and the
// per-layer fidelity checks).
struct AppendOptions {
  bool keep_hidden = false;       // all rows of the final normalised hidden
  bool keep_residuals = false;    // every layer's output residual stream
  // Teacher forcing: [layers][N][hc][D]; layer L > 0 takes IN[L−1] as input.
  const float* teacher = nullptr;
  ProgressFn progress;
};

struct PrefillResult {
  std::vector<float> logits;     // [vocab], last row
  int32_t next_token = -1;       // argmax, ties to the lower id
  std::vector<float> hidden;     // [N][D] when keep_hidden, else the last row
  std::vector<float> residuals;  // [layers][N][hc][D] when keep_residuals
  size_t cache_bytes = 0;        // pages the request holds at the end
  std::string error;             // batch calls: why this request failed (empty: it did not)
};

// The longest request accepted: max_positions (0 = no own limit) capped by
// max_position_embeddings.
int64_t prompt_limit(const ModelConfig& c, int64_t max_positions);

// Checks tokens to be appended at position `start` (non-empty, ids <
// vocab_size, start + N <= limit) and throws dsv4::Error naming what is wrong.
void validate_prompt(const ModelConfig& c, const std::vector<int32_t>& tokens, int64_t limit, int64_t start = 0);

}  // namespace dsv4
