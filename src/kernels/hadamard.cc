#include "kernels/hadamard.h"

#include <cmath>

#include "core/formats.h"

namespace dsv4 {

void hadamard_bf16(float* x, int64_t n) {
  for (int64_t h = 1; h < n; h *= 2)
    for (int64_t i = 0; i < n; i += 2 * h)
      for (int64_t j = i; j < i + h; ++j) {
        float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
  const float scale = 1.0f / std::sqrt(float(n));
  for (int64_t i = 0; i < n; ++i) x[i] = bf16r(x[i] * scale);
}

}  // namespace dsv4
