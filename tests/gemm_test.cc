// The fast gemm against its scalar definition: bitwise equal for every shape,
// thread count and row block (the reduction order is one FMA chain per
// output in ascending k).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/gemm.h"

namespace dsv4 {
namespace {

TEST(Gemm, FastEqualsReferenceBitwise) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  for (auto [M, K, N] : {std::array<int64_t, 3>{1, 1, 1}, {3, 17, 5}, {4, 64, 16}, {7, 100, 33},
                         {200, 256, 50}, {385, 129, 47}, {600, 64, 17}}) {
    std::vector<float> A(size_t(M * K)), B(size_t(N * K));
    for (float& v : A) v = nd(rng);
    for (float& v : B) v = nd(rng);
    auto load = dense_rows_loader(B.data(), K, N, K);
    for (bool bf16 : {false, true}) {
      std::vector<float> ref(size_t(M * N)), fast(size_t(M * N));
      gemm_reference(A.data(), K, M, K, N, load, GemmOut{ref.data(), N, bf16});
      for (int threads : {1, 2, 3}) {
        ThreadPool::set_threads(threads);
        std::fill(fast.begin(), fast.end(), -1.f);
        gemm(A.data(), K, M, K, N, load, GemmOut{fast.data(), N, bf16});
        EXPECT_EQ(std::memcmp(fast.data(), ref.data(), fast.size() * 4), 0)
            << M << "x" << K << "x" << N << " threads " << threads;
      }
      ThreadPool::set_threads(0);
    }
  }
}

TEST(Gemm, ResultOfARowDoesNotDependOnM) {
  std::mt19937 rng(9);
  std::normal_distribution<float> nd;
  const int64_t K = 300, N = 40, M = 500;
  std::vector<float> A(size_t(M * K)), B(size_t(N * K));
  for (float& v : A) v = nd(rng);
  for (float& v : B) v = nd(rng);
  auto load = dense_rows_loader(B.data(), K, N, K);
  std::vector<float> all(static_cast<size_t>(M * N)), one(static_cast<size_t>(N));
  gemm(A.data(), K, M, K, N, load, GemmOut{all.data(), N, false});
  for (int64_t m : {0, 3, 191, 192, 499}) {
    gemm(A.data() + m * K, K, 1, K, N, load, GemmOut{one.data(), N, false});
    EXPECT_EQ(std::memcmp(one.data(), all.data() + m * N, size_t(N) * 4), 0) << m;
  }
}

}  // namespace
}  // namespace dsv4
