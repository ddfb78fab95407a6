// Decoding continues from the prefill's caches (PREFILL.md §2): each greedy
// step's logits equal, bit for bit, the last row of a prefill of the prompt
// plus the tokens generated so far.
#include <gtest/gtest.h>

#include <cstring>

#include "core/cpu.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/prefill.h"
#include "kernels/gemv.h"
#include "test_util.h"

namespace dsv4 {
namespace {

const Model& golden_model() {
  static std::unique_ptr<Model> m = Model::load(testing::golden_dir());
  return *m;
}

class DecodeAfterPrefill : public ::testing::TestWithParam<int64_t> {};

TEST_P(DecodeAfterPrefill, StepsMatchFreshPrefills) {
  const Model& m = golden_model();
  const int64_t n = GetParam();
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) tokens[size_t(i)] = int32_t((i * 7919 + 3) % m.config.vocab_size);
  PrefillOptions o;
  o.tile_tokens = 128;
  auto pool = pool_for_request(m, n + 8);
  RequestState st;
  st.init(m, pool.get());
  PrefillResult r = extend(m, st, tokens, o);
  std::vector<int32_t> all = tokens;
  const int K = 8;
  for (int i = 0; i < K; ++i) {
    PrefillResult fresh = prefill(m, all, o);
    ASSERT_EQ(r.logits.size(), fresh.logits.size());
    EXPECT_EQ(std::memcmp(r.logits.data(), fresh.logits.data(), r.logits.size() * sizeof(float)), 0)
        << "N=" << n << " step " << i;
    all.push_back(r.next_token);
    r = extend(m, st, {r.next_token}, o);
  }
  EXPECT_EQ(st.n_tokens, n + K);
}

// Lengths around the window (128), the HCA block (128) and CSA blocks (4).
INSTANTIATE_TEST_SUITE_P(Prompts, DecodeAfterPrefill, ::testing::Values(1, 3, 126, 127, 130, 300));

// Decode steps take the GEMV path (kernels/gemv.h) where the CPU has it,
// while the prefills take gemm: the steps still equal fresh prefills, for
// every kernel variant and thread count.
TEST(DecodeAfterPrefillVariants, GemvStepsMatchFreshPrefills) {
  const Model& m = golden_model();
  const int64_t n = 130;
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) tokens[size_t(i)] = int32_t((i * 7919 + 3) % m.config.vocab_size);
  PrefillOptions o;
  o.tile_tokens = 128;
  const Isa best = kernel_isa();
  for (Isa isa : supported_isas()) {
    set_kernel_isa(isa);
    for (int threads : {1, 2, 3}) {
      ThreadPool::set_threads(threads);
      SCOPED_TRACE(::testing::Message() << isa_name(isa) << ", " << threads << " threads");
      auto pool = pool_for_request(m, n + 4);
      RequestState st;
      st.init(m, pool.get());
      PrefillResult r = extend(m, st, tokens, o);
      std::vector<int32_t> all = tokens;
      for (int i = 0; i < 3; ++i) {
        all.push_back(r.next_token);
        const int64_t tiles = gemv_tile_count();
        r = extend(m, st, {r.next_token}, o);
        if (isa >= Isa::kAvx512) {
          EXPECT_GT(gemv_tile_count(), tiles) << "the step took the GEMV path";
        }
        PrefillResult fresh = prefill(m, all, o);
        ASSERT_EQ(r.logits.size(), fresh.logits.size());
        EXPECT_EQ(std::memcmp(r.logits.data(), fresh.logits.data(), r.logits.size() * sizeof(float)), 0)
            << "step " << i;
      }
    }
  }
  set_kernel_isa(best);
  ThreadPool::set_threads(0);
}

TEST(DecodeLimits, RequestLongerThanLimitIsRejected) {
  const Model& m = golden_model();
  auto pool = pool_for_request(m, 10);
  RequestState st;
  st.init(m, pool.get());
  PrefillOptions o;
  o.max_positions = 10;
  std::vector<int32_t> tokens(10, 5);
  extend(m, st, tokens, o);
  EXPECT_THROW(extend(m, st, {5}, o), Error);
  EXPECT_EQ(st.n_tokens, 10);  // the failed step changed nothing
}

}  // namespace
}  // namespace dsv4
