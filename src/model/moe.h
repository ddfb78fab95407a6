// Mixture of experts (MODEL.md §9): sqrtsoftplus (or softmax/sigmoid) gate
// with biased top-k or hash routing, SwiGLU experts with the clamp, routed
// outputs summed in ascending expert id, plus the shared expert.
#pragma once
#include <cstdint>
#include <vector>

#include "io/config.h"
#include "model/weights.h"

namespace dsv4 {

struct Routing {
  std::vector<int32_t> expert;  // [n][k], ascending expert id per token
  std::vector<float> weight;    // [n][k]
};

// Routes the tile's ffn inputs x [n][D] (token ids for hash layers).
Routing moe_route(const MoeWeights& w, const ModelConfig& c, int layer, const float* x, const int32_t* tokens,
                  int64_t n);

// One SwiGLU expert on rows x [m][D]: y [m][D] (bf16). row_weight may be null
// (shared expert) or give the routing weight of each row.
void expert_forward(const ExpertWeights& e, const ModelConfig& c, const float* x, int64_t m, const float* row_weight,
                    float* y);

// out [n][D] = bf16(Σ_routed y_e + y_shared).
void moe_forward(const MoeWeights& w, const ModelConfig& c, int layer, const float* x, const int32_t* tokens,
                 int64_t n, float* out);

}  // namespace dsv4
