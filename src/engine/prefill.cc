#include "engine/prefill.h"

#include <algorithm>
#include <cstring>

#include "core/arith.h"
#include "core/error.h"
#include "core/formats.h"
#include "core/scratch.h"
#include "core/stage_timer.h"
#include "kernels/linear.h"
#include "kernels/norm.h"
#include "model/activations.h"
#include "model/hc.h"
#include "model/moe.h"

namespace dsv4 {

int64_t prompt_limit(const ModelConfig& c, int64_t max_positions) {
  return max_positions > 0 ? std::min<int64_t>(max_positions, c.max_position_embeddings) : c.max_position_embeddings;
}

void validate_prompt(const ModelConfig& c, const std::vector<int32_t>& tokens, int64_t limit, int64_t start) {
  if (tokens.empty()) throw Error("prompt is empty: at least one token is needed");
  if (start + int64_t(tokens.size()) > limit)
    throw Error("request of " + std::to_string(start + int64_t(tokens.size())) +
                " tokens is longer than the limit of " + std::to_string(limit) +
                " (--max-context, capped by max_position_embeddings)");
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= c.vocab_size)
      throw Error("token " + std::to_string(i) + " has id " + std::to_string(tokens[i]) +
                  ", outside [0, vocab_size = " + std::to_string(c.vocab_size) + ")");
}

namespace {

// One request's share of a chunk round: positions [p0, p0 + n) of its
// tokens, rows [row0, row0 + n) of the round's residual stream.
struct Segment {
  size_t request;
  RequestState* st;
  const int32_t* tokens;  // the segment's own token ids
  int64_t i0, p0, n, row0, tile;
};

// Rows per attention projection step (see layer_forward): enough rows for
// the projections to reuse each decoded weight panel well, while q and the
// attention output stay at 64 MB each for Flash shapes.
constexpr int64_t kAttentionGroupRows = 512;

// The round's rows cut into attention calls: each request's rows in groups
// of whole tiles of at least kAttentionGroupRows (a long prompt: several
// calls), and consecutive short ones packed into one call up to that many
// rows (requests decoding together: one call, each weight read once).
std::vector<std::vector<AttentionSpan>> attention_calls(const std::vector<Segment>& segs, int layer) {
  std::vector<std::vector<AttentionSpan>> calls(1);
  int64_t rows = 0;
  for (const Segment& s : segs) {
    const int64_t group = round_up(kAttentionGroupRows, s.tile);
    for (int64_t g0 = 0; g0 < s.n; g0 += group) {
      const int64_t n = std::min(group, s.n - g0);
      if (rows > 0 && rows + n > kAttentionGroupRows) {
        calls.emplace_back();
        rows = 0;
      }
      calls.back().push_back({s.row0 + g0, s.p0 + g0, n, s.tile, &s.st->layers[size_t(layer)]});
      rows += n;
    }
  }
  if (calls.back().empty()) calls.pop_back();
  return calls;
}

// One layer on every row of the round. X [rows][hc][D] is updated in place:
// attention runs tile by tile in position order (each tile reads the caches
// that the earlier ones wrote), then one MoE step over all rows.
void layer_forward(const Model& m, int layer, const std::vector<Segment>& segs, const int32_t* tokens, int64_t rows,
                   float* X, ExpertRunner* experts, LayerActivations& scratch) {
  const ModelConfig& c = m.config;
  const LayerWeights& lw = m.weights.layers[size_t(layer)];
  const int64_t D = c.hidden_size;
  const int hc = c.hc_mult;
  std::vector<float>& y = scratch.y;
  std::vector<float>& f = scratch.f;
  dsv4::scratch(y, size_t(rows * D));
  dsv4::scratch(f, size_t(rows * D));
  HcMix mix;
  for (std::vector<AttentionSpan>& spans : attention_calls(segs, layer)) {
    // The call's rows are consecutive; the spans count from its first.
    const int64_t r0 = spans.front().row0, n = spans.back().row0 + spans.back().n - r0;
    for (AttentionSpan& a : spans) a.row0 -= r0;
    float* Xg = X + r0 * hc * D;
    {
      ScopedStage st(Stage::kHc);
      hc_pre(Xg, n, hc, D, lw.hc_attn, c.hc_sinkhorn_iters, c.hc_eps, c.rms_norm_eps, y.data(), &mix);
      rms_norm_rows_bf16(y.data(), n, lw.attn_norm.data(), D, c.rms_norm_eps, y.data());
    }
    attention_forward(lw.attn, c, lw.kind, m.rope(layer), y.data(), n, spans, scratch.attention, f.data());
    ScopedStage st(Stage::kHc);
    hc_post(f.data(), Xg, n, hc, D, mix, scratch.hc);
  }
  {
    ScopedStage st(Stage::kHc);
    hc_pre(X, rows, hc, D, lw.hc_ffn, c.hc_sinkhorn_iters, c.hc_eps, c.rms_norm_eps, y.data(), &mix);
    rms_norm_rows_bf16(y.data(), rows, lw.ffn_norm.data(), D, c.rms_norm_eps, y.data());
  }
  moe_forward(lw.ffn, c, layer, y.data(), tokens, rows, scratch.moe, f.data(), experts);
  ScopedStage st(Stage::kHc);
  hc_post(f.data(), X, rows, hc, D, mix, scratch.hc);
}

// hc_head → norm for `n` rows of X [.][hc][D] into hidden [n][D].
void final_norm(const Model& m, const float* X, int64_t n, float* hidden) {
  const ModelConfig& c = m.config;
  const int64_t D = c.hidden_size;
  std::vector<float> head_in(size_t(n * D));
  hc_head(X, n, c.hc_mult, D, m.weights.hc_head, c.hc_eps, c.rms_norm_eps, head_in.data());
  rms_norm_rows_bf16(head_in.data(), n, m.weights.norm.data(), D, c.rms_norm_eps, hidden);
}

}  // namespace

void RequestState::init(const Model& model, CachePool* pool) {
  const ModelConfig& c = model.config;
  n_tokens = 0;
  layers.clear();
  layers.resize(size_t(c.num_hidden_layers));
  for (int l = 0; l < c.num_hidden_layers; ++l)
    layers[size_t(l)].init(pool, c, model.weights.layers[size_t(l)].attn, c.layer_kind(l));
}

size_t RequestState::pages_missing(const Model& model, int64_t n) const {
  size_t p = 0;
  for (size_t l = 0; l < layers.size(); ++l) p += layers[l].pages_missing(model.weights.layers[l].attn, n);
  return p;
}

void RequestState::reserve(const Model& model, int64_t n) {
  if (layers.empty()) return;
  const CachePool* pool = layers[0].window.pool();
  const size_t need = pages_missing(model, n);
  if (need > pool->free_pages())
    throw Error("cache pool exhausted: the request needs " + std::to_string(need) + " more pages of " +
                std::to_string(pool->page_bytes()) + " bytes for " + std::to_string(n) + " positions, " +
                std::to_string(pool->free_pages()) + " are free (raise --cache-pool-mb)");
  for (size_t l = 0; l < layers.size(); ++l) layers[l].reserve(model.weights.layers[l].attn, n);
}

void RequestState::copy_from(const Model& model, const RequestState& src) {
  if (src.layers.empty()) throw Error("a request state copy needs an initialised source");
  CachePool* pool = src.layers[0].window.pool();
  const size_t need = src.cache_bytes() / pool->page_bytes();
  if (need > pool->free_pages())
    throw Error("cache pool exhausted: a copy of the session needs " + std::to_string(need) + " pages of " +
                std::to_string(pool->page_bytes()) + " bytes, " + std::to_string(pool->free_pages()) +
                " are free (raise --cache-pool-mb)");
  RequestState copy;
  copy.init(model, pool);
  for (size_t l = 0; l < copy.layers.size(); ++l) copy.layers[l].copy_from(src.layers[l]);
  copy.n_tokens = src.n_tokens;
  *this = std::move(copy);
}

size_t RequestState::cache_bytes() const {
  size_t b = 0;
  for (const AttentionState& s : layers) b += s.bytes_held();
  return b;
}

size_t request_cache_bytes(const Model& model, int64_t n_tokens) {
  CachePool probe(0);
  RequestState st;
  st.init(model, &probe);
  return st.pages_missing(model, n_tokens) * probe.page_bytes();
}

std::unique_ptr<CachePool> pool_for_request(const Model& model, int64_t n_tokens) {
  return std::make_unique<CachePool>(request_cache_bytes(model, n_tokens));
}

namespace {

// How one request walks an extend_batch call: its positions, tile and chunk.
struct RequestPlan {
  bool ok = false;  // validated and its pages reserved
  int64_t start = 0, n = 0, tile = 0, chunk = 0;
};

// Checks and reserves request by request: a failure stays with its request
// (its result's error). Sizes the results' optional blocks.
std::vector<RequestPlan> plan_requests(const Model& model, const std::vector<RequestState*>& states,
                                       const std::vector<std::vector<int32_t>>& tokens, const PrefillOptions& opts,
                                       std::vector<PrefillResult>& res) {
  const ModelConfig& c = model.config;
  std::vector<RequestPlan> plans(states.size());
  for (size_t q = 0; q < states.size(); ++q) {
    try {
      if (states[q]->n_tokens > 0 && opts.teacher) throw Error("teacher forcing needs a request that starts at position 0");
      validate_prompt(c, tokens[q], prompt_limit(c, opts.max_positions), states[q]->n_tokens);
      states[q]->reserve(model, states[q]->n_tokens + int64_t(tokens[q].size()));
    } catch (const Error& e) {
      res[q].error = e.what();
      continue;
    }
    RequestPlan& p = plans[q];
    p.ok = true;
    p.n = int64_t(tokens[q].size());
    p.start = states[q]->n_tokens;
    p.tile = opts.tile_tokens > 0 ? std::min(opts.tile_tokens, p.n) : p.n;
    p.chunk = opts.chunk_tokens > 0 ? std::min(p.n, round_up(opts.chunk_tokens, p.tile)) : p.n;
    if (opts.keep_hidden) res[q].hidden.resize(size_t(p.n * c.hidden_size));
    if (opts.keep_residuals)
      res[q].residuals.resize(size_t(c.num_hidden_layers * p.n * c.hc_mult * c.hidden_size));
  }
  return plans;
}

// The segments of chunk round `round`: each request's next chunk, their rows
// one after another; `round_tokens` gets their token ids in row order.
std::vector<Segment> round_segments(const std::vector<RequestPlan>& plans, const std::vector<RequestState*>& states,
                                    const std::vector<std::vector<int32_t>>& tokens, int64_t round,
                                    std::vector<int32_t>& round_tokens, int64_t* rows) {
  std::vector<Segment> segs;
  *rows = 0;
  round_tokens.clear();
  for (size_t q = 0; q < plans.size(); ++q) {
    const RequestPlan& p = plans[q];
    const int64_t i0 = round * p.chunk;
    if (!p.ok || i0 >= p.n) continue;
    const int64_t n = std::min(p.chunk, p.n - i0);
    segs.push_back(Segment{q, states[q], tokens[q].data() + i0, i0, p.start + i0, n, *rows, p.tile});
    round_tokens.insert(round_tokens.end(), tokens[q].begin() + i0, tokens[q].begin() + i0 + n);
    *rows += n;
  }
  return segs;
}

// Every row's embedding, copied to the hc streams of X.
void embed_rows(const Model& model, const std::vector<Segment>& segs, float* X) {
  const int64_t D = model.config.hidden_size, hc = model.config.hc_mult;
  std::vector<float> erow(static_cast<size_t>(D));
  for (const Segment& s : segs)
    for (int64_t i = 0; i < s.n; ++i) {
      model.weights.embed.dequant_row(s.tokens[i], erow.data());
      for (int64_t k = 0; k < hc; ++k) std::copy(erow.begin(), erow.end(), X + ((s.row0 + i) * hc + k) * D);
    }
}

// Copies each segment's rows of layer `l` between X and a request's
// [layers][N][hc][D] block (teacher input in, residuals out).
void copy_layer_rows(const std::vector<Segment>& segs, int64_t row_floats, int64_t l,
                     const std::vector<int64_t>& n_of_request, const float* from_block, float* X) {
  for (const Segment& s : segs)
    std::memcpy(X + s.row0 * row_floats, from_block + (l * n_of_request[s.request] + s.i0) * row_floats,
                size_t(s.n * row_floats) * sizeof(float));
}

// The head for the requests that end in this round: final norm (of every
// row with keep_hidden), logits and next token; advances every state. The
// last rows of all of them go through the head in one product, so that
// requests decoding together read its vocab_size rows once.
void finish_round(const Model& model, const std::vector<Segment>& segs, const std::vector<RequestPlan>& plans,
                  const PrefillOptions& opts, const float* X, std::vector<PrefillResult>& res) {
  const ModelConfig& c = model.config;
  const int64_t D = c.hidden_size, hc = c.hc_mult, V = c.vocab_size;
  ScopedStage head_stage(Stage::kHead);
  std::vector<const Segment*> ending;
  for (const Segment& s : segs) {
    PrefillResult& r = res[s.request];
    const int64_t N = plans[s.request].n;
    const bool last = s.i0 + s.n == N;
    if (opts.keep_hidden) {
      final_norm(model, X + s.row0 * hc * D, s.n, r.hidden.data() + s.i0 * D);
    } else if (last) {
      r.hidden.resize(size_t(D));
      final_norm(model, X + (s.row0 + s.n - 1) * hc * D, 1, r.hidden.data());
    }
    s.st->n_tokens = s.p0 + s.n;
    if (last) ending.push_back(&s);
  }
  if (ending.empty()) return;
  const int64_t M = int64_t(ending.size());
  std::vector<float> h(size_t(M * D)), logits(size_t(M * V));
  for (int64_t j = 0; j < M; ++j) {
    const PrefillResult& r = res[ending[size_t(j)]->request];
    const int64_t at = opts.keep_hidden ? (plans[ending[size_t(j)]->request].n - 1) * D : 0;
    std::copy(r.hidden.begin() + at, r.hidden.begin() + at + D, h.begin() + j * D);
  }
  LinearOpts fp32_out;
  fp32_out.out_bf16 = false;
  linear(model.weights.head, h.data(), M, logits.data(), fp32_out);
  for (int64_t j = 0; j < M; ++j) {
    const Segment& s = *ending[size_t(j)];
    PrefillResult& r = res[s.request];
    r.logits.assign(logits.begin() + j * V, logits.begin() + (j + 1) * V);
    r.next_token = argmax(r.logits.data(), V);
    r.cache_bytes = s.st->cache_bytes();
  }
}

}  // namespace

std::vector<PrefillResult> extend_batch(const Model& model, const std::vector<RequestState*>& states,
                                        const std::vector<std::vector<int32_t>>& tokens, const PrefillOptions& opts,
                                        ExpertRunner* experts, BatchActivations* act) {
  const ModelConfig& c = model.config;
  const size_t Q = states.size();
  if (tokens.size() != Q) throw Error("extend_batch: " + std::to_string(Q) + " states for " + std::to_string(tokens.size()) + " prompts");
  if (opts.teacher && Q != 1) throw Error("teacher forcing takes exactly one request");
  const int64_t row_floats = int64_t(c.hc_mult) * c.hidden_size;
  std::vector<PrefillResult> res(Q);
  const std::vector<RequestPlan> plans = plan_requests(model, states, tokens, opts, res);
  std::vector<int64_t> n_of_request(Q);
  int64_t rounds = 0, total = 0, done = 0;
  for (size_t q = 0; q < Q; ++q) {
    n_of_request[q] = plans[q].n;
    if (plans[q].ok) rounds = std::max(rounds, ceil_div(plans[q].n, plans[q].chunk));
    if (plans[q].ok) total += plans[q].n;
  }
  if (experts) rounds = experts->agree_rounds(rounds);
  BatchActivations local;
  BatchActivations& a = act ? *act : local;
  std::vector<int32_t> round_tokens;
  for (int64_t round = 0; round < rounds; ++round) {
    int64_t rows = 0;
    const std::vector<Segment> segs = round_segments(plans, states, tokens, round, round_tokens, &rows);
    float* X = scratch(a.X, size_t(rows * row_floats));
    embed_rows(model, segs, X);
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      if (opts.teacher && l > 0) copy_layer_rows(segs, row_floats, l - 1, n_of_request, opts.teacher, X);
      layer_forward(model, int(l), segs, round_tokens.data(), rows, X, experts, a.layer);
      if (opts.progress) opts.progress(done + rows * (l + 1) / c.num_hidden_layers, total);
      if (opts.keep_residuals)
        for (const Segment& s : segs)
          std::memcpy(res[s.request].residuals.data() + (l * n_of_request[s.request] + s.i0) * row_floats,
                      X + s.row0 * row_floats, size_t(s.n * row_floats) * sizeof(float));
    }
    finish_round(model, segs, plans, opts, X, res);
    if (opts.round_done)
      for (const Segment& s : segs)
        if (s.i0 + s.n < plans[s.request].n) opts.round_done(s.request, s.p0, s.p0 + s.n);
    done += rows;
  }
  return res;
}

PrefillResult extend(const Model& model, RequestState& st, const std::vector<int32_t>& tokens,
                     const PrefillOptions& opts) {
  std::vector<PrefillResult> r = extend_batch(model, {&st}, {tokens}, opts);
  if (!r[0].error.empty()) throw Error(r[0].error);
  return std::move(r[0]);
}

std::vector<uint8_t> cache_contents(const Model& m, const RequestState& st) {
  std::vector<uint8_t> out;
  auto append = [&](const PagedRows& rows, int64_t n) {
    for (int64_t r = 0; r < n; ++r) out.insert(out.end(), rows.row(r), rows.row(r) + rows.row_bytes());
  };
  const int64_t N = st.n_tokens;
  for (size_t l = 0; l < st.layers.size(); ++l) {
    const AttentionState& a = st.layers[l];
    append(a.window, std::min(N, a.window_rows));
    const AttentionWeights& w = m.weights.layers[l].attn;
    if (a.kind.has_compressor()) {
      append(a.comp.rows, a.comp.n_rows);
      append(a.comp.ring, std::min(N, w.compressor.ring_slots()));
    }
    if (a.kind.has_indexer()) {
      append(a.indexer.comp.rows, a.indexer.comp.n_rows);
      append(a.indexer.comp.ring, std::min(N, w.indexer.compressor.ring_slots()));
    }
  }
  return out;
}

uint64_t cache_checksum(const Model& m, const RequestState& st) {
  const std::vector<uint8_t> bytes = cache_contents(m, st);
  return fnv1a64(bytes.data(), bytes.size());
}

PrefillResult prefill(const Model& model, const std::vector<int32_t>& tokens, const PrefillOptions& opts,
                      CachePool* pool) {
  std::unique_ptr<CachePool> own;
  if (!pool) {
    own = pool_for_request(model, int64_t(tokens.size()));
    pool = own.get();
  }
  RequestState st;
  st.init(model, pool);
  return extend(model, st, tokens, opts);
}

}  // namespace dsv4
