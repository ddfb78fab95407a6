// The server's scheduler: one thread that owns the Engine and runs every
// admitted request together (continuous batching), while HTTP threads submit
// requests and read their tokens as they come.
//
// Each step is one Engine::append_batch over the running requests: a
// decoding request appends its last sampled token, and the requests still
// prefilling share one budget of prompt positions (prefill_chunk), oldest
// first: the oldest takes what it still needs up to the budget, the next
// what is left, and so on (a request left with nothing waits for the next
// step). So a long prompt delays the streams beside it by at most one
// budget per step, first tokens come in arrival order rather than all
// after the last prompt, and every request shares each step's weight
// passes. Requests join and leave between steps. A request's tokens
// depend only on the request (the engine's batch results are bitwise those
// of the request alone, and sampling draws from (seed, position)): whatever
// else runs, the same request gives the same tokens.
//
// Admission: waiting requests are admitted in arrival order while fewer than
// `parallel` run and the cache pool has room for the prompt plus max_tokens
// (pages counted with Engine::cache_bytes_for, so a running request never
// meets a full pool); others wait. submit() refuses a request when
// `max_queue` are already waiting (QueueFull: HTTP 429).
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"

namespace dsv4::serve {

// What a client asked for, in tokens.
struct GenerationRequest {
  std::vector<int32_t> prompt;  // non-empty; prompt.size() < engine.position_limit()
  SamplingParams sampling;      // checked by the caller
  int64_t max_tokens = 16;      // new tokens at most (>= 1); cut to what the position limit leaves
  std::vector<std::string> stop;  // stop strings (need the tokenizer); the text ends before the first
  bool ignore_eos = false;
  // Log-probabilities: -1 none; 0..20: the chosen token's, and this many
  // most likely alternatives per position (from the raw logits, before
  // temperature and cuts, as OpenAI reports them).
  int top_logprobs = -1;
  // The prefix cache keeps the state after prompt + every generated token
  // (one extra engine step after the answer, not streamed) so that the next
  // turn of a conversation resumes past this answer; and, in thinking mode,
  // the state one token before the end of the prompt (the next turn's
  // layout parts there).
  bool remember_answer = true;
  bool remember_before_last = false;
  // The answer's own constraints start once it has generated `answer_after`
  // (thinking mode: </think>, so the reasoning stays free); -1: at once.
  int32_t answer_after = -1;
  // Tokens the answer is made to write when its constraints start (a
  // tool_choice that requires a call: the opening of a DSML tool-call
  // block), instead of draws; then drawing resumes. They count against
  // max_tokens like any other.
  std::vector<int32_t> forced;
  // JSON mode (needs the tokenizer): from then on every draw is masked to
  // tokens that keep the text a prefix of one JSON object
  // (serve/json_constraint.h), and the answer ends (kStop) with the object.
  bool json_object = false;
};

// One generated token.
struct TokenOut {
  int32_t id = -1;
  float logprob = 0;                                // when top_logprobs >= 0
  std::vector<std::pair<int32_t, float>> top;        // top_logprobs alternatives, most likely first (ties: lower id)
};

// Why a request ended.
enum class Finish { kNone, kStop, kLength, kCancelled, kError };

// What a request has produced since the reader last took it.
struct Update {
  std::vector<TokenOut> tokens;  // new tokens, in order (eos included when it ended the request)
  std::string text;              // text that became final (TextStream: whole characters, cut before a stop string)
  Finish finish = Finish::kNone; // set on the last update
  std::string error;             // kError: why (e.g. the engine refused the tokens)
  // Filled on the last update.
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;      // of the prompt, restored from the prefix cache
  int64_t completion_tokens = 0;  // tokens generated (eos included)
  double queue_seconds = 0;       // submit to admission
  double first_token_seconds = 0; // submit to the first token
};

// The reader's side of one request: shared between the scheduler and the
// HTTP thread that streams it.
class RequestStream {
 public:
  // Waits until there is something new (or `timeout` passes) and moves it
  // out. Returns false on timeout with nothing new (the caller may then send
  // a keep-alive and check its client). After the update with finish set,
  // returns false at once.
  bool next(Update* out, std::chrono::milliseconds timeout);
  // The client went away: the scheduler drops the request and frees its
  // pages at its next step (its final update says kCancelled).
  void cancel();
  bool admitted() const;  // has left the queue (prefill started)

 private:
  friend class Scheduler;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  Update pending_;
  bool has_pending_ = false;
  bool done_ = false;       // the final update was produced
  bool delivered_ = false;  // ... and taken
  bool cancelled_ = false;
  bool admitted_ = false;
};

// Counters for /metrics (totals since start, gauges now).
struct SchedulerMetrics {
  int64_t running = 0, queued = 0;
  int64_t requests_total = 0, requests_rejected = 0, requests_cancelled = 0, requests_failed = 0;
  int64_t prompt_tokens_total = 0;     // prompt tokens of finished requests
  int64_t cached_tokens_total = 0;     // of those, restored from the prefix cache
  int64_t generated_tokens_total = 0;
  size_t cache_pool_bytes_used = 0, cache_pool_bytes_total = 0;
  size_t prefix_cache_bytes = 0;
  int64_t prefix_cache_entries = 0;
  // Prompt tokens prefilled and tokens generated per second of the steps
  // that did them, over the last minute (0 when nothing ran).
  double prefill_tokens_per_second = 0, decode_tokens_per_second = 0;
  int64_t steps_total = 0;
};

class QueueFull : public std::exception {
 public:
  const char* what() const noexcept override { return "the request queue is full"; }
};
class ShuttingDown : public std::exception {
 public:
  const char* what() const noexcept override { return "the server is shutting down"; }
};

struct SchedulerOptions {
  int parallel = 4;    // requests running at once
  int max_queue = 64;  // requests waiting for admission
  // Prompt positions all prefilling requests append together per step,
  // oldest first; 0: the engine's chunk_tokens (rounded up to whole tiles).
  int64_t prefill_chunk = 0;
};

class Scheduler {
 public:
  // Starts the scheduler thread. The engine's cache pool must be sized; the
  // engine is used from that thread only from now on.
  Scheduler(Engine& engine, SchedulerOptions options);
  // shutdown(0) if not done yet, then joins the thread.
  ~Scheduler();

  // Queues a request. Throws QueueFull, ShuttingDown, or dsv4::Error for a
  // request that cannot run at all (empty prompt, a token out of range, a
  // prompt at or over the position limit, more cache than the whole pool).
  std::shared_ptr<RequestStream> submit(GenerationRequest request);

  // Stops accepting (submit throws ShuttingDown), lets the running and
  // queued requests go on for up to `deadline`, then ends the rest (running
  // ones with Finish::kLength, cut short as a token budget would; queued
  // ones with Finish::kError "the server is shutting down") and stops the
  // thread. Every stream gets its final update.
  void shutdown(std::chrono::milliseconds deadline);

  SchedulerMetrics metrics() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsv4::serve
