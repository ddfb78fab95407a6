// The prefix cache and the saved states (engine/prefix_cache.h,
// engine/snapshot.h, io/state_file.h): a request resumed from a cached
// state gives the bits of a fresh prefill at every prefix length, window
// and block boundary; leaving out any part of the state breaks that; LRU
// eviction under the byte budget; state files survive a restart, and a
// file that cannot be trusted is refused with one line and the request
// prefilled instead.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

#include "core/error.h"
#include "engine/engine.h"
#include "engine/prefill.h"
#include "engine/snapshot.h"
#include "io/state_file.h"
#include "io/synthetic.h"
#include "test_util.h"

namespace dsv4 {
namespace {

using testing::TempDir;

// The tiny preset (window 128; compress ratios 4 and 128) and the same with
// a window of 64, so that the window ends inside the ratio-128 blocks.
struct Models {
  TempDir tmp;
  std::string tiny, w64;
  Models() {
    SyntheticOptions o;
    o.preset = "tiny";
    o.seed = 5;
    o.shards = 1;
    tiny = tmp / "tiny";
    write_synthetic_model(tiny, o);
    o.sliding_window = 64;
    w64 = tmp / "w64";
    write_synthetic_model(w64, o);
  }
};

const Models& models() {
  static Models m;
  return m;
}

std::unique_ptr<Engine> engine_for(const std::string& dir, int64_t tile, size_t cache_bytes,
                                   const std::string& state_dir = "", int64_t every = 0, int64_t chunk = 2048) {
  EngineOptions o;
  o.model_dir = dir;
  o.tile_tokens = tile;
  o.chunk_tokens = chunk;
  o.prefix_cache_bytes = cache_bytes;
  o.state_dir = state_dir;
  o.snapshot_every = every;
  o.max_positions = 8192;
  auto e = Engine::load(o);
  e->set_cache_pool_bytes(6 * e->cache_bytes_for(4400));
  return e;
}

std::vector<int32_t> tokens(int64_t n, int vocab, int salt = 0, int64_t from = 0) {
  std::vector<int32_t> t;
  for (int64_t i = from; i < from + n; ++i) t.push_back(int32_t((i * 7919 + 3 + salt * 31) % vocab));
  if (from == 0 && n > 0) t[0] = 0;
  return t;
}

// The first k tokens of the base prompt, then a tail of its own.
std::vector<int32_t> diverging(const std::vector<int32_t>& base, int64_t k, int64_t tail, int vocab) {
  std::vector<int32_t> t(base.begin(), base.begin() + k);
  const std::vector<int32_t> rest = tokens(tail, vocab, 1, k);
  t.insert(t.end(), rest.begin(), rest.end());
  return t;
}

std::vector<int32_t> slice(const std::vector<int32_t>& t, int64_t b, int64_t e) {
  return std::vector<int32_t>(t.begin() + b, t.begin() + e);
}

struct Outcome {
  std::vector<float> logits;
  int32_t next = -1;
  uint64_t checksum = 0;
  std::vector<int32_t> decoded;  // greedy, when asked for
};

// Appends `rest` to `s` (then greedy-decodes `decode` tokens).
Outcome finish(Session& s, const std::vector<int32_t>& rest, int decode) {
  Outcome o;
  PrefillResult r = s.append(rest);
  o.logits = r.logits;
  o.next = r.next_token;
  o.checksum = s.cache_checksum();
  for (int i = 0; i < decode; ++i) {
    o.decoded.push_back(r.next_token);
    r = s.append({r.next_token});
  }
  return o;
}

void expect_same(const Outcome& a, const Outcome& b, const std::string& what) {
  EXPECT_TRUE(testing::same_bits(a.logits, b.logits)) << what << ": logits";
  EXPECT_EQ(a.next, b.next) << what << ": next token";
  EXPECT_EQ(a.checksum, b.checksum) << what << ": cache checksum";
  EXPECT_EQ(a.decoded, b.decoded) << what << ": decoded tokens";
}

// ---- Bitwise, at every kind of boundary ---------------------------------

struct Case {
  bool w64;
  int64_t tile;
};

class PrefixBitwise : public ::testing::TestWithParam<Case> {};

// Prefix lengths on both sides of the ratio-4 and ratio-128 blocks, the
// windows (64, 128) and the chunk (2048). Tile 1 walks one position per
// attention step and takes minutes for 4100 tokens (ASan: far more), so it
// stops at 2049: past the chunk boundary and every block and window kind,
// which is what the longer prefixes add at the other tiles.
std::vector<int64_t> prefix_lengths(int64_t tile) {
  std::vector<int64_t> k = {1, 3, 4, 5, 127, 128, 129, 255, 511, 2047, 2049, 4100};
  if (tile == 1) k.pop_back();
  return k;
}

TEST_P(PrefixBitwise, ResumeEqualsFreshPrefill) {
  const Case c = GetParam();
  auto e = engine_for(c.w64 ? models().w64 : models().tiny, c.tile, size_t(1) << 30);
  const int V = e->config().vocab_size;
  const std::vector<int64_t> ks = prefix_lengths(c.tile);
  const int64_t tail = 130;  // completes a ratio-128 block after any k
  const std::vector<int32_t> base = tokens(ks.back() + tail, V);
  {
    auto walk = e->new_session();
    int64_t at = 0;
    for (int64_t k : ks) {
      walk->append(slice(base, at, k));
      at = k;
      e->remember(*walk);
    }
  }
  int64_t expect_cached = 0;
  for (int64_t k : ks) {
    const std::vector<int32_t> prompt = diverging(base, k, tail, V);
    const int decode = (k == 5 || k == 129 || k == 2049) ? 16 : 0;
    auto fresh = e->new_session();
    const Outcome want = finish(*fresh, prompt, decode);
    fresh.reset();
    int64_t cached = -1;
    auto s = e->resume(prompt, &cached);
    ASSERT_EQ(cached, k);
    ASSERT_EQ(s->tokens(), slice(prompt, 0, k));
    expect_same(finish(*s, slice(prompt, k, int64_t(prompt.size())), decode), want, "prefix " + std::to_string(k));
    expect_cached += k;
  }
  const PrefixCacheStats st = e->prefix_cache_stats();
  EXPECT_EQ(st.lookups, int64_t(ks.size()));
  EXPECT_EQ(st.hits, int64_t(ks.size()));
  EXPECT_EQ(st.cached_tokens, expect_cached);
  EXPECT_EQ(st.entries, int64_t(ks.size()));
  EXPECT_EQ(st.snapshots, int64_t(ks.size()));
}

INSTANTIATE_TEST_SUITE_P(Configs, PrefixBitwise,
                         ::testing::Values(Case{false, 1}, Case{false, 64}, Case{false, 0}, Case{true, 1},
                                           Case{true, 64}, Case{true, 0}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return std::string(i.param.w64 ? "Window64" : "Tiny") + "Tile" +
                                  std::to_string(i.param.tile);
                         });

// A resume takes the longest cached prefix and leaves at least one token.
TEST(PrefixCache, LongestPrefixLeavingOneToken) {
  auto e = engine_for(models().tiny, 64, size_t(1) << 30);
  const std::vector<int32_t> p = tokens(300, e->config().vocab_size);
  auto s = e->new_session();
  s->append(slice(p, 0, 100));
  e->remember(*s);
  s->append(slice(p, 100, 200));
  e->remember(*s);
  int64_t cached = -1;
  EXPECT_EQ(e->resume(slice(p, 0, 200), &cached)->position(), 100);  // the 200 would leave nothing
  EXPECT_EQ(cached, 100);
  EXPECT_EQ(e->resume(slice(p, 0, 201), &cached)->position(), 200);
  EXPECT_EQ(e->resume(slice(p, 0, 100), &cached)->position(), 0);
  EXPECT_EQ(cached, 0);
  std::vector<int32_t> other = p;
  other[50] = (other[50] + 1) % e->config().vocab_size;
  EXPECT_EQ(e->resume(other, &cached)->position(), 0);
  auto off = engine_for(models().tiny, 64, 0);
  off->remember(*off->new_session());
  EXPECT_EQ(off->resume(p, &cached)->position(), 0);
  EXPECT_EQ(off->prefix_cache_stats().lookups, 1);
  EXPECT_EQ(off->prefix_cache_stats().entries, 0);
}

// No room in the pool for the restored state: an empty session, no
// warning, and the state is still there once pages are free again.
TEST(PrefixCache, FullPoolResumesEmptyAndKeepsTheState) {
  auto e = engine_for(models().tiny, 64, size_t(1) << 30);
  e->set_cache_pool_bytes(e->cache_bytes_for(300));
  const std::vector<int32_t> p = tokens(300, e->config().vocab_size);
  auto holder = e->new_session();
  holder->append(slice(p, 0, 200));
  e->remember(*holder);
  ::testing::internal::CaptureStderr();
  int64_t cached = -1;
  EXPECT_EQ(e->resume(p, &cached)->position(), 0);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  EXPECT_EQ(cached, 0);
  holder.reset();
  EXPECT_EQ(e->resume(p, &cached)->position(), 200);
  EXPECT_EQ(e->prefix_cache_stats().hits, 1);
}

// ---- Every part of the state is needed ----------------------------------

// Position 130 leaves two tokens of an unfinished block at both ratios (4
// and 128), the previous ratio-4 block overlapping the next row, and window
// rows that the next 127 queries still read; the 170 tokens after it finish
// the ratio-128 block.
class SnapshotParts : public ::testing::TestWithParam<int> {};

TEST_P(SnapshotParts, LeavingOutAPartBreaksTheContinuation) {
  std::unique_ptr<Model> m = Model::load(models().tiny);
  const std::vector<int32_t> p = tokens(300, m->config.vocab_size);
  const int64_t k = 130;
  PrefillOptions o;
  o.tile_tokens = 64;
  auto pool = std::make_unique<CachePool>(3 * request_cache_bytes(*m, 300));  // three states at once
  RequestState whole;
  whole.init(*m, pool.get());
  const PrefillResult want = extend(*m, whole, p, o);
  RequestState head;
  head.init(*m, pool.get());
  extend(*m, head, slice(p, 0, k), o);
  std::vector<uint8_t> blob = snapshot_state(*m, head);
  EXPECT_EQ(blob.size(), snapshot_bytes(*m, k));
  if (GetParam() >= 0) {
    EXPECT_GT(damage_snapshot(*m, blob, SnapshotPart(GetParam())), 0u);
  }
  RequestState resumed;
  resumed.init(*m, pool.get());
  restore_state(*m, blob, resumed);
  const PrefillResult got = extend(*m, resumed, slice(p, k, 300), o);
  const bool same = testing::same_bits(got.logits, want.logits) && cache_checksum(*m, resumed) == cache_checksum(*m, whole);
  EXPECT_EQ(same, GetParam() < 0) << "part " << GetParam();
}

// -1: nothing left out (the control); then the window's oldest row still
// read, the unfinished blocks, the overlapped previous block.
INSTANTIATE_TEST_SUITE_P(Parts, SnapshotParts,
                         ::testing::Values(-1, int(SnapshotPart::kWindow), int(SnapshotPart::kPartialBlock),
                                           int(SnapshotPart::kOverlap)));

TEST(Snapshot, BlobOfAnotherShapeIsRefused) {
  std::unique_ptr<Model> m = Model::load(models().tiny);
  auto pool = pool_for_request(*m, 300);
  RequestState st;
  st.init(*m, pool.get());
  extend(*m, st, tokens(200, m->config.vocab_size), PrefillOptions{});
  std::vector<uint8_t> blob = snapshot_state(*m, st);
  blob.pop_back();
  RequestState r;
  r.init(*m, pool.get());
  EXPECT_THROW(restore_state(*m, blob, r), Error);
  EXPECT_EQ(r.cache_bytes(), 0u);
}

// ---- Snapshots inside a long append ---------------------------------------

// Chunk rounds of 300 positions: the snapshots of every 512 land on the
// first round boundary at or past each multiple (600, 1200), never on the
// append's end (1300).
TEST(PrefixCache, SnapshotsAtRoundBoundariesInsideLongAppends) {
  auto e = engine_for(models().tiny, 100, size_t(1) << 30, "", 512, 300);
  const int V = e->config().vocab_size;
  const std::vector<int32_t> base = tokens(1300, V);
  e->new_session()->append(base);
  EXPECT_EQ(e->prefix_cache_stats().entries, 2);
  for (int64_t k : {600, 1200}) {
    const std::vector<int32_t> prompt = diverging(base, k + 50, 100, V);
    auto fresh = e->new_session();
    const Outcome want = finish(*fresh, prompt, 0);
    int64_t cached = 0;
    auto s = e->resume(prompt, &cached);
    EXPECT_EQ(cached, k);
    expect_same(finish(*s, slice(prompt, cached, int64_t(prompt.size())), 0), want, "round snapshot " + std::to_string(k));
  }
}

// ---- LRU under the byte budget ---------------------------------------------

TEST(PrefixCache, EvictsLeastRecentlyUsedUnderTheBudget) {
  const int64_t n = 200;
  size_t one = 0;
  {
    auto probe = engine_for(models().tiny, 64, size_t(1) << 30);
    auto s = probe->new_session();
    s->append(tokens(n, probe->config().vocab_size));
    probe->remember(*s);
    one = probe->prefix_cache_stats().bytes;
  }
  ASSERT_GT(one, 0u);
  auto e = engine_for(models().tiny, 64, one * 5 / 2);
  const int V = e->config().vocab_size;
  auto keep = [&](int salt) {
    auto s = e->new_session();
    s->append(tokens(n, V, salt));
    e->remember(*s);
  };
  auto extended = [&](int salt) {
    std::vector<int32_t> t = tokens(n + 1, V, salt);
    return t;
  };
  keep(1);
  keep(2);
  int64_t cached = 0;
  e->resume(extended(1), &cached);  // 1 is now more recent than 2
  EXPECT_EQ(cached, n);
  keep(3);
  PrefixCacheStats st = e->prefix_cache_stats();
  EXPECT_EQ(st.entries, 2);
  EXPECT_EQ(st.evictions, 1);
  EXPECT_EQ(st.bytes, 2 * one);
  e->resume(extended(2), &cached);
  EXPECT_EQ(cached, 0);
  e->resume(extended(1), &cached);
  EXPECT_EQ(cached, n);
  e->resume(extended(3), &cached);
  EXPECT_EQ(cached, n);
  st = e->prefix_cache_stats();
  EXPECT_EQ(st.lookups, 4);
  EXPECT_EQ(st.hits, 3);
  EXPECT_EQ(st.cached_tokens, 3 * n);
  EXPECT_EQ(st.snapshots, 3);
  EXPECT_EQ(st.snapshot_bytes, 3 * one);
  // A state larger than the whole budget is not kept.
  auto small = engine_for(models().tiny, 64, one / 2);
  auto s = small->new_session();
  s->append(tokens(n, V));
  small->remember(*s);
  EXPECT_EQ(small->prefix_cache_stats().entries, 0);
  EXPECT_EQ(small->prefix_cache_stats().bytes, 0u);
}

// ---- State files -------------------------------------------------------------

struct Saved {
  TempDir dir;
  std::vector<int32_t> prompt;  // 300 tokens; its first 200 are saved
  std::string file;
  Outcome want;  // a fresh prefill of the prompt
};

// One engine saves the state of the prompt's first 200 tokens into a fresh
// directory and goes away.
std::unique_ptr<Saved> save_one() {
  auto s = std::make_unique<Saved>();
  auto e = engine_for(models().tiny, 64, size_t(1) << 30, s->dir.path.string());
  s->prompt = tokens(300, e->config().vocab_size, 4);
  auto fresh = e->new_session();
  s->want = finish(*fresh, s->prompt, 4);
  auto head = e->new_session();
  head->append(slice(s->prompt, 0, 200));
  e->remember(*head);
  s->file = (s->dir.path / state_file_name(slice(s->prompt, 0, 200))).string();
  return s;
}

// A new engine on the same directory: what it resumed and what it wrote on
// stderr meanwhile.
struct Reloaded {
  int64_t cached = -1;
  Outcome got;
  std::string err;
};

Reloaded reload(const Saved& s, const std::string& model, size_t cache_bytes = size_t(1) << 30) {
  Reloaded r;
  ::testing::internal::CaptureStderr();
  auto e = engine_for(model, 64, cache_bytes, s.dir.path.string());
  auto session = e->resume(s.prompt, &r.cached);
  r.got = finish(*session, slice(s.prompt, session->position(), 300), 4);
  r.err = ::testing::internal::GetCapturedStderr();
  return r;
}

void expect_one_warning(const std::string& err, const std::string& file, const std::string& reason) {
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  EXPECT_NE(err.find(file), std::string::npos) << err;
  EXPECT_NE(err.find(reason), std::string::npos) << err;
}

TEST(StateFiles, RoundTripAcrossEngines) {
  auto s = save_one();
  ASSERT_TRUE(std::filesystem::exists(s->file));
  for (size_t budget : {size_t(1) << 30, size_t(0)}) {  // 0: read from the file on demand
    const Reloaded r = reload(*s, models().tiny, budget);
    EXPECT_EQ(r.cached, 200);
    expect_same(r.got, s->want, "reloaded");
    EXPECT_EQ(r.err, "");
  }
}

TEST(StateFiles, AnotherModelIsRefused) {
  auto s = save_one();
  const Reloaded r = reload(*s, models().w64);
  EXPECT_EQ(r.cached, 0);
  expect_one_warning(r.err, s->file, "another model");
}

TEST(StateFiles, DamagedFilesAreRefusedAndThePromptPrefilled) {
  struct Damage {
    std::string name, reason;
    void (*apply)(std::vector<uint8_t>&);
  };
  const std::vector<Damage> damages = {
      {"version", "format version 2, expected 1", [](std::vector<uint8_t>& b) { b[8] = 2; }},
      {"truncated", "truncated or damaged", [](std::vector<uint8_t>& b) { b.resize(b.size() / 2); }},
      {"token flipped", "header checksum mismatch", [](std::vector<uint8_t>& b) { b[56 + 40] ^= 0x10; }},
      {"payload flipped", "payload checksum mismatch", [](std::vector<uint8_t>& b) { b[b.size() - 7] ^= 0x01; }},
      {"not a state", "not a dsv4 state file", [](std::vector<uint8_t>& b) { b[0] = 'X'; }},
  };
  for (const Damage& d : damages) {
    auto s = save_one();
    std::vector<uint8_t> bytes = testing::read_bytes(s->file);
    d.apply(bytes);
    testing::write_bytes(s->file, bytes);
    const Reloaded r = reload(*s, models().tiny);
    EXPECT_EQ(r.cached, 0) << d.name;
    expect_same(r.got, s->want, d.name);
    expect_one_warning(r.err, s->file, d.reason);
  }
}

// Any one byte changed, wherever it is (magic, version, counts, checksums,
// token ids, payload), makes the header or the payload check throw.
TEST(StateFiles, EveryFlippedByteIsCaught) {
  TempDir tmp;
  const std::string path = tmp / "s.dsv4state";
  const std::vector<int32_t> ids = {0, 5, 9, 1000};
  std::vector<uint8_t> payload(3000);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = uint8_t(i * 37);
  write_state_file(path, 42, ids, payload);
  const std::vector<uint8_t> good = testing::read_bytes(path);
  EXPECT_EQ(read_state_payload(read_state_header(path, 42)), payload);
  for (size_t at = 0; at < good.size(); at += (at < 80 ? 1 : 97)) {
    std::vector<uint8_t> bad = good;
    bad[at] ^= 0x04;
    testing::write_bytes(path, bad);
    EXPECT_THROW(read_state_payload(read_state_header(path, 42)), Error) << "byte " << at;
  }
}

TEST(StateFiles, UnwritableDirectoryIsAWarning) {
  TempDir tmp;
  testing::write_bytes(tmp / "file", {1, 2, 3});
  const std::string dir = tmp / "file/states";  // under a regular file: cannot be made, even as root
  ::testing::internal::CaptureStderr();
  auto e = engine_for(models().tiny, 64, size_t(1) << 30, dir);
  const std::vector<int32_t> p = tokens(150, e->config().vocab_size);
  auto s = e->new_session();
  s->append(slice(p, 0, 100));
  e->remember(*s);
  int64_t cached = 0;
  auto r = e->resume(p, &cached);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(cached, 100);  // still cached in memory
  expect_one_warning(err, dir, "cannot use the state directory");
}

// A directory that goes away after loading stands for a full disk: every
// write fails; one warning, and the states stay in memory.
TEST(StateFiles, FailedWritesAreOneWarning) {
  TempDir tmp;
  const std::string dir = tmp / "states";
  auto e = engine_for(models().tiny, 64, size_t(1) << 30, dir);
  std::filesystem::remove_all(dir);
  const std::vector<int32_t> p = tokens(150, e->config().vocab_size);
  ::testing::internal::CaptureStderr();
  auto s = e->new_session();
  for (int64_t k : {50, 100}) {
    s->append(slice(p, s->position(), k));
    e->remember(*s);
  }
  int64_t cached = 0;
  auto r = e->resume(p, &cached);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(cached, 100);
  EXPECT_EQ(e->prefix_cache_stats().entries, 2);
  expect_one_warning(err, dir, "cannot create the state file");
}

}  // namespace
}  // namespace dsv4

namespace dsv4 {
namespace {

// The cost of one snapshot, for docs/PERFORMANCE_LOG.md (not run by ctest):
//   DSV4_SNAPSHOT_MODEL=/work/models/flash4 DSV4_SNAPSHOT_POSITIONS=1024,8192
//   build/tests/dsv4_tests --gtest_also_run_disabled_tests --gtest_filter='*SnapshotCost*'
TEST(PrefixCacheMeasure, DISABLED_SnapshotCost) {
  const char* dir = std::getenv("DSV4_SNAPSHOT_MODEL");
  const char* positions = std::getenv("DSV4_SNAPSHOT_POSITIONS");
  std::unique_ptr<Model> m = Model::load(dir ? dir : models().tiny);
  std::vector<int64_t> ns;
  for (std::string s = positions ? positions : "1024,8192"; !s.empty();) {
    const size_t comma = s.find(',');
    ns.push_back(std::stoll(s.substr(0, comma)));
    s = comma == std::string::npos ? "" : s.substr(comma + 1);
  }
  TempDir tmp;
  auto seconds = [](auto f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  for (int64_t n : ns) {
    auto pool = pool_for_request(*m, n);
    RequestState st;
    st.init(*m, pool.get());
    const std::vector<int32_t> t = tokens(n, m->config.vocab_size);
    const double prefill = seconds([&] { extend(*m, st, t, PrefillOptions{}); });
    std::vector<uint8_t> blob;
    const double snap = seconds([&] { blob = snapshot_state(*m, st); });
    st = RequestState{};
    st.init(*m, pool.get());
    const double restore = seconds([&] { restore_state(*m, blob, st); });
    StateFileHeader h;
    const double write = seconds([&] { h = write_state_file(tmp / "s.dsv4state", 1, t, blob); });
    const double read = seconds([&] { read_state_payload(h); });
    std::printf("positions %lld: prefill %.2f s, snapshot %zu bytes (%.2f MB, pool pages %zu bytes), copy out %.2f ms, "
                "restore %.2f ms, file write %.2f ms, file read + XXH3 %.2f ms\n",
                static_cast<long long>(n), prefill, blob.size(), double(blob.size()) / 1e6, st.cache_bytes(),
                snap * 1e3, restore * 1e3, write * 1e3, read * 1e3);
  }
}

}  // namespace
}  // namespace dsv4
