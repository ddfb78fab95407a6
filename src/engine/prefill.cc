#include "engine/prefill.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/formats.h"
#include "core/stage_timer.h"
#include "kernels/linear.h"
#include "kernels/norm.h"
#include "model/hc.h"
#include "model/moe.h"

namespace dsv4 {

int64_t prompt_limit(const ModelConfig& c, int64_t max_prompt) {
  return max_prompt > 0 ? std::min<int64_t>(max_prompt, c.max_position_embeddings) : c.max_position_embeddings;
}

void validate_prompt(const ModelConfig& c, const std::vector<int32_t>& tokens, int64_t limit, int64_t start) {
  if (tokens.empty()) throw Error("prompt is empty: at least one token is needed");
  if (start + int64_t(tokens.size()) > limit)
    throw Error("request of " + std::to_string(start + int64_t(tokens.size())) +
                " tokens is longer than the limit of " + std::to_string(limit) +
                " (--max-prompt, capped by max_position_embeddings)");
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= c.vocab_size)
      throw Error("token " + std::to_string(i) + " has id " + std::to_string(tokens[i]) +
                  ", outside [0, vocab_size = " + std::to_string(c.vocab_size) + ")");
}

int32_t argmax(const float* v, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (v[i] > v[best]) best = i;
  return int32_t(best);
}

namespace {

// One transformer block on the tile's residual rows X [n][hc][D].
void block_forward(const Model& m, int layer, const int32_t* tokens, int64_t p0, int64_t n, float* X,
                   AttentionState& st) {
  const ModelConfig& c = m.config;
  const LayerWeights& lw = m.weights.layers[size_t(layer)];
  const int64_t D = c.hidden_size;
  const int hc = c.hc_mult;
  std::vector<float> y(size_t(n * D)), f(size_t(n * D));
  HcMix mix;

  {
    ScopedStage s(Stage::kHc);
    hc_pre(X, n, hc, D, lw.hc_attn, c.hc_sinkhorn_iters, c.hc_eps, c.rms_norm_eps, y.data(), &mix);
    for (int64_t i = 0; i < n; ++i) rms_norm_bf16(y.data() + i * D, lw.attn_norm.data(), D, c.rms_norm_eps, y.data() + i * D);
  }
  attention_forward(lw.attn, c, lw.ratio, m.rope(layer), y.data(), p0, n, st, f.data());
  {
    ScopedStage s(Stage::kHc);
    hc_post(f.data(), X, n, hc, D, mix);
    hc_pre(X, n, hc, D, lw.hc_ffn, c.hc_sinkhorn_iters, c.hc_eps, c.rms_norm_eps, y.data(), &mix);
    for (int64_t i = 0; i < n; ++i) rms_norm_bf16(y.data() + i * D, lw.ffn_norm.data(), D, c.rms_norm_eps, y.data() + i * D);
  }
  moe_forward(lw.ffn, c, layer, y.data(), tokens, n, f.data());
  ScopedStage s(Stage::kHc);
  hc_post(f.data(), X, n, hc, D, mix);
}

}  // namespace

void RequestState::init(const Model& model, CachePool* pool) {
  const ModelConfig& c = model.config;
  n_tokens = 0;
  layers.clear();
  layers.resize(size_t(c.num_hidden_layers));
  for (int l = 0; l < c.num_hidden_layers; ++l)
    layers[size_t(l)].init(pool, c, model.weights.layers[size_t(l)].attn, c.ratio(l));
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

size_t RequestState::cache_bytes() const {
  size_t b = 0;
  for (const AttentionState& s : layers) b += s.bytes_held();
  return b;
}

std::unique_ptr<CachePool> pool_for_request(const Model& model, int64_t n_tokens) {
  CachePool probe(0);
  RequestState st;
  st.init(model, &probe);
  return std::make_unique<CachePool>(st.pages_missing(model, n_tokens) * probe.page_bytes());
}

PrefillResult extend(const Model& model, RequestState& st, const std::vector<int32_t>& tokens,
                     const PrefillOptions& opts) {
  const ModelConfig& c = model.config;
  if (st.n_tokens > 0 && opts.teacher) throw Error("teacher forcing needs a request that starts at position 0");
  validate_prompt(c, tokens, prompt_limit(c, opts.max_prompt), st.n_tokens);
  const int64_t N = int64_t(tokens.size()), D = c.hidden_size, hc = c.hc_mult, L = c.num_hidden_layers;
  const int64_t T = opts.tile_tokens > 0 ? std::min(opts.tile_tokens, N) : N;
  const int64_t start = st.n_tokens;
  st.reserve(model, start + N);  // fails here, before any state changes

  PrefillResult res;
  if (opts.keep_hidden) res.hidden.resize(size_t(N * D));
  if (opts.keep_residuals) res.residuals.resize(size_t(L * N * hc * D));
  std::vector<float> X, head_in(size_t(T * D)), hidden(size_t(T * D)), erow(static_cast<size_t>(D));

  for (int64_t i0 = 0; i0 < N; i0 += T) {
    const int64_t n = std::min(T, N - i0), p0 = start + i0;
    X.resize(size_t(n * hc * D));
    for (int64_t i = 0; i < n; ++i) {
      model.weights.embed.dequant_row(tokens[size_t(i0 + i)], erow.data());
      for (int64_t k = 0; k < hc; ++k) std::copy(erow.begin(), erow.end(), X.begin() + (i * hc + k) * D);
    }
    for (int64_t l = 0; l < L; ++l) {
      if (opts.teacher && l > 0)
        std::memcpy(X.data(), opts.teacher + (((l - 1) * N + i0) * hc) * D, size_t(n * hc * D) * sizeof(float));
      block_forward(model, int(l), tokens.data() + i0, p0, n, X.data(), st.layers[size_t(l)]);
      if (opts.keep_residuals)
        std::memcpy(res.residuals.data() + ((l * N + i0) * hc) * D, X.data(), size_t(n * hc * D) * sizeof(float));
    }
    ScopedStage head_stage(Stage::kHead);
    hc_head(X.data(), n, int(hc), D, model.weights.hc_head, c.hc_eps, c.rms_norm_eps, head_in.data());
    for (int64_t i = 0; i < n; ++i)
      rms_norm_bf16(head_in.data() + i * D, model.weights.norm.data(), D, c.rms_norm_eps, hidden.data() + i * D);
    if (opts.keep_hidden) std::copy(hidden.begin(), hidden.begin() + n * D, res.hidden.begin() + i0 * D);
    if (i0 + n == N) {
      if (!opts.keep_hidden) res.hidden.assign(hidden.begin() + (n - 1) * D, hidden.begin() + n * D);
      res.logits.resize(size_t(c.vocab_size));
      LinearOpts fp32_out;
      fp32_out.out_bf16 = false;
      linear(model.weights.head, hidden.data() + (n - 1) * D, 1, res.logits.data(), fp32_out);
    }
    st.n_tokens = p0 + n;
  }
  res.next_token = argmax(res.logits.data(), c.vocab_size);
  res.cache_bytes = st.cache_bytes();
  return res;
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
