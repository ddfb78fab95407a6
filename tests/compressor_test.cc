// §7 Compressor (model/compressor.h) against the spec applied directly to the
// whole sequence; tiles give bitwise the same rows and state. References and
// tolerances: stage_util.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/cache_pool.h"
#include "io/config.h"
#include "kernels/rope.h"
#include "model/compressor.h"
#include "model/model.h"
#include "model/weights.h"
#include "stage_util.h"

namespace {

using namespace dsv4::testing;
using dsv4::ModelConfig;

float e2m1_round(float v) {  // |v| ≤ 6
  const double r = nearest_code_value(std::fabs(v), 8, e2m1_value);
  return float(v < 0 ? -r : r);
}

// q4(x) of §2, blocks of 32.
void ref_q4(float* x, size_t n) {
  for (size_t b0 = 0; b0 < n; b0 += 32) {
    const size_t b1 = std::min(n, b0 + 32);
    float amax = 0.f;
    for (size_t i = b0; i < b1; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float s = pow2_scale(amax, 6.0f * 0x1p-126f, 6.0f);
    for (size_t i = b0; i < b1; ++i) x[i] = e2m1_round(std::clamp(x[i] / s, -6.0f, 6.0f)) * s;
  }
}

// Tolerances of one step of the FP8 / FP4 grids around a value (for
// ExpectMostlyExact): neighbouring e4m3 values differ by ≤ 1/8 of the larger,
// e2m1 values by ≤ 1/2 of the larger; blk_amax covers the subnormal / zero steps.
double e4m3_step_tol(float a, float b, float blk_amax) {
  return std::max(std::fabs(a), std::fabs(b)) / 8 + blk_amax * 0x1p-16;
}
double e2m1_step_tol(float a, float b, float blk_amax) {
  return std::max(std::fabs(a), std::fabs(b)) / 2 + blk_amax / 6;
}

// RMSNorm of §4 in double: bf16(w · (v · r)), w may be null.
void ref_rms_norm(const float* v, const float* w, int64_t n, double eps, float* y) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += double(v[i]) * v[i];
  const double r = 1.0 / std::sqrt(ss / double(n) + eps);
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = bfd((w ? double(w[i]) : 1.0) * (double(v[i]) * r));
  std::copy(out.begin(), out.end(), y);
}

struct CompFixture {
  ModelConfig c;
  Arena arena;
  dsv4::CompressorWeights w;
  TestWeight wkv, wgate;
  std::vector<float> x;  // [T][D]
  int64_t T = 0, D = 32;

  // Every input on a grid: the a_t and g_t sums are exact in fp32.
  CompFixture(uint32_t seed, int ratio, int hd, int rd, bool indexer, int64_t tokens) : c(rope_config(rd)), T(tokens) {
    Rng rng(seed);
    c.hidden_size = int(D);
    c.scale_pow2 = true;
    w.ratio = ratio;
    w.coff = ratio == 4 ? 2 : 1;
    w.head_dim = hd;
    w.indexer = indexer;
    const int64_t width = w.coff * hd;
    wkv = bf16_weight(arena, rng.grid_vec(size_t(width * D), 128, 8), width, D);
    wgate = bf16_weight(arena, rng.grid_vec(size_t(width * D), 128, 8), width, D);
    w.wkv = wkv.w;
    w.wgate = wgate.w;
    w.ape = rng.grid_vec(size_t(ratio * width), 64, 6);
    w.norm = rng.bf16_vec(size_t(hd), 0.5, 1.5);
    // Channels 64..127, the second q8 block of 64 when there are ≥ 128 nope
    // dims, get a 2^12 times larger norm weight: quantised with one scale for
    // both blocks, the first block's values would fall into e4m3's subnormals.
    if (!indexer)
      for (int ch = 64; ch < std::min(hd - rd, 128); ++ch) w.norm[size_t(ch)] *= 4096;
    x = rng.grid_vec(size_t(T * D), 128, 6);
  }
};

// §7 directly over the whole sequence: rows [T div r][hd].
std::vector<float> ref_compress(const CompFixture& f) {
  const int r = f.w.ratio, hd = f.w.head_dim, coff = f.w.coff, rd = f.c.qk_rope_head_dim;
  const int64_t width = coff * hd;
  std::vector<double> A(size_t(f.T * width)), G(size_t(f.T * width));
  for (int64_t t = 0; t < f.T; ++t)
    for (int64_t k = 0; k < width; ++k) {
      A[size_t(t * width + k)] = ref_dot(f.wkv, k, f.x.data() + t * f.D).sum;
      G[size_t(t * width + k)] = ref_dot(f.wgate, k, f.x.data() + t * f.D).sum + f.w.ape[size_t((t % r) * width + k)];
    }
  const std::vector<float> freqs = ref_freqs(f.c, true);
  const int64_t rows = f.T / r;
  std::vector<float> out(size_t(rows * hd));
  for (int64_t c = 0; c < rows; ++c) {
    float* v = out.data() + c * hd;
    for (int ch = 0; ch < hd; ++ch) {
      std::vector<std::pair<double, double>> slots;  // (score, value)
      if (coff == 2) {
        for (int s = 0; s < r; ++s) {
          const int64_t t = (c - 1) * r + s;
          if (t < 0)
            slots.push_back({-INFINITY, 0.0});
          else
            slots.push_back({G[size_t(t * width + ch)], A[size_t(t * width + ch)]});
        }
        for (int s = 0; s < r; ++s) {
          const int64_t t = c * r + s;
          slots.push_back({G[size_t(t * width + hd + ch)], A[size_t(t * width + hd + ch)]});
        }
      } else {
        for (int s = 0; s < r; ++s) {
          const int64_t t = c * r + s;
          slots.push_back({G[size_t(t * width + ch)], A[size_t(t * width + ch)]});
        }
      }
      double mx = -INFINITY, den = 0, num = 0;
      for (auto& sv : slots) mx = std::max(mx, sv.first);
      for (auto& sv : slots) {
        const double e = std::exp(sv.first - mx);
        den += e;
        num += e * sv.second;
      }
      v[ch] = bfd(num / den);
    }
    ref_rms_norm(v, f.w.norm.data(), hd, f.c.rms_norm_eps, v);
    ref_rope(v + hd - rd, freqs, c * r);
    if (f.w.indexer) {
      std::vector<float> h = ref_hadamard(v, hd);
      ref_q4(h.data(), size_t(hd));
      std::copy(h.begin(), h.end(), v);
    } else {
      ref_q8(v, size_t(hd - rd), 64);
    }
  }
  return out;
}

// Projects all the fixture's tokens at once and feeds them in tiles starting
// at the given split points, as attention_forward does.
dsv4::CompressorState run_compressor(const CompFixture& f, std::vector<int64_t> splits) {
  const dsv4::RopeTable rope(dsv4::rope_params(f.c, true));
  // Pages for the compressor state; the pool outlives every state made here.
  static dsv4::CachePool pool(size_t(256) << 20);
  dsv4::CompressorState st;
  st.init(&pool, f.w);
  st.reserve(f.w, f.T);
  splits.insert(splits.begin(), 0);
  splits.push_back(f.T);
  dsv4::CompressorActivations act;
  dsv4::compressor_project(f.w, f.x.data(), f.T, act);
  for (size_t i = 0; i + 1 < splits.size(); ++i)
    dsv4::compressor_update(f.w, f.c, rope, act, splits[i], splits[i], splits[i + 1] - splits[i], st);
  return st;
}

// The emitted rows, widened to fp32.
std::vector<float> state_rows(const dsv4::CompressorState& st, int hd) {
  std::vector<float> v(size_t(st.n_rows * hd));
  st.read_rows(st.n_rows, hd, v.data());
  return v;
}

// The source-row ring (a | g + ape per slot), as stored.
std::vector<float> state_ring(const dsv4::CompressorState& st, const dsv4::CompressorWeights& w, int64_t T) {
  const int64_t slots = std::min<int64_t>(T, w.coff * w.ratio), width = 2 * w.coff * w.head_dim;
  std::vector<float> v;
  for (int64_t s = 0; s < slots; ++s) v.insert(v.end(), st.ring.row_f32(s), st.ring.row_f32(s) + width);
  return v;
}

void check_compressor_rows(const CompFixture& f, const dsv4::CompressorState& st) {
  const int hd = f.w.head_dim, rd = f.c.qk_rope_head_dim;
  const int64_t rows = f.T / f.w.ratio;
  ASSERT_EQ(st.n_rows, rows);
  std::vector<float> got(size_t(rows * hd));
  st.read_rows(rows, hd, got.data());
  const std::vector<float> ref = ref_compress(f);
  auto tol = [&](size_t i) {
    const int ch = int(i % size_t(hd));
    const float* row = ref.data() + (i / size_t(hd)) * size_t(hd);
    float amax = 0;
    if (f.w.indexer) {
      for (int j = ch / 32 * 32; j < ch / 32 * 32 + 32; ++j) amax = std::max(amax, std::fabs(row[j]));
      return e2m1_step_tol(got[i], ref[i], amax);
    }
    if (ch >= hd - rd) return bf16_step(ref[i]);
    for (int j = ch / 64 * 64; j < std::min(hd - rd, ch / 64 * 64 + 64); ++j) amax = std::max(amax, std::fabs(row[j]));
    return e4m3_step_tol(got[i], ref[i], amax);
  };
  ExpectMostlyExact(got, ref, 0.98, tol, "compressed rows");
}

TEST(StageCompressor, Ratio4OverlappingMatchesReference) {
  // hd = 144, rd = 16: nope dims 128 = two q8 blocks of 64. 22 tokens: rows 0..4,
  // tokens 20, 21 left pending. Row 0's first four slots are value 0 / score −∞.
  CompFixture f(171, 4, 144, 16, false, 22);
  check_compressor_rows(f, run_compressor(f, {}));
}

TEST(StageCompressor, Ratio8NonOverlappingMatchesReference) {
  CompFixture f(181, 8, 144, 16, false, 21);
  check_compressor_rows(f, run_compressor(f, {}));
}

TEST(StageCompressor, Ratio128MatchesReference) {
  CompFixture f(191, 128, 80, 16, false, 300);
  check_compressor_rows(f, run_compressor(f, {}));
}

TEST(StageCompressor, IndexerRowsHadamardAndFp4) {
  // 40 rows: enough elements that some land exactly on e2m1 rounding ties.
  CompFixture f(201, 4, 64, 16, true, 162);
  check_compressor_rows(f, run_compressor(f, {}));
}

TEST(StageCompressor, TilesGiveBitwiseSameRowsAndState) {
  struct Case {
    int ratio, hd;
    bool indexer;
    int64_t T;
    std::vector<std::vector<int64_t>> splits;
  };
  const std::vector<Case> cases = {
      {4, 144, false, 22, {{5}, {13}, {1, 2, 3, 4, 8, 9}}},
      {4, 64, true, 22, {{6}, {11}}},
      {8, 144, false, 21, {{3}, {12}, {8}}},
      {128, 80, false, 300, {{100}, {129}, {255, 256}}},
  };
  for (const Case& k : cases) {
    CompFixture f(211 + uint32_t(k.ratio), k.ratio, k.hd, 16, k.indexer, k.T);
    const dsv4::CompressorState whole = run_compressor(f, {});
    for (const auto& sp : k.splits) {
      std::string name = "ratio " + std::to_string(k.ratio) + (k.indexer ? " indexer" : "") + ", splits";
      for (int64_t s : sp) name += " " + std::to_string(s);
      SCOPED_TRACE(name);
      const dsv4::CompressorState tiled = run_compressor(f, sp);
      EXPECT_EQ(tiled.n_rows, whole.n_rows);
      EXPECT_TRUE(same_bits(state_rows(tiled, f.w.head_dim), state_rows(whole, f.w.head_dim)));
      EXPECT_TRUE(same_bits(state_ring(tiled, f.w, f.T), state_ring(whole, f.w, f.T)));
    }
  }
}

TEST(StageCompressor, EmitRowFromStateMatchesForward) {
  // compressor_emit_row on the final state re-emits the last complete row.
  CompFixture f(221, 4, 144, 16, false, 24);
  const dsv4::CompressorState st = run_compressor(f, {});
  ASSERT_EQ(st.n_rows, 6);
  std::vector<float> row(144);
  dsv4::compressor_emit_row(f.w, f.c, dsv4::RopeTable(dsv4::rope_params(f.c, true)), st, 5, row.data());
  const std::vector<float> rows = state_rows(st, 144);
  EXPECT_TRUE(same_bits(row, std::vector<float>(rows.begin() + 5 * 144, rows.begin() + 6 * 144)));
}

}  // namespace
