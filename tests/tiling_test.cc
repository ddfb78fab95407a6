// PREFILL.md §1, §2 and §6: the tile walk and the thread count never change a
// result — logits, every hidden row and every cache byte are bitwise
// identical — and the paged caches hold what §2 says, in pool pages.
#include <gtest/gtest.h>

#include <fstream>

#include "core/cpu.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/prefill.h"
#include "io/synthetic.h"
#include "test_util.h"

namespace dsv4 {
namespace {

using testing::same_bits;

// gen-model --preset tiny (the golden tiny-a shapes, room for 8192+ tokens).
const Model& tiny_model() {
  static testing::TempDir dir;
  static std::unique_ptr<Model> m = [] {
    SyntheticOptions o;
    o.seed = 7;
    write_synthetic_model(dir / "tiny", o);
    return Model::load(dir / "tiny");
  }();
  return *m;
}

std::vector<int32_t> prompt(int64_t n, int vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  uint64_t s = 12345;
  for (int64_t i = 0; i < n; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    t[size_t(i)] = i == 0 ? 0 : int32_t((s >> 33) % uint64_t(vocab));
  }
  return t;
}

struct Outcome {
  PrefillResult result;
  std::vector<uint8_t> cache;
};

Outcome run(const Model& m, const std::vector<int32_t>& tokens, int64_t tile,
            int64_t chunk = PrefillOptions{}.chunk_tokens) {
  auto pool = pool_for_request(m, int64_t(tokens.size()));
  RequestState st;
  st.init(m, pool.get());
  PrefillOptions o;
  o.tile_tokens = tile;
  o.chunk_tokens = chunk;
  o.keep_hidden = true;
  Outcome r;
  r.result = extend(m, st, tokens, o);
  r.cache = cache_contents(m, st);
  return r;
}

class TileSizes : public ::testing::TestWithParam<int64_t> {};

TEST_P(TileSizes, BitwiseIdenticalToWholePrompt) {
  const Model& m = tiny_model();
  const int64_t n = GetParam();
  auto tokens = prompt(n, m.config.vocab_size);
  const Outcome ref = run(m, tokens, 0);
  for (int64_t t : {1, 3, 16, 64, 128, 512}) {
    const Outcome r = run(m, tokens, t);
    EXPECT_TRUE(same_bits(r.result.logits, ref.result.logits)) << "N=" << n << " tile=" << t;
    EXPECT_TRUE(same_bits(r.result.hidden, ref.result.hidden)) << "N=" << n << " tile=" << t;
    EXPECT_EQ(r.cache, ref.cache) << "N=" << n << " tile=" << t;
    EXPECT_EQ(r.result.next_token, ref.result.next_token);
  }
}

INSTANTIATE_TEST_SUITE_P(Prompts, TileSizes, ::testing::Values(1, 2, 127, 128, 129, 300, 1000, 8192));

TEST(Threads, BitwiseIdenticalAcrossThreadCounts) {
  const Model& m = tiny_model();
  auto tokens = prompt(300, m.config.vocab_size);
  ThreadPool::set_threads(1);
  const Outcome one = run(m, tokens, 64);
  ThreadPool::set_threads(2);
  const Outcome two = run(m, tokens, 64);
  ThreadPool::set_threads(3);
  const Outcome three = run(m, tokens, 64);
  ThreadPool::set_threads(0);
  for (const Outcome* r : {&two, &three}) {
    EXPECT_TRUE(same_bits(one.result.logits, r->result.logits));
    EXPECT_TRUE(same_bits(one.result.hidden, r->result.hidden));
    EXPECT_EQ(one.cache, r->cache);
  }
}

// core/cpu.h: every kernel variant this CPU runs (scalar, AVX2, AVX-512)
// gives the bits of every other, end to end.
TEST(KernelVariants, BitwiseIdenticalAcrossInstructionSets) {
  const Model& m = tiny_model();
  auto tokens = prompt(300, m.config.vocab_size);
  const Isa best = kernel_isa();
  std::vector<std::pair<Isa, Outcome>> runs;
  for (Isa isa : supported_isas()) {
    set_kernel_isa(isa);
    runs.emplace_back(isa, run(m, tokens, 64));
  }
  set_kernel_isa(best);
  ASSERT_GE(runs.size(), 2u) << "the scalar variant and at least one vector variant";
  for (size_t i = 1; i < runs.size(); ++i) {
    const Outcome& a = runs[0].second;
    const Outcome& b = runs[i].second;
    EXPECT_TRUE(same_bits(a.result.logits, b.result.logits)) << isa_name(runs[i].first);
    EXPECT_TRUE(same_bits(a.result.hidden, b.result.hidden)) << isa_name(runs[i].first);
    EXPECT_EQ(a.cache, b.cache) << isa_name(runs[i].first);
  }
}

// PREFILL.md §1: layer-major chunks (one MoE step over several tiles) give
// bitwise what the tile-major walk gives, for every chunk size.
TEST(ChunkSizes, BitwiseIdenticalToTileMajor) {
  const Model& m = tiny_model();
  auto tokens = prompt(3000, m.config.vocab_size);
  const Outcome ref = run(m, tokens, 128, 128);
  for (auto [tile, chunk] : std::vector<std::pair<int64_t, int64_t>>{{128, 0}, {128, 512}, {128, 2048}, {300, 1000}, {64, 100}}) {
    const Outcome r = run(m, tokens, tile, chunk);
    EXPECT_TRUE(same_bits(r.result.logits, ref.result.logits)) << "tile=" << tile << " chunk=" << chunk;
    EXPECT_TRUE(same_bits(r.result.hidden, ref.result.hidden)) << "tile=" << tile << " chunk=" << chunk;
    EXPECT_EQ(r.cache, ref.cache) << "tile=" << tile << " chunk=" << chunk;
  }
}

// PREFILL.md §4, §6: requests prefilled together share each MoE step, and
// each gets bitwise what it gets alone; a bad request fails alone.
TEST(Batch, EachRequestAsAlone) {
  const Model& m = tiny_model();
  const int V = m.config.vocab_size;
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t n : {1, 129, 700, 2000}) prompts.push_back(prompt(n, V));
  prompts[2][5] = (prompts[2][5] + 17) % V;  // not a prefix of the longer prompt
  std::vector<int32_t> bad = prompt(50, V);
  bad[10] = V;  // out of range
  prompts.insert(prompts.begin() + 1, bad);

  CachePool pool(size_t(64) << 20);
  std::vector<RequestState> states(prompts.size());
  std::vector<RequestState*> ptrs;
  for (RequestState& s : states) {
    s.init(m, &pool);
    ptrs.push_back(&s);
  }
  PrefillOptions o;
  o.chunk_tokens = 256;
  o.keep_hidden = true;
  std::vector<PrefillResult> got = extend_batch(m, ptrs, prompts, o);
  ASSERT_EQ(got.size(), prompts.size());
  EXPECT_NE(got[1].error.find("outside [0, vocab_size"), std::string::npos) << got[1].error;
  EXPECT_EQ(states[1].n_tokens, 0);
  EXPECT_EQ(states[1].cache_bytes(), 0u);
  for (size_t i : {0, 2, 3, 4}) {
    const Outcome alone = run(m, prompts[i], 128);
    EXPECT_TRUE(got[i].error.empty()) << got[i].error;
    EXPECT_TRUE(same_bits(got[i].logits, alone.result.logits)) << "request " << i;
    EXPECT_TRUE(same_bits(got[i].hidden, alone.result.hidden)) << "request " << i;
    EXPECT_EQ(cache_contents(m, states[i]), alone.cache) << "request " << i;
    EXPECT_EQ(got[i].next_token, alone.result.next_token);
  }
}

TEST(Batch, PoolExhaustionFailsOnlyThatRequest) {
  const Model& m = tiny_model();
  auto small = prompt(100, m.config.vocab_size), big = prompt(4000, m.config.vocab_size);
  // Room for the small request, not for both.
  CachePool pool((pool_for_request(m, 100)->total_pages() + 3) * CachePool::kDefaultPageBytes);
  RequestState a, b;
  a.init(m, &pool);
  b.init(m, &pool);
  std::vector<PrefillResult> got = extend_batch(m, {&a, &b}, {small, big}, PrefillOptions{});
  EXPECT_TRUE(got[0].error.empty()) << got[0].error;
  EXPECT_NE(got[1].error.find("cache pool exhausted"), std::string::npos) << got[1].error;
  EXPECT_EQ(b.cache_bytes(), 0u);
  EXPECT_TRUE(same_bits(got[0].logits, run(m, small, 128).result.logits));
}

// PREFILL.md §2, row by row: raw window min(N, sliding_window) rows of
// head_dim bf16; compressed rows N div r of head_dim bf16; indexer rows
// N div 4 of index_head_dim bf16; compressor state min(N, coff·r) source
// rows of 2·coff·hd fp32 (a and g). Each array is rounded up to whole pages.
size_t formula_bytes(const ModelConfig& c, int64_t N, size_t page) {
  auto pages = [&](int64_t rows, int64_t row_bytes) {
    const int64_t per = int64_t(page) / row_bytes;
    return size_t((rows + per - 1) / per) * page;
  };
  size_t b = 0;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const int r = c.ratio(l);
    b += pages(std::min<int64_t>(N, c.sliding_window), 2 * c.head_dim);
    if (r != 0) {
      const int coff = r == 4 ? 2 : 1;
      b += pages(N / r, 2 * c.head_dim) + pages(std::min<int64_t>(N, coff * r), 2 * coff * c.head_dim * 4);
    }
    if (r == 4) b += pages(N / 4, 2 * c.index_head_dim) + pages(std::min<int64_t>(N, 8), 2 * 2 * c.index_head_dim * 4);
  }
  return b;
}

TEST(CacheBytes, MatchesFormula) {
  const Model& m = tiny_model();
  for (int64_t n : {1, 5, 127, 128, 300, 2100, 8192}) {
    PrefillOptions o;
    PrefillResult r = prefill(m, prompt(n, m.config.vocab_size), o);
    EXPECT_EQ(r.cache_bytes, formula_bytes(m.config, n, CachePool::kDefaultPageBytes)) << "N=" << n;
  }
}

TEST(CachePool, ExhaustionFailsCleanlyAndLeavesThePoolIntact) {
  const Model& m = tiny_model();
  auto tokens = prompt(4000, m.config.vocab_size);
  auto needed = pool_for_request(m, 4000);
  CachePool pool((needed->total_pages() - 1) * CachePool::kDefaultPageBytes);  // one page short
  ASSERT_GT(pool.total_pages(), pool_for_request(m, 100)->total_pages());
  const size_t free0 = pool.free_pages();
  {
    RequestState st;
    st.init(m, &pool);
    PrefillOptions o;
    try {
      extend(m, st, tokens, o);
      FAIL() << "expected the pool to be exhausted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("cache pool exhausted"), std::string::npos) << e.what();
    }
    EXPECT_EQ(st.n_tokens, 0);
    EXPECT_EQ(st.cache_bytes(), 0u);
  }
  EXPECT_EQ(pool.free_pages(), free0);
  // A request that fits still succeeds, and gives the same result as alone.
  auto small = prompt(100, m.config.vocab_size);
  PrefillOptions o;
  PrefillResult in_pool = prefill(m, small, o, &pool);
  PrefillResult alone = prefill(m, small, o);
  EXPECT_TRUE(same_bits(in_pool.logits, alone.logits));
  EXPECT_EQ(pool.free_pages(), free0);  // the finished request gave its pages back
}

TEST(CachePool, CliReportsAFullPool) {
  testing::TempDir tmp;
  SyntheticOptions so;
  write_synthetic_model(tmp / "m", so);
  // 4000 positions need more than the 16 pages of 64 KiB in 1 MiB.
  std::string ids = "[0";
  for (int i = 1; i < 4000; ++i) ids += "," + std::to_string(3 + i % 1000);
  std::ofstream(tmp / "p.json") << ids << "]";
  auto r = testing::run_dsv4("prefill --model " + (tmp / "m") + " --tokens " + (tmp / "p.json") + " --cache-pool-mb 1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("cache pool exhausted"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace dsv4
