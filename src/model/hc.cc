#include "model/hc.h"

#include <algorithm>
#include <cmath>

#include "core/arith.h"
#include "core/formats.h"
#include "core/scratch.h"
#include "core/thread_pool.h"
#include "kernels/dot.h"
#include "model/workers.h"

namespace dsv4 {

namespace {

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

constexpr int kHcBlock = 8;  // tokens per block of mixes

// m[t] = (fn · x_t) · r_t for the tokens of a block, r_t = 1/sqrt(mean(x_t²)
// + eps) over the flattened streams. Four tokens at a time (dot4_f32), so
// that four independent sums hide the latency of each one's adds.
void mixes(const float* const* x, int tokens, int64_t len, const float* fn, int rows, float norm_eps, float* m) {
  float r[kHcBlock];
  for (int t = 0; t < tokens; ++t) r[t] = 1.0f / std::sqrt(sumsq_f32(x[t], len) / float(len) + norm_eps);
  for (int i = 0; i < rows; ++i) {
    const float* f = fn + int64_t(i) * len;
    int t = 0;
    for (; t + 4 <= tokens; t += 4) {
      float d[4];
      dot4_f32(f, x + t, len, d);
      for (int u = 0; u < 4; ++u) m[(t + u) * rows + i] = d[u] * r[t + u];
    }
    for (; t < tokens; ++t) m[t * rows + i] = dot_f32(f, x[t], len) * r[t];
  }
}

// s[c] = Σ_i wt[i·stride]·X[i][c] in fp32, ascending i: 16 channels at a
// time (vectorised), each its own sum.
void stream_sum(const float* X, const float* wt, int64_t stride, int hc, int64_t D, float* s) {
  int64_t c0 = 0;
  for (; c0 + 16 <= D; c0 += 16) {
    float acc[16] = {0};
    for (int i = 0; i < hc; ++i)
      for (int l = 0; l < 16; ++l) acc[l] += wt[i * stride] * X[i * D + c0 + l];
    for (int l = 0; l < 16; ++l) s[c0 + l] = acc[l];
  }
  for (int64_t c = c0; c < D; ++c) {
    float acc = 0.f;
    for (int i = 0; i < hc; ++i) acc += wt[i * stride] * X[i * D + c];
    s[c] = acc;
  }
}

// Σ_i pre[i]·X[i] in fp32, ascending i, rounded to bf16.
void weighted_streams(const float* X, const float* pre, int hc, int64_t D, float* y) {
  stream_sum(X, pre, 1, hc, D, y);
  bf16r_inplace(y, size_t(D));
}

}  // namespace

void hc_pre(const float* X, int64_t n, int hc, int64_t D, const HcWeights& w, int sinkhorn_iters, float hc_eps,
            float norm_eps, float* y, HcMix* mix) {
  const int rows = (2 + hc) * hc;
  mix->post.assign(size_t(n * hc), 0.f);
  mix->comb.assign(size_t(n * hc * hc), 0.f);
  parallel_for_each(ceil_div<int64_t>(n, kHcBlock), [&](int64_t b) {
    const int64_t t0 = b * kHcBlock;
    const int tokens = int(std::min<int64_t>(kHcBlock, n - t0));
    const float* xs[kHcBlock];
    for (int i = 0; i < tokens; ++i) xs[i] = X + (t0 + i) * hc * D;
    std::vector<float> mb(size_t(tokens * rows));
    mixes(xs, tokens, hc * D, w.fn.data(), rows, norm_eps, mb.data());
    for (int64_t t = t0; t < t0 + tokens; ++t) {
      const float* x = X + t * hc * D;
      const float* m = mb.data() + (t - t0) * rows;
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
    }
  });
}

void hc_post(const float* f, float* X, int64_t n, int hc, int64_t D, const HcMix& mix, HcActivations& act) {
  std::vector<std::vector<float>>& per_worker = worker_slots(act.per_worker);
  ThreadPool::global().parallel_for(n, [&](int64_t b, int64_t e, int worker) {
    float* const out = scratch(per_worker[size_t(worker)], size_t(hc * D));
    for (int64_t t = b; t < e; ++t) {
      float* x = X + t * hc * D;
      const float* post = mix.post.data() + t * hc;
      const float* C = mix.comb.data() + t * hc * hc;
      for (int k = 0; k < hc; ++k) {
        float* o = out + k * D;
        stream_sum(x, C + k, hc, hc, D, o);  // Σ_j C[j][k]·X[j]
        for (int64_t c = 0; c < D; ++c) o[c] = post[k] * f[t * D + c] + o[c];
      }
      bf16r_inplace(out, size_t(hc * D));
      std::copy(out, out + hc * D, x);
    }
  });
}

void hc_head(const float* X, int64_t n, int hc, int64_t D, const HcHeadWeights& w, float hc_eps, float norm_eps,
             float* y) {
  parallel_for_each(n, [&](int64_t t) {
    const float* x = X + t * hc * D;
    float m[64], pre[64];
    mixes(&x, 1, hc * D, w.fn.data(), hc, norm_eps, m);
    for (int i = 0; i < hc; ++i) pre[i] = sigmoid(m[i] * w.scale[0] + w.base[i]) + hc_eps;
    weighted_streams(x, pre, hc, D, y + t * D);
  });
}

}  // namespace dsv4
