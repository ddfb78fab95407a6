#include "engine/engine.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <unordered_set>
#include <unistd.h>

#include "core/error.h"
#include "core/memory_usage.h"
#include "core/thread_pool.h"
#include "dist/ep.h"
#include "engine/prefill.h"
#include "engine/prefix_cache.h"
#include "engine/snapshot.h"
#include "io/state_file.h"
#include "io/text_file.h"
#include "io/weight_check.h"
#include "model/model.h"

namespace dsv4 {

struct Engine::Impl {
  EngineOptions opts;
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<CachePool> pool;
  std::unique_ptr<dist::MpiExpertRunner> experts;  // under expert_parallel
  BatchActivations activations;                    // every append's blocks, kept
  int live_sessions = 0;
  // Null when off (no budget and no state directory).
  std::unique_ptr<PrefixCache> prefix;
  PrefixCacheStats prefix_stats;

  // Takes the state of `st` (whose tokens are `tokens`) into the prefix
  // cache unless it holds that state already.
  void take_snapshot(const RequestState& st, const std::vector<int32_t>& tokens) {
    if (!prefix || tokens.empty() || prefix->contains(tokens)) return;
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<uint8_t> blob = snapshot_state(*model, st);
    prefix_stats.snapshot_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    prefix_stats.snapshot_bytes += blob.size();
    ++prefix_stats.snapshots;
    prefix->insert(tokens, std::move(blob));
  }

  PrefillOptions prefill_options(const AppendOptions& what) const {
    PrefillOptions p;
    p.tile_tokens = opts.tile_tokens;
    p.chunk_tokens = opts.chunk_tokens;
    p.max_positions = opts.max_positions;
    p.keep_hidden = what.keep_hidden;
    p.keep_residuals = what.keep_residuals;
    p.teacher = what.teacher;
    p.progress = what.progress;
    return p;
  }
};

struct Session::State {
  RequestState request;
  std::vector<int32_t> tokens;  // every token appended, in order
};

namespace {

volatile uint8_t g_page_in_sink = 0;  // keeps page_in_weights' reads

// DIR/tokenizer.json, checked against the model's vocabulary, or null.
std::unique_ptr<Tokenizer> model_tokenizer(const std::string& dir, const ModelConfig& c) {
  if (!Tokenizer::present_in(dir)) return nullptr;
  auto tok = Tokenizer::load(dir);
  if (tok->size() > c.vocab_size)
    throw Error((std::filesystem::path(dir) / "tokenizer.json").string() + " has token ids up to " +
                std::to_string(tok->size() - 1) + " but config.json has vocab_size " + std::to_string(c.vocab_size));
  return tok;
}

}  // namespace

void EngineOptions::check() const {
  if (threads < 0 || threads > 1024) throw Error("--threads must be in [1, 1024], got " + std::to_string(threads));
  if (tile_tokens < 0) throw Error("--tile-tokens must be >= 0");
  if (chunk_tokens < 0) throw Error("--chunk-tokens must be >= 0");
  if (max_positions < 0) throw Error("--max-context must be >= 0");
  if (snapshot_every < 0) throw Error("--snapshot-every must be >= 0");
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

std::unique_ptr<Engine> Engine::load(const EngineOptions& o) {
  if (o.model_dir.empty()) throw Error("no model directory given (--model DIR)");
  o.check();
  if (o.threads > 0) ThreadPool::set_threads(o.threads);
  auto impl = std::make_unique<Impl>();
  impl->opts = o;
  // Under expert parallelism this rank maps and checks only its share of
  // the routed experts; the MTP block (mtp.*) is never used, so not scanned.
  ExpertRange held;
  const bool ep = o.expert_parallel && dist::active();
  if (ep) {
    require_directory(o.model_dir, "model directory");
    const ModelConfig cfg = ModelConfig::load((std::filesystem::path(o.model_dir) / "config.json").string());
    held = dist::expert_range(cfg.n_routed_experts, dist::rank(), dist::size());
  }
  impl->model = Model::load(o.model_dir, held);
  if (o.check_weights)
    check_weights_finite(impl->model->checkpoint, [held](const std::string& n) {
      return n.rfind("mtp.", 0) != 0 && dist::holds_tensor(n, held);
    });
  impl->tokenizer = model_tokenizer(o.model_dir, impl->model->config);
  if (ep) impl->experts = std::make_unique<dist::MpiExpertRunner>(impl->model->config.n_routed_experts);
  if (o.prefix_cache_bytes > 0 || !o.state_dir.empty())
    impl->prefix = std::make_unique<PrefixCache>(o.prefix_cache_bytes, o.state_dir,
                                                 model_fingerprint(impl->model->config, impl->model->checkpoint));
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

const ModelConfig& Engine::config() const { return impl_->model->config; }
const EngineOptions& Engine::options() const { return impl_->opts; }
const Tokenizer* Engine::tokenizer() const { return impl_->tokenizer.get(); }
int64_t Engine::position_limit() const { return prompt_limit(config(), impl_->opts.max_positions); }
size_t Engine::checkpoint_bytes() const { return impl_->model->checkpoint.total_bytes(); }

namespace {

WeightFormat format_of(const Weight& w) {
  switch (w.kind) {
    case Weight::Kind::kFP8: return WeightFormat::kFP8;
    case Weight::Kind::kFP4: return WeightFormat::kFP4;
    case Weight::Kind::kBF16: return WeightFormat::kBF16;
    case Weight::Kind::kF32: return WeightFormat::kF32;
  }
  return WeightFormat::kF32;
}

}  // namespace

WeightFormats Engine::weight_formats() const {
  const Model& m = *impl_->model;
  const LayerWeights& l0 = m.weights.layers.front();
  WeightFormats f;
  f.attention = format_of(l0.attn.wq_b);
  f.gate = format_of(l0.ffn.gate);
  f.shared_experts = format_of(l0.ffn.shared.w1);
  f.routed_experts = format_of(l0.ffn.experts[size_t(m.experts.begin)].w1);
  f.embed = format_of(m.weights.embed);
  f.head = format_of(m.weights.head);
  // Compressor and indexer formats from the layers that have them (the
  // loader gives every layer the same).
  for (const LayerWeights& l : m.weights.layers) {
    if (l.kind.has_compressor()) f.compressor = format_of(l.attn.compressor.wkv);
    if (l.kind.has_indexer()) f.indexer_proj = format_of(l.attn.indexer.weights_proj);
  }
  return f;
}

DecodeBytes Engine::decode_step_bytes(int64_t t) const {
  return dsv4::decode_step_bytes(config(), weight_formats(), t);
}

std::optional<size_t> Engine::page_in_weights() const {
  // Not the rows of matrices repacked as FP4 or FP8 panels (nor the FP4
  // ones' scales): the panels are resident already, and the rows are read
  // only by fallbacks.
  std::unordered_set<const uint8_t*> repacked;
  auto skip = [&](const Weight& w) {
    if (w.fp4_panels) repacked.insert({w.data, w.scale});
    if (w.fp8_panels) repacked.insert(w.data);
  };
  for (const LayerWeights& l : impl_->model->weights.layers) for_each_quant_matrix(l, skip);
  std::vector<const TensorView*> views;
  size_t bytes = 0;
  for (const auto& kv : impl_->model->checkpoint.tensors())
    if (!repacked.count(kv.second.data)) {
      views.push_back(&kv.second);
      bytes += kv.second.nbytes;
    }
  if (bytes > available_memory_bytes()) return std::nullopt;
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  std::vector<uint8_t> sums(views.size());
  parallel_for_each(int64_t(views.size()), [&](int64_t i) {
    uint8_t s = 0;
    const TensorView& v = *views[size_t(i)];
    for (size_t b = 0; b < v.nbytes; b += page) s = uint8_t(s + v.data[b]);
    sums[size_t(i)] = s;
  });
  uint8_t total = 0;
  for (uint8_t s : sums) total = uint8_t(total + s);
  g_page_in_sink = total;
  return bytes;
}

size_t Engine::cache_bytes_for(int64_t positions) const {
  return request_cache_bytes(*impl_->model, std::max<int64_t>(1, positions));
}

void Engine::set_cache_pool_bytes(size_t bytes) {
  if (impl_->live_sessions > 0) throw Error("the cache pool cannot be resized while sessions hold pages");
  impl_->pool = std::make_unique<CachePool>(bytes);
}

Engine::CachePoolUse Engine::cache_pool_use() const {
  const CachePool* pool = impl_->pool.get();
  if (!pool) return {};
  return {pool->total_pages() * pool->page_bytes(), (pool->total_pages() - pool->free_pages()) * pool->page_bytes()};
}

std::unique_ptr<Session> Engine::new_session() {
  if (!impl_->pool) set_cache_pool_bytes(cache_bytes_for(position_limit()));
  auto state = std::make_unique<Session::State>();
  state->request.init(*impl_->model, impl_->pool.get());
  ++impl_->live_sessions;
  return std::unique_ptr<Session>(new Session(this, std::move(state)));
}

std::vector<PrefillResult> Engine::append_batch(const std::vector<Session*>& sessions,
                                                const std::vector<std::vector<int32_t>>& tokens,
                                                const AppendOptions& what) {
  std::vector<RequestState*> states;
  for (Session* s : sessions) {
    if (s->engine_ != this) throw Error("append_batch: a session of another engine");
    states.push_back(&s->state_->request);
  }
  PrefillOptions po = impl_->prefill_options(what);
  const int64_t every = impl_->opts.snapshot_every;
  if (impl_->prefix && every > 0)
    po.round_done = [&](size_t q, int64_t from, int64_t to) {
      if (to / every == from / every) return;
      // The session's token list still ends where this append started.
      std::vector<int32_t> t = sessions[q]->state_->tokens;
      t.insert(t.end(), tokens[q].begin(), tokens[q].begin() + (to - int64_t(t.size())));
      impl_->take_snapshot(*states[q], t);
    };
  std::vector<PrefillResult> r = extend_batch(*impl_->model, states, tokens, po, impl_->experts.get(),
                                              &impl_->activations);
  for (size_t i = 0; i < sessions.size(); ++i)
    if (r[i].error.empty()) {
      std::vector<int32_t>& t = sessions[i]->state_->tokens;
      t.insert(t.end(), tokens[i].begin(), tokens[i].end());
    }
  return r;
}

// A state whose blob does not fit the model is a warning and is forgotten;
// one that finds no room in the pool is kept for later. Either way the
// session starts empty and the request is prefilled from the start.
std::unique_ptr<Session> Engine::resume(const std::vector<int32_t>& prompt, int64_t* cached_tokens) {
  ++impl_->prefix_stats.lookups;
  if (cached_tokens) *cached_tokens = 0;
  std::unique_ptr<Session> s = new_session();
  if (!impl_->prefix) return s;
  std::optional<PrefixCache::Hit> hit = impl_->prefix->lookup(prompt);
  if (!hit) return s;
  try {
    snapshot_position(*impl_->model, *hit->blob);
  } catch (const Error& e) {
    std::fprintf(stderr, "dsv4: warning: prefix cache: the state of %zu tokens does not fit the model: %s; prefilling instead\n",
                 hit->tokens.size(), e.what());
    impl_->prefix->drop(hit->tokens);
    return s;
  }
  try {
    restore_state(*impl_->model, *hit->blob, s->state_->request);
  } catch (const Error&) {
    return s;  // a full pool: restore_state took no page
  }
  s->state_->tokens = std::move(hit->tokens);
  ++impl_->prefix_stats.hits;
  impl_->prefix_stats.cached_tokens += s->position();
  if (cached_tokens) *cached_tokens = s->position();
  return s;
}

void Engine::remember(const Session& s) {
  if (s.engine_ != this) throw Error("remember: a session of another engine");
  impl_->take_snapshot(s.state_->request, s.state_->tokens);
}

PrefixCacheStats Engine::prefix_cache_stats() const {
  PrefixCacheStats s = impl_->prefix_stats;
  if (impl_->prefix) impl_->prefix->fill_stats(&s);
  return s;
}

dist::EpTotals Engine::take_expert_parallel_totals(double wall_seconds) {
  if (!impl_->experts) return {};
  const dist::EpTotals t = impl_->experts->reduce_totals(wall_seconds);
  impl_->experts->clear_stats();
  return t;
}

Session::Session(Engine* engine, std::unique_ptr<State> state) : engine_(engine), state_(std::move(state)) {}

Session::~Session() {
  state_.reset();  // gives the pages back before the engine's count drops
  --engine_->impl_->live_sessions;
}

int64_t Session::position() const { return state_->request.n_tokens; }
const std::vector<int32_t>& Session::tokens() const { return state_->tokens; }

PrefillResult Session::append(const std::vector<int32_t>& tokens, const AppendOptions& what) {
  std::vector<PrefillResult> r = engine_->append_batch({this}, {tokens}, what);
  if (!r[0].error.empty()) throw Error(r[0].error);
  return std::move(r[0]);
}

std::unique_ptr<Session> Session::fork() const {
  std::unique_ptr<Session> s = engine_->new_session();
  s->restore(*this);
  return s;
}

void Session::restore(const Session& snapshot) {
  if (snapshot.engine_ != engine_) throw Error("a session can only be restored from one of its own engine");
  if (&snapshot == this) return;
  state_->request.copy_from(*engine_->impl_->model, snapshot.state_->request);
  state_->tokens = snapshot.state_->tokens;
}

size_t Session::cache_bytes() const { return state_->request.cache_bytes(); }

uint64_t Session::cache_checksum() const { return dsv4::cache_checksum(*engine_->impl_->model, state_->request); }

}  // namespace dsv4
