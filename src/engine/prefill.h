// Prefill (PREFILL.md §1, §3, §4). A request is walked in chunks of
// chunk_tokens positions, each cut into tiles of tile_tokens: layer-major
// within the chunk (attention tile by tile, then one MoE step over every row
// of the chunk), chunk after chunk. Only the per-layer caches of RequestState
// cross tiles and chunks. Several requests run together: per chunk round
// their rows share each MoE step (one weight pass), each keeps its own caches.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <memory>

#include "core/cache_pool.h"
#include "engine/request.h"
#include "engine/sampler.h"
#include "model/activations.h"
#include "model/attention.h"
#include "model/model.h"
#include "model/moe.h"

namespace dsv4 {

// Everything a request carries from one tile to the next: per layer, the
// raw KV window, the compressed and indexer rows and the compressor states.
struct RequestState {
  std::vector<AttentionState> layers;
  int64_t n_tokens = 0;  // positions already processed

  // Empty state whose pages come from `pool` (which must outlive it).
  void init(const Model& model, CachePool* pool);
  // Pages missing to hold the state of the first n_tokens positions.
  size_t pages_missing(const Model& model, int64_t n_tokens) const;
  // Takes those pages, all or none: on a full pool it throws dsv4::Error and
  // the pool and this state are unchanged.
  void reserve(const Model& model, int64_t n_tokens);
  // Bytes of all cache pages the request holds.
  size_t cache_bytes() const;
  // This state becomes a copy of `src` (same model and pool) in pages of its
  // own, all or none: on a full pool it throws dsv4::Error and this state
  // is unchanged.
  void copy_from(const Model& model, const RequestState& src);
};

// Processes `tokens` at positions [state.n_tokens, state.n_tokens + N) in
// tiles, continuing from `state` (prefill when it is empty, decoding when N
// is 1). Teacher forcing is only accepted from position 0.
PrefillResult extend(const Model& model, RequestState& state, const std::vector<int32_t>& tokens,
                     const PrefillOptions& opts);

// What one extend_batch call works in: the residual stream X
// [rows][hc][D] of a chunk round and the layers' blocks, kept from layer to
// layer and call to call (blocks this large, 32 MB and more for 2048 Flash
// rows, would be mapped, faulted in and zeroed afresh by every allocation).
// The engine keeps one and passes it to every call.
struct BatchActivations {
  std::vector<float> X;
  LayerActivations layer;
};

// Several requests at once: request i appends tokens[i] to states[i]. A
// request that is invalid or does not get its cache pages fails alone (its
// result's `error` says why; its state is unchanged); the others go on and
// give bitwise the results they give alone. With `experts`, the routed
// experts run through it and the number of chunk rounds is agreed with it
// (every participant takes the same MoE steps, with zero rows if need be).
// `act` holds the activation blocks (null: this call makes its own).
std::vector<PrefillResult> extend_batch(const Model& model, const std::vector<RequestState*>& states,
                                        const std::vector<std::vector<int32_t>>& tokens, const PrefillOptions& opts,
                                        ExpertRunner* experts = nullptr, BatchActivations* act = nullptr);

// A whole prompt from empty state, with pages from `pool` (null: a pool of
// exactly the request's size).
PrefillResult prefill(const Model& model, const std::vector<int32_t>& tokens, const PrefillOptions& opts,
                      CachePool* pool = nullptr);

// Bytes of the pages one request of n_tokens positions holds.
size_t request_cache_bytes(const Model& model, int64_t n_tokens);
// A pool sized for one request of n_tokens positions.
std::unique_ptr<CachePool> pool_for_request(const Model& model, int64_t n_tokens);

// The request's cache contents in logical order (slot by slot: window,
// compressed rows, compressor state, per layer), whatever pages hold them.
std::vector<uint8_t> cache_contents(const Model& model, const RequestState& st);
// FNV-1a 64 of cache_contents: equal caches, equal checksums.
uint64_t cache_checksum(const Model& model, const RequestState& st);

}  // namespace dsv4
