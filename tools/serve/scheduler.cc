#include "serve/scheduler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "core/error.h"
#include "core/thread_pool.h"
#include "io/text_stream.h"
#include "serve/json_constraint.h"

namespace dsv4::serve {

using Clock = std::chrono::steady_clock;

namespace {

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// The chosen token's log-probability and the `top` most likely alternatives,
// from the raw logits: log-softmax in double, ties to the lower id.
TokenOut token_with_logprobs(int32_t id, const std::vector<float>& logits, int top) {
  TokenOut t;
  t.id = id;
  if (top < 0) return t;
  double m = -INFINITY;
  for (float v : logits) m = std::max(m, double(v));
  double sum = 0;
  for (float v : logits) sum += std::exp(double(v) - m);
  const double lse = m + std::log(sum);
  t.logprob = float(double(logits[size_t(id)]) - lse);
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  const size_t k = std::min(size_t(top), ids.size());
  std::partial_sort(ids.begin(), ids.begin() + long(k), ids.end(), [&](int32_t a, int32_t b) {
    return logits[size_t(a)] != logits[size_t(b)] ? logits[size_t(a)] > logits[size_t(b)] : a < b;
  });
  for (size_t i = 0; i < k; ++i) t.top.emplace_back(ids[i], float(double(logits[size_t(ids[i])]) - lse));
  return t;
}

}  // namespace

// ---- RequestStream ------------------------------------------------------------

bool RequestStream::next(Update* out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (delivered_) return false;
  if (!cv_.wait_for(lock, timeout, [&] { return has_pending_; })) return false;
  *out = std::move(pending_);
  pending_ = Update();
  has_pending_ = false;
  if (out->finish != Finish::kNone) delivered_ = true;
  return true;
}

void RequestStream::cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_ = true;
}

bool RequestStream::admitted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return admitted_;
}

// ---- The scheduler --------------------------------------------------------------

namespace {

// One request from submit() to its final update (and, with remember_answer,
// the extra step after it).
struct Job {
  GenerationRequest req;
  std::shared_ptr<RequestStream> stream;
  int64_t max_tokens = 0;  // req.max_tokens cut to what the position limit leaves
  size_t reserved = 0;     // pool bytes counted for it at admission
  Clock::time_point submitted, admitted;

  // From admission on: the scheduler thread only.
  enum class Phase { kPrefill, kDecode, kRememberAnswer } phase = Phase::kPrefill;
  std::unique_ptr<Session> session;
  int64_t cached = 0;
  bool before_last_pending = false;  // remember_before_last, not yet reached
  bool finished = false;  // the stream has its final update
  bool over = false;      // done with the engine: leaves at the next drop
  std::optional<TextStream> text;
  std::vector<int32_t> generated;
  // req.answer_after has been generated (or is -1): the constraints apply.
  bool answer_started = false;
  size_t forced_at = 0;  // the next of req.forced to write
  // JSON mode's state, once it applies (req.json_object).
  std::optional<JsonPrefix> json;
  double first_token_seconds = 0;

  bool forcing() const { return answer_started && forced_at < req.forced.size(); }
};

// What one step did, for the tokens/s of the last minute.
struct StepRecord {
  Clock::time_point end;
  double seconds = 0;
  int64_t prefilled = 0, generated = 0;
};

}  // namespace

struct Scheduler::Impl {
  Impl(Engine& e, SchedulerOptions o);
  void run();

  void check(const GenerationRequest& r, Job* job) const;

  // Under mu.
  void admit_waiting(std::vector<std::unique_ptr<Job>>* admitted);
  void take_cancelled_from_queue(std::vector<std::unique_ptr<Job>>* out);

  // The scheduler thread.
  void start(Job& job);
  void step();
  std::vector<int32_t> tokens_for_step(const Job& job, int64_t* prefill_left) const;
  bool after_append(Job& job, const PrefillResult& r, int64_t appended, StepRecord* rec);
  void keep_prefill_state(Job& job, int64_t from, int64_t to);
  void take_tokens(const std::vector<Job*>& jobs, const std::vector<PrefillResult>& results,
                   const std::vector<size_t>& drawing);
  int32_t choose(const Job& job, const std::vector<float>& logits, int64_t position) const;
  bool advance_constraints(Job& job, int32_t id);
  void start_answer(Job& job);
  void take_token(Job& job, TokenOut t);
  void end_answer(Job& job, Finish why, const std::string& error = {});
  void deliver(Job& job, TokenOut* token, std::string text, Finish finish, const std::string& error = {});
  void count_finished(Job& job, Finish why);
  void drop_cancelled();
  void drop_finished();
  void remember(const Session& s);
  void record_step(const StepRecord& r);
  void publish();

  Engine& engine;
  const SchedulerOptions options;
  size_t pool_total = 0;
  int64_t prefill_chunk = 0;  // prompt positions the prefilling requests share per step (0: no limit)

  mutable std::mutex mu;
  std::condition_variable wake;
  std::deque<std::unique_ptr<Job>> queue;
  bool stopping = false;
  Clock::time_point stop_at;
  SchedulerMetrics counters;
  size_t reserved_bytes = 0;
  int64_t running_count = 0;
  std::deque<StepRecord> recent;  // steps of the last minute

  // The scheduler thread's own.
  std::vector<std::unique_ptr<Job>> running;
  JsonVocabulary json_vocabulary;  // JSON mode's, made at its first request

  std::mutex join_mu;
  std::thread thread;
};

Scheduler::Impl::Impl(Engine& e, SchedulerOptions o) : engine(e), options(o) {
  if (options.parallel < 1) throw Error("the scheduler needs parallel >= 1");
  if (options.max_queue < 0) throw Error("the scheduler needs max_queue >= 0");
  // A pool not made yet is made on first use for one request at the limit.
  pool_total = engine.cache_pool_use().total_bytes;
  if (pool_total == 0) pool_total = engine.cache_bytes_for(engine.position_limit());
  if (options.prefill_chunk < 0) throw Error("the scheduler needs prefill_chunk >= 0");
  // The engine rounds a chunk up to whole tiles; so do we, so that by
  // default a step's append is at most one chunk round.
  prefill_chunk = options.prefill_chunk;
  if (prefill_chunk == 0) {
    prefill_chunk = engine.options().chunk_tokens;
    const int64_t tile = engine.options().tile_tokens;
    if (prefill_chunk > 0 && tile > 0) prefill_chunk = (prefill_chunk + tile - 1) / tile * tile;
  }
  counters.cache_pool_bytes_total = pool_total;
  counters.cache_pool_bytes_used = engine.cache_pool_use().used_bytes;
  const PrefixCacheStats pc = engine.prefix_cache_stats();
  counters.prefix_cache_bytes = pc.bytes;
  counters.prefix_cache_entries = pc.entries;
}

Scheduler::Scheduler(Engine& engine, SchedulerOptions options) : impl_(std::make_unique<Impl>(engine, options)) {
  impl_->thread = std::thread([this] { impl_->run(); });
}

Scheduler::~Scheduler() { shutdown(std::chrono::milliseconds(0)); }

// ---- The HTTP threads' side -----------------------------------------------------

// Refuses what can never run (dsv4::Error) and fills in the job's budget and
// reservation. Touches only the engine's constant parts.
void Scheduler::Impl::check(const GenerationRequest& r, Job* job) const {
  const int64_t n = int64_t(r.prompt.size()), limit = engine.position_limit();
  if (n >= limit)
    throw Error("This model's maximum context length is " + std::to_string(limit) + " tokens; the prompt has " +
                std::to_string(n) + " tokens.");
  validate_prompt(engine.config(), r.prompt, limit);
  if (r.max_tokens < 1) throw Error("max_tokens must be >= 1");
  if (r.top_logprobs < -1 || r.top_logprobs > 20) throw Error("top_logprobs must be between 0 and 20");
  r.sampling.check(engine.config().vocab_size);
  for (const int32_t id : r.forced)
    if (id < 0 || id >= engine.config().vocab_size)
      throw Error("forced token " + std::to_string(id) + " is outside the vocabulary");
  if (!r.stop.empty() && !engine.tokenizer()) throw Error("stop strings need the model's tokenizer.json");
  if (r.json_object && !engine.tokenizer()) throw Error("JSON mode needs the model's tokenizer.json");
  // The first token comes from the prompt's logits: K tokens take n + K - 1
  // positions, and remember_answer one more where the limit leaves it.
  job->max_tokens = std::min(r.max_tokens, limit - n + 1);
  job->reserved = engine.cache_bytes_for(std::min(n + job->max_tokens, limit));
  if (job->reserved > pool_total)
    throw Error("the request needs " + std::to_string(job->reserved) + " bytes of cache, more than the pool's " +
                std::to_string(pool_total));
}

std::shared_ptr<RequestStream> Scheduler::submit(GenerationRequest request) {
  Impl& s = *impl_;
  auto job = std::make_unique<Job>();
  try {
    s.check(request, job.get());
  } catch (...) {
    std::lock_guard<std::mutex> lock(s.mu);
    ++s.counters.requests_rejected;
    throw;
  }
  job->req = std::move(request);
  job->stream = std::make_shared<RequestStream>();
  auto stream = job->stream;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.stopping || int64_t(s.queue.size()) >= s.options.max_queue) {
      ++s.counters.requests_rejected;
      if (s.stopping) throw ShuttingDown();
      throw QueueFull();
    }
    job->submitted = Clock::now();
    s.queue.push_back(std::move(job));
    ++s.counters.requests_total;
    s.counters.queued = int64_t(s.queue.size());
  }
  s.wake.notify_one();
  return stream;
}

void Scheduler::shutdown(std::chrono::milliseconds deadline) {
  Impl& s = *impl_;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    const Clock::time_point at = Clock::now() + deadline;
    // A second call may bring the deadline forward, never push it back.
    s.stop_at = s.stopping ? std::min(s.stop_at, at) : at;
    s.stopping = true;
  }
  s.wake.notify_all();
  std::lock_guard<std::mutex> lock(s.join_mu);
  if (s.thread.joinable()) s.thread.join();
}

SchedulerMetrics Scheduler::metrics() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->counters;
}

// ---- The scheduler thread ---------------------------------------------------------

void Scheduler::Impl::run() {
  for (;;) {
    std::vector<std::unique_ptr<Job>> admitted, dropped;
    bool at_deadline = false;
    {
      std::unique_lock<std::mutex> lock(mu);
      // Nothing to do: sleep until a submit or shutdown.
      wake.wait(lock, [&] { return !queue.empty() || !running.empty() || stopping; });
      at_deadline = stopping && Clock::now() >= stop_at;
      if (at_deadline) {
        for (auto& j : queue) dropped.push_back(std::move(j));
        queue.clear();
      } else {
        take_cancelled_from_queue(&dropped);
        admit_waiting(&admitted);
      }
    }
    for (auto& j : dropped)
      end_answer(*j, at_deadline ? Finish::kError : Finish::kCancelled,
                 at_deadline ? "the server is shutting down" : "");
    if (at_deadline) {
      for (auto& j : running)
        if (!j->finished) end_answer(*j, Finish::kLength);
      for (auto& j : running) j->over = true;
    } else {
      drop_cancelled();
      step();
      // Started after the step, so that a request that finished just before
      // has its answer remembered (remember_answer's step) when the next
      // turn of its conversation resumes from the cache.
      for (auto& j : admitted) start(*j);
      for (auto& j : admitted) running.push_back(std::move(j));
    }
    drop_finished();
    publish();
    std::lock_guard<std::mutex> lock(mu);
    if (at_deadline || (stopping && queue.empty() && running.empty())) return;
  }
}

void Scheduler::Impl::take_cancelled_from_queue(std::vector<std::unique_ptr<Job>>* out) {
  for (auto it = queue.begin(); it != queue.end();) {
    bool cancelled;
    {
      std::lock_guard<std::mutex> lock((*it)->stream->mu_);
      cancelled = (*it)->stream->cancelled_;
    }
    if (cancelled) {
      out->push_back(std::move(*it));
      it = queue.erase(it);
    } else {
      ++it;
    }
  }
}

// Arrival order: a request that does not fit waits, and so do those after it
// (no overtaking, so that a large request is not starved by small ones).
void Scheduler::Impl::admit_waiting(std::vector<std::unique_ptr<Job>>* admitted) {
  while (!queue.empty() && running_count < options.parallel && reserved_bytes + queue.front()->reserved <= pool_total) {
    reserved_bytes += queue.front()->reserved;
    ++running_count;
    admitted->push_back(std::move(queue.front()));
    queue.pop_front();
  }
}

void Scheduler::Impl::start(Job& job) {
  job.admitted = Clock::now();
  {
    std::lock_guard<std::mutex> lock(job.stream->mu_);
    job.stream->admitted_ = true;
  }
  try {
    job.session = engine.resume(job.req.prompt, &job.cached);
  } catch (const std::exception& e) {
    end_answer(job, Finish::kError, e.what());
    return;
  }
  const int64_t n = int64_t(job.req.prompt.size());
  // As the CLI: the state one token before the end is kept only when the
  // cache did not already reach it.
  job.before_last_pending = job.req.remember_before_last && job.cached < n - 1;
  if (engine.tokenizer()) job.text.emplace(*engine.tokenizer(), job.req.stop);
  if (job.req.json_object && json_vocabulary.bytes.empty())
    json_vocabulary = serve::json_vocabulary(*engine.tokenizer());
  if (job.req.answer_after < 0) start_answer(job);
}

// The answer's constraints apply from here on.
void Scheduler::Impl::start_answer(Job& job) {
  job.answer_started = true;
  if (job.req.json_object) job.json.emplace();
}

// A prefilling request appends the next part of its prompt that the step's
// budget still has room for (stopping one token short of the end when that
// state is to be kept; nothing when the budget is spent); a decoding one its
// last token; a finished one with remember_answer its last token too.
std::vector<int32_t> Scheduler::Impl::tokens_for_step(const Job& job, int64_t* prefill_left) const {
  if (job.phase != Job::Phase::kPrefill) return {job.generated.back()};
  const std::vector<int32_t>& p = job.req.prompt;
  const int64_t pos = job.session->position();
  int64_t end = int64_t(p.size()) - (job.before_last_pending ? 1 : 0);
  if (prefill_chunk > 0) {
    end = std::min(end, pos + *prefill_left);
    *prefill_left -= end - pos;
  }
  return std::vector<int32_t>(p.begin() + pos, p.begin() + end);
}

void Scheduler::Impl::step() {
  std::vector<Job*> jobs;
  std::vector<Session*> sessions;
  std::vector<std::vector<int32_t>> tokens;
  int64_t prefill_left = prefill_chunk;  // `running` is in arrival order: the oldest prompts first
  for (auto& j : running) {
    if (j->over) continue;
    std::vector<int32_t> t = tokens_for_step(*j, &prefill_left);
    if (t.empty()) continue;  // a prompt waiting for the budget
    jobs.push_back(j.get());
    sessions.push_back(j->session.get());
    tokens.push_back(std::move(t));
  }
  if (jobs.empty()) return;
  StepRecord rec;
  const Clock::time_point t0 = Clock::now();
  std::vector<PrefillResult> results;
  try {
    results = engine.append_batch(sessions, tokens);
  } catch (const std::exception& e) {
    for (Job* j : jobs) end_answer(*j, Finish::kError, e.what());
    return;
  }
  std::vector<size_t> drawing;  // the jobs whose append ended in a token to draw
  for (size_t i = 0; i < jobs.size(); ++i) {
    try {
      if (after_append(*jobs[i], results[i], int64_t(tokens[i].size()), &rec)) drawing.push_back(i);
    } catch (const std::exception& e) {
      if (!jobs[i]->finished) end_answer(*jobs[i], Finish::kError, e.what());
      jobs[i]->over = true;
    }
  }
  take_tokens(jobs, results, drawing);
  rec.end = Clock::now();
  rec.seconds = seconds_between(t0, rec.end);
  record_step(rec);
}

bool Scheduler::Impl::after_append(Job& job, const PrefillResult& r, int64_t appended, StepRecord* rec) {
  if (!r.error.empty()) {
    if (!job.finished) end_answer(job, Finish::kError, r.error);
    job.over = true;
    return false;
  }
  const int64_t n = int64_t(job.req.prompt.size()), pos = job.session->position();
  switch (job.phase) {
    case Job::Phase::kPrefill:
      rec->prefilled += appended;
      if (pos < n) {
        keep_prefill_state(job, pos - appended, pos);
        return false;
      }
      job.phase = Job::Phase::kDecode;
      break;
    case Job::Phase::kDecode:
      break;
    case Job::Phase::kRememberAnswer:
      remember(*job.session);
      job.over = true;
      return false;
  }
  ++rec->generated;
  return true;
}

// The tokens of the jobs `drawing` indexes, each drawn from its own row of
// logits alone (engine/sampler.h): so the draws share the thread pool (16
// of ~1 ms each a 16-stream step), and the jobs take them in order.
void Scheduler::Impl::take_tokens(const std::vector<Job*>& jobs, const std::vector<PrefillResult>& results,
                                  const std::vector<size_t>& drawing) {
  std::vector<TokenOut> drawn(drawing.size());
  std::vector<std::string> failed(drawing.size());
  parallel_for_each(int64_t(drawing.size()), [&](int64_t d) {
    const Job& job = *jobs[drawing[size_t(d)]];
    const std::vector<float>& logits = results[drawing[size_t(d)]].logits;
    try {
      const int64_t position = int64_t(job.req.prompt.size() + job.generated.size());
      drawn[size_t(d)] = token_with_logprobs(choose(job, logits, position), logits, job.req.top_logprobs);
    } catch (const std::exception& e) {
      failed[size_t(d)] = e.what();
    }
  });
  for (size_t d = 0; d < drawing.size(); ++d) {
    Job& job = *jobs[drawing[d]];
    try {
      if (!failed[d].empty()) throw Error(failed[d]);
      take_token(job, std::move(drawn[d]));
    } catch (const std::exception& e) {
      if (!job.finished) end_answer(job, Finish::kError, e.what());
      job.over = true;
    }
  }
}

// Inside a prompt: the state one token before its end (remember_before_last),
// and the periodic snapshots the engine takes inside one long append
// (snapshot_every), which our chunk-per-step appends would otherwise skip.
void Scheduler::Impl::keep_prefill_state(Job& job, int64_t from, int64_t to) {
  const int64_t n = int64_t(job.req.prompt.size()), every = engine.options().snapshot_every;
  if (job.before_last_pending && to == n - 1) {
    remember(*job.session);
    job.before_last_pending = false;
  } else if (every > 0 && from / every < to / every) {
    remember(*job.session);
  }
}

// The token for `position`: the next forced one, or a draw (as
// tools/generation.cc draws it), in JSON mode among the tokens that keep
// the object possible (the others' logits -inf). Any thread.
int32_t Scheduler::Impl::choose(const Job& job, const std::vector<float>& logits, int64_t position) const {
  if (job.forcing()) return job.req.forced[job.forced_at];
  if (!job.json) return sample(logits, job.req.sampling, position, job.generated);
  // Kept per thread: fresh half-megabyte rows would be faulted in page by
  // page each draw (sampler.cc's note).
  thread_local std::vector<uint8_t> allowed;
  thread_local std::vector<float> masked;
  allowed_tokens(*job.json, json_vocabulary, &allowed);
  masked.assign(logits.begin(), logits.end());
  for (size_t id = 0; id < masked.size(); ++id)
    if (id >= allowed.size() || !allowed[id]) masked[id] = -INFINITY;
  return sample(masked, job.req.sampling, position, job.generated);
}

// The forced tokens and JSON mode after token `id`: whether it completed
// the JSON object.
bool Scheduler::Impl::advance_constraints(Job& job, int32_t id) {
  if (!job.answer_started) {
    if (id == job.req.answer_after) start_answer(job);
    return false;
  }
  if (job.forcing()) {
    ++job.forced_at;
    return false;
  }
  if (!job.json) return false;
  if (!job.json->feed(json_vocabulary.bytes.at(size_t(id))))
    throw Error("JSON mode: token " + std::to_string(id) + " breaks the object");
  return job.json->complete();
}

// The token drawn for position prompt + i (as tools/generation.cc draws
// it), and whether it ends the answer.
void Scheduler::Impl::take_token(Job& job, TokenOut t) {
  const int64_t i = int64_t(job.generated.size());
  const int32_t id = t.id;
  job.generated.push_back(id);
  const bool json_done = advance_constraints(job, id);
  if (i == 0) job.first_token_seconds = seconds_between(job.submitted, Clock::now());
  const bool eos = !job.req.ignore_eos && id == engine.config().eos_token_id;
  std::string text;
  if (job.text && !eos) text = job.text->push(id);
  Finish why = Finish::kNone;
  if (eos || json_done || (job.text && job.text->stopped()))
    why = Finish::kStop;
  else if (int64_t(job.generated.size()) >= job.max_tokens)
    why = Finish::kLength;
  if (why == Finish::kNone) {
    deliver(job, &t, std::move(text), Finish::kNone);
    return;
  }
  if (job.text) text += job.text->finish();
  deliver(job, &t, std::move(text), why);
  // The client has its answer now; the state after it is kept for the next
  // turn (one more step with the last token, as generate's append_last).
  if (job.req.remember_answer && job.session->position() < engine.position_limit()) {
    job.phase = Job::Phase::kRememberAnswer;
  } else {
    remember(*job.session);
    job.over = true;
  }
}

// Ends a request that did not finish on its own (cancelled, failed, cut at
// the shutdown deadline): its final update, and it leaves at the next drop.
void Scheduler::Impl::end_answer(Job& job, Finish why, const std::string& error) {
  std::string text;
  if (job.text) text = job.text->finish();
  deliver(job, nullptr, std::move(text), why, error);
  job.over = true;
}

void Scheduler::Impl::deliver(Job& job, TokenOut* token, std::string text, Finish finish, const std::string& error) {
  RequestStream& s = *job.stream;
  {
    std::lock_guard<std::mutex> lock(s.mu_);
    Update& u = s.pending_;
    if (token) u.tokens.push_back(std::move(*token));
    u.text += text;
    if (finish != Finish::kNone) {
      u.finish = finish;
      u.error = error;
      u.prompt_tokens = int64_t(job.req.prompt.size());
      u.cached_tokens = job.cached;
      u.completion_tokens = int64_t(job.generated.size());
      const bool was_admitted = job.admitted != Clock::time_point();
      u.queue_seconds = seconds_between(job.submitted, was_admitted ? job.admitted : Clock::now());
      u.first_token_seconds = job.first_token_seconds;
      s.done_ = true;
    }
    s.has_pending_ = true;
  }
  s.cv_.notify_all();
  if (finish != Finish::kNone) count_finished(job, finish);
}

void Scheduler::Impl::count_finished(Job& job, Finish why) {
  job.finished = true;
  std::lock_guard<std::mutex> lock(mu);
  SchedulerMetrics& c = counters;
  if (why == Finish::kCancelled) ++c.requests_cancelled;
  if (why == Finish::kError) ++c.requests_failed;
  if (job.admitted == Clock::time_point()) return;  // never ran
  c.prompt_tokens_total += int64_t(job.req.prompt.size());
  c.cached_tokens_total += job.cached;
  c.generated_tokens_total += int64_t(job.generated.size());
}

void Scheduler::Impl::drop_cancelled() {
  for (auto& j : running) {
    if (j->finished) continue;  // a cancel after the answer: the remember step still runs
    bool cancelled;
    {
      std::lock_guard<std::mutex> lock(j->stream->mu_);
      cancelled = j->stream->cancelled_;
    }
    if (cancelled) end_answer(*j, Finish::kCancelled);
  }
}

// Requests done with the engine leave; their sessions' pages go back to the
// pool here.
void Scheduler::Impl::drop_finished() {
  size_t freed = 0;
  int64_t left = 0;
  for (auto& j : running) {
    if (!j->over) continue;
    j->session.reset();
    freed += j->reserved;
    ++left;
  }
  std::erase_if(running, [](const std::unique_ptr<Job>& j) { return j->over; });
  std::lock_guard<std::mutex> lock(mu);
  reserved_bytes -= freed;
  running_count -= left;
}

void Scheduler::Impl::remember(const Session& s) {
  try {
    engine.remember(s);
  } catch (const std::exception& e) {
    // The answer is not at stake: only the next turn's head start.
    std::fprintf(stderr, "dsv4 serve: could not keep a state in the prefix cache: %s\n", e.what());
  }
}

void Scheduler::Impl::record_step(const StepRecord& r) {
  std::lock_guard<std::mutex> lock(mu);
  ++counters.steps_total;
  recent.push_back(r);
  while (!recent.empty() && r.end - recent.front().end > std::chrono::minutes(1)) recent.pop_front();
  double prefill_s = 0, decode_s = 0;
  int64_t prefilled = 0, generated = 0;
  for (const StepRecord& s : recent) {
    if (s.prefilled > 0) prefill_s += s.seconds, prefilled += s.prefilled;
    if (s.generated > 0) decode_s += s.seconds, generated += s.generated;
  }
  counters.prefill_tokens_per_second = prefill_s > 0 ? double(prefilled) / prefill_s : 0.0;
  counters.decode_tokens_per_second = decode_s > 0 ? double(generated) / decode_s : 0.0;
}

// The gauges, read from the engine on this thread and published under the lock.
void Scheduler::Impl::publish() {
  const Engine::CachePoolUse pool = engine.cache_pool_use();
  const PrefixCacheStats pc = engine.prefix_cache_stats();
  std::lock_guard<std::mutex> lock(mu);
  counters.running = running_count;
  counters.queued = int64_t(queue.size());
  counters.cache_pool_bytes_used = pool.used_bytes;
  if (pool.total_bytes > 0) counters.cache_pool_bytes_total = pool.total_bytes;
  counters.prefix_cache_bytes = pc.bytes;
  counters.prefix_cache_entries = pc.entries;
}

}  // namespace dsv4::serve
