// Token sampling (sampler.h).
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
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

// How many of `order` (ids by descending p) the top-k, top-p and min-p
// filters keep; p is normalised over the whole vocabulary.
size_t kept_prefix(const std::vector<double>& p, const std::vector<int32_t>& order, const SamplingParams& s) {
  size_t n = order.size();
  if (s.top_k > 0) n = std::min(n, size_t(s.top_k));
  double kept_mass = 0;
  for (size_t i = 0; i < n; ++i) kept_mass += p[size_t(order[i])];
  if (s.top_p < 1) {  // mass measured within what top-k kept
    double cum = 0;
    for (size_t i = 0; i < n; ++i) {
      cum += p[size_t(order[i])];
      if (cum >= double(s.top_p) * kept_mass) {
        n = i + 1;
        break;
      }
    }
  }
  const double floor = double(s.min_p) * p[size_t(order[0])];
  while (n > 1 && p[size_t(order[n - 1])] < floor) --n;
  return n;
}

// Ids by descending p, ties to the lower id: the order sample() draws in.
// p is the logit through monotone roundings, so the ids are first sorted by
// logit, descending (a stable radix sort of one 64-bit key each; equal
// logits keep ascending ids), then every run of equal p (different logits
// can round to one p: at a low temperature thousands of them to 0) by id.
// A last insertion pass with the defining comparison moves whatever a
// rounding of exp that is not monotone could have misplaced: usually
// nothing, one comparison per id. The defining comparison is a strict
// total order, so this is the permutation one std::sort by it gives, which
// reads p at random: 15 ms of a 129,280-id sample on the session 19 Zen 4,
// 4 ms with this (sampled once per stream and step by the server).
std::vector<int32_t> by_probability(const std::vector<float>& logits, const std::vector<double>& p) {
  const size_t n = logits.size();
  std::vector<uint64_t> key(n);
  for (size_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, &logits[i], 4);
    const uint32_t up = b & 0x80000000u ? ~b : b | 0x80000000u;  // ascends with the float
    key[i] = uint64_t(~up) << 32 | uint32_t(i);
  }
  // Stable radix sort on the logit half (the id half starts ascending).
  std::vector<uint64_t> tmp(n);
  for (int shift = 32; shift < 64; shift += 8) {
    size_t count[257] = {};
    for (uint64_t k : key) ++count[((k >> shift) & 0xff) + 1];
    for (int d = 0; d < 256; ++d) count[d + 1] += count[d];
    for (uint64_t k : key) tmp[count[(k >> shift) & 0xff]++] = k;
    key.swap(tmp);
  }
  std::vector<int32_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = int32_t(uint32_t(key[i]));
  for (size_t i = 0; i < n;) {
    size_t j = i + 1;
    while (j < n && p[size_t(order[j])] == p[size_t(order[i])]) ++j;
    if (j - i > 1) std::sort(order.begin() + std::ptrdiff_t(i), order.begin() + std::ptrdiff_t(j));
    i = j;
  }
  const auto before = [&](int32_t a, int32_t b) {
    return p[size_t(a)] != p[size_t(b)] ? p[size_t(a)] > p[size_t(b)] : a < b;
  };
  for (size_t i = 1; i < n; ++i) {
    const int32_t v = order[i];
    size_t j = i;
    for (; j > 0 && before(v, order[j - 1]); --j) order[j] = order[j - 1];
    order[j] = v;
  }
  return order;
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
  if (s.temperature == 0) return greedy(logits);
  const double t = s.temperature;
  const double top = double(logits[size_t(greedy(logits))]);
  std::vector<double> p(logits.size());
  double sum = 0;
  for (size_t i = 0; i < p.size(); ++i) sum += p[i] = std::exp((double(logits[i]) - top) / t);
  for (double& x : p) x /= sum;
  const std::vector<int32_t> order = by_probability(logits, p);
  const size_t n = kept_prefix(p, order, s);
  double mass = 0;
  for (size_t i = 0; i < n; ++i) mass += p[size_t(order[i])];
  const double u = counter_uniform(s.seed, position) * mass;
  double cum = 0;
  for (size_t i = 0; i < n; ++i) {
    cum += p[size_t(order[i])];
    if (u < cum) return order[i];
  }
  return order[n - 1];
}

}  // namespace dsv4
