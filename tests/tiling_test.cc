// PREFILL.md §1, §2 and §6: the tile walk and the thread count never change a
// result — logits, every hidden row and every cache byte are bitwise
// identical — and the paged caches hold what §2 says, in pool pages.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/prefill.h"
#include "model/synthetic.h"
#include "test_util.h"

namespace dsv4 {
namespace {

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

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The request's cache contents in logical order (slot by slot), independent
// of which physical pages hold them.
std::vector<uint8_t> cache_contents(const Model& m, const RequestState& st) {
  std::vector<uint8_t> out;
  auto append = [&](const PagedRows& rows, int64_t n) {
    for (int64_t r = 0; r < n; ++r) out.insert(out.end(), rows.row(r), rows.row(r) + rows.row_bytes());
  };
  const int64_t N = st.n_tokens;
  for (size_t l = 0; l < st.layers.size(); ++l) {
    const AttentionState& a = st.layers[l];
    append(a.window, std::min(N, a.window_rows));
    const AttentionWeights& w = m.weights.layers[l].attn;
    if (a.ratio != 0) {
      append(a.comp.rows, a.comp.n_rows);
      append(a.comp.ring, std::min<int64_t>(N, w.compressor.coff * w.compressor.ratio));
    }
    if (a.ratio == 4) {
      append(a.idx_comp.rows, a.idx_comp.n_rows);
      append(a.idx_comp.ring, std::min<int64_t>(N, 2 * 4));
    }
  }
  return out;
}

struct Outcome {
  PrefillResult result;
  std::vector<uint8_t> cache;
};

Outcome run(const Model& m, const std::vector<int32_t>& tokens, int64_t tile) {
  auto pool = pool_for_request(m, int64_t(tokens.size()));
  RequestState st;
  st.init(m, pool.get());
  PrefillOptions o;
  o.tile_tokens = tile;
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
  for (int64_t t : {1, 3, 16, 128, 512}) {
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
