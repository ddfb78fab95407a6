// The fp32 dot product every reduction in the engine uses. The order of the
// sum depends only on the length: element i goes to lane i % 16, lanes are
// combined pairwise in a fixed tree. Vectorises without -ffast-math.
#pragma once
#include <cstdint>

namespace dsv4 {

inline float combine16(const float* acc) {
  float t8[8], t4[4];
  for (int j = 0; j < 8; ++j) t8[j] = acc[j] + acc[j + 8];
  for (int j = 0; j < 4; ++j) t4[j] = t8[j] + t8[j + 4];
  return (t4[0] + t4[2]) + (t4[1] + t4[3]);
}

inline float dot_f32(const float* a, const float* b, int64_t n) {
  float acc[16] = {0};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) acc[j] += a[i + j] * b[i + j];
  for (int j = 0; i + j < n; ++j) acc[j] += a[i + j] * b[i + j];
  return combine16(acc);
}

// out[t] = dot_f32(a, b[t], n) for four vectors b at once: the same sums,
// four independent chains (one dot_f32 waits on its adds' latency).
inline void dot4_f32(const float* a, const float* const* b, int64_t n, float* out) {
  float acc[4][16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
#pragma GCC unroll 4
    for (int t = 0; t < 4; ++t)
      for (int j = 0; j < 16; ++j) acc[t][j] += a[i + j] * b[t][i + j];
  for (int t = 0; t < 4; ++t) {
    for (int j = 0; i + j < n; ++j) acc[t][j] += a[i + j] * b[t][i + j];
    out[t] = combine16(acc[t]);
  }
}

// sum of squares with the same lane order as dot_f32(a, a, n).
inline float sumsq_f32(const float* a, int64_t n) { return dot_f32(a, a, n); }

}  // namespace dsv4
