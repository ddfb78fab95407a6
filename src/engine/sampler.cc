// Token sampling (sampler.h).
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
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
  std::vector<int32_t> order(p.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return p[size_t(a)] != p[size_t(b)] ? p[size_t(a)] > p[size_t(b)] : a < b;
  });
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
