#include "model/indexer.h"

#include <cmath>
#include <numeric>

#include "core/arith.h"
#include "core/formats.h"
#include "core/scratch.h"
#include "core/thread_pool.h"
#include "kernels/gemm.h"
#include "kernels/hadamard.h"
#include "kernels/indexer_score.h"
#include "kernels/topk.h"
#include "model/workers.h"

namespace dsv4 {

void IndexerRows::pack(const float* r, int64_t count, int d) {
  rows = r;
  n = count;
  di = d;
  const int64_t panels = ceil_div<int64_t>(n, kGemmNR), size = int64_t(di + 1) / 2 * kGemmNR;
  if (pairs.size() < size_t(panels * size)) pairs.resize(size_t(panels * size));
  min_exponent.assign(size_t(panels), 255);
  exact.assign(size_t(panels), 0);
  // Without the BF16 kernel the loader takes no panel: the products then
  // load fp32 panels.
  const PairLoader load = dense_rows_pair_loader(rows, di, n, di);
  parallel_for_each(panels, [&](int64_t p) {
    exact[size_t(p)] = load(p * kGemmNR, pairs.data() + p * size, &min_exponent[size_t(p)]);
  });
}

const uint32_t* IndexerRows::panel(int64_t n0, int* min_exp) const {
  const int64_t p = n0 / kGemmNR;
  if (!exact[size_t(p)]) return nullptr;
  *min_exp = min_exponent[size_t(p)];
  return pairs.data() + p * (int64_t(di + 1) / 2 * kGemmNR);
}

void indexer_queries(const IndexerWeights& w, const ModelConfig& c, const RopeTable& rope, const float* x,
                     const float* qr, const float* cs, int64_t n, float* qi, float* wts) {
  const int64_t Hi = c.index_n_heads, di = c.index_head_dim, rd = c.qk_rope_head_dim;
  linear(w.wq_b, qr, n, qi, quant_linear_opts(c.weight_block_size, c.scale_pow2));
  parallel_for_each(n * Hi, [&](int64_t ih) {
    float* qh = qi + ih * di;
    rope.rotate(qh + di - rd, cs + (ih / Hi) * rd);
    hadamard_bf16(qh, di);
    q4_inplace(qh, size_t(di), 32);
  });
  linear(w.weights_proj, x, n, wts, LinearOpts{});
  const float k = bf16r(float(std::pow(double(di), -0.5) * std::pow(double(Hi), -0.5)));
  for (int64_t j = 0; j < n * Hi; ++j) wts[j] = bf16r(wts[j] * k);
}

void indexer_select(const float* qi, const float* wts, const IndexerRows& rows, int64_t n_visible, int Hi, int topk,
                    IndexerQueryBuffers& buf, std::vector<int32_t>* chosen) {
  if (n_visible <= topk) {  // every row is chosen, whatever the scores
    chosen->resize(size_t(n_visible));
    std::iota(chosen->begin(), chosen->end(), 0);
    return;
  }
  // d[h][r] = bf16(qi[h] · row r) for all heads at once: one gemm per query
  // (one FMA chain per dot, ascending i), then the §8.3 sum in ascending h.
  // The panels hold rows past n_visible too: their columns are not written,
  // and an output's chain does not depend on the other columns.
  const int di = rows.di;
  float* const dots = scratch(buf.dots, size_t(int64_t(Hi) * n_visible));
  float* const score = scratch(buf.score, size_t(n_visible));
  const PairSource packed = [&](int64_t n0, int* min_exponent) { return rows.panel(n0, min_exponent); };
  gemm(qi, di, Hi, di, n_visible, dense_rows_loader(rows.rows, di, n_visible, di), GemmOut{dots, n_visible, true},
       /*parallel=*/false, nullptr, &packed);
  indexer_scores(dots, n_visible, Hi, wts, n_visible, score);
  topk_set(score, n_visible, topk, chosen);
}

void indexer_choose(const ModelConfig& c, LayerKind kind, const IndexerState& st, const float* qi, const float* wts,
                    int64_t p0, int64_t n, IndexerActivations& act, std::vector<std::vector<int32_t>>* chosen) {
  const int64_t Hi = c.index_n_heads, di = c.index_head_dim;
  const int64_t vis = kind.visible_rows(p0 + n - 1);  // rows visible to the tile's last query
  float* const rows = scratch(act.rows, size_t(vis * di));
  st.comp.read_rows(vis, int(di), rows);
  act.packed.pack(rows, vis, int(di));
  chosen->resize(size_t(n));
  std::vector<IndexerQueryBuffers>& per_worker = worker_slots(act.per_worker);
  ThreadPool::global().parallel_for(n, [&](int64_t b, int64_t e, int worker) {
    for (int64_t i = b; i < e; ++i)
      indexer_select(qi + i * Hi * di, wts + i * Hi, act.packed, kind.visible_rows(p0 + i), int(Hi), c.index_topk,
                     per_worker[size_t(worker)], &(*chosen)[size_t(i)]);
  });
}

}  // namespace dsv4
