#include "kernels/topk.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace dsv4 {

namespace {

// (score desc, index asc), NaN below every number: a strict total order.
struct Better {
  const float* score;
  bool operator()(int32_t a, int32_t b) const {
    const float sa = score[a], sb = score[b];
    const bool na = std::isnan(sa), nb = std::isnan(sb);
    if (na != nb) return nb;  // a number beats NaN
    if (!na && sa != sb) return sa > sb;
    return a < b;
  }
};

}  // namespace

void topk_indices(const float* score, int64_t n, int64_t k, std::vector<int32_t>* out) {
  k = std::min(k, n);
  out->resize(static_cast<size_t>(n));
  std::iota(out->begin(), out->end(), 0);
  std::partial_sort(out->begin(), out->begin() + k, out->end(), Better{score});
  out->resize(static_cast<size_t>(k));
}

void topk_set(const float* score, int64_t n, int64_t k, std::vector<int32_t>* out) {
  k = std::min(k, n);
  out->resize(static_cast<size_t>(n));
  std::iota(out->begin(), out->end(), 0);
  if (k < n) std::nth_element(out->begin(), out->begin() + k, out->end(), Better{score});
  out->resize(static_cast<size_t>(k));
  std::sort(out->begin(), out->end());
}

}  // namespace dsv4
