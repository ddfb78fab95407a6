// Token sampling (sampler.h).
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"

namespace dsv4 {

namespace {

// splitmix64's finaliser: a bijection of 64-bit words that mixes every bit.
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

int32_t greedy(const std::vector<float>& v) { return argmax(v.data(), int64_t(v.size())); }

// An id and its weight, ordered the way the filters take ids: by weight,
// descending, ties to the lower id (a strict total order, so every
// selection by it is one permutation).
struct Weighted {
  double w;
  int32_t id;
  bool operator<(const Weighted& o) const { return w != o.w ? w > o.w : id < o.id; }
};

// The ids top-k and top-p keep, ascending; `w` the weights of all ids.
// Only the part of the order the filters reach is sorted: top-k selects
// its k in linear time, and top-p sorts segments of growing length until
// its prefix reaches the mass. A full sort of a 129,280-id row took ~3 ms,
// 16 of them a 16-stream server step (Zen 4, session 24).
std::vector<int32_t> kept_by_rank(const std::vector<double>& w, const SamplingParams& s) {
  std::vector<Weighted> order(w.size());
  for (size_t i = 0; i < w.size(); ++i) order[i] = {w[i], int32_t(i)};
  size_t n = order.size();
  if (s.top_k > 0 && size_t(s.top_k) < n) {
    n = size_t(s.top_k);
    std::nth_element(order.begin(), order.begin() + std::ptrdiff_t(n), order.end());
    order.resize(n);
  }
  if (s.top_p < 1) {
    std::vector<Weighted> by_id = order;
    std::sort(by_id.begin(), by_id.end(), [](const Weighted& a, const Weighted& b) { return a.id < b.id; });
    double kept_mass = 0, cum = 0;
    for (const Weighted& x : by_id) kept_mass += x.w;
    const double target = double(s.top_p) * kept_mass;
    size_t sorted = 0, want = 256;
    for (size_t i = 0; i < n; ++i) {
      if (i == sorted) {  // the next segment of the order, sorted
        const auto b = order.begin() + std::ptrdiff_t(sorted);
        const auto e = order.begin() + std::ptrdiff_t(std::min(n, sorted + want));
        std::nth_element(b, e - 1, order.end());  // e - 1 then holds its rank; all before it rank higher
        std::sort(b, e);
        sorted = size_t(e - order.begin());
        want *= 4;
      }
      if ((cum += order[i].w) >= target) {
        n = i + 1;
        break;
      }
    }
  }
  std::vector<int32_t> ids(n);
  for (size_t i = 0; i < n; ++i) ids[i] = order[i].id;
  std::sort(ids.begin(), ids.end());
  return ids;
}

}  // namespace

int32_t argmax(const float* v, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (v[i] > v[best]) best = i;
  return int32_t(best);
}

void SamplingParams::check() const {
  if (!std::isfinite(temperature) || temperature < 0)
    throw Error("--temp must be a finite number >= 0, got " + std::to_string(temperature));
  if (top_k < 0) throw Error("--top-k must be >= 0, got " + std::to_string(top_k));
  if (!(top_p > 0 && top_p <= 1)) throw Error("--top-p must be in (0, 1], got " + std::to_string(top_p));
  if (!(min_p >= 0 && min_p <= 1)) throw Error("--min-p must be in [0, 1], got " + std::to_string(min_p));
}

double counter_uniform(uint64_t seed, int64_t position) {
  const uint64_t h = mix64(mix64(seed ^ 0x243F6A8885A308D3ull) + uint64_t(position) * 0x9E3779B97F4A7C15ull);
  return double(h >> 11) * 0x1.0p-53;
}

int32_t sample(const std::vector<float>& logits, const SamplingParams& s, int64_t position) {
  if (logits.empty()) throw Error("sample: empty logits");
  const int32_t best = greedy(logits);
  if (s.temperature == 0 || !std::isfinite(logits[size_t(best)])) return best;
  // Weights relative to the largest logit's, which is exactly 1: the filters
  // and the draw are ratios, so they need no normalisation.
  const double t = s.temperature, top = double(logits[size_t(best)]);
  std::vector<double> w(logits.size());
  for (size_t i = 0; i < w.size(); ++i) w[i] = std::exp((double(logits[i]) - top) / t);
  const bool ranked = (s.top_k > 0 && size_t(s.top_k) < w.size()) || s.top_p < 1;
  std::vector<int32_t> ids;
  if (ranked) ids = kept_by_rank(w, s);
  const size_t n = ranked ? ids.size() : w.size();
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
