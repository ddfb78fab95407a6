// The server's scheduler (tools/serve/scheduler.h): requests run together
// give bitwise the tokens and logprobs each gets alone (and that the CLI's
// loop gives), the prompts still prefilling share one budget of positions
// per step, oldest first, beside running streams, cancelled and finished
// requests give their pages back, admission
// respects the queue, `parallel` and the pool, shutdown ends every stream,
// the prefix cache resumes a conversation, and stop strings and eos end an
// answer.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <thread>

#include "core/error.h"
#include "engine/engine.h"
#include "generation.h"
#include "io/synthetic.h"
#include "serve/scheduler.h"
#include "test_util.h"

namespace dsv4::serve {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

// The golden tiny model, small tiles and chunks so that prompts of a few
// hundred tokens take several steps.
// The pool holds `sessions` requests of `positions` positions.
std::unique_ptr<Engine> tiny_engine(int sessions = 8, int64_t positions = 800, size_t prefix_cache_bytes = 0,
                                    const std::string& dir = testing::golden_dir()) {
  EngineOptions o;
  o.model_dir = dir;
  o.tile_tokens = 32;
  o.chunk_tokens = 64;
  o.prefix_cache_bytes = prefix_cache_bytes;
  auto e = Engine::load(o);
  e->set_cache_pool_bytes(size_t(sessions) * e->cache_bytes_for(positions));
  return e;
}

std::vector<int32_t> prompt(int64_t n, int vocab, int salt) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[size_t(i)] = int32_t((i * 7919 + 3 + salt * 131) % vocab);
  return t;
}

// Everything a stream gave, joined.
struct Answer {
  std::vector<TokenOut> tokens;
  std::string text;
  Update last;  // the final update (its tokens and text moved into the above)
  int updates = 0;
};

Answer collect(RequestStream& s) {
  Answer a;
  Update u;
  for (;;) {
    if (!s.next(&u, 30s)) {
      ADD_FAILURE() << "no final update within 30 s";
      return a;
    }
    ++a.updates;
    for (TokenOut& t : u.tokens) a.tokens.push_back(std::move(t));
    a.text += u.text;
    if (u.finish != Finish::kNone) {
      a.last = std::move(u);
      return a;
    }
  }
}

std::vector<int32_t> ids(const Answer& a) {
  std::vector<int32_t> v;
  for (const TokenOut& t : a.tokens) v.push_back(t.id);
  return v;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Ids, logprobs and alternatives bit for bit.
void expect_same_tokens(const Answer& got, const Answer& want, const std::string& what) {
  ASSERT_EQ(ids(got), ids(want)) << what;
  for (size_t i = 0; i < got.tokens.size(); ++i) {
    const TokenOut &g = got.tokens[i], &w = want.tokens[i];
    EXPECT_TRUE(same_bits(g.logprob, w.logprob)) << what << " token " << i;
    ASSERT_EQ(g.top.size(), w.top.size()) << what;
    for (size_t k = 0; k < g.top.size(); ++k) {
      EXPECT_EQ(g.top[k].first, w.top[k].first) << what;
      EXPECT_TRUE(same_bits(g.top[k].second, w.top[k].second)) << what;
    }
  }
  EXPECT_EQ(got.last.finish, want.last.finish) << what;
}

// Prompts of 1 to 300 tokens (several over the 64-token chunk), different
// budgets, greedy and seeded draws, with and without logprobs.
std::vector<GenerationRequest> mixed_requests(int vocab) {
  const int64_t lengths[] = {5, 140, 70, 300, 1, 64, 99, 17, 200};
  const int64_t budgets[] = {8, 5, 12, 3, 6, 10, 4, 9, 7};
  std::vector<GenerationRequest> rs;
  for (int i = 0; i < 9; ++i) {
    GenerationRequest r;
    r.prompt = prompt(lengths[i], vocab, i);
    r.max_tokens = budgets[i];
    if (i % 2) {
      r.sampling.temperature = 0.8f;
      r.sampling.top_k = i == 3 ? 0 : 40;
      r.sampling.seed = uint64_t(100 + i);
    }
    r.top_logprobs = i % 3 == 0 ? 3 : i % 3 == 1 ? 0 : -1;
    r.remember_answer = i % 4 != 0;
    rs.push_back(r);
  }
  return rs;
}

TEST(ServeScheduler, TogetherEqualsAloneAndTheCli) {
  auto engine = tiny_engine();
  const std::vector<GenerationRequest> rs = mixed_requests(engine->config().vocab_size);
  std::vector<Answer> alone;
  {
    Scheduler s(*engine, {.parallel = 1, .max_queue = 64});
    for (const GenerationRequest& r : rs) alone.push_back(collect(*s.submit(r)));
  }
  // The prefill budget split at tile bounds (the engine's chunk) and across
  // them (100 positions a step).
  std::vector<Answer> together(rs.size());
  for (int64_t budget : {int64_t(0), int64_t(100)}) {
    SCOPED_TRACE("prefill_chunk " + std::to_string(budget));
    {
      Scheduler s(*engine, {.parallel = 8, .max_queue = 64, .prefill_chunk = budget});
      std::vector<std::shared_ptr<RequestStream>> streams;
      // Four at once; the rest join while those run (and the ninth waits for
      // a free place).
      for (size_t i = 0; i < 4; ++i) streams.push_back(s.submit(rs[i]));
      Update first;
      ASSERT_TRUE(streams[0]->next(&first, 30s));
      for (size_t i = 4; i < rs.size(); ++i) streams.push_back(s.submit(rs[i]));
      together[0] = collect(*streams[0]);
      together[0].tokens.insert(together[0].tokens.begin(), first.tokens.begin(), first.tokens.end());
      for (size_t i = 1; i < rs.size(); ++i) together[i] = collect(*streams[i]);
      EXPECT_GE(s.metrics().steps_total, 1);
    }
    for (size_t i = 0; i < rs.size(); ++i) {
      expect_same_tokens(together[i], alone[i], "request " + std::to_string(i));
      EXPECT_EQ(together[i].last.completion_tokens, int64_t(together[i].tokens.size()));
      EXPECT_EQ(together[i].last.prompt_tokens, int64_t(rs[i].prompt.size()));
      if (rs[i].top_logprobs == 0) {
        EXPECT_TRUE(together[i].tokens[0].top.empty());
      }
    }
  }
  EXPECT_EQ(engine->cache_pool_use().used_bytes, 0u);

  // The CLI's loop, for a seeded draw with a prompt over the chunk.
  for (size_t i : {size_t(1), size_t(2)}) {
    cli::GenerationParams p;
    p.sampling = rs[i].sampling;
    p.max_new_tokens = rs[i].max_tokens;
    cli::TokenStream out(nullptr, {}, {});
    const cli::Generation g = cli::generate(*engine, rs[i].prompt, p, out);
    EXPECT_EQ(g.tokens, ids(together[i])) << "request " << i;
  }
}

// Polls until `done` holds (the scheduler publishes after its step).
template <class F>
bool eventually(F done) {
  for (int i = 0; i < 3000; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(1ms);
  }
  return done();
}

// A 640-token prompt takes one 64-token chunk per step (10 steps alone);
// beside a decoding stream it does not add steps to it: the two share them.
TEST(ServeScheduler, LongPrefillAdvancesOneChunkPerStep) {
  auto engine = tiny_engine();
  const int vocab = engine->config().vocab_size;
  GenerationRequest longer;
  longer.prompt = prompt(640, vocab, 1);
  longer.max_tokens = 1;
  longer.remember_answer = false;
  GenerationRequest stream;
  stream.prompt = prompt(8, vocab, 2);
  stream.max_tokens = 60;
  stream.ignore_eos = true;
  stream.remember_answer = false;
  {
    Scheduler s(*engine, {});
    collect(*s.submit(longer));
    // The final update comes before the step is counted.
    ASSERT_TRUE(eventually([&] { return s.metrics().running == 0; }));
    EXPECT_EQ(s.metrics().steps_total, 10);
  }
  Scheduler s(*engine, {});
  auto a = s.submit(stream);
  auto b = s.submit(longer);
  const Answer answer = collect(*a);
  collect(*b);
  EXPECT_EQ(answer.tokens.size(), 60u);
  ASSERT_TRUE(eventually([&] { return s.metrics().running == 0; }));
  // Alone: 60 steps (the prompt, then 59 decodes). The long prompt joins
  // within the first steps and its 10 ride along; in series it would be 70.
  EXPECT_LE(s.metrics().steps_total, 62);
}

// Three 192-token prompts share one 64-position budget a step, oldest
// first: 9 steps (each carries exactly 64 prompt positions), and the first
// tokens come in arrival order, each a prompt's prefill after the last
// (with one chunk per request and step, all three would end together in
// 3 to 5 steps).
TEST(ServeScheduler, PromptsShareOnePrefillBudgetOldestFirst) {
  auto engine = tiny_engine();
  const int vocab = engine->config().vocab_size;
  Scheduler s(*engine, {});
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 3; ++i) {
    GenerationRequest r;
    r.prompt = prompt(192, vocab, 20 + i);
    r.max_tokens = 1;
    r.remember_answer = false;
    streams.push_back(s.submit(r));
  }
  std::vector<double> first;
  for (auto& st : streams) first.push_back(collect(*st).last.first_token_seconds);
  ASSERT_TRUE(eventually([&] { return s.metrics().running == 0; }));
  EXPECT_EQ(s.metrics().steps_total, 9);
  EXPECT_LT(first[0], first[1]);
  EXPECT_LT(first[1], first[2]);
}

TEST(ServeScheduler, CancelFreesPages) {
  auto engine = tiny_engine();
  const int vocab = engine->config().vocab_size;
  Scheduler s(*engine, {.parallel = 2, .max_queue = 8});
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 3; ++i) {
    GenerationRequest r;
    r.prompt = prompt(100, vocab, i);
    r.max_tokens = 3000;
    r.ignore_eos = true;
    streams.push_back(s.submit(r));
  }
  Update u;
  ASSERT_TRUE(streams[0]->next(&u, 30s));
  ASSERT_TRUE(streams[1]->next(&u, 30s));
  EXPECT_FALSE(streams[2]->admitted());  // parallel = 2
  EXPECT_TRUE(eventually([&] { return s.metrics().cache_pool_bytes_used > 0; }));
  for (auto& st : streams) st->cancel();
  for (size_t i = 0; i < streams.size(); ++i) {
    const Answer a = collect(*streams[i]);
    EXPECT_EQ(a.last.finish, Finish::kCancelled) << i << " " << a.tokens.size() << " " << a.last.error;
  }
  EXPECT_FALSE(streams[2]->admitted());  // left the queue without running
  EXPECT_FALSE(streams[0]->next(&u, 0ms));  // after the final update: nothing more
  ASSERT_TRUE(eventually([&] { return s.metrics().running == 0; }));
  const SchedulerMetrics m = s.metrics();
  EXPECT_EQ(m.cache_pool_bytes_used, 0u);
  EXPECT_EQ(m.requests_cancelled, 3);
  EXPECT_EQ(m.requests_total, 3);
  EXPECT_EQ(m.queued, 0);
}

TEST(ServeScheduler, QueueFullAndParallelLimit) {
  auto engine = tiny_engine();
  const int vocab = engine->config().vocab_size;
  Scheduler s(*engine, {.parallel = 1, .max_queue = 2});
  GenerationRequest r;
  r.prompt = prompt(20, vocab, 0);
  r.max_tokens = 3000;
  r.ignore_eos = true;
  auto first = s.submit(r);
  ASSERT_TRUE(eventually([&] { return first->admitted(); }));
  auto second = s.submit(r), third = s.submit(r);
  EXPECT_THROW(s.submit(r), QueueFull);
  EXPECT_EQ(s.metrics().requests_rejected, 1);
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(second->admitted());
  EXPECT_LE(s.metrics().running, 1);
  // Requests that can never run are refused at once.
  GenerationRequest bad = r;
  bad.prompt.clear();
  EXPECT_THROW(s.submit(bad), Error);
  bad.prompt = prompt(engine->position_limit(), vocab, 0);
  EXPECT_THROW(s.submit(bad), Error);
  for (auto* st : {&first, &second, &third}) (*st)->cancel();
}

// A pool with room for one request at a time: the second waits for the
// first's pages, then runs, and both give their tokens.
TEST(ServeScheduler, SmallPoolRunsRequestsOneAfterAnother) {
  auto probe = tiny_engine();
  const size_t one = probe->cache_bytes_for(200);
  probe.reset();
  auto engine = tiny_engine(1, 1);
  engine->set_cache_pool_bytes(one + one / 2);
  const int vocab = engine->config().vocab_size;
  Scheduler s(*engine, {.parallel = 4, .max_queue = 8});
  GenerationRequest r;
  r.prompt = prompt(150, vocab, 3);
  r.max_tokens = 50;
  r.ignore_eos = true;
  auto a = s.submit(r), b = s.submit(r);
  Update u;
  ASSERT_TRUE(a->next(&u, 30s));
  if (u.finish == Finish::kNone) {
    EXPECT_FALSE(b->admitted());
  }
  const Answer first = collect(*a), second = collect(*b);
  EXPECT_EQ(first.last.finish, Finish::kLength);
  EXPECT_EQ(second.last.finish, Finish::kLength);
  EXPECT_EQ(second.tokens.size(), 50u);
  EXPECT_GT(second.last.queue_seconds, 0);
}

TEST(ServeScheduler, ShutdownEndsEveryStream) {
  auto engine = tiny_engine(2, 4096);
  const int vocab = engine->config().vocab_size;
  auto s = std::make_unique<Scheduler>(*engine, SchedulerOptions{.parallel = 1, .max_queue = 8});
  GenerationRequest r;
  r.prompt = prompt(10, vocab, 0);
  r.max_tokens = 4000;
  r.ignore_eos = true;
  auto running = s->submit(r), queued = s->submit(r);
  Update u;
  ASSERT_TRUE(running->next(&u, 30s));
  s->shutdown(100ms);
  EXPECT_THROW(s->submit(r), ShuttingDown);
  const Answer cut = collect(*running), waited = collect(*queued);
  EXPECT_EQ(cut.last.finish, Finish::kLength);
  EXPECT_LT(cut.last.completion_tokens, 4000);
  EXPECT_EQ(waited.last.finish, Finish::kError);
  EXPECT_EQ(waited.last.error, "the server is shutting down");
  s->shutdown(0ms);  // idempotent
  s.reset();
  EXPECT_EQ(engine->cache_pool_use().used_bytes, 0u);
}

// The next turn's prompt extends the first prompt and its answer: it resumes
// past both, and answers as it would without the cache.
TEST(ServeScheduler, PrefixCacheResumesAfterTheAnswer) {
  auto engine = tiny_engine(8, 800, size_t(64) << 20);
  auto plain = tiny_engine();
  const int vocab = engine->config().vocab_size;
  GenerationRequest turn1;
  turn1.prompt = prompt(90, vocab, 5);
  turn1.max_tokens = 6;
  turn1.ignore_eos = true;
  Scheduler s(*engine, {});
  const Answer a1 = collect(*s.submit(turn1));
  GenerationRequest turn2 = turn1;
  const std::vector<int32_t> answer1 = ids(a1);
  turn2.prompt.insert(turn2.prompt.end(), answer1.begin(), answer1.end());
  for (int32_t t : prompt(12, vocab, 6)) turn2.prompt.push_back(t);
  turn2.top_logprobs = 2;
  const Answer a2 = collect(*s.submit(turn2));
  EXPECT_EQ(a2.last.cached_tokens, int64_t(turn1.prompt.size() + a1.tokens.size()));
  // Engines share the process's worker pool: one runs at a time.
  ASSERT_TRUE(eventually([&] { return s.metrics().running == 0; }));
  EXPECT_GT(s.metrics().prefix_cache_entries, 0);
  EXPECT_EQ(s.metrics().cached_tokens_total, a2.last.cached_tokens);
  Scheduler p(*plain, {});
  const Answer want = collect(*p.submit(turn2));
  EXPECT_EQ(want.last.cached_tokens, 0);
  expect_same_tokens(a2, want, "second turn");
}

// Without a tokenizer: eos ends an answer (kStop, eos included) unless
// ignore_eos. A near-uniform draw finds a seed that meets eos.
TEST(ServeScheduler, EosEndsTheAnswer) {
  auto engine = tiny_engine();
  const int vocab = engine->config().vocab_size, eos = engine->config().eos_token_id;
  Scheduler s(*engine, {.parallel = 8, .max_queue = 64});
  std::vector<GenerationRequest> rs;
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int seed = 0; seed < 48; ++seed) {
    GenerationRequest r;
    r.prompt = prompt(4, vocab, 0);
    r.max_tokens = 64;
    r.ignore_eos = true;
    r.remember_answer = false;
    r.sampling.temperature = 100;
    r.sampling.seed = uint64_t(seed);
    rs.push_back(r);
    streams.push_back(s.submit(r));
  }
  std::optional<size_t> found;
  std::vector<int32_t> full;
  for (size_t i = 0; i < streams.size(); ++i) {
    const Answer a = collect(*streams[i]);
    const std::vector<int32_t> v = ids(a);
    if (!found && std::find(v.begin(), v.end(), eos) != v.end()) found = i, full = v;
  }
  if (!found) GTEST_SKIP() << "no draw met eos";
  GenerationRequest r = rs[*found];
  r.ignore_eos = false;
  const Answer a = collect(*s.submit(r));
  const size_t at = size_t(std::find(full.begin(), full.end(), eos) - full.begin());
  EXPECT_EQ(ids(a), std::vector<int32_t>(full.begin(), full.begin() + long(at) + 1));
  EXPECT_EQ(a.last.finish, Finish::kStop);
}

// With the V4 tokenizer: the text stops before a stop string, the answer
// ends there with kStop.
TEST(ServeScheduler, StopStringEndsTheText) {
  const std::string tok = std::string(DSV4_TOKENIZER_DIR) + "/tokenizer.json";
  if (!fs::exists(tok)) GTEST_SKIP() << tok << " is missing (scripts/setup.sh makes it)";
  testing::TempDir tmp;
  SyntheticOptions so;
  so.layers = 2;
  so.experts = 4;
  so.vocab = 129280;
  write_synthetic_model(tmp / "m", so);
  fs::copy_file(tok, tmp / "m/tokenizer.json");
  auto engine = tiny_engine(4, 400, 0, tmp / "m");
  ASSERT_NE(engine->tokenizer(), nullptr);
  Scheduler s(*engine, {});
  GenerationRequest r;
  r.prompt = engine->tokenizer()->encode("Hello, how are you today?");
  r.max_tokens = 24;
  r.ignore_eos = true;
  const Answer full = collect(*s.submit(r));
  ASSERT_EQ(full.last.finish, Finish::kLength);
  // A stop string of two whole characters from the middle of the text.
  const std::string& t = full.text;
  // (Not U+FFFD: the stop strings are matched on the bytes the tokens
  // decode to, before an incomplete character becomes U+FFFD.)
  const auto is_start = [&](size_t i) { return (t[i] & 0xC0) != 0x80; };
  for (size_t a = t.size() / 2; a < t.size() && r.stop.empty(); ++a) {
    if (!is_start(a)) continue;
    size_t b = a + 1, chars = 0;
    while (b < t.size() && !(is_start(b) && ++chars == 2)) ++b;
    const std::string s = t.substr(a, b - a);
    if (s.find("\xEF\xBF\xBD") == std::string::npos) r.stop = {s};
  }
  ASSERT_FALSE(r.stop.empty());
  const Answer cut = collect(*s.submit(r));
  EXPECT_EQ(cut.last.finish, Finish::kStop);
  EXPECT_EQ(cut.text, t.substr(0, t.find(r.stop[0])));
  EXPECT_LE(cut.tokens.size(), full.tokens.size());
  const std::vector<int32_t> f = ids(full), c = ids(cut);
  EXPECT_TRUE(std::equal(c.begin(), c.end(), f.begin()));
}

}  // namespace
}  // namespace dsv4::serve
