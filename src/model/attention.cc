#include "model/attention.h"

#include <algorithm>

#include "core/formats.h"
#include "core/scratch.h"
#include "core/stage_timer.h"
#include "core/thread_pool.h"
#include "kernels/norm.h"
#include "kernels/sparse_attention.h"

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

void AttentionState::copy_from(const AttentionState& src) {
  window.copy_from(src.window);
  if (kind.has_compressor()) comp.copy_from(src.comp);
  if (kind.has_indexer()) indexer.copy_from(src.indexer);
}

namespace {

// The fixed inputs of one attention_forward call, shared by its steps.
struct Layer {
  const AttentionWeights& w;
  const ModelConfig& c;
  LayerKind kind;
  const RopeTable& rope;
  int64_t H, d, rd, nd;  // heads, head dim, rope dims, nope dims
  Layer(const AttentionWeights& w, const ModelConfig& c, LayerKind kind, const RopeTable& rope)
      : w(w), c(c), kind(kind), rope(rope), H(c.num_attention_heads), d(c.head_dim), rd(c.qk_rope_head_dim),
        nd(c.head_dim - c.qk_rope_head_dim) {}
  LinearOpts quant() const { return quant_linear_opts(c.weight_block_size, c.scale_pow2); }
};

// A tile's keys as bf16 pair rows (kernels/sparse_attention.h), each with
// its smallest exponent: the window rows of positions [lo, p0 + n), then the
// compressed rows visible to the tile's last query.
struct TileKeys {
  int64_t lo = 0;
  const uint32_t* window = nullptr;
  const int* window_exp = nullptr;
  const uint32_t* compressed = nullptr;
  const int* compressed_exp = nullptr;
};

// §6.1–6.2: the normalised q latent qr [n][q_lora_rank] and the query heads
// q [n][H][d] (head norm, then RoPE with the rows' tables cs [n][rd]).
void project_q(const Layer& L, const float* x, const float* cs, int64_t n, float* qr, float* q) {
  const int64_t ql = L.c.q_lora_rank;
  linear(L.w.wq_a, x, n, qr, L.quant());
  rms_norm_rows_bf16(qr, n, L.w.q_norm.data(), ql, L.c.rms_norm_eps, qr);
  linear(L.w.wq_b, qr, n, q, L.quant());
  parallel_for_each(n * L.H, [&](int64_t ih) {
    float* qh = q + ih * L.d;
    q_head_norm_bf16(qh, L.d, L.c.rms_norm_eps);
    L.rope.rotate(qh + L.nd, cs + (ih / L.H) * L.rd);
  });
}

// §6.3: the raw kv rows [n][d]: norm, RoPE, FP8 on the nope part.
void project_kv(const Layer& L, const float* x, const float* cs, int64_t n, float* kv) {
  linear(L.w.wkv, x, n, kv, L.quant());
  parallel_for_each(n, [&](int64_t i) {
    float* r = kv + i * L.d;
    rms_norm_bf16(r, L.w.kv_norm.data(), L.d, L.c.rms_norm_eps, r);
    L.rope.rotate(r + L.nd, cs + i * L.rd);
    q8_inplace(r, size_t(L.nd), 64, L.c.scale_pow2);
  });
}

// The window keys of the tile at [p0, p0 + n) with kv rows [n][d]: the older
// rows read from the ring first, then the tile's own; only then does the
// tile overwrite the ring, so the ring needs just sliding_window slots.
void window_keys(const Layer& L, const float* kv, int64_t p0, int64_t n, AttentionState& st, AttentionActivations& b,
                 TileKeys* keys) {
  ScopedStage stage(Stage::kAttention);
  const int64_t W = st.window_rows, d = L.d, dp = key_pair_count(d);
  const int64_t lo = std::max<int64_t>(0, p0 - W + 1), n_old = p0 - lo;
  uint32_t* const win = scratch(b.window_keys, size_t((n_old + n) * dp));
  int* const exp = scratch(b.window_exp, size_t(n_old + n));
  parallel_for_each(n_old + n, [&](int64_t j) {
    exp[j] = j < n_old ? pack_key_row(st.window.row_bf16((lo + j) % W), d, win + j * dp)
                       : pack_key_row(kv + (j - n_old) * d, d, win + j * dp);
  });
  for (int64_t i = std::max<int64_t>(0, n - W); i < n; ++i) {
    uint16_t* dst = st.window.row_bf16((p0 + i) % W);
    for (int64_t k = 0; k < d; ++k) dst[k] = f32_to_bf16(kv[size_t(i * d + k)]);
  }
  keys->lo = lo;
  keys->window = win;
  keys->window_exp = exp;
}

// §7: the compressed rows (and the indexer's) completed inside the tile of
// the call's rows [t0, t0 + n) at [p0, p0 + n), from the call's compressor
// products (attention_forward).
void update_compressed_rows(const Layer& L, int64_t t0, int64_t p0, int64_t n, AttentionState& st,
                            const AttentionActivations& b) {
  ScopedStage stage(Stage::kCompressors);
  if (L.kind.has_compressor()) compressor_update(L.w.compressor, L.c, L.rope, b.compressor, t0, p0, n, st.comp);
  if (L.kind.has_indexer())
    compressor_update(L.w.indexer.compressor, L.c, L.rope, b.indexer_compressor, t0, p0, n, st.indexer.comp);
}

// The compressed rows visible to the last query of the tile ending at
// position `last`, as key pair rows.
void compressed_keys(const Layer& L, const AttentionState& st, int64_t last, AttentionActivations& b, TileKeys* keys) {
  if (!L.kind.has_compressor()) return;
  ScopedStage stage(Stage::kAttention);
  const int64_t vis = L.kind.visible_rows(last), dp = key_pair_count(L.d);
  uint32_t* const comp = scratch(b.compressed_keys, size_t(vis * dp));
  int* const exp = scratch(b.compressed_exp, size_t(vis));
  parallel_for_each(vis, [&](int64_t r) { exp[r] = pack_key_row(st.comp.rows.row_bf16(r), L.d, comp + r * dp); });
  keys->compressed = comp;
  keys->compressed_exp = exp;
}

// §6.4–6.6: each query of the tile at [p0, p0 + n) (heads q [n][H][d]) over
// its window rows and its compressed rows (on CSA those in chosen[i], on HCA
// every visible one); the output o [n][H][d] rotated back by −pos.
void sparse_attention(const Layer& L, const float* q, const float* cs, int64_t p0, int64_t n, const TileKeys& k,
                      const std::vector<std::vector<int32_t>>& chosen, int64_t window_rows, float* o) {
  ScopedStage stage(Stage::kAttention);
  const int64_t H = L.H, d = L.d, dp = key_pair_count(d), W = window_rows;
  parallel_for_each(n, [&](int64_t i) {
    const int64_t t = p0 + i;
    std::vector<const uint32_t*> keys;
    int key_exp = 255;
    for (int64_t j = std::max<int64_t>(0, t - W + 1); j <= t; ++j) {
      keys.push_back(k.window + (j - k.lo) * dp);
      key_exp = std::min(key_exp, k.window_exp[j - k.lo]);
    }
    auto add_compressed = [&](int64_t r) {
      keys.push_back(k.compressed + r * dp);
      key_exp = std::min(key_exp, k.compressed_exp[r]);
    };
    if (L.kind.has_indexer()) {
      for (int32_t r : chosen[size_t(i)]) add_compressed(r);
    } else {
      for (int64_t r = 0; r < L.kind.visible_rows(t); ++r) add_compressed(r);
    }
    float* const oi = o + i * H * d;
    attend_query(q + i * H * d, H, keys.data(), int64_t(keys.size()), d, key_exp, L.w.attn_sink.data(), oi);
    for (int64_t h = 0; h < H; ++h) L.rope.rotate(oi + h * d + L.nd, cs + i * L.rd, /*inverse=*/true);
  });
}

// §6.7: grouped low-rank output, o [n][H][d] -> out [n][D]. wo_a's FP8
// values are exact in bf16, so the bf16 product is the FP8 weight without
// activation quantisation.
void project_output(const Layer& L, const float* o, int64_t n, AttentionActivations& b, float* out) {
  ScopedStage stage(Stage::kProjections);
  const int64_t G = L.c.o_groups, ol = L.c.o_lora_rank, Hd = L.H * L.d, gw = Hd / G;
  float* const u = scratch(b.u, size_t(n * G * ol));
  LinearOpts bf16_out;
  for (int64_t g = 0; g < G; ++g)
    linear(L.w.wo_a, o + g * gw, n, u + g * ol, bf16_out, g * ol, (g + 1) * ol, Hd, G * ol);
  linear(L.w.wo_b, u, n, out, L.quant());
}

// One tile, rows [t0, t0 + n) of the call at positions [p0, p0 + n): reads
// the cache rows that the earlier tiles wrote, writes its own.
void attend_tile(const Layer& L, int64_t t0, int64_t p0, int64_t n, AttentionState& st,
                 AttentionActivations& b) {
  const int64_t H = L.H, d = L.d, Hi = L.c.index_n_heads, di = L.c.index_head_dim;
  TileKeys keys;
  window_keys(L, b.kv.data() + t0 * d, p0, n, st, b, &keys);
  update_compressed_rows(L, t0, p0, n, st, b);
  if (L.kind.has_indexer()) {
    // Timed as the indexer's: its scores are indexer FLOPs in the bench's
    // per-stage report.
    ScopedStage stage(Stage::kIndexer);
    indexer_choose(L.c, L.kind, st.indexer, b.qi.data() + t0 * Hi * di, b.wts.data() + t0 * Hi, p0, n, b.indexer,
                   &b.chosen);
  }
  compressed_keys(L, st, p0 + n - 1, b, &keys);
  sparse_attention(L, b.q.data() + t0 * H * d, b.cs.data() + t0 * L.rd, p0, n, keys, b.chosen, st.window_rows,
                   b.o.data() + t0 * H * d);
}

}  // namespace

void attention_forward(const AttentionWeights& w, const ModelConfig& c, LayerKind kind, const RopeTable& rope,
                       const float* x, int64_t rows, const std::vector<AttentionSpan>& spans,
                       AttentionActivations& b, float* out) {
  const Layer L(w, c, kind, rope);
  const int64_t H = L.H, d = L.d, rd = L.rd, Hi = c.index_n_heads, di = c.index_head_dim;
  float* const cs = scratch(b.cs, size_t(rows * rd));  // the rows' rotation tables
  {
    // The projections read only x, never the caches, so they run over all
    // rows at once: each weight is read (and each FP8 panel decoded) once
    // for every row of every request, not once per tile or per request.
    // Every output row is the same FMA chain whatever the rows are.
    ScopedStage stage(Stage::kProjections);
    for (const AttentionSpan& s : spans)
      for (int64_t i = 0; i < s.n; ++i) rope.cos_sin(s.p0 + i, cs + (s.row0 + i) * rd);
    project_q(L, x, cs, rows, scratch(b.qr, size_t(rows * c.q_lora_rank)), scratch(b.q, size_t(rows * H * d)));
    project_kv(L, x, cs, rows, scratch(b.kv, size_t(rows * d)));
  }
  {
    // Like the projections, over all rows at once.
    ScopedStage stage(Stage::kCompressors);
    if (kind.has_compressor()) compressor_project(w.compressor, x, rows, b.compressor);
    if (kind.has_indexer()) compressor_project(w.indexer.compressor, x, rows, b.indexer_compressor);
  }
  if (kind.has_indexer()) {
    ScopedStage stage(Stage::kIndexer);
    indexer_queries(w.indexer, c, rope, x, b.qr.data(), cs, rows, scratch(b.qi, size_t(rows * Hi * di)),
                    scratch(b.wts, size_t(rows * Hi)));
  }
  // Each request tile by tile in position order: each tile reads the cache
  // rows that the earlier ones wrote.
  scratch(b.o, size_t(rows * H * d));
  for (const AttentionSpan& s : spans) {
    const int64_t tile = s.tile <= 0 || s.tile > s.n ? s.n : s.tile;
    for (int64_t t0 = 0; t0 < s.n; t0 += tile)
      attend_tile(L, s.row0 + t0, s.p0 + t0, std::min(tile, s.n - t0), *s.st, b);
  }
  project_output(L, b.o.data(), rows, b, out);
}

}  // namespace dsv4
