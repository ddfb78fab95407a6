// §4 Hyper-connections (model/hc.h): hc_pre, the Sinkhorn comb, hc_post and
// hc_head against a double reference, and the fast paths against plain loops.
// References and tolerances: stage_util.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/formats.h"
#include "kernels/dot.h"
#include "model/hc.h"
#include "model/model.h"
#include "stage_util.h"

namespace {

using namespace dsv4::testing;

struct HcCase {
  int hc;
  int64_t D;
  int64_t n;
  std::vector<float> X;  // [n][hc][D], bf16
  dsv4::HcWeights w;
};

HcCase make_hc_case(uint32_t seed, int hc, int64_t D, int64_t n) {
  Rng rng(seed);
  HcCase k{hc, D, n, rng.bf16_vec(size_t(n * hc * D), -2, 2), {}};
  const int rows = (2 + hc) * hc;
  for (int64_t i = 0; i < rows * hc * D; ++i) k.w.fn.push_back(float(rng.uniform(-0.1, 0.1)));
  for (int i = 0; i < rows; ++i) k.w.base.push_back(float(rng.uniform(-1, 1)));
  k.w.scale = {0.7f, 1.3f, 2.0f};
  return k;
}

struct HcPreRef {
  std::vector<float> y;                  // [D]
  std::vector<double> pre, post, comb;   // [hc], [hc], [hc][hc]
};

// §4 hc_pre for one token, in double.
HcPreRef ref_hc_pre(const float* X, int hc, int64_t D, const dsv4::HcWeights& w, int iters, double hc_eps,
                    double norm_eps) {
  const int64_t len = hc * D;
  const int rows = (2 + hc) * hc;
  double ss = 0;
  for (int64_t i = 0; i < len; ++i) ss += double(X[i]) * X[i];
  const double r = 1.0 / std::sqrt(ss / double(len) + norm_eps);
  std::vector<double> m(static_cast<size_t>(rows));
  for (int i = 0; i < rows; ++i) {
    double s = 0;
    for (int64_t j = 0; j < len; ++j) s += double(w.fn[size_t(i * len + j)]) * X[j];
    m[size_t(i)] = s * r;
  }
  auto sigmoid = [](double v) { return 1.0 / (1.0 + std::exp(-v)); };
  HcPreRef out;
  for (int i = 0; i < hc; ++i) out.pre.push_back(sigmoid(m[size_t(i)] * w.scale[0] + w.base[size_t(i)]) + hc_eps);
  for (int i = 0; i < hc; ++i) out.post.push_back(2 * sigmoid(m[size_t(hc + i)] * w.scale[1] + w.base[size_t(hc + i)]));
  std::vector<double>& C = out.comb;
  C.resize(size_t(hc * hc));
  auto at = [&](int j, int k) -> double& { return C[size_t(j * hc + k)]; };
  for (int j = 0; j < hc; ++j) {
    double mx = -INFINITY, s = 0;
    for (int k = 0; k < hc; ++k) {
      at(j, k) = m[size_t(2 * hc + j * hc + k)] * w.scale[2] + w.base[size_t(2 * hc + j * hc + k)];
      mx = std::max(mx, at(j, k));
    }
    for (int k = 0; k < hc; ++k) s += std::exp(at(j, k) - mx);
    for (int k = 0; k < hc; ++k) at(j, k) = std::exp(at(j, k) - mx) / s + hc_eps;
  }
  auto col_norm = [&] {
    for (int k = 0; k < hc; ++k) {
      double s = 0;
      for (int j = 0; j < hc; ++j) s += at(j, k);
      for (int j = 0; j < hc; ++j) at(j, k) /= (s + hc_eps);
    }
  };
  auto row_norm = [&] {
    for (int j = 0; j < hc; ++j) {
      double s = 0;
      for (int k = 0; k < hc; ++k) s += at(j, k);
      for (int k = 0; k < hc; ++k) at(j, k) /= (s + hc_eps);
    }
  };
  col_norm();
  for (int it = 1; it < iters; ++it) {
    row_norm();
    col_norm();
  }
  for (int64_t c = 0; c < D; ++c) {
    double s = 0;
    for (int i = 0; i < hc; ++i) s += out.pre[size_t(i)] * X[i * D + c];
    out.y.push_back(bfd(s));
  }
  return out;
}

TEST(StageHc, PreMatchesReference) {
  for (int hc : {4, 3}) {
    SCOPED_TRACE("hc = " + std::to_string(hc));
    HcCase k = make_hc_case(11 + hc, hc, 64, 3);
    std::vector<float> y(size_t(k.n * k.D));
    dsv4::HcMix mix;
    dsv4::hc_pre(k.X.data(), k.n, hc, k.D, k.w, 20, 1e-6f, 1e-6f, y.data(), &mix);
    ASSERT_EQ(mix.post.size(), size_t(k.n * hc));
    ASSERT_EQ(mix.comb.size(), size_t(k.n * hc * hc));
    for (int64_t t = 0; t < k.n; ++t) {
      HcPreRef r = ref_hc_pre(k.X.data() + t * hc * k.D, hc, k.D, k.w, 20, 1e-6, 1e-6);
      // post and comb are fp32 values from an (hc·D)-term dot, a sigmoid /
      // softmax and 20 Sinkhorn rounds: they come out ≤ 3e-7 from the double
      // reference; 2e-6 leaves margin and still sees a dropped hc_eps.
      for (int i = 0; i < hc; ++i) EXPECT_NEAR(mix.post[size_t(t * hc + i)], r.post[size_t(i)], 2e-6) << "post " << i;
      for (int i = 0; i < hc * hc; ++i) EXPECT_NEAR(mix.comb[size_t(t * hc * hc + i)], r.comb[size_t(i)], 2e-6) << "comb " << i;
      for (int64_t c = 0; c < k.D; ++c) {
        double s = 0, a = 0;
        for (int i = 0; i < hc; ++i) {
          s += r.pre[size_t(i)] * k.X[size_t((t * hc + i) * k.D + c)];
          a += std::fabs(r.pre[size_t(i)] * k.X[size_t((t * hc + i) * k.D + c)]);
        }
        // pre itself carries ~1e-6 relative error (allowed through abs_sum).
        EXPECT_TRUE(NearBf16(y[size_t(t * k.D + c)], s, a * 16, 1)) << "y token " << t << " ch " << c;
      }
    }
  }
}

// Largest |row sum − 1| and |column sum − 1| of a token's comb matrix.
template <class T>
std::pair<double, double> stochastic_error(const T* C, int hc) {
  double row_err = 0, col_err = 0;
  for (int j = 0; j < hc; ++j) {
    double row = 0, col = 0;
    for (int i = 0; i < hc; ++i) {
      row += C[j * hc + i];
      col += C[i * hc + j];
    }
    row_err = std::max(row_err, std::fabs(row - 1));
    col_err = std::max(col_err, std::fabs(col - 1));
  }
  return {row_err, col_err};
}

TEST(StageHc, CombIsDoublyStochasticAfterSinkhorn) {
  // The last Sinkhorn step normalises columns, so they sum to 1 (up to eps).
  // Rows converge at a rate that depends on how peaked the logits are: with
  // mild logits they are 1 to 1e-4 after 20 rounds; with peaked ones (scale 6)
  // 20 rounds leave up to ~2% (the double reference does the same; the row
  // error is not even monotone in the number of rounds).
  for (float comb_scale : {1.0f, 6.0f}) {
    SCOPED_TRACE("comb scale " + fmt(comb_scale));
    HcCase k = make_hc_case(21, 4, 64, 4);
    k.w.scale[2] = comb_scale;
    std::vector<float> y(size_t(k.n * k.D));
    dsv4::HcMix mix;
    dsv4::hc_pre(k.X.data(), k.n, 4, k.D, k.w, 20, 1e-6f, 1e-6f, y.data(), &mix);
    double worst_row_one = 0;
    for (int64_t t = 0; t < k.n; ++t) {
      const float* C = mix.comb.data() + t * 16;
      for (int i = 0; i < 16; ++i) EXPECT_GT(C[i], 0.f);
      const auto [row_err, col_err] = stochastic_error(C, 4);
      EXPECT_LT(col_err, 1e-5) << "token " << t;
      EXPECT_LT(row_err, comb_scale == 1.0f ? 1e-4 : 0.05) << "token " << t;
      const HcPreRef one = ref_hc_pre(k.X.data() + t * 4 * k.D, 4, k.D, k.w, 1, 1e-6, 1e-6);
      worst_row_one = std::max(worst_row_one, stochastic_error(one.comb.data(), 4).first);
    }
    // The softmax rows with a single column pass are far from balanced: the
    // row check above is not vacuous.
    EXPECT_GT(worst_row_one, 0.02);
  }
}

TEST(StageHc, PostMatchesReference) {
  Rng rng(31);
  const int hc = 4;
  const int64_t D = 48, n = 3;
  std::vector<float> X = rng.bf16_vec(size_t(n * hc * D), -3, 3), f = rng.bf16_vec(size_t(n * D), -2, 2);
  dsv4::HcMix mix;
  for (int64_t i = 0; i < n * hc; ++i) mix.post.push_back(float(rng.uniform(0, 2)));
  // A deliberately asymmetric C, so C[j][k] and C[k][j] cannot be confused.
  for (int64_t i = 0; i < n * hc * hc; ++i) mix.comb.push_back(float(rng.uniform(0, 1)));
  std::vector<float> X0 = X;
  dsv4::HcActivations act;
  dsv4::hc_post(f.data(), X.data(), n, hc, D, mix, act);
  for (int64_t t = 0; t < n; ++t)
    for (int k = 0; k < hc; ++k)
      for (int64_t c = 0; c < D; ++c) {
        double s = double(mix.post[size_t(t * hc + k)]) * f[size_t(t * D + c)];
        double a = std::fabs(s);
        for (int j = 0; j < hc; ++j) {
          const double v = double(mix.comb[size_t(t * hc * hc + j * hc + k)]) * X0[size_t((t * hc + j) * D + c)];
          s += v;
          a += std::fabs(v);
        }
        EXPECT_TRUE(NearBf16(X[size_t((t * hc + k) * D + c)], s, a, hc + 1))
            << "token " << t << " stream " << k << " ch " << c;
      }
}

// The fast hc paths against plain loops, bit for bit: dot4_f32 against
// dot_f32 (mixes takes four tokens at once), a token's hc_pre output the same
// alone as in a block of 8 or in a partial block, and hc_post (16 channels at
// a time) against its definition in fp32, D with a tail past the last 16.
TEST(StageHc, FastPathsEqualPlainLoopsBitwise) {
  Rng rng(53);
  for (int64_t len : {1, 15, 16, 17, 100, 1040}) {
    std::vector<float> a = rng.bf16_vec(size_t(len), -2, 2);
    std::vector<std::vector<float>> b;
    for (int t = 0; t < 4; ++t) b.push_back(rng.bf16_vec(size_t(len), -2, 2));
    const float* bs[4] = {b[0].data(), b[1].data(), b[2].data(), b[3].data()};
    float out[4];
    dsv4::dot4_f32(a.data(), bs, len, out);
    for (int t = 0; t < 4; ++t)
      EXPECT_EQ(std::bit_cast<uint32_t>(out[t]), std::bit_cast<uint32_t>(dsv4::dot_f32(a.data(), bs[t], len)))
          << "len " << len << " t " << t;
  }
  const int hc = 4;
  const int64_t D = 40;
  HcCase k = make_hc_case(61, hc, D, 11);
  std::vector<float> y(size_t(k.n * D));
  dsv4::HcMix mix;
  dsv4::hc_pre(k.X.data(), k.n, hc, D, k.w, 20, 1e-6f, 1e-6f, y.data(), &mix);
  for (int64_t t = 0; t < k.n; ++t) {
    std::vector<float> y1(static_cast<size_t>(D));
    dsv4::HcMix mix1;
    dsv4::hc_pre(k.X.data() + t * hc * D, 1, hc, D, k.w, 20, 1e-6f, 1e-6f, y1.data(), &mix1);
    EXPECT_TRUE(std::equal(y1.begin(), y1.end(), y.begin() + t * D)) << "token " << t;
    EXPECT_TRUE(std::equal(mix1.post.begin(), mix1.post.end(), mix.post.begin() + t * hc)) << "token " << t;
    EXPECT_TRUE(std::equal(mix1.comb.begin(), mix1.comb.end(), mix.comb.begin() + t * hc * hc)) << "token " << t;
  }
  // hc_post on inputs where the order of the sum shows in the bf16 result:
  // streams 0 and 1 cancel exactly in ascending order (equal weights,
  // opposite values of ~2^20), so the result is streams 2 and 3 alone; any
  // other order first rounds them away against ±2^20.
  std::vector<float> f = rng.bf16_vec(size_t(k.n * D), -2, 2), X0 = k.X;
  for (int64_t t = 0; t < k.n; ++t) {
    for (int kk = 0; kk < hc; ++kk)
      mix.comb[size_t(t * hc * hc + hc + kk)] = mix.comb[size_t(t * hc * hc + kk)];
    for (int64_t c = 0; c < D; ++c) {
      const float big = dsv4::bf16r(float(rng.uniform(1, 2)) * 0x1p20f);
      X0[size_t((t * hc + 0) * D + c)] = big;
      X0[size_t((t * hc + 1) * D + c)] = -big;
    }
  }
  std::vector<float> X = X0;
  dsv4::HcActivations act;
  dsv4::hc_post(f.data(), X.data(), k.n, hc, D, mix, act);
  for (int64_t t = 0; t < k.n; ++t)
    for (int kk = 0; kk < hc; ++kk)
      for (int64_t c = 0; c < D; ++c) {
        float s = 0.f;
        for (int j = 0; j < hc; ++j)
          s += mix.comb[size_t(t * hc * hc + j * hc + kk)] * X0[size_t((t * hc + j) * D + c)];
        const float want = dsv4::bf16r(mix.post[size_t(t * hc + kk)] * f[size_t(t * D + c)] + s);
        ASSERT_EQ(std::bit_cast<uint32_t>(X[size_t((t * hc + kk) * D + c)]), std::bit_cast<uint32_t>(want))
            << "token " << t << " stream " << kk << " ch " << c;
      }
}

TEST(StageHc, HeadMatchesReference) {
  Rng rng(41);
  const int hc = 4;
  const int64_t D = 64, n = 2;
  std::vector<float> X = rng.bf16_vec(size_t(n * hc * D), -2, 2);
  dsv4::HcHeadWeights w;
  for (int64_t i = 0; i < hc * hc * D; ++i) w.fn.push_back(float(rng.uniform(-0.1, 0.1)));
  for (int i = 0; i < hc; ++i) w.base.push_back(float(rng.uniform(-1, 1)));
  w.scale = {1.7f};
  std::vector<float> y(size_t(n * D));
  dsv4::hc_head(X.data(), n, hc, D, w, 1e-6f, 1e-6f, y.data());
  for (int64_t t = 0; t < n; ++t) {
    const float* x = X.data() + t * hc * D;
    double ss = 0;
    for (int64_t i = 0; i < hc * D; ++i) ss += double(x[i]) * x[i];
    const double r = 1.0 / std::sqrt(ss / double(hc * D) + 1e-6);
    double pre[4];
    for (int i = 0; i < hc; ++i) {
      double m = 0;
      for (int64_t j = 0; j < hc * D; ++j) m += double(w.fn[size_t(i * hc * D + j)]) * x[j];
      pre[i] = 1.0 / (1.0 + std::exp(-(m * r * w.scale[0] + w.base[size_t(i)]))) + 1e-6;
    }
    for (int64_t c = 0; c < D; ++c) {
      double s = 0, a = 0;
      for (int i = 0; i < hc; ++i) {
        s += pre[i] * x[i * D + c];
        a += std::fabs(pre[i] * x[i * D + c]);
      }
      EXPECT_TRUE(NearBf16(y[size_t(t * D + c)], s, a * 16, 1)) << "token " << t << " ch " << c;
    }
  }
}

}  // namespace
