#include "kernels/norm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/formats.h"
#include "core/thread_pool.h"
#include "kernels/dot.h"

namespace dsv4 {

void rms_norm_bf16(const float* v, const float* w, int64_t n, float eps, float* y) {
  float ms = sumsq_f32(v, n) / float(n);
  float r = 1.0f / std::sqrt(ms + eps);
  for (int64_t i = 0; i < n; ++i) {
    float t = v[i] * r;
    y[i] = bf16r(w ? w[i] * t : t);
  }
}

void rms_norm_rows_bf16(const float* v, int64_t rows, const float* w, int64_t n, float eps, float* y) {
  parallel_for_each(rows, [&](int64_t i) { rms_norm_bf16(v + i * n, w, n, eps, y + i * n); });
}

void q_head_norm_bf16(float* q, int64_t n, float eps) {
  // Lane j of acc sums bf16(q²) of the elements j, j + 16, j + 32, … in
  // order. The squares and the products are rounded by the vectorised
  // bf16r_inplace, a chunk at a time (a per-element bf16r would keep these
  // loops scalar).
  constexpr int64_t kChunk = 256;  // a multiple of 16: lane j stays lane j
  float acc[16] = {0}, sq[kChunk];
  for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
    const int64_t len = std::min(kChunk, n - c0);
    for (int64_t k = 0; k < len; ++k) sq[k] = q[c0 + k] * q[c0 + k];
    bf16r_inplace(sq, size_t(len));
    int64_t i = 0;
    for (; i + 16 <= len; i += 16)
      for (int j = 0; j < 16; ++j) acc[j] += sq[i + j];
    for (int j = 0; i + j < len; ++j) acc[j] += sq[i + j];
  }
  float m = bf16r(combine16(acc) / float(n));
  float r = bf16r(1.0f / std::sqrt(bf16r(m + bf16r(eps))));
  for (int64_t k = 0; k < n; ++k) q[k] *= r;
  bf16r_inplace(q, size_t(n));
}

}  // namespace dsv4
