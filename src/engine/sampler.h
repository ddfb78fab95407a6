// Choosing the next token from a row of logits: greedy (temperature 0) or a
// draw from the softmax at a temperature, narrowed by top-k, top-p and
// min-p. The draw is counter-based: the uniform for a request's token at
// position p is a hash of (seed, p) alone, so a request gets the same tokens
// whatever else shares its batch and however the work is split.
#pragma once
#include <cstdint>
#include <vector>

namespace dsv4 {

struct SamplingParams {
  float temperature = 0;  // 0: greedy (argmax, ties to the lower id)
  int top_k = 0;          // keep the k most likely tokens; 0: all
  float top_p = 1;        // keep the smallest most-likely prefix with this mass
  float min_p = 0;        // drop tokens with p < min_p * p_max
  uint64_t seed = 0;

  // Throws dsv4::Error naming the option out of range (--temp, --top-k,
  // --top-p, --min-p).
  void check() const;
};

// Greedy choice: the largest logit, the lower id on ties (the engine's
// next_token).
int32_t argmax(const float* v, int64_t n);

// A uniform double in [0, 1) that depends only on (seed, position).
double counter_uniform(uint64_t seed, int64_t position);

// The token for `position` (the position it will occupy). Temperature 0 is
// the engine's greedy choice bit for bit. Otherwise each id weighs
// exp((logit - max logit) / temperature), in double; ranked by weight
// (ties to the lower id), the first top_k are kept, then the shortest
// prefix of those whose weight reaches top_p of theirs, then those weighing
// at least min_p of the largest; the draw with counter_uniform(seed,
// position) walks the kept ids in ascending order.
int32_t sample(const std::vector<float>& logits, const SamplingParams& params, int64_t position);

}  // namespace dsv4
