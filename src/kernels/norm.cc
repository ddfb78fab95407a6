#include "kernels/norm.h"

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
  float acc[16] = {0};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) acc[j] += bf16r(q[i + j] * q[i + j]);
  for (int j = 0; i + j < n; ++j) acc[j] += bf16r(q[i + j] * q[i + j]);
  float m = bf16r(combine16(acc) / float(n));
  float r = bf16r(1.0f / std::sqrt(bf16r(m + bf16r(eps))));
  for (int64_t k = 0; k < n; ++k) q[k] = bf16r(q[k] * r);
}

}  // namespace dsv4
