#include "model/attention.h"

#include <algorithm>
#include <optional>
#include <cmath>
#include <numeric>

#include "core/formats.h"
#include "core/scratch.h"
#include "core/thread_pool.h"
#include "kernels/gemm.h"
#include "kernels/hadamard.h"
#include "kernels/indexer_score.h"
#include "kernels/norm.h"
#include "kernels/sparse_attention.h"
#include "kernels/topk.h"
#include "core/stage_timer.h"

namespace dsv4 {

void AttentionState::init(CachePool* pool, const ModelConfig& c, const AttentionWeights& w, LayerKind k) {
  kind = k;
  window_rows = c.sliding_window;
  window = PagedRows(pool, size_t(c.head_dim) * sizeof(uint16_t));
  if (kind.has_compressor()) comp.init(pool, w.compressor);
  if (kind.has_indexer()) indexer.init(pool, w.indexer);
}

size_t AttentionState::pages_missing(const AttentionWeights& w, int64_t n_tokens) const {
  size_t p = window.pages_missing(std::min(n_tokens, window_rows));
  if (kind.has_compressor()) p += comp.pages_missing(w.compressor, n_tokens);
  if (kind.has_indexer()) p += indexer.pages_missing(w.indexer, n_tokens);
  return p;
}

void AttentionState::reserve(const AttentionWeights& w, int64_t n_tokens) {
  window.reserve(std::min(n_tokens, window_rows));
  if (kind.has_compressor()) comp.reserve(w.compressor, n_tokens);
  if (kind.has_indexer()) indexer.reserve(w.indexer, n_tokens);
}

size_t AttentionState::bytes_held() const {
  return window.bytes_held() + comp.bytes_held() + indexer.bytes_held();
}

void attention_forward(const AttentionWeights& w, const ModelConfig& c, LayerKind kind, const RopeTable& rope,
                       const float* x, int64_t p0, int64_t n, int64_t tile, AttentionState& st, float* out) {
  const int64_t H = c.num_attention_heads, d = c.head_dim, rd = c.qk_rope_head_dim, nd = d - rd;
  const int64_t ql = c.q_lora_rank, G = c.o_groups, ol = c.o_lora_rank;
  const LinearOpts qopts = quant_linear_opts(c.weight_block_size, c.scale_pow2);
  if (tile <= 0 || tile > n) tile = n;

  // Per-token rotation tables for the rows.
  std::vector<float> cs(size_t(n * rd));
  for (int64_t i = 0; i < n; ++i) rope.cos_sin(p0 + i, cs.data() + i * rd);

  // The projections read only x, never the caches, so they run over all n
  // rows at once: each FP8 weight panel is decoded once for all of them, not
  // once per tile (with 128-row tiles the decoding was ~4% of a Flash
  // prefill). Every output row is the same FMA chain whatever M is.
  // §6.1–6.2: q.
  std::optional<ScopedStage> stage(std::in_place, Stage::kProjections);
  // The rows' activations (16 MB for q alone per 128 Flash rows) in
  // buffers kept from call to call (core/scratch.h).
  thread_local std::vector<float> qr_buf, q_buf, kv_buf, qi_buf, wts_buf, o_buf, u_buf;
  thread_local std::vector<uint32_t> win_buf, comp_buf;
  float* const qr = scratch(qr_buf, size_t(n * ql));
  float* const q = scratch(q_buf, size_t(n * H * d));
  linear(w.wq_a, x, n, qr, qopts);
  rms_norm_rows_bf16(qr, n, w.q_norm.data(), ql, c.rms_norm_eps, qr);
  linear(w.wq_b, qr, n, q, qopts);
  parallel_for_each(n * H, [&](int64_t ih) {
    float* qh = q + ih * d;
    q_head_norm_bf16(qh, d, c.rms_norm_eps);
    rope.rotate(qh + nd, cs.data() + (ih / H) * rd);
  });
  // §6.3: the raw kv rows.
  float* const kv = scratch(kv_buf, size_t(n * d));
  linear(w.wkv, x, n, kv, qopts);
  parallel_for_each(n, [&](int64_t i) {
    float* r = kv + i * d;
    rms_norm_bf16(r, w.kv_norm.data(), d, c.rms_norm_eps, r);
    rope.rotate(r + nd, cs.data() + i * rd);
    q8_inplace(r, size_t(nd), 64, c.scale_pow2);
  });
  // §8: indexer queries and weights.
  const int64_t Hi = c.index_n_heads, di = c.index_head_dim;
  float *qi = nullptr, *wts = nullptr;
  if (kind.has_indexer()) {
    stage.emplace(Stage::kIndexer);
    qi = scratch(qi_buf, size_t(n * Hi * di));
    wts = scratch(wts_buf, size_t(n * Hi));
    indexer_queries(w.indexer, c, rope, x, qr, cs.data(), n, qi, wts);
  }

  // Tile by tile in position order: each tile reads the cache rows that the
  // earlier ones wrote.
  const int64_t W = st.window_rows, dp = key_pair_count(d);
  float* const o = scratch(o_buf, size_t(n * H * d));
  for (int64_t t0 = 0; t0 < n; t0 += tile) {
    const int64_t nt = std::min(tile, n - t0), pt = p0 + t0;
    // The window keys of this tile are the older rows read from the ring
    // first, then the tile's own rows; only then does the tile overwrite
    // the ring, so the ring needs just sliding_window slots. Keys are kept
    // as bf16 pair rows (kernels/sparse_attention.h), with the smallest
    // exponent of each row.
    stage.emplace(Stage::kAttention);
    const int64_t lo = std::max<int64_t>(0, pt - W + 1), n_old = pt - lo;
    uint32_t* const win = scratch(win_buf, size_t((n_old + nt) * dp));
    std::vector<int> win_exp(size_t(n_old + nt));
    parallel_for_each(n_old + nt, [&](int64_t j) {
      win_exp[size_t(j)] = j < n_old ? pack_key_row(st.window.row_bf16((lo + j) % W), d, win + j * dp)
                                     : pack_key_row(kv + (t0 + j - n_old) * d, d, win + j * dp);
    });
    for (int64_t i = std::max<int64_t>(0, nt - W); i < nt; ++i) {
      uint16_t* dst = st.window.row_bf16((pt + i) % W);
      for (int64_t k = 0; k < d; ++k) dst[k] = f32_to_bf16(kv[size_t((t0 + i) * d + k)]);
    }

    // §7: compressed rows completed inside this tile.
    stage.emplace(Stage::kCompressors);
    if (kind.has_compressor()) compressor_forward(w.compressor, c, rope, x + t0 * c.hidden_size, pt, nt, st.comp);
    if (kind.has_indexer())
      compressor_forward(w.indexer.compressor, c, rope, x + t0 * c.hidden_size, pt, nt, st.indexer.comp);

    // §8.3: each query's selected compressed rows, timed as the indexer's
    // (its scores are indexer FLOPs in the bench's per-stage report).
    const int64_t vis = kind.visible_rows(pt + nt - 1);  // compressed rows visible to the tile's last query
    std::vector<std::vector<int32_t>> chosen;
    if (kind.has_indexer()) {
      stage.emplace(Stage::kIndexer);
      indexer_choose(c, kind, st.indexer, qi + t0 * Hi * di, wts + t0 * Hi, pt, nt, &chosen);
    }

    stage.emplace(Stage::kAttention);
    // The compressed rows visible to the tile's last query as key pair rows.
    uint32_t* comp = nullptr;
    std::vector<int> comp_exp;
    if (kind.has_compressor()) {
      comp = scratch(comp_buf, size_t(vis * dp));
      comp_exp.resize(size_t(vis));
      parallel_for_each(vis, [&](int64_t r) {
        comp_exp[size_t(r)] = pack_key_row(st.comp.rows.row_bf16(r), d, comp + r * dp);
      });
    }

    // §6.4–6.6: attention per query token, all heads.
    parallel_for_each(nt, [&](int64_t i) {
      const int64_t t = pt + i;
      std::vector<const uint32_t*> keys;
      int key_exp = 255;
      for (int64_t j = std::max<int64_t>(0, t - W + 1); j <= t; ++j) {
        keys.push_back(win + (j - lo) * dp);
        key_exp = std::min(key_exp, win_exp[size_t(j - lo)]);
      }
      auto add_compressed = [&](int64_t r) {
        keys.push_back(comp + r * dp);
        key_exp = std::min(key_exp, comp_exp[size_t(r)]);
      };
      if (kind.has_indexer()) {
        for (int32_t r : chosen[size_t(i)]) add_compressed(r);
      } else {
        for (int64_t r = 0; r < kind.visible_rows(t); ++r) add_compressed(r);
      }
      float* const oi = o + (t0 + i) * H * d;
      attend_query(q + (t0 + i) * H * d, H, keys.data(), int64_t(keys.size()), d, key_exp, w.attn_sink.data(), oi);
      for (int64_t h = 0; h < H; ++h) rope.rotate(oi + h * d + nd, cs.data() + (t0 + i) * rd, /*inverse=*/true);
    });
  }

  stage.emplace(Stage::kProjections);
  // §6.7: grouped low-rank output. wo_a's FP8 values are exact in bf16, so
  // the bf16 product is the FP8 weight without activation quantisation.
  const int64_t gw = H * d / G;
  float* const u = scratch(u_buf, size_t(n * G * ol));
  LinearOpts bf16_out;
  for (int64_t g = 0; g < G; ++g)
    linear(w.wo_a, o + g * gw, n, u + g * ol, bf16_out, g * ol, (g + 1) * ol, H * d, G * ol);
  linear(w.wo_b, u, n, out, qopts);
}

}  // namespace dsv4
