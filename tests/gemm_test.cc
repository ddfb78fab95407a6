// The fast gemm against its scalar definition: bitwise equal for every shape,
// thread count and row block (the reduction order is one FMA chain per
// output in ascending k).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/cpu.h"
#include "core/error.h"
#include "core/formats.h"
#include "core/peak.h"
#include "core/thread_pool.h"
#include "kernels/gemm.h"
#include "kernels/gemv.h"
#include "kernels/linear.h"

namespace dsv4 {
namespace {

// Every kernel variant the CPU runs (core/cpu.h), each thread count.
TEST(Gemm, FastEqualsReferenceBitwise) {
  const Isa best = kernel_isa();
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  for (auto [M, K, N] : {std::array<int64_t, 3>{1, 1, 1}, {3, 17, 5}, {4, 64, 16}, {7, 100, 33},
                         {200, 256, 50}, {385, 129, 47}, {600, 64, 17},
                         {13, 2500, 37},  // K over one k block: the chains continue across blocks
                         {29, 1536, 40}}) {  // rows 6 KB apart: the fp32 kernels read a padded copy of A
    std::vector<float> A(size_t(M * K)), B(size_t(N * K));
    for (float& v : A) v = nd(rng);
    for (float& v : B) v = nd(rng);
    auto load = dense_rows_loader(B.data(), K, N, K);
    for (bool bf16 : {false, true}) {
      std::vector<float> ref(size_t(M * N)), fast(size_t(M * N));
      gemm_reference(A.data(), K, M, K, N, load, GemmOut{ref.data(), N, bf16});
      for (Isa isa : supported_isas()) {
        set_kernel_isa(isa);
        for (int threads : {1, 2, 3}) {
          ThreadPool::set_threads(threads);
          std::fill(fast.begin(), fast.end(), -1.f);
          gemm(A.data(), K, M, K, N, load, GemmOut{fast.data(), N, bf16});
          EXPECT_EQ(std::memcmp(fast.data(), ref.data(), fast.size() * 4), 0)
              << M << "x" << K << "x" << N << " " << isa_name(isa) << " threads " << threads;
        }
      }
      set_kernel_isa(best);
      ThreadPool::set_threads(0);
    }
  }
}

// Operands that are bf16 values, as the FP8/FP4 linears' (quantised
// activations times power-of-two scales) and BF16 weights are: the BF16
// dot-product kernel (Isa::kAvx512Bf16) takes them and must still give the
// reference's bits. Odd K (a padded last pair), K over one k block, row and
// panel tails; with a pair loader, and with panels packed beforehand (a
// PairSource), too; and with one inexact B value, which
// sends its panel to the fp32 kernel.
TEST(Gemm, Bf16OperandsEqualReferenceBitwise) {
  const Isa best = kernel_isa();
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  auto bf16_value = [&](float scale) { return bf16r(nd(rng) * scale); };
  const int64_t dot_before = gemm_dot_panel_count();
  for (auto [M, K, N] : {std::array<int64_t, 3>{1, 1, 1}, {3, 17, 5}, {13, 64, 33}, {25, 257, 47},
                         {200, 256, 64}, {30, 2500, 37}, {7, 2049, 19}, {385, 130, 20}, {400, 2100, 40},
                         {27, 1024, 40}}) {  // 32 lines of pairs per row, packed 33 apart
    std::vector<float> A(size_t(M * K)), B(size_t(N * K));
    for (float& v : A) v = bf16_value(1.f);
    for (float& v : B) v = bf16_value(0.05f);
    if (K > 2048) B[size_t(3 * K + 1500)] = 0.1f;  // not a bf16 value
    auto load = dense_rows_loader(B.data(), K, N, K);
    const PairLoader load_pairs = dense_rows_pair_loader(B.data(), K, N, K);
    std::vector<float> ref(size_t(M * N)), fast(size_t(M * N));
    gemm_reference(A.data(), K, M, K, N, load, GemmOut{ref.data(), N, false});
    for (Isa isa : supported_isas()) {
      set_kernel_isa(isa);
      // B also packed once and handed over in place (PairSource), every
      // third panel declined (loaded and packed per call): a two-panel
      // micro-tile then reads from two buffers.
      const int64_t KH = (K + 1) / 2, panels = (N + kGemmNR - 1) / kGemmNR;
      std::vector<uint32_t> packed(static_cast<size_t>(panels * KH * kGemmNR));
      std::vector<int> exps(static_cast<size_t>(panels));
      std::vector<bool> have(static_cast<size_t>(panels));
      for (int64_t p = 0; p < panels; ++p)
        have[size_t(p)] = p % 3 != 1 && load_pairs(p * kGemmNR, packed.data() + p * KH * kGemmNR, &exps[size_t(p)]);
      const PairSource source = [&](int64_t n0, int* e) -> const uint32_t* {
        const int64_t p = n0 / kGemmNR;
        if (!have[size_t(p)]) return nullptr;
        *e = exps[size_t(p)];
        return packed.data() + p * KH * kGemmNR;
      };
      for (int threads : {1, 2})
        for (int how : {0, 1, 2}) {  // fp32 panels only, a PairLoader, a PairSource
          ThreadPool::set_threads(threads);
          std::fill(fast.begin(), fast.end(), -1.f);
          gemm(A.data(), K, M, K, N, load, GemmOut{fast.data(), N, false}, true, how == 1 ? &load_pairs : nullptr,
               how == 2 ? &source : nullptr);
          EXPECT_EQ(std::memcmp(fast.data(), ref.data(), fast.size() * 4), 0)
              << M << "x" << K << "x" << N << " " << isa_name(isa) << " threads " << threads << " B " << how;
        }
    }
    set_kernel_isa(best);
    ThreadPool::set_threads(0);
  }
  const std::vector<Isa> have = supported_isas();
  if (have.back() == Isa::kAvx512Bf16) {
    EXPECT_GT(gemm_dot_panel_count(), dot_before) << "the BF16 kernel never ran";
  }
}

// Where the BF16 kernel would flush a subnormal product to zero, gemm must
// leave it to the fp32 kernels. 2^-70 · 2^-70 = 2^-140 is subnormal in fp32:
// the FMA chain keeps it, vdpbf16ps would not. 2^-56 · 2^-56 = 2^-112 is
// the smallest scale the BF16 kernel takes (core/cpu.h, kernels/gemm.cc).
TEST(Gemm, Bf16KernelOnlyWhereNothingIsFlushed) {
  const Isa best = kernel_isa();
  const int64_t M = 24, K = 64, N = 32;
  for (int e : {-70, -57, -56}) {
    std::vector<float> A(size_t(M * K)), B(size_t(N * K));
    for (size_t i = 0; i < A.size(); ++i) A[i] = std::ldexp(float(1 + int(i % 5)) * (i % 3 ? 1.f : -1.f), e);
    for (size_t i = 0; i < B.size(); ++i) B[i] = std::ldexp(float(1 + int(i % 7)) * (i % 4 ? 1.f : -1.f), e);
    auto load = dense_rows_loader(B.data(), K, N, K);
    std::vector<float> ref(size_t(M * N)), fast(size_t(M * N));
    gemm_reference(A.data(), K, M, K, N, load, GemmOut{ref.data(), N, false});
    for (Isa isa : supported_isas()) {
      set_kernel_isa(isa);
      const int64_t before = gemm_dot_panel_count();
      gemm(A.data(), K, M, K, N, load, GemmOut{fast.data(), N, false});
      EXPECT_EQ(std::memcmp(fast.data(), ref.data(), fast.size() * 4), 0) << "2^" << e << " " << isa_name(isa);
      if (isa == Isa::kAvx512Bf16) {
        // Values 1..7 times 2^e: the smallest biased exponent is e + 127.
        const bool dot = 2 * (e + 127) >= 142;
        EXPECT_EQ(gemm_dot_panel_count() > before, dot) << "2^" << e;
      }
    }
    set_kernel_isa(best);
  }
}

// Weight::dequant_panel_pairs against the reference panel, every panel of w:
// the same values as bf16 pairs (k in the high half, k + 1 in the low one)
// and a lower bound of their exponents where it takes a panel; whether it
// takes panel o0 is expected(o0).
template <class Expected>
void expect_pair_panels(const Weight& w, Expected expected, const std::string& what) {
  for (int64_t o0 = 0; o0 < w.out; o0 += kGemmNR) {
    std::vector<float> ref(size_t(w.in * kGemmNR));
    std::vector<uint32_t> pairs(size_t(w.in / 2 * kGemmNR), 0xdeadbeef);
    w.dequant_panel_reference(o0, w.out, ref.data());
    int min_exp = -1;
    const bool taken = w.dequant_panel_pairs(o0, w.out, pairs.data(), &min_exp);
    EXPECT_EQ(taken, expected(o0)) << what << " o0 " << o0;
    if (!taken) continue;
    for (int64_t k = 0; k < w.in; k += 2)
      for (int j = 0; j < kGemmNR; ++j) {
        uint32_t x, y;
        std::memcpy(&x, &ref[size_t(k * kGemmNR + j)], 4);
        std::memcpy(&y, &ref[size_t((k + 1) * kGemmNR + j)], 4);
        ASSERT_EQ(x & 0xffffu, 0u);  // the reference values are bf16 values
        ASSERT_EQ(y & 0xffffu, 0u);
        ASSERT_EQ(pairs[size_t(k / 2 * kGemmNR + j)], (x & 0xffff0000u) | (y >> 16))
            << what << " o0 " << o0 << " k " << k << " j " << j;
        for (uint32_t v : {x, y}) {
          if (v & 0x7fffffffu) {
            ASSERT_LE(min_exp, int((v >> 23) & 0xff)) << what << ": a lower bound";
          }
        }
      }
  }
}

// The fp32 panel of the other kernels (Weight::dequant_panel): the
// reference's bits, also from a weight's FP4 or FP8 panels
// (linear.cc panel_from_quant_panels) and where those refuse a scale.
void expect_fp32_panels(const Weight& w, const std::string& what) {
  for (int64_t o0 = 0; o0 < w.out; o0 += kGemmNR) {
    std::vector<float> ref(size_t(w.in * kGemmNR)), panel(size_t(w.in * kGemmNR), -7.f);
    w.dequant_panel_reference(o0, w.out, ref.data());
    w.dequant_panel(o0, w.out, panel.data());
    ASSERT_EQ(std::memcmp(ref.data(), panel.data(), ref.size() * sizeof(float)), 0) << what << " o0 " << o0;
  }
}

// Rows given by pointers (the indexer's, packed once per tile) and
// row-major rows straight to pairs, against the pairs and exponent bound taken
// from the values one by one: every K tail (masked loads; each row its own
// allocation, so a read past K shows under ASan), partial panels, and
// refusal of inexact, subnormal and infinite values.
TEST(Gemm, GatheredRowPairsEqualRowValues) {
  if (supported_isas().back() != Isa::kAvx512Bf16) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  const Isa best = kernel_isa();
  set_kernel_isa(Isa::kAvx512Bf16);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  for (int64_t K : {512, 1, 7, 31, 32, 33, 100}) {
    for (int64_t N : {16, 5, 21}) {
      std::vector<std::vector<float>> rows(static_cast<size_t>(N));
      std::vector<float> dense(size_t(N * K));
      for (int64_t n = 0; n < N; ++n) {
        rows[size_t(n)].resize(static_cast<size_t>(K));
        for (int64_t k = 0; k < K; ++k)
          dense[size_t(n * K + k)] = rows[size_t(n)][size_t(k)] = bf16r(rng() % 5 == 0 ? 0.f : nd(rng));
      }
      std::vector<const float*> ptrs;
      for (auto& r : rows) ptrs.push_back(r.data());
      const PairLoader dense_pairs = dense_rows_pair_loader(dense.data(), K, N, K);
      // bad: none, or an inexact / subnormal / infinite value in row 2.
      for (uint32_t bad : {0u, 0x3f800001u, 0x00010000u, 0x7f800000u}) {
        if (bad) std::memcpy(&rows[2][size_t(K / 2)], &bad, 4);
        if (bad) std::memcpy(&dense[size_t(2 * K + K / 2)], &bad, 4);
        for (int64_t n0 = 0; n0 < N; n0 += kGemmNR) {
          const std::string what = "K " + std::to_string(K) + " N " + std::to_string(N) + " n0 " +
                                   std::to_string(n0) + " bad " + std::to_string(bad);
          std::vector<uint32_t> expect(size_t((K + 1) / 2 * kGemmNR), 0);
          int expect_exp = 255;
          for (int64_t n = n0; n < std::min(N, n0 + kGemmNR); ++n)
            for (int64_t k = 0; k < K; ++k) {
              uint32_t v;
              std::memcpy(&v, &rows[size_t(n)][size_t(k)], 4);
              expect[size_t(k / 2 * kGemmNR + (n - n0))] |= k % 2 ? v >> 16 : v & 0xffff0000u;
              if (v & 0x7fffffffu) expect_exp = std::min(expect_exp, int((v >> 23) & 0xff));
            }
          const bool exact = !bad || n0 > 2;
          for (int how = 0; how < 2; ++how) {
            std::vector<uint32_t> got(expect.size(), 0xdeadbeef);
            int got_exp = -1;
            const bool taken = how == 0 ? gathered_rows_pairs(ptrs.data(), N, K, n0, got.data(), &got_exp)
                                        : dense_pairs(n0, got.data(), &got_exp);
            ASSERT_EQ(taken, exact) << what << " how " << how;
            if (!taken) continue;
            EXPECT_EQ(got_exp, expect_exp) << what << " how " << how;
            EXPECT_EQ(got, expect) << what << " how " << how;
          }
        }
      }
    }
  }
  set_kernel_isa(Isa::kAvx2);
  std::vector<uint32_t> pairs(kGemmNR);
  int e = 0;
  const float one = 1.f, *row = &one;
  EXPECT_FALSE(gathered_rows_pairs(&row, 1, 1, 0, pairs.data(), &e)) << "only the BF16 kernel takes pairs";
  set_kernel_isa(best);
}

// The FP4 and FP8 decoders straight to bf16 pairs (Isa::kAvx512Bf16): the
// reference panel's values, refused exactly where a scale would make a value
// subnormal or infinite or where an FP8 code is NaN.
TEST(Gemm, PairPanelsEqualReferencePanels) {
  if (supported_isas().back() != Isa::kAvx512Bf16) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  const Isa best = kernel_isa();
  set_kernel_isa(Isa::kAvx512Bf16);
  std::mt19937 rng(3);
  // FP4: scale codes 2..252 are taken. 1184 values a row: two whole groups
  // of 16 scale blocks (read 16 at a time) and 5 more (read one by one).
  for (int64_t in : {192, 1184}) {
    const int64_t out = 37;
    std::vector<uint8_t> data(size_t(out * in / 2)), scale(size_t(out * in / 32));
    for (uint8_t& b : data) b = uint8_t(rng());
    Weight w;
    w.kind = Weight::Kind::kFP4;
    w.out = out;
    w.in = in;
    w.data = data.data();
    w.scale = scale.data();
    for (int edge : {-1, 0, 1, 2, 252, 253, 255}) {
      for (uint8_t& c : scale) c = uint8_t(2 + rng() % 251);
      if (edge >= 0) scale[size_t(rng() % scale.size())] = uint8_t(edge);
      // From the rows, and from the panels pack_quant_panels makes of them.
      Weight packed = w;
      const std::shared_ptr<const uint8_t> panels = pack_quant_panels(packed);
      ASSERT_TRUE(panels);
      for (const Weight* from : {&w, &packed})
      expect_pair_panels(
          *from,
          [&](int64_t o0) {
            for (int64_t o = o0; o < std::min(out, o0 + kGemmNR); ++o)
              for (int64_t b = 0; b < in / 32; ++b) {
                const int c = scale[size_t(o * (in / 32) + b)];
                if (c < 2 || c > 252) return false;
              }
            return true;
          },
          "fp4 in " + std::to_string(in) + " edge " + std::to_string(edge) + (from == &w ? "" : " panels"));
      expect_fp32_panels(packed, "fp4 in " + std::to_string(in) + " edge " + std::to_string(edge) + " fp32");
    }
  }
  for (int block : {128, 16, 40}) {  // FP8: scale codes 10..246 and no NaN code; block 40 is not taken
    const int64_t out = 150, in = 256, srows = (out + block - 1) / block, scols = (in + block - 1) / block;
    std::vector<uint8_t> data(size_t(out * in)), scale(size_t(srows * scols));
    Weight w;
    w.kind = Weight::Kind::kFP8;
    w.out = out;
    w.in = in;
    w.block = block;
    w.data = data.data();
    w.scale = scale.data();
    for (int edge : {-1, 9, 10, 246, 247, 0x7f, 0xff}) {  // 0x7f, 0xff: a NaN code instead
      for (uint8_t& b : data) {
        b = uint8_t(rng());
        if ((b & 0x7f) == 0x7f) b = 0x7e;
      }
      for (uint8_t& c : scale) c = uint8_t(10 + rng() % 237);
      if (edge == 0x7f || edge == 0xff)
        data[size_t(rng() % data.size())] = uint8_t(edge);
      else if (edge >= 0)
        scale[size_t(rng() % scale.size())] = uint8_t(edge);
      // From the rows, and from the panels where the packer makes them (a
      // block that is a multiple of 16, no NaN code).
      Weight packed = w;
      const std::shared_ptr<const uint8_t> panels = pack_quant_panels(packed);
      EXPECT_EQ(bool(panels), block % 16 == 0 && edge != 0x7f && edge != 0xff);
      for (const Weight* from : {&w, &packed})
      expect_pair_panels(
          *from,
          [&](int64_t o0) {
            if (block % 16 != 0) return false;
            for (int64_t o = o0; o < std::min(out, o0 + kGemmNR); ++o)
              for (int64_t k = 0; k < in; ++k) {
                const int c = scale[size_t((o / block) * scols + k / block)];
                if (c < 10 || c > 246 || (data[size_t(o * in + k)] & 0x7f) == 0x7f) return false;
              }
            return true;
          },
          "fp8 block " + std::to_string(block) + " edge " + std::to_string(edge) + (from == &w ? "" : " panels"));
      expect_fp32_panels(packed, "fp8 block " + std::to_string(block) + " edge " + std::to_string(edge) + " fp32");
    }
  }
  set_kernel_isa(best);
}

TEST(Gemm, KernelVariantChoice) {
  const std::vector<Isa> have = supported_isas();
  ASSERT_FALSE(have.empty());
  EXPECT_EQ(have.front(), Isa::kScalar);
  // The fastest variant by default, where vdpbf16ps is measured against
  // fp32 FMA (core/peak.h).
  const bool dot_slower = have.back() == Isa::kAvx512Bf16 && bf16_dot_to_fma_ratio() < 1.0;
  EXPECT_EQ(default_isa(), dot_slower ? Isa::kAvx512 : have.back()) << bf16_dot_to_fma_ratio();
  if (have.back() == Isa::kAvx512Bf16) {
    EXPECT_GT(bf16_dot_to_fma_ratio(), 0.1);
    EXPECT_LT(bf16_dot_to_fma_ratio(), 10.0);
  } else {
    EXPECT_EQ(bf16_dot_to_fma_ratio(), 0.0);
  }
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16}) {
    EXPECT_EQ(parse_isa(isa_name(isa), "DSV4_ISA"), isa);
  }
  try {
    parse_isa("sse2", "DSV4_ISA");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("DSV4_ISA: expected scalar, avx2, avx512 or avx512bf16, got 'sse2'"),
              std::string::npos)
        << e.what();
  }
  // The GEMV tiles take the fastest variant while the gemm runs its
  // default, and follow any other choice (core/cpu.h gemv_isa).
  const Isa best = kernel_isa(), best_gemv = gemv_isa();
  for (Isa isa : have) {
    set_kernel_isa(isa);
    EXPECT_EQ(gemv_isa(), isa == default_isa() ? have.back() : isa) << isa_name(isa);
  }
  set_kernel_isa(default_isa());
  set_gemv_isa(Isa::kScalar);
  EXPECT_EQ(gemv_isa(), Isa::kScalar);
  EXPECT_EQ(kernel_isa(), default_isa());
  set_kernel_isa(best);
  set_gemv_isa(best_gemv);
  // The variants past the fastest one this CPU has are refused.
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16}) {
    if (isa <= have.back()) continue;
    for (void (*set)(Isa) : {&set_kernel_isa, &set_gemv_isa}) {
      try {
        set(isa);
        ADD_FAILURE() << "no error";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(std::string("'") + isa_name(isa) + "' is not supported"),
                  std::string::npos)
            << e.what();
      }
    }
    EXPECT_EQ(kernel_isa(), best) << "a refused choice leaves the variant as it was";
    EXPECT_EQ(gemv_isa(), best_gemv);
  }
}

// A is read in place: rows with a stride past K (a column slice of a wider
// matrix, as the grouped output projection passes it), over a row chunk edge.
TEST(Gemm, ReadsARowsWithTheirStride) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  const int64_t M = 200, K = 70, lda = 83, N = 37;
  std::vector<float> A(size_t(M * lda)), B(size_t(N * K));
  for (float& v : A) v = nd(rng);
  for (float& v : B) v = nd(rng);
  auto load = dense_rows_loader(B.data(), K, N, K);
  std::vector<float> ref(size_t(M * N)), fast(size_t(M * N));
  gemm_reference(A.data(), lda, M, K, N, load, GemmOut{ref.data(), N, false});
  gemm(A.data(), lda, M, K, N, load, GemmOut{fast.data(), N, false});
  EXPECT_EQ(std::memcmp(fast.data(), ref.data(), fast.size() * 4), 0);
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

// A product wide and tall enough to be taken in row slices (A over 4 MB,
// N >= 2048): rows on both sides of the slice edges equal the reference.
TEST(Gemm, RowSlicesOfALargeProductEqualReference) {
  std::mt19937 rng(13);
  std::normal_distribution<float> nd;
  const int64_t M = 1040, K = 1024, N = 2048;  // slices of 512 rows
  std::vector<float> A(size_t(M * K)), B(size_t(N * K));
  for (float& v : A) v = nd(rng);
  for (float& v : B) v = nd(rng);
  auto load = dense_rows_loader(B.data(), K, N, K);
  std::vector<float> all(static_cast<size_t>(M * N)), one(static_cast<size_t>(N));
  gemm(A.data(), K, M, K, N, load, GemmOut{all.data(), N, true});
  for (int64_t m : {0, 511, 512, 1023, 1024, 1039}) {
    gemm_reference(A.data() + m * K, K, 1, K, N, load, GemmOut{one.data(), N, true});
    EXPECT_EQ(std::memcmp(one.data(), all.data() + m * N, size_t(N) * 4), 0) << m;
  }
}

TEST(Gemm, EmptySumsAreZero) {
  std::vector<float> out(6, -1.f);
  gemm(nullptr, 0, 2, 0, 3, dense_rows_loader(nullptr, 0, 3, 0), GemmOut{out.data(), 3, true});
  for (float v : out) EXPECT_EQ(v, 0.f);
}

// linear() on FP8 and FP4 weights against dequant_row and one FMA chain per
// output, for few rows (one chunk) and many (several chunks), K over two k
// blocks and not a multiple of one.
TEST(Gemm, LinearEqualsRowByRowDefinition) {
  std::mt19937 rng(21);
  std::normal_distribution<float> nd;
  const int64_t K = 2560, N = 40;
  for (Weight::Kind kind : {Weight::Kind::kFP8, Weight::Kind::kFP4}) {
    std::vector<uint8_t> data(size_t(kind == Weight::Kind::kFP8 ? N * K : N * K / 2)), scale;
    for (uint8_t& b : data) b = uint8_t(rng() & (kind == Weight::Kind::kFP8 ? 0x7e : 0xff));  // no NaN codes
    scale.resize(kind == Weight::Kind::kFP8 ? size_t(((N + 127) / 128) * ((K + 127) / 128)) : size_t(N * K / 32));
    for (uint8_t& b : scale) b = uint8_t(120 + rng() % 8);
    Weight w;
    w.kind = kind;
    w.out = N;
    w.in = K;
    w.block = 128;
    w.data = data.data();
    w.scale = scale.data();
    for (int64_t M : {5, 300}) {
      std::vector<float> x(static_cast<size_t>(M * K)), y(static_cast<size_t>(M * N)), row(static_cast<size_t>(K));
      for (float& v : x) v = nd(rng);
      LinearOpts o;
      o.out_bf16 = false;
      linear(w, x.data(), M, y.data(), o);
      for (int64_t n = 0; n < N; ++n) {
        w.dequant_row(n, row.data());
        for (int64_t m = 0; m < M; ++m) {
          float acc = 0.f;
          for (int64_t k = 0; k < K; ++k) acc = std::fma(x[size_t(m * K + k)], row[size_t(k)], acc);
          ASSERT_EQ(acc, y[size_t(m * N + n)]) << "kind " << int(kind) << " M " << M << " m " << m << " n " << n;
        }
      }
    }
  }
}

// The vectorised panel loaders (each variant the CPU runs) against
// dequant_row, value by value, for every weight format, shapes with a partial
// last panel and with 16 or more FP4 scale blocks a row (read 16 at a time),
// all byte values.
TEST(Gemm, DequantPanelEqualsReferenceBitwise) {
  const Isa best = kernel_isa();
  std::mt19937 rng(11);
  for (Weight::Kind kind : {Weight::Kind::kF32, Weight::Kind::kBF16, Weight::Kind::kFP8, Weight::Kind::kFP4}) {
    // FP8 scale blocks other than Flash's 128: one shorter than a 64-code
    // step (16), one that does not divide it (48), one the 16-wide path
    // cannot take (40: the reference path).
    const std::vector<int> blocks =
        kind == Weight::Kind::kFP8 ? std::vector<int>{128, 16, 48, 40} : std::vector<int>{128};
    for (int block : blocks) {
      for (auto [out, in] : {std::pair<int64_t, int64_t>{21, 256}, {16, 64}, {5, 96}, {40, 384}, {150, 256}, {21, 512}, {37, 1184}}) {
        std::vector<uint8_t> data, scale;
        switch (kind) {
          case Weight::Kind::kF32: data.resize(size_t(out * in * 4)); break;
          case Weight::Kind::kBF16: data.resize(size_t(out * in * 2)); break;
          case Weight::Kind::kFP8:
            data.resize(size_t(out * in));
            scale.resize(size_t(((out + block - 1) / block) * ((in + block - 1) / block)));
            break;
          case Weight::Kind::kFP4:
            data.resize(size_t(out * in / 2));
            scale.resize(size_t(out * in / 32));
            break;
        }
        for (size_t i = 0; i < data.size(); ++i) data[i] = uint8_t(rng());
        if (kind == Weight::Kind::kF32 || kind == Weight::Kind::kBF16) {
          // Keep finite values: random float bit patterns would make NaNs.
          std::normal_distribution<float> nd;
          for (int64_t i = 0; i < out * in; ++i) {
            const float v = nd(rng);
            if (kind == Weight::Kind::kF32) {
              std::memcpy(data.data() + 4 * i, &v, 4);
            } else {
              uint32_t b;
              std::memcpy(&b, &v, 4);
              const uint16_t h = uint16_t(b >> 16);
              std::memcpy(data.data() + 2 * i, &h, 2);
            }
          }
        } else if (kind == Weight::Kind::kFP8) {
          for (size_t i = 0; i < data.size() && i < 256; ++i) data[i] = uint8_t(i);  // every code, NaNs included
        }
        for (size_t i = 0; i < scale.size(); ++i) scale[i] = uint8_t(120 + rng() % 16);
        // The ends of e8m0 too: 0 (2^-127, subnormal), 255 (inf), 2^127.
        for (size_t i = 0; i < scale.size(); i += 7) scale[i] = std::array<uint8_t, 3>{0, 255, 254}[(i / 7) % 3];
        Weight w;
        w.kind = kind;
        w.out = out;
        w.in = in;
        w.block = block;
        w.data = data.data();
        w.scale = scale.empty() ? nullptr : scale.data();
        std::vector<float> fast(size_t(in * kGemmNR)), ref(size_t(in * kGemmNR));
        for (int64_t o0 = 0; o0 < out; o0 += kGemmNR) {
          const int64_t o_end = std::min<int64_t>(out, o0 + 13);  // also a cut inside a panel
          for (int64_t end : {out, o_end}) {
            w.dequant_panel_reference(o0, end, ref.data());
            for (Isa isa : supported_isas()) {
              set_kernel_isa(isa);
              std::fill(fast.begin(), fast.end(), -7.f);
              w.dequant_panel(o0, end, fast.data());
              EXPECT_EQ(std::memcmp(fast.data(), ref.data(), fast.size() * 4), 0)
                  << "kind " << int(kind) << " block " << block << " " << out << "x" << in << " o0 " << o0
                  << " end " << end << " " << isa_name(isa);
            }
            set_kernel_isa(best);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace dsv4
