// Manifold-constrained hyper-connections (MODEL.md §4): the residual stream of
// a token is hc streams of width D; hc_pre mixes them into one sublayer input,
// hc_post writes the sublayer output back, hc_head collapses them at the end.
#pragma once
#include <cstdint>
#include <vector>

namespace dsv4 {

struct HcWeights {
  std::vector<float> fn;     // [(2+hc)·hc][hc·D]
  std::vector<float> base;   // [(2+hc)·hc]
  std::vector<float> scale;  // [3]
};

struct HcHeadWeights {
  std::vector<float> fn;     // [hc][hc·D]
  std::vector<float> base;   // [hc]
  std::vector<float> scale;  // [1]
};

struct HcMix {
  std::vector<float> post;  // [n][hc]
  std::vector<float> comb;  // [n][hc][hc], comb[j][k] as C[j][k]
};

// X: [n][hc][D] (bf16 values). Writes y [n][D] (bf16) and the mixing weights.
void hc_pre(const float* X, int64_t n, int hc, int64_t D, const HcWeights& w, int sinkhorn_iters, float hc_eps,
            float norm_eps, float* y, HcMix* mix);

// hc_post's buffers (model/activations.h): per worker, the new streams of
// the token it is on [hc][D].
struct HcActivations {
  std::vector<std::vector<float>> per_worker;
};

// X[k] = bf16(post[k]·f + Σ_j C[j][k]·X[j]) for each token, in place on X.
void hc_post(const float* f, float* X, int64_t n, int hc, int64_t D, const HcMix& mix, HcActivations& act);

// y [n][D] = bf16(Σ_i pre[i]·X[i]) with pre from hc_head_fn/base/scale.
void hc_head(const float* X, int64_t n, int hc, int64_t D, const HcHeadWeights& w, float hc_eps, float norm_eps,
             float* y);

}  // namespace dsv4
