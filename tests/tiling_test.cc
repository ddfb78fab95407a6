// PREFILL.md §1 and §6: the tile walk and the thread count never change a
// result — logits and every hidden row are bitwise identical.
#include <gtest/gtest.h>

#include <cstring>

#include "core/thread_pool.h"
#include "engine/prefill.h"
#include "test_util.h"

namespace dsv4 {
namespace {

const Model& golden_model() {
  static std::unique_ptr<Model> m = Model::load(testing::golden_dir());
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

class TileSizes : public ::testing::TestWithParam<int64_t> {};

TEST_P(TileSizes, BitwiseIdenticalToWholePrompt) {
  const Model& m = golden_model();
  const int64_t n = GetParam();
  auto tokens = prompt(n, m.config.vocab_size);
  PrefillOptions whole;
  whole.tile_tokens = 0;
  whole.keep_hidden = true;
  PrefillResult ref = prefill(m, tokens, whole);
  for (int64_t t : {1, 3, 16, 128, 512}) {
    if (t > n && t != 1) continue;
    PrefillOptions o = whole;
    o.tile_tokens = t;
    PrefillResult r = prefill(m, tokens, o);
    EXPECT_TRUE(same_bits(r.logits, ref.logits)) << "N=" << n << " tile=" << t;
    EXPECT_TRUE(same_bits(r.hidden, ref.hidden)) << "N=" << n << " tile=" << t;
    EXPECT_EQ(r.next_token, ref.next_token);
  }
}

INSTANTIATE_TEST_SUITE_P(Prompts, TileSizes, ::testing::Values(1, 2, 127, 128, 129, 300, 1000));

TEST(Threads, BitwiseIdenticalAcrossThreadCounts) {
  const Model& m = golden_model();
  auto tokens = prompt(300, m.config.vocab_size);
  PrefillOptions o;
  o.keep_hidden = true;
  ThreadPool::set_threads(1);
  PrefillResult one = prefill(m, tokens, o);
  ThreadPool::set_threads(2);
  PrefillResult two = prefill(m, tokens, o);
  ThreadPool::set_threads(3);
  PrefillResult three = prefill(m, tokens, o);
  ThreadPool::set_threads(0);
  EXPECT_TRUE(same_bits(one.logits, two.logits));
  EXPECT_TRUE(same_bits(one.hidden, two.hidden));
  EXPECT_TRUE(same_bits(one.logits, three.logits));
  EXPECT_TRUE(same_bits(one.hidden, three.hidden));
}

}  // namespace
}  // namespace dsv4
