#include "model/moe.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "core/formats.h"
#include "core/scratch.h"
#include "core/stage_timer.h"
#include "core/thread_pool.h"
#include "kernels/swiglu.h"
#include "kernels/topk.h"
#include "model/workers.h"

namespace dsv4 {

Routing moe_route(const MoeWeights& w, const ModelConfig& c, int layer, const float* x, const int32_t* tokens,
                  int64_t n, MoeActivations& act) {
  const int64_t E = c.n_routed_experts, k = c.num_experts_per_tok;
  float* const logits = scratch(act.logits, size_t(n * E));
  LinearOpts fp32_out;
  fp32_out.out_bf16 = false;
  linear(w.gate, x, n, logits, fp32_out);
  Routing r;
  r.expert.resize(size_t(n * k));
  r.weight.resize(size_t(n * k));
  std::vector<float> s(static_cast<size_t>(E)), biased(static_cast<size_t>(E));
  std::vector<int32_t> idx;
  for (int64_t t = 0; t < n; ++t) {
    const float* l = logits + t * E;
    switch (c.scoring_func) {
      case ScoringFunc::kSqrtSoftplus:
        for (int64_t e = 0; e < E; ++e) s[e] = std::sqrt(l[e] > 20.f ? l[e] : std::log1p(std::exp(l[e])));
        break;
      case ScoringFunc::kSigmoid:
        for (int64_t e = 0; e < E; ++e) s[e] = 1.0f / (1.0f + std::exp(-l[e]));
        break;
      case ScoringFunc::kSoftmax: {
        float mx = *std::max_element(l, l + E), sum = 0.f;
        for (int64_t e = 0; e < E; ++e) sum += (s[e] = std::exp(l[e] - mx));
        for (int64_t e = 0; e < E; ++e) s[e] /= sum;
        break;
      }
    }
    if (c.is_hash_layer(layer)) {
      idx.assign(w.tid2eid.begin() + tokens[t] * k, w.tid2eid.begin() + (tokens[t] + 1) * k);
    } else {
      for (int64_t e = 0; e < E; ++e) biased[e] = s[e] + w.gate_bias[size_t(e)];
      topk_indices(biased.data(), E, k, &idx);
    }
    float sum = 0.f;
    for (int32_t e : idx) sum += s[size_t(e)];
    // Keep each token's experts in ascending id: the order the sum uses.
    std::vector<int32_t> sorted = idx;
    std::sort(sorted.begin(), sorted.end());
    for (int64_t j = 0; j < k; ++j) {
      const float se = s[size_t(sorted[j])];
      r.expert[size_t(t * k + j)] = sorted[j];
      r.weight[size_t(t * k + j)] =
          (c.scoring_func == ScoringFunc::kSoftmax ? se : se / sum) * c.routed_scaling_factor;
    }
  }
  return r;
}

void expert_forward(const ExpertWeights& e, const ModelConfig& c, const float* x, int64_t m, const float* row_weight,
                    ExpertActivations& act, float* y) {
  const int64_t I = c.moe_intermediate_size;
  const LinearOpts q = quant_linear_opts(c.weight_block_size, c.scale_pow2);
  // w1 and w3 read the same FP8-quantised rows: quantised once.
  float* const xq = scratch(act.xq, size_t(m * c.hidden_size));
  float* const g = scratch(act.g, size_t(m * I));
  float* const u = scratch(act.u, size_t(m * I));
  act_quant_rows(x, m, c.hidden_size, c.hidden_size, q, xq);
  LinearOpts q_in = q;
  q_in.act_quant = false;
  linear(e.w1, xq, m, g, q_in);
  linear(e.w3, xq, m, u, q_in);
  parallel_for_each(m, [&](int64_t r) {
    swiglu_bf16(g + r * I, u + r * I, I, c.swiglu_limit, row_weight ? row_weight[r] : 1.f, g + r * I);
  });
  linear(e.w2, g, m, y, q);
}

void run_experts_local(const MoeWeights& w, const ModelConfig& c, const float* const* x_rows, const int32_t* expert,
                       const float* weight, int64_t n_pairs, MoeActivations& act, float* y) {
  const int64_t D = c.hidden_size, E = c.n_routed_experts;
  std::vector<std::vector<int64_t>> pairs_of(static_cast<size_t>(E));
  for (int64_t j = 0; j < n_pairs; ++j) pairs_of[size_t(expert[j])].push_back(j);
  // Whole experts run in parallel (their linears then run inline, nested),
  // so the row gathers, activation quantisation and SwiGLU of one expert run
  // beside another expert's instead of between parallel GEMMs. Largest
  // first, so that the last chunks of the pool are the smallest. Each
  // expert writes only its own pairs' rows: the order decides nothing else.
  std::vector<int64_t> order;
  for (int64_t e = 0; e < E; ++e)
    if (!pairs_of[size_t(e)].empty()) order.push_back(e);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return pairs_of[size_t(a)].size() > pairs_of[size_t(b)].size(); });
  StageTimes::global().routed_expert_passes += int64_t(order.size());
  std::vector<RoutedExpertBuffers>& per_worker = worker_slots(act.per_worker);
  ThreadPool::global().parallel_for(int64_t(order.size()), [&](int64_t b, int64_t end, int worker) {
    RoutedExpertBuffers& buf = per_worker[size_t(worker)];
    for (int64_t i = b; i < end; ++i) {
      const int64_t e = order[size_t(i)];
      const auto& pairs = pairs_of[size_t(e)];
      const int64_t m = int64_t(pairs.size());
      float* const xe = scratch(buf.x, size_t(m * D));
      float* const we = scratch(buf.weight, size_t(m));
      float* const ye = scratch(buf.y, size_t(m * D));
      for (int64_t r = 0; r < m; ++r) {
        std::copy(x_rows[pairs[size_t(r)]], x_rows[pairs[size_t(r)]] + D, xe + r * D);
        we[r] = weight[pairs[size_t(r)]];
      }
      expert_forward(w.experts[size_t(e)], c, xe, m, we, buf.expert, ye);
      for (int64_t r = 0; r < m; ++r) std::copy(ye + r * D, ye + (r + 1) * D, y + pairs[size_t(r)] * D);
    }
  });
}

void moe_forward(const MoeWeights& w, const ModelConfig& c, int layer, const float* x, const int32_t* tokens,
                 int64_t n, MoeActivations& act, float* out, ExpertRunner* runner) {
  const int64_t D = c.hidden_size, k = c.num_experts_per_tok;
  if (n == 0 && !runner) return;
  std::optional<ScopedStage> stage(std::in_place, Stage::kGate);
  Routing r = n > 0 ? moe_route(w, c, layer, x, tokens, n, act) : Routing{};
  stage.emplace(Stage::kExperts);
  // y_routed[t][j] is expert r.expert[t][j]'s output on row t; the runner
  // writes every pair's row.
  const float* const y_routed = scratch(act.y_routed, size_t(n * k * D));
  if (runner) {
    runner->run_routed(w, c, x, n, r, act, act.y_routed.data());
  } else {
    std::vector<const float*> rows(size_t(n * k));
    for (int64_t i = 0; i < n * k; ++i) rows[size_t(i)] = x + (i / k) * D;
    run_experts_local(w, c, rows.data(), r.expert.data(), r.weight.data(), n * k, act, act.y_routed.data());
  }
  if (n == 0) return;
  float* const ys = scratch(act.y_shared, size_t(n * D));
  expert_forward(w.shared, c, x, n, nullptr, act.shared, ys);
  parallel_for_each(n, [&](int64_t t) {
    for (int64_t ch = 0; ch < D; ++ch) {
      float s = 0.f;
      for (int64_t j = 0; j < k; ++j) s += y_routed[(t * k + j) * D + ch];
      out[t * D + ch] = bf16r(s + ys[t * D + ch]);
    }
  });
}

}  // namespace dsv4
