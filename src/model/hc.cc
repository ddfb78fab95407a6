#include "model/hc.h"

#include <cmath>

#include "core/formats.h"
#include "core/thread_pool.h"
#include "kernels/dot.h"

namespace dsv4 {

namespace {

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// m = (fn · x) · r with r = 1/sqrt(mean(x²) + eps) over the flattened streams.
void mixes(const float* x, int64_t len, const float* fn, int rows, float norm_eps, float* m) {
  float r = 1.0f / std::sqrt(sumsq_f32(x, len) / float(len) + norm_eps);
  for (int i = 0; i < rows; ++i) m[i] = dot_f32(fn + int64_t(i) * len, x, len) * r;
}

// Σ_i pre[i]·X[i] in fp32, ascending i, rounded to bf16.
void weighted_streams(const float* X, const float* pre, int hc, int64_t D, float* y) {
  for (int64_t c = 0; c < D; ++c) {
    float s = 0.f;
    for (int i = 0; i < hc; ++i) s += pre[i] * X[i * D + c];
    y[c] = bf16r(s);
  }
}

}  // namespace

void hc_pre(const float* X, int64_t n, int hc, int64_t D, const HcWeights& w, int sinkhorn_iters, float hc_eps,
            float norm_eps, float* y, HcMix* mix) {
  const int rows = (2 + hc) * hc;
  mix->post.assign(size_t(n * hc), 0.f);
  mix->comb.assign(size_t(n * hc * hc), 0.f);
  parallel_for_each(n, [&](int64_t t) {
    const float* x = X + t * hc * D;
    std::vector<float> m(static_cast<size_t>(rows));
    mixes(x, hc * D, w.fn.data(), rows, norm_eps, m.data());
    float pre[64];
    for (int i = 0; i < hc; ++i) pre[i] = sigmoid(m[i] * w.scale[0] + w.base[i]) + hc_eps;
    float* post = mix->post.data() + t * hc;
    for (int i = 0; i < hc; ++i) post[i] = 2.0f * sigmoid(m[hc + i] * w.scale[1] + w.base[hc + i]);
    float* C = mix->comb.data() + t * hc * hc;
    for (int j = 0; j < hc; ++j) {
      float mx = -INFINITY;
      for (int k = 0; k < hc; ++k) {
        C[j * hc + k] = m[2 * hc + j * hc + k] * w.scale[2] + w.base[2 * hc + j * hc + k];
        mx = std::max(mx, C[j * hc + k]);
      }
      float s = 0.f;
      for (int k = 0; k < hc; ++k) s += (C[j * hc + k] = std::exp(C[j * hc + k] - mx));
      for (int k = 0; k < hc; ++k) C[j * hc + k] = C[j * hc + k] / s + hc_eps;
    }
    auto col_norm = [&] {
      for (int k = 0; k < hc; ++k) {
        float s = 0.f;
        for (int j = 0; j < hc; ++j) s += C[j * hc + k];
        for (int j = 0; j < hc; ++j) C[j * hc + k] /= (s + hc_eps);
      }
    };
    col_norm();
    for (int it = 1; it < sinkhorn_iters; ++it) {
      for (int j = 0; j < hc; ++j) {
        float s = 0.f;
        for (int k = 0; k < hc; ++k) s += C[j * hc + k];
        for (int k = 0; k < hc; ++k) C[j * hc + k] /= (s + hc_eps);
      }
      col_norm();
    }
    weighted_streams(x, pre, hc, D, y + t * D);
  });
}

void hc_post(const float* f, float* X, int64_t n, int hc, int64_t D, const HcMix& mix) {
  parallel_for_each(n, [&](int64_t t) {
    float* x = X + t * hc * D;
    const float* post = mix.post.data() + t * hc;
    const float* C = mix.comb.data() + t * hc * hc;
    std::vector<float> out(size_t(hc * D));
    for (int k = 0; k < hc; ++k)
      for (int64_t c = 0; c < D; ++c) {
        float s = 0.f;
        for (int j = 0; j < hc; ++j) s += C[j * hc + k] * x[j * D + c];
        out[size_t(k * D + c)] = bf16r(post[k] * f[t * D + c] + s);
      }
    std::copy(out.begin(), out.end(), x);
  });
}

void hc_head(const float* X, int64_t n, int hc, int64_t D, const HcHeadWeights& w, float hc_eps, float norm_eps,
             float* y) {
  parallel_for_each(n, [&](int64_t t) {
    const float* x = X + t * hc * D;
    float m[64], pre[64];
    mixes(x, hc * D, w.fn.data(), hc, norm_eps, m);
    for (int i = 0; i < hc; ++i) pre[i] = sigmoid(m[i] * w.scale[0] + w.base[i]) + hc_eps;
    weighted_streams(x, pre, hc, D, y + t * D);
  });
}

}  // namespace dsv4
