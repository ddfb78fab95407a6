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

// expert_forward's buffers: the FP8-quantised rows and the w1 / w3 products.
struct ExpertActivations {
  std::vector<float> xq, g, u;
};

// One worker's buffers in run_experts_local: an expert's gathered rows, their
// routing weights and outputs, and the expert's own buffers.
struct RoutedExpertBuffers {
  std::vector<float> x, weight, y;
  ExpertActivations expert;
};

// The MoE step's buffers (model/activations.h). The routed pairs' outputs
// alone are n·k·D floats (200 MB for 2048 Flash rows).
struct MoeActivations {
  std::vector<float> logits;    // the gate's [n][E]
  std::vector<float> y_routed;  // [n·k][D]: pair i's expert output
  std::vector<float> y_shared;  // [n][D]
  ExpertActivations shared;
  std::vector<RoutedExpertBuffers> per_worker;  // by parallel_for worker id
};

// Routes the tile's ffn inputs x [n][D] (token ids for hash layers).
Routing moe_route(const MoeWeights& w, const ModelConfig& c, int layer, const float* x, const int32_t* tokens,
                  int64_t n, MoeActivations& act);

// One SwiGLU expert on rows x [m][D]: y [m][D] (bf16). row_weight may be null
// (shared expert) or give the routing weight of each row.
void expert_forward(const ExpertWeights& e, const ModelConfig& c, const float* x, int64_t m, const float* row_weight,
                    ExpertActivations& act, float* y);

// Where the routed experts of one MoE step run (PREFILL.md §4). The default
// runs every expert in this process; the expert-parallel runner (src/dist)
// sends each (row, expert, weight) to the rank that owns the expert.
class ExpertRunner {
 public:
  virtual ~ExpertRunner() = default;
  // y [n·k][D]: for each routed pair i, expert r.expert[i]'s output on row
  // i / k of x [n][D], already scaled by r.weight[i] (bf16 values). Called
  // once per MoE step even when n is 0, so that all ranks stay in lockstep.
  // `act` holds the buffers of the experts run here (run_experts_local).
  virtual void run_routed(const MoeWeights& w, const ModelConfig& c, const float* x, int64_t n, const Routing& r,
                          MoeActivations& act, float* y) = 0;
  // The number of chunk rounds every participant takes: the most any needs.
  virtual int64_t agree_rounds(int64_t local) { return local; }
};

// Runs the experts of the listed pairs in this process, grouped by expert in
// ascending id: pairs[j] indexes r.expert / r.weight, x_rows[j] is its input
// row; writes y[j] [D]. Every output row is independent of the grouping.
void run_experts_local(const MoeWeights& w, const ModelConfig& c, const float* const* x_rows, const int32_t* expert,
                       const float* weight, int64_t n_pairs, MoeActivations& act, float* y);

// out [n][D] = bf16(Σ_routed y_e + y_shared), the routed sum in ascending
// expert id. `runner` null: every expert runs here.
void moe_forward(const MoeWeights& w, const ModelConfig& c, int layer, const float* x, const int32_t* tokens,
                 int64_t n, MoeActivations& act, float* out, ExpertRunner* runner = nullptr);

}  // namespace dsv4
