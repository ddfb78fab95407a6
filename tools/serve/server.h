// `dsv4 serve`: the HTTP side (docs/SERVER.md). It listens first and loads
// the model on another thread (503 "loading" meanwhile), then parses each
// request (serve/openai.h), submits it to the scheduler and streams or
// returns its answer; SIGINT/SIGTERM end it cleanly.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace dsv4::serve {

struct ServeOptions {
  EngineOptions engine;
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: a free one
  int parallel = 4;
  int max_queue = 64;
  int64_t prefill_chunk = 0;  // prompt positions shared per step, oldest first (0: the engine's chunk_tokens)
  size_t cache_pool_bytes = 0;  // 0: room for `parallel` requests at the limit, at most a quarter of the memory
  std::string api_key;          // empty: no authentication
  // Browser pages from these origins may call the API (CORS); "*": any.
  std::vector<std::string> cors_origins;
  std::string model_name;       // empty: the model directory's last component
  size_t max_body_bytes = size_t(8) << 20;
  double shutdown_timeout_seconds = 10;
  double keepalive_seconds = 5;
  std::string version;          // system_fingerprint "dsv4-VERSION"
};

// Serves until SIGINT/SIGTERM; returns the exit code (1 when the model
// cannot be loaded). Throws dsv4::Error when it cannot listen.
int serve(const ServeOptions& options);

// The cache pool of the pool-sizing rule: `per_request` bytes for each of
// `parallel` requests, capped at a quarter of `memory_bytes`.
size_t default_cache_pool_bytes(size_t per_request, int parallel, size_t memory_bytes);

}  // namespace dsv4::serve
