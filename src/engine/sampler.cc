// Token sampling (sampler.h).
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "core/error.h"
#include "core/scratch.h"

namespace dsv4 {

namespace {

// splitmix64's finaliser: a bijection of 64-bit words that mixes every bit.
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// An id and its weight, ordered the way the filters take ids: by weight,
// descending, ties to the lower id (a strict total order, so every
// selection by it is one permutation).
struct Weighted {
  double w;
  int32_t id;
  bool operator<(const Weighted& o) const { return w != o.w ? w > o.w : id < o.id; }
};

// The filters keep their megabytes in the thread's workspaces (core/
// scratch.h): fresh vectors each draw were faulted in page by page (~10%
// of a draw's samples in the kernel on the session 24 VM).

// The k-th of w[0..V) in rank order (k <= V): a heap of the k best so far,
// whose top is the worst of them; most ids fail one comparison with it.
Weighted kth_by_rank(const double* w, size_t V, size_t k) {
  Weighted* const heap = workspace<Weighted>(Buf::kSamplerRanks, k);
  for (size_t i = 0; i < k; ++i) heap[i] = {w[i], int32_t(i)};
  std::make_heap(heap, heap + k);
  for (size_t i = k; i < V; ++i) {
    const Weighted x{w[i], int32_t(i)};
    if (x < heap[0]) {
      std::pop_heap(heap, heap + k);
      heap[k - 1] = x;
      std::push_heap(heap, heap + k);
    }
  }
  return heap[0];
}

// Sorts v[0..n) (ascending ids) into rank order: a stable LSD radix sort on
// the weights' bits (a weight >= 0 ascends with them), descending, so equal
// weights keep ascending ids. A pass where every weight has the same digit
// moves nothing and is skipped (a row's weights share their top bits).
void sort_by_rank(Weighted* v, size_t n) {
  Weighted* spare = workspace<Weighted>(Buf::kSamplerSortSpare, n);
  Weighted* const out = v;
  const auto digit = [](const Weighted& x, int shift) {
    uint64_t b;
    std::memcpy(&b, &x.w, sizeof b);
    return size_t((~b >> shift) & 0xff);
  };
  for (int shift = 0; shift < 64; shift += 8) {
    size_t count[257] = {};
    for (size_t i = 0; i < n; ++i) ++count[digit(v[i], shift) + 1];
    if (*std::max_element(count + 1, count + 257) == n) continue;
    for (int d = 0; d < 256; ++d) count[d + 1] += count[d];
    for (size_t i = 0; i < n; ++i) spare[count[digit(v[i], shift)]++] = v[i];
    std::swap(v, spare);
  }
  if (v != out) std::copy(v, v + n, out);
}

// Keeps those of ids[0..n) (ascending) that rank at or before `last`
// (the final id a filter keeps); returns how many.
size_t keep_up_to(const double* w, int32_t* ids, size_t n, const Weighted& last) {
  size_t kept = 0;
  for (size_t i = 0; i < n; ++i) {
    const Weighted x{w[ids[i]], ids[i]};
    if (!(last < x)) ids[kept++] = ids[i];
  }
  return kept;
}

// top-p over ids[0..n) (ascending): the shortest prefix of their rank
// order whose weights, summed in that order, reach top_p of their mass
// (summed by id). Only ids that can be in it are sorted: the ids after the
// prefix weigh more than mass - target together, each at most as much as
// its last, so that weighs more than (mass - target) / n; half of it leaves
// room for rounding. A peaked row sorts a handful, a flat one all.
size_t keep_top_p(const double* w, int32_t* ids, size_t n, float top_p) {
  double mass = 0;
  for (size_t i = 0; i < n; ++i) mass += w[ids[i]];
  const double target = double(top_p) * mass, floor = 0.5 * (mass - target) / double(n);
  Weighted* const order = workspace<Weighted>(Buf::kSamplerRanks, n);
  size_t m = 0;
  for (size_t i = 0; i < n; ++i)
    if (w[ids[i]] >= floor) order[m++] = {w[ids[i]], ids[i]};
  sort_by_rank(order, m);
  double cum = 0;
  for (size_t i = 0; i < m; ++i)
    if ((cum += order[i].w) >= target) return keep_up_to(w, ids, n, order[i]);
  return n;  // rounding kept the sum under the target: all of them
}

// The ids top-k and top-p keep, ascending, in ids (room for V); returns
// how many. Neither sorts more than it must: ordering all 129,280 ids
// took ~3 ms a draw, 16 draws a 16-stream server step (Zen 4, session 24).
size_t kept_by_rank(const double* w, size_t V, const SamplingParams& s, int32_t* ids) {
  size_t n = V;
  for (size_t i = 0; i < V; ++i) ids[i] = int32_t(i);
  if (s.top_k > 0 && size_t(s.top_k) < V) n = keep_up_to(w, ids, n, kth_by_rank(w, V, size_t(s.top_k)));
  if (s.top_p < 1) n = keep_top_p(w, ids, n, s.top_p);
  return n;
}

// Throws where a logit_bias id cannot index a row of `vocab` logits;
// `who` begins the message.
void check_bias_id(int32_t id, int64_t vocab, const char* who) {
  if (id < 0 || id >= vocab)
    throw Error(std::string(who) + " token " + std::to_string(id) + " is outside the vocabulary [0, " +
                std::to_string(vocab) + ")");
}

// `logits` with the adjustments of `s` (sampler.h), in the thread's
// workspace. Only the ids with a bias or a count change; each subtracts its
// penalties in one expression, so the order the counts are found in does
// not matter.
const float* adjusted_logits(const std::vector<float>& logits, const SamplingParams& s,
                             std::span<const int32_t> generated) {
  const int64_t V = int64_t(logits.size());
  float* const l = workspace<float>(Buf::kSamplerLogits, size_t(V));
  std::copy(logits.begin(), logits.end(), l);
  // The ranges were checked with the request (SamplingParams::check); the
  // ids again here, against this row, since they index it.
  for (const auto& [id, bias] : s.logit_bias) {
    check_bias_id(id, V, "sample: logit_bias");
    l[id] += bias;
  }
  if (s.presence_penalty == 0 && s.frequency_penalty == 0) return l;
  std::vector<int32_t> ids(generated.begin(), generated.end());
  std::sort(ids.begin(), ids.end());
  for (size_t i = 0, j = 0; i < ids.size(); i = j) {
    while (j < ids.size() && ids[j] == ids[i]) ++j;
    if (ids[i] < 0 || ids[i] >= V)
      throw Error("sample: generated token " + std::to_string(ids[i]) + " is outside the vocabulary [0, " +
                  std::to_string(V) + ")");
    l[ids[i]] -= float(j - i) * s.frequency_penalty + s.presence_penalty;
  }
  return l;
}

}  // namespace

int32_t argmax(const float* v, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (v[i] > v[best]) best = i;
  return int32_t(best);
}

void SamplingParams::check(int64_t vocab) const {
  if (!std::isfinite(temperature) || temperature < 0)
    throw Error("--temp must be a finite number >= 0, got " + std::to_string(temperature));
  if (top_k < 0) throw Error("--top-k must be >= 0, got " + std::to_string(top_k));
  if (!(top_p > 0 && top_p <= 1)) throw Error("--top-p must be in (0, 1], got " + std::to_string(top_p));
  if (!(min_p >= 0 && min_p <= 1)) throw Error("--min-p must be in [0, 1], got " + std::to_string(min_p));
  if (!(presence_penalty >= -2 && presence_penalty <= 2))
    throw Error("--presence-penalty must be in [-2, 2], got " + std::to_string(presence_penalty));
  if (!(frequency_penalty >= -2 && frequency_penalty <= 2))
    throw Error("--frequency-penalty must be in [-2, 2], got " + std::to_string(frequency_penalty));
  std::vector<int32_t> ids;
  for (const auto& [id, bias] : logit_bias) {
    check_bias_id(id, vocab, "--logit-bias:");
    if (!(bias >= -100 && bias <= 100))
      throw Error("--logit-bias: the bias of token " + std::to_string(id) + " must be in [-100, 100], got " +
                  std::to_string(bias));
    ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  if (const auto twice = std::adjacent_find(ids.begin(), ids.end()); twice != ids.end())
    throw Error("--logit-bias: token " + std::to_string(*twice) + " is given twice");
}

double counter_uniform(uint64_t seed, int64_t position) {
  const uint64_t h = mix64(mix64(seed ^ 0x243F6A8885A308D3ull) + uint64_t(position) * 0x9E3779B97F4A7C15ull);
  return double(h >> 11) * 0x1.0p-53;
}

int32_t sample(const std::vector<float>& logits_in, const SamplingParams& s, int64_t position,
               std::span<const int32_t> generated) {
  if (logits_in.empty()) throw Error("sample: empty logits");
  const size_t V = logits_in.size();
  const float* const logits = s.adjusts_logits() ? adjusted_logits(logits_in, s, generated) : logits_in.data();
  const int32_t best = argmax(logits, int64_t(V));
  if (s.temperature == 0 || !std::isfinite(logits[best])) return best;
  // Weights relative to the largest logit's, which is exactly 1: the filters
  // and the draw are ratios, so they need no normalisation.
  const double t = s.temperature, top = double(logits[best]);
  double* const w = workspace<double>(Buf::kSamplerWeights, V);
  for (size_t i = 0; i < V; ++i) w[i] = std::exp((double(logits[i]) - top) / t);
  const bool ranked = (s.top_k > 0 && size_t(s.top_k) < V) || s.top_p < 1;
  int32_t* const ids = ranked ? workspace<int32_t>(Buf::kSamplerKept, V) : nullptr;
  const size_t n = ranked ? kept_by_rank(w, V, s, ids) : V;
  auto id_at = [&](size_t i) { return ranked ? ids[i] : int32_t(i); };
  // min-p last, against the largest weight (1). The draw walks the kept ids
  // in ascending order; a zero weight is never drawn.
  const double floor = double(s.min_p);
  double mass = 0;
  for (size_t i = 0; i < n; ++i)
    if (const double x = w[size_t(id_at(i))]; x >= floor) mass += x;
  const double u = counter_uniform(s.seed, position) * mass;
  double cum = 0;
  int32_t last = best;
  for (size_t i = 0; i < n; ++i) {
    const int32_t id = id_at(i);
    const double x = w[size_t(id)];
    if (x < floor || x == 0) continue;
    last = id;
    if (u < (cum += x)) return id;
  }
  return last;  // u rounded up to the mass
}

}  // namespace dsv4
