// Choosing the next token from a row of logits: greedy (temperature 0) or a
// draw from the softmax at a temperature, narrowed by top-k, top-p and
// min-p. The draw is counter-based: the uniform for a request's token at
// position p is a hash of (seed, p) alone, so a request gets the same tokens
// whatever else shares its batch and however the work is split.
#pragma once
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace dsv4 {

struct SamplingParams {
  float temperature = 0;  // 0: greedy (argmax, ties to the lower id)
  int top_k = 0;          // keep the k most likely tokens; 0: all
  float top_p = 1;        // keep the smallest most-likely prefix with this mass
  float min_p = 0;        // drop tokens with p < min_p * p_max
  uint64_t seed = 0;

  // Adjustments of the logits before any choice, greedy included, as
  // OpenAI's API defines them: id i's logit becomes
  //   logit + bias_i - (count_i * frequency_penalty + (count_i > 0 ? presence_penalty : 0)),
  // in fp32 in that order, where count_i is how often i occurs among the
  // tokens generated so far (not the prompt's) and bias_i is its logit_bias
  // entry (0 without one). They depend only on the request's own tokens, so
  // a request still gets the same tokens whatever shares its batch.
  float presence_penalty = 0;                         // [-2, 2]
  float frequency_penalty = 0;                        // [-2, 2]
  std::vector<std::pair<int32_t, float>> logit_bias;  // (id, bias in [-100, 100]), distinct ids

  bool adjusts_logits() const { return presence_penalty != 0 || frequency_penalty != 0 || !logit_bias.empty(); }

  // Throws dsv4::Error naming the option out of range (--temp, --top-k,
  // --top-p, --min-p, --presence-penalty, --frequency-penalty,
  // --logit-bias) or a logit_bias id outside [0, vocab) or given twice.
  void check(int64_t vocab) const;
};

// Greedy choice: the largest logit, the lower id on ties (the engine's
// next_token).
int32_t argmax(const float* v, int64_t n);

// A uniform double in [0, 1) that depends only on (seed, position).
double counter_uniform(uint64_t seed, int64_t position);

// The token for `position` (the position it will occupy), after the
// tokens `generated` so far (what the penalties count). The logits are
// adjusted first (above; not at all without adjustments). Temperature 0 is
// then the engine's greedy choice bit for bit. Otherwise each id weighs
// exp((logit - max logit) / temperature), in double; ranked by weight
// (ties to the lower id), the first top_k are kept, then the shortest
// prefix of those whose weight reaches top_p of theirs, then those weighing
// at least min_p of the largest; the draw with counter_uniform(seed,
// position) walks the kept ids in ascending order.
int32_t sample(const std::vector<float>& logits, const SamplingParams& params, int64_t position,
               std::span<const int32_t> generated);

}  // namespace dsv4
