#include "kernels/topk.h"

#include <algorithm>
#include <cmath>

namespace dsv4 {

void topk_indices(const float* score, int64_t n, int64_t k, std::vector<int32_t>* out) {
  k = std::min(k, n);
  out->resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) (*out)[i] = int32_t(i);
  auto better = [score](int32_t a, int32_t b) {
    float sa = score[a], sb = score[b];
    bool na = std::isnan(sa), nb = std::isnan(sb);
    if (na != nb) return nb;  // a number beats NaN
    if (!na && sa != sb) return sa > sb;
    return a < b;
  };
  std::partial_sort(out->begin(), out->begin() + k, out->end(), better);
  out->resize(static_cast<size_t>(k));
}

}  // namespace dsv4
