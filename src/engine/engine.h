// The engine as every front end sees it (the dsv4 commands, bench, chat,
// and the server to come): an Engine that loads a checkpoint and owns the
// weights, the cache pool and, under mpirun, the expert-parallel runner; a
// Session per request that appends tokens (prefill, or decode one token at a
// time) and holds that request's caches. Nothing here exposes tensors,
// layers or kernels: a front end includes this header and io/ or core/
// utilities, never model/ or kernels/ (tests/layering_test.cc checks it).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dist/mpi.h"
#include "engine/decode_bytes.h"
#include "engine/request.h"
#include "engine/sampler.h"
#include "io/config.h"
#include "io/tokenizer.h"

namespace dsv4 {

struct EngineOptions {
  std::string model_dir;     // config.json + safetensors (+ tokenizer.json)
  int threads = 0;           // worker threads of the process pool; 0: leave it as it is
  int64_t tile_tokens = 128;   // positions per tile (0 = a whole append in one tile)
  int64_t chunk_tokens = 2048; // positions per MoE step and request (0 = a whole append)
  int64_t max_positions = 0;   // longest request; 0 = max_position_embeddings
  // Scan the used weights for NaN/Inf on load and fail naming the tensor.
  bool check_weights = false;
  // Under mpirun: hold this rank's share of the routed experts and run the
  // others through the MPI runner (PREFILL.md §4). Off: every expert here.
  bool expert_parallel = false;
  // The prefix cache: states of earlier sessions kept by their token ids,
  // for Engine::resume. 0 bytes: off (unless state_dir is set: then the
  // states live in their files only and are read back on demand).
  size_t prefix_cache_bytes = 0;
  // Inside a long append, also keep the state every this many tokens (0:
  // only what remember() is given). Taken at the end of the first chunk
  // round (chunk_tokens positions, rounded up to whole tiles) that reaches
  // or passes each multiple, never at the end of the append itself (that
  // state is remember()'s): with the defaults, exactly at every multiple
  // of 2048.
  int64_t snapshot_every = 2048;
  // Keep the cached states in files here across restarts (empty: memory
  // only); made if missing. A file of another model or format, cut short
  // or damaged is named on stderr and ignored; an unwritable directory or
  // a full disk is a warning and requests still answer.
  std::string state_dir;

  // Throws dsv4::Error naming the first option out of range (the checks
  // Engine::load makes before it reads anything).
  void check() const;
};

class Engine;

// What the prefix cache did since the engine was loaded.
struct PrefixCacheStats {
  int64_t lookups = 0;        // resume() calls
  int64_t hits = 0;           // those that resumed from a cached state
  int64_t cached_tokens = 0;  // positions not prefilled again, summed over hits
  int64_t entries = 0;        // states held now
  int64_t evictions = 0;      // states dropped for room
  size_t bytes = 0;           // bytes the states hold now (in memory; files not counted)
  // The states taken (remember() and inside long appends): how many, the
  // seconds spent copying them out of the sessions' pages (files not
  // included) and their bytes, summed. Per snapshot: divide by snapshots.
  int64_t snapshots = 0;
  double snapshot_seconds = 0;
  size_t snapshot_bytes = 0;
};

// One request's state: its position, caches and last logits. Made by
// Engine::new_session; must not outlive its engine.
class Session {
 public:
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  int64_t position() const;  // tokens processed so far
  // Every token appended so far, in order (position() of them).
  const std::vector<int32_t>& tokens() const;
  // Appends `tokens` at position() (prefill when the session is empty,
  // decode when one token): the last row's logits and greedy next token
  // (and what `what` asks for besides).
  // Throws dsv4::Error on a bad token, a request past the limit or a full
  // cache pool; the session is then unchanged.
  PrefillResult append(const std::vector<int32_t>& tokens, const AppendOptions& what = {});
  // A copy of the whole state at this position (window, compressed and
  // indexer rows, every compressor's partial block, the position) in pages
  // of its own from the same pool: it continues bitwise as this session
  // would. Throws dsv4::Error when the pool cannot hold the copy.
  std::unique_ptr<Session> fork() const;
  // This session becomes a copy of `snapshot` (a session of the same
  // engine, e.g. an earlier fork()); on a full pool it throws and this
  // session is unchanged.
  void restore(const Session& snapshot);

  size_t cache_bytes() const;        // pool pages held
  uint64_t cache_checksum() const;   // FNV-1a of the caches in logical order

 private:
  friend class Engine;
  struct State;
  Session(Engine* engine, std::unique_ptr<State> state);
  Engine* engine_;
  std::unique_ptr<State> state_;
};

class Engine {
 public:
  // Reads DIR/config.json, maps and validates the checkpoint (under
  // expert_parallel only this rank's routed experts), loads DIR/tokenizer.json
  // when there is one. Throws dsv4::Error naming the file and field.
  static std::unique_ptr<Engine> load(const EngineOptions& o);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const ModelConfig& config() const;
  const EngineOptions& options() const;
  const Tokenizer* tokenizer() const;  // null when the model directory has none
  int64_t position_limit() const;      // max_positions capped by max_position_embeddings
  size_t checkpoint_bytes() const;     // the mapped safetensors files
  // Reads every page of the mapped weights the kernels read once
  // (benchmarks, the server: the first request after loading would
  // otherwise pay for faulting them in), where they all fit in the
  // available memory, and says how many bytes that was; nothing, with
  // nothing read, where they do not fit (they would evict each other).
  std::optional<size_t> page_in_weights() const;
  // The formats of the loaded matrices, and what one session's decode step
  // at position t reads with them (engine/decode_bytes.h).
  WeightFormats weight_formats() const;
  DecodeBytes decode_step_bytes(int64_t t) const;

  // The cache pool: bytes one session of `positions` positions needs, and
  // the pool's size (made on first use for one request at the limit unless
  // set; set it while no session is alive).
  size_t cache_bytes_for(int64_t positions) const;
  void set_cache_pool_bytes(size_t bytes);
  // The pool's size and the bytes sessions hold now (0 and 0 before the
  // pool is made).
  struct CachePoolUse {
    size_t total_bytes = 0;
    size_t used_bytes = 0;
  };
  CachePoolUse cache_pool_use() const;
  std::unique_ptr<Session> new_session();

  // The prefix cache (engine/prefix_cache.h; docs/ARCHITECTURE.md). Like
  // everything else here, to be driven from one thread: nothing is locked.
  //
  // A session for a request whose prompt is `prompt`: a copy of the longest
  // cached state whose tokens are a prefix of `prompt` and leave at least
  // one of its tokens to append (so that the append gives logits), or an
  // empty session. *cached_tokens (if given) = its position(). The caller
  // then appends prompt[position()..]: the results are bitwise those of
  // prefilling the whole prompt.
  std::unique_ptr<Session> resume(const std::vector<int32_t>& prompt, int64_t* cached_tokens = nullptr);
  // Keeps `s`'s state at its position in the prefix cache (nothing when the
  // cache is off); e.g. at the end of every request.
  void remember(const Session& s);
  PrefixCacheStats prefix_cache_stats() const;

  // Advances several sessions together: session i appends tokens[i]. Their
  // rows share every MoE step (one pass over each expert's weights) and
  // each session's results are bitwise those it gives alone. A session
  // whose tokens are invalid or that gets no cache pages fails alone (its
  // result's `error`; its state unchanged). Under expert_parallel every
  // rank calls this, with its own sessions, the same number of times.
  std::vector<PrefillResult> append_batch(const std::vector<Session*>& sessions,
                                          const std::vector<std::vector<int32_t>>& tokens,
                                          const AppendOptions& what = {});

  // Expert-parallel traffic since the last call (collective under
  // expert_parallel: rank 0 gets every rank's totals); empty without it.
  dist::EpTotals take_expert_parallel_totals(double wall_seconds);

 private:
  friend class Session;
  struct Impl;
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsv4
