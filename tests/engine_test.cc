// The engine API (src/engine/engine.h) as front ends use it: sessions give
// the bits of the driver underneath, a fork continues bitwise as its
// original would, restore takes a session back to a snapshot, and a full
// pool fails a fork without changing anything.
#include <gtest/gtest.h>

#include <cstring>

#include "core/error.h"
#include "engine/engine.h"
#include "engine/prefill.h"
#include "test_util.h"

namespace dsv4 {
namespace {

std::unique_ptr<Engine> golden_engine(int64_t tile = 128) {
  EngineOptions o;
  o.model_dir = testing::golden_dir();
  o.tile_tokens = tile;
  auto e = Engine::load(o);
  e->set_cache_pool_bytes(8 * e->cache_bytes_for(300));  // room for a few sessions and their forks
  return e;
}

std::vector<int32_t> prompt(int64_t n, int vocab, int salt = 0) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[size_t(i)] = int32_t((i * 7919 + 3 + salt * 31) % vocab);
  t[0] = 0;
  return t;
}

bool same_logits(const PrefillResult& a, const PrefillResult& b) {
  return a.logits.size() == b.logits.size() &&
         std::memcmp(a.logits.data(), b.logits.data(), a.logits.size() * sizeof(float)) == 0;
}

std::vector<int32_t> slice(const std::vector<int32_t>& t, size_t b, size_t e) {
  return std::vector<int32_t>(t.begin() + long(b), t.begin() + long(e));
}

TEST(EngineSession, AppendEqualsDriver) {
  auto engine = golden_engine();
  const std::vector<int32_t> t = prompt(300, engine->config().vocab_size);
  auto s = engine->new_session();
  const PrefillResult r = s->append(t);
  PrefillOptions o;
  o.tile_tokens = 128;
  std::unique_ptr<Model> m = Model::load(testing::golden_dir());
  auto pool = pool_for_request(*m, 300);  // outlives the state that holds its pages
  RequestState st;
  st.init(*m, pool.get());
  const PrefillResult d = extend(*m, st, t, o);
  EXPECT_TRUE(same_logits(r, d));
  EXPECT_EQ(s->cache_checksum(), cache_checksum(*m, st));
  EXPECT_EQ(s->position(), 300);
}

// Fork points on both sides of the window (128) and of CSA/HCA blocks, so
// that partial compressor blocks and wrapped window rows are copied.
class EngineFork : public ::testing::TestWithParam<int64_t> {};

TEST_P(EngineFork, ForkContinuesBitwiseAsOriginal) {
  auto engine = golden_engine();
  const int64_t k = GetParam(), n = 300;
  const std::vector<int32_t> t = prompt(n, engine->config().vocab_size);
  auto whole = engine->new_session();
  const PrefillResult ref = whole->append(t);

  auto s = engine->new_session();
  s->append(slice(t, 0, size_t(k)));
  auto f = s->fork();
  EXPECT_EQ(f->position(), k);
  EXPECT_EQ(f->cache_checksum(), s->cache_checksum());
  const PrefillResult rf = f->append(slice(t, size_t(k), size_t(n)));
  const PrefillResult rs = s->append(slice(t, size_t(k), size_t(n)));
  EXPECT_TRUE(same_logits(rf, ref)) << "fork at " << k;
  EXPECT_TRUE(same_logits(rs, ref)) << "original after fork at " << k;
  EXPECT_EQ(f->cache_checksum(), whole->cache_checksum());
  EXPECT_EQ(s->cache_checksum(), whole->cache_checksum());
}

INSTANTIATE_TEST_SUITE_P(At, EngineFork, ::testing::Values(1, 5, 127, 129, 131, 256, 299));

// A snapshot taken before a divergent turn brings the session back: after
// restore it continues as if the divergence never happened.
TEST(EngineSession, RestoreUndoesADivergentTurn) {
  auto engine = golden_engine();
  const int vocab = engine->config().vocab_size;
  const std::vector<int32_t> t = prompt(200, vocab), other = prompt(90, vocab, 5);
  auto s = engine->new_session();
  s->append(slice(t, 0, 150));
  auto snapshot = s->fork();
  const uint64_t at_snapshot = s->cache_checksum();
  s->append(slice(other, 1, 90));
  EXPECT_NE(s->cache_checksum(), at_snapshot);
  s->restore(*snapshot);
  EXPECT_EQ(s->position(), 150);
  EXPECT_EQ(s->cache_checksum(), at_snapshot);
  const PrefillResult r = s->append(slice(t, 150, 200));
  auto fresh = engine->new_session();
  EXPECT_TRUE(same_logits(r, fresh->append(t)));
}

TEST(EngineSession, ForkOnAFullPoolFailsCleanly) {
  auto engine = golden_engine();
  const std::vector<int32_t> t = prompt(300, engine->config().vocab_size);
  engine->set_cache_pool_bytes(engine->cache_bytes_for(300));
  auto s = engine->new_session();
  s->append(t);
  const uint64_t before = s->cache_checksum();
  EXPECT_THROW(s->fork(), Error);
  EXPECT_EQ(s->cache_checksum(), before);
  EXPECT_EQ(s->position(), 300);
}

TEST(EngineSession, PoolCannotBeResizedUnderLiveSessions) {
  auto engine = golden_engine();
  auto s = engine->new_session();
  EXPECT_THROW(engine->set_cache_pool_bytes(1 << 20), Error);
  s.reset();
  EXPECT_NO_THROW(engine->set_cache_pool_bytes(1 << 20));
}

// Streams decoding together (one append_batch per step, every weight read
// once for all of them) give each stream the bits it gets alone, while
// streams join and leave: a stream's prompt is prefilled in the same batch
// as other streams' decode steps, and finished streams drop out.
TEST(EngineDecode, StreamsTogetherEqualStreamsAlone) {
  constexpr int kStreams = 16, kSteps = 5;
  auto engine = golden_engine();
  engine->set_cache_pool_bytes(2 * kStreams * engine->cache_bytes_for(300));
  const int vocab = int(engine->config().vocab_size);
  std::vector<std::vector<int32_t>> prompts;
  for (int s = 0; s < kStreams; ++s) prompts.push_back(prompt(1 + (s * 37) % 260, vocab, s));
  // Alone: each stream prefilled, then greedy for kSteps tokens.
  std::vector<std::vector<PrefillResult>> alone(kStreams);
  for (int s = 0; s < kStreams; ++s) {
    auto session = engine->new_session();
    alone[s].push_back(session->append(prompts[size_t(s)]));
    for (int i = 0; i < kSteps; ++i) alone[s].push_back(session->append({alone[s].back().next_token}));
  }
  // Together: stream s joins at step s % 3 (its prompt in the same batch as
  // the others' decode steps) and leaves after its kSteps tokens.
  std::vector<std::unique_ptr<Session>> sessions(kStreams);
  std::vector<std::vector<PrefillResult>> together(kStreams);
  for (int step = 0; step < kSteps + 3; ++step) {
    std::vector<Session*> batch;
    std::vector<std::vector<int32_t>> tokens;
    std::vector<int> who;
    for (int s = 0; s < kStreams; ++s) {
      if (step == s % 3) {
        sessions[size_t(s)] = engine->new_session();
        tokens.push_back(prompts[size_t(s)]);
      } else if (step > s % 3 && int(together[s].size()) <= kSteps) {
        tokens.push_back({together[s].back().next_token});
      } else {
        continue;
      }
      batch.push_back(sessions[size_t(s)].get());
      who.push_back(s);
    }
    std::vector<PrefillResult> got = engine->append_batch(batch, tokens);
    for (size_t j = 0; j < who.size(); ++j) together[who[j]].push_back(std::move(got[j]));
  }
  for (int s = 0; s < kStreams; ++s) {
    ASSERT_EQ(together[s].size(), alone[s].size()) << "stream " << s;
    for (size_t i = 0; i < alone[s].size(); ++i) {
      EXPECT_EQ(together[s][i].next_token, alone[s][i].next_token) << "stream " << s << " token " << i;
      EXPECT_TRUE(same_logits(together[s][i], alone[s][i])) << "stream " << s << " token " << i;
    }
  }
}

}  // namespace
}  // namespace dsv4
