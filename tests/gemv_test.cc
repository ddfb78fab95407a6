// The decode GEMV (kernels/gemv.h): bit for bit equal to its reference (one
// std::fma chain per output over dequant_row) and to linear() for every
// weight kind, shape, row count, kernel variant and thread count.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <memory>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/cpu.h"
#include "core/formats.h"
#include "core/thread_pool.h"
#include "kernels/gemv.h"
#include "kernels/gemv_avx512.h"
#include "kernels/linear.h"

namespace dsv4 {
namespace {

using Kind = Weight::Kind;

// A weight with random codes and the scale codes drawn from [s_lo, s_hi];
// FP8 without NaN codes unless asked.
struct RandomWeight {
  std::vector<uint8_t> data, scale;
  Weight w;
  RandomWeight(Kind kind, int64_t out, int64_t in, int block, int s_lo, int s_hi, bool nan_codes, uint32_t seed,
               bool bf16_subnormals = true) {
    std::mt19937 rng(seed);
    w.kind = kind;
    w.out = out;
    w.in = in;
    w.block = block;
    switch (kind) {
      case Kind::kBF16: data.resize(size_t(out * in * 2)); break;
      case Kind::kFP8:
        data.resize(size_t(out * in));
        scale.resize(size_t(((out + block - 1) / block) * ((in + block - 1) / block)));
        break;
      case Kind::kFP4:
        data.resize(size_t(out * in / 2));
        scale.resize(size_t(out * in / 32));
        break;
      case Kind::kF32: data.resize(size_t(out * in * 4)); break;
    }
    for (auto& b : data) b = uint8_t(rng());
    if (kind == Kind::kBF16) {  // finite bf16 values of many magnitudes, some subnormal
      std::normal_distribution<float> nd;
      for (int64_t i = 0; i < out * in; ++i) {
        const float v = std::ldexp(nd(rng), int(rng() % 40) - 20 - (bf16_subnormals && i % 97 == 0 ? 110 : 0));
        uint32_t b;
        std::memcpy(&b, &v, 4);
        const uint16_t h = uint16_t(b >> 16);
        std::memcpy(data.data() + 2 * i, &h, 2);
      }
    }
    if (kind == Kind::kFP8 && !nan_codes)
      for (auto& b : data)
        if ((b & 0x7f) == 0x7f) b = uint8_t(b ^ 1);
    for (auto& s : scale) s = uint8_t(s_lo + int(rng() % uint32_t(s_hi - s_lo + 1)));
    w.data = data.data();
    w.scale = scale.empty() ? nullptr : scale.data();
  }
};

// Random rows; bf16 values where asked (as the head's input is).
std::vector<float> random_rows(int64_t M, int64_t ld, uint32_t seed, bool bf16 = false) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> x(size_t(M * ld));
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = i % 13 == 5 ? 0.f : std::ldexp(nd(rng), int(rng() % 16) - 8);
    if (bf16) x[i] = bf16r(x[i]);
  }
  return x;
}

// Equal bits, where NaNs count as equal to NaNs (their payload depends on
// which operand an FMA form names first).
::testing::AssertionResult SameBits(const std::vector<float>& got, const std::vector<float>& want) {
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i]) && std::isnan(want[i])) continue;
    uint32_t a, b;
    std::memcpy(&a, &got[i], 4);
    std::memcpy(&b, &want[i], 4);
    if (a != b)
      return ::testing::AssertionFailure() << "element " << i << ": " << got[i] << " vs reference " << want[i];
  }
  return ::testing::AssertionSuccess();
}

struct Shape {
  int64_t out, in;
};

// Shapes: one row, outputs not a multiple of 16 or of the 32-row tile, in
// not a multiple of an FP8 block (ragged last block), one Flash-like, and
// one with 128-row panel tiles on one thread (gemv.cc quant_panel_tile_rows:
// groups of 8, 4 and 2 panels, gemv_avx512bf16.cc panel_tile).
// Rows shorter than 4 KB are taken in spans of 2 to 8 strided tiles (gemv.cc)
// that the outputs end inside of, and the 1, 2 and 3 threads below give
// different strides.
const Shape kShapes[] = {{1, 256}, {21, 256}, {16, 64}, {5, 96}, {40, 384}, {150, 256}, {37, 1184}, {70, 208},
                         {131, 1024}, {600, 256}};

// Every kernel variant with the GEMV tiles on the same one, and the fp32
// gemm with the tiles on vdpbf16ps, as default_isa() runs them where
// vdpbf16ps lost to fp32 FMA (core/cpu.h gemv_isa).
std::vector<std::pair<Isa, Isa>> variant_pairs() {
  const std::vector<Isa> isas = supported_isas();
  std::vector<std::pair<Isa, Isa>> r;
  for (Isa isa : isas) r.push_back({isa, isa});
  if (isas.back() == Isa::kAvx512Bf16) r.push_back({Isa::kAvx512, Isa::kAvx512Bf16});
  return r;
}

void expect_gemv_matches(const RandomWeight& rw, const char* what, bool decodable = true, bool bf16_inputs = false) {
  const Weight& w = rw.w;
  const Isa best = kernel_isa();
  // 5, 8: one pass of the tile; 9, 13: 8 rows, then 1 or 5; 16: two passes
  // of 8 (kGemvMaxRows); 17: past it (gemm).
  for (int64_t M : {1, 2, 3, 5, 8, 9, 13, 16, 17}) {
    const int64_t ldx = w.in + 3, ldy = w.out + 5;
    const std::vector<float> x = random_rows(M, ldx, uint32_t(w.out * 7 + M), bf16_inputs);
    // Whole weight and a row range that starts inside a tile.
    for (auto [b, e] : {std::pair<int64_t, int64_t>{0, w.out}, {w.out / 3, w.out - w.out / 5}}) {
      if (e <= b) continue;
      for (bool bf16 : {false, true}) {
        std::vector<float> ref(size_t(M * ldy), -3.f);
        gemv_reference(w, x.data(), M, ldx, ref.data(), ldy, bf16, b, e);
        LinearOpts opts;
        opts.out_bf16 = bf16;
        for (auto [isa, gemv_variant] : variant_pairs()) {
          set_kernel_isa(isa);
          set_gemv_isa(gemv_variant);
          for (int threads : {1, 2, 3}) {
            ThreadPool::set_threads(threads);
            SCOPED_TRACE(::testing::Message() << what << " " << w.out << "x" << w.in << " M " << M << " rows [" << b
                                              << ", " << e << ") bf16 " << bf16 << " " << isa_name(isa) << " gemv "
                                              << isa_name(gemv_variant) << " threads " << threads);
            std::vector<float> y(size_t(M * ldy), -3.f);
            linear(w, x.data(), M, y.data(), opts, b, e, ldx, ldy);
            EXPECT_TRUE(SameBits(y, ref)) << "linear";
            if (gemv_available(w, M)) {
              std::vector<float> g(size_t(M * ldy), -3.f);
              const bool took = gemv(w, x.data(), M, ldx, g.data(), ldy, bf16, b, e);
              EXPECT_EQ(took, decodable);
              if (took) {
                EXPECT_TRUE(SameBits(g, ref)) << "gemv";
              }
            }
          }
        }
        set_kernel_isa(best);
        ThreadPool::set_threads(0);
      }
    }
  }
}

TEST(Gemv, Fp8EqualsReferenceBitwise) {
  for (int block : {128, 16, 48})
    for (const Shape& s : kShapes)
      if (s.in % 16 == 0) expect_gemv_matches(RandomWeight(Kind::kFP8, s.out, s.in, block, 110, 134, false, 1), "fp8");
}

TEST(Gemv, Fp4EqualsReferenceBitwise) {
  for (const Shape& s : kShapes)
    if (s.in % 32 == 0) expect_gemv_matches(RandomWeight(Kind::kFP4, s.out, s.in, 128, 0, 140, false, 2), "fp4");
}

TEST(Gemv, Bf16EqualsReferenceBitwise) {
  for (const Shape& s : kShapes) expect_gemv_matches(RandomWeight(Kind::kBF16, s.out, s.in, 128, 0, 0, false, 3), "bf16");
}

// FP4 scale codes drawn from [s_lo, s_hi], and whether vdpbf16ps takes
// them (2-252 only) or the tile runs again on fp32 FMAs. The AVX2 tiles'
// fast decoder takes codes up to 132 (gemv_avx2.cc), the others run again
// on its exact one.
struct Fp4ScaleCase {
  int s_lo, s_hi;
  bool on_pairs;
};
constexpr Fp4ScaleCase kFp4ScaleCases[] = {{100, 140, true}, {100, 132, true}, {0, 1, false}, {253, 255, false}};

// Scale codes drawn from [s_lo, s_hi] for FP4 and FP8 panels: whether
// vdpbf16ps takes them (FP4 2-252, FP8 10-246) and whether gemv takes them
// at all (the fp32 FMA tiles: FP8 up to 134), else linear() goes to gemm.
struct PanelCase {
  Kind kind;
  int block, s_lo, s_hi;
  bool on_pairs, decodable;
};
constexpr PanelCase kPanelCases[] = {
    {Kind::kFP4, 128, 100, 140, true, true}, {Kind::kFP4, 128, 0, 1, false, true},
    {Kind::kFP4, 128, 253, 255, false, true}, {Kind::kFP8, 128, 110, 134, true, true},
    {Kind::kFP8, 16, 110, 134, true, true},  {Kind::kFP8, 48, 110, 134, true, true},
    {Kind::kFP8, 128, 0, 9, false, true},    {Kind::kFP8, 128, 247, 255, false, false}};

// FP4 and FP8 repacked as panels (kernels/gemv.h pack_quant_panels): the
// same bits on every path that reads them (gemv's vdpbf16ps tiles, the
// gemm's pair decoder past gemv's input rows) and on the paths that read
// the rows instead (other kernel variants, a row range that does not start
// a panel, scales that vdpbf16ps cannot take). With the rows overwritten
// after packing, the panels alone still give the reference's answer: they
// are what was read. (FP8 codes are uniform: 1 in 16 is subnormal.)
TEST(Gemv, QuantPanelsEqualReferenceBitwise) {
  if (gemv_isa() != Isa::kAvx512Bf16) GTEST_SKIP() << "no AVX512-BF16 kernels for this CPU";
  for (const PanelCase c : kPanelCases)
    for (const Shape& s : kShapes) {
      if (s.in % (c.kind == Kind::kFP4 ? 32 : 16) != 0) continue;
      RandomWeight rw(c.kind, s.out, s.in, c.block, c.s_lo, c.s_hi, false, 13);
      const std::shared_ptr<const uint8_t> panels = pack_quant_panels(rw.w);
      if (!panels) GTEST_SKIP() << "no AVX512-BF16 kernels for this CPU";
      const std::string what = std::string(c.kind == Kind::kFP4 ? "fp4" : "fp8") + " panels, block " +
                               std::to_string(c.block) + ", scale codes " + std::to_string(c.s_lo) + "-" +
                               std::to_string(c.s_hi);
      const int64_t dot_tiles = gemv_dot_tile_count();
      expect_gemv_matches(rw, what.c_str(), c.decodable, true);
      EXPECT_EQ(gemv_dot_tile_count() > dot_tiles, c.on_pairs) << what;
      if (!c.on_pairs) continue;
      // Past gemv's rows (24), every gemm variant's panels come from them
      // too (linear.cc panel_from_quant_panels).
      const Isa best = kernel_isa();
      for (Isa isa : supported_isas())
        for (int64_t M : {1, 3, 8, 16, 24}) {
          set_kernel_isa(isa);
          set_gemv_isa(Isa::kAvx512Bf16);
          const std::vector<float> x = random_rows(M, s.in, uint32_t(M), true);
          std::vector<float> ref(size_t(M * s.out)), y(size_t(M * s.out), -3.f);
          gemv_reference(rw.w, x.data(), M, s.in, ref.data(), s.out, true, 0, s.out);
          const std::vector<uint8_t> rows = rw.data;
          std::fill(rw.data.begin(), rw.data.end(), uint8_t(0x77));
          LinearOpts opts;
          linear(rw.w, x.data(), M, y.data(), opts);
          rw.data = rows;
          EXPECT_TRUE(SameBits(y, ref)) << "from the panels alone, " << what << ", " << s.out << "x" << s.in
                                        << " M " << M << " " << isa_name(isa);
        }
      set_kernel_isa(best);
    }
}

// FP4 panels where the GEMV tiles run on AVX2 (gemv_avx2.cc fp4_panel_tile;
// the gemm's panels from them, linear.cc panel_fp4_from_panels): with the
// rows overwritten after packing, gemv and linear still give the
// reference's bits for every row count, thread count and scale range (the
// fast decoder's, the exact one's past code 132, subnormal scales), so the
// panels are what was read; a row range that does not start a group of 8
// reads the rows. The packer writes the bytes the vdpbf16ps tiles' packer
// writes.
TEST(Gemv, Fp4PanelsOnAvx2EqualReferenceBitwise) {
  const std::vector<Isa> isas = supported_isas();
  if (std::find(isas.begin(), isas.end(), Isa::kAvx2) == isas.end()) GTEST_SKIP() << "no AVX2 on this CPU";
  const Isa best = kernel_isa();
  for (const Fp4ScaleCase c : kFp4ScaleCases)
    for (const Shape& s : kShapes) {
      if (s.in % 32 != 0) continue;
      set_kernel_isa(Isa::kAvx2);
      RandomWeight rw(Kind::kFP4, s.out, s.in, 128, c.s_lo, c.s_hi, false, 17);
      const std::shared_ptr<const uint8_t> panels = pack_quant_panels(rw.w);
      ASSERT_TRUE(panels);
      const size_t bytes = quant_panel_bytes(rw.w);
      if (isas.back() == Isa::kAvx512Bf16) {
        set_gemv_isa(Isa::kAvx512Bf16);
        Weight other = rw.w;
        const std::shared_ptr<const uint8_t> theirs = pack_quant_panels(other);
        ASSERT_TRUE(theirs);
        EXPECT_EQ(std::memcmp(panels.get(), theirs.get(), bytes), 0) << s.out << "x" << s.in;
        set_gemv_isa(Isa::kAvx2);
      }
      const std::string what = "fp4 panels " + std::to_string(s.out) + "x" + std::to_string(s.in) +
                               ", scale codes " + std::to_string(c.s_lo) + "-" + std::to_string(c.s_hi);
      for (int64_t M : {1, 2, 3, 5, 8, 9, 16, 24}) {
        const int64_t ldx = s.in + 3, ldy = s.out + 5;
        const std::vector<float> x = random_rows(M, ldx, uint32_t(M + 7));
        for (auto [b, e] : {std::pair<int64_t, int64_t>{0, s.out}, {8, s.out}, {s.out / 3, s.out}}) {
          if (e <= b) continue;
          std::vector<float> ref(size_t(M * ldy), -3.f);
          gemv_reference(rw.w, x.data(), M, ldx, ref.data(), ldy, false, b, e);
          // Rows that start a group of 8 come from the panels alone.
          const bool from_panels = b % 8 == 0 && (M <= kGemvMaxRows || b % 16 == 0);
          const std::vector<uint8_t> rows = rw.data;
          if (from_panels) std::fill(rw.data.begin(), rw.data.end(), uint8_t(0x77));
          for (int threads : {1, 2, 3}) {
            ThreadPool::set_threads(threads);
            std::vector<float> y(size_t(M * ldy), -3.f);
            LinearOpts opts;
            opts.out_bf16 = false;
            linear(rw.w, x.data(), M, y.data(), opts, b, e, ldx, ldy);
            EXPECT_TRUE(SameBits(y, ref)) << what << " M " << M << " rows [" << b << ", " << e << ") threads "
                                          << threads;
          }
          rw.data = rows;
        }
      }
      ThreadPool::set_threads(0);
    }
  set_kernel_isa(best);
}

// What the FP8 panels cannot hold, the packer leaves to the rows: a NaN
// code (no panels, the weight untouched), a block that is not a multiple of
// 16 (a panel's rows would span two scale rows).
TEST(Gemv, Fp8PanelsLeaveNanAndRaggedBlocksToTheRows) {
  RandomWeight nan(Kind::kFP8, 40, 256, 128, 110, 130, false, 4);
  nan.data[300] = 0xff;
  if (quant_panel_bytes(nan.w) == 0) GTEST_SKIP() << "no AVX512-BF16 kernels for this CPU";
  EXPECT_FALSE(pack_quant_panels(nan.w));
  EXPECT_EQ(nan.w.fp8_panels, nullptr);
  RandomWeight ragged(Kind::kFP8, 40, 256, 40, 110, 130, false, 4);
  EXPECT_EQ(quant_panel_bytes(ragged.w), 0u);
  EXPECT_FALSE(pack_quant_panels(ragged.w));
}

// A BF16 weight with pair panels (the head, for decode): the same bits from
// the panels on fp32 FMAs and, where the CPU has AVX512-BF16 and no value
// could be flushed, on vdpbf16ps; a row range that does not start a panel
// reads the rows as before. Subnormal weights or inputs that are not bf16
// values keep the fp32 chains.
TEST(Gemv, Bf16PairPanelsEqualReferenceBitwise) {
  const std::vector<Isa> isas = supported_isas();
  const bool dot = std::find(isas.begin(), isas.end(), Isa::kAvx512Bf16) != isas.end();
  for (bool subnormals : {true, false})
    for (bool bf16_inputs : {false, true})
      for (const Shape& s : kShapes) {
        RandomWeight rw(Kind::kBF16, s.out, s.in, 128, 0, 0, false, 3, subnormals);
        const std::shared_ptr<const uint32_t> panels = pack_pair_panels(rw.w);
        if (!panels) GTEST_SKIP() << "no AVX-512 kernels on this CPU";
        EXPECT_EQ(rw.w.pair_min_exponent == Weight::kNoPairDot, subnormals);
        const int64_t tiles = gemv_tile_count(), dot_tiles = gemv_dot_tile_count();
        expect_gemv_matches(rw, subnormals ? "bf16 panels, subnormal" : "bf16 panels", true, bf16_inputs);
        EXPECT_GT(gemv_tile_count(), tiles);
        EXPECT_EQ(gemv_dot_tile_count() > dot_tiles, dot && bf16_inputs && !subnormals);
      }
}

// FP8 decoded once into pair panels (kernels/gemv.h pack_pair_panels),
// where the GEMV tiles run on AVX2: the same bits on every path, and from
// the panels alone, also for scale codes the row tiles refuse (past 134).
// Values that are not exact bf16 values (NaN codes) keep the rows.
TEST(Gemv, Fp8PairPanelsOnAvx2EqualReferenceBitwise) {
  const std::vector<Isa> isas = supported_isas();
  if (std::find(isas.begin(), isas.end(), Isa::kAvx2) == isas.end()) GTEST_SKIP() << "no AVX2 on this CPU";
  const Isa best = kernel_isa();
  struct Case {
    int block, s_lo, s_hi;
  };
  for (const Case c : {Case{128, 110, 134}, Case{16, 110, 134}, Case{48, 110, 134}, Case{128, 135, 160}})
    for (const Shape& s : kShapes) {
      if (s.in % 16 != 0) continue;
      RandomWeight rw(Kind::kFP8, s.out, s.in, c.block, c.s_lo, c.s_hi, false, 17);
      set_gemv_isa(Isa::kAvx2);
      const std::shared_ptr<const uint32_t> panels = pack_pair_panels(rw.w);
      set_kernel_isa(best);
      ASSERT_TRUE(panels) << s.out << "x" << s.in;
      const bool rows_decodable = c.s_hi <= 134;
      if (rows_decodable) expect_gemv_matches(rw, "fp8 pair panels");
      for (int64_t M : {1, 3, 8, 16}) {
        const std::vector<float> x = random_rows(M, s.in, uint32_t(M + 5));
        std::vector<float> ref(size_t(M * s.out)), y(size_t(M * s.out), -3.f);
        gemv_reference(rw.w, x.data(), M, s.in, ref.data(), s.out, false, 0, s.out);
        const std::vector<uint8_t> rows = rw.data;
        std::fill(rw.data.begin(), rw.data.end(), uint8_t(0x77));
        set_gemv_isa(Isa::kAvx2);
        EXPECT_TRUE(gemv(rw.w, x.data(), M, s.in, y.data(), s.out, false, 0, s.out));
        set_kernel_isa(best);
        rw.data = rows;
        EXPECT_TRUE(SameBits(y, ref)) << "from the panels alone, block " << c.block << ", scale codes " << c.s_lo
                                      << "-" << c.s_hi << ", " << s.out << "x" << s.in << " M " << M;
      }
    }
  RandomWeight nan(Kind::kFP8, 40, 256, 128, 110, 130, true, 4);
  nan.data[300] = 0xff;
  set_gemv_isa(Isa::kAvx2);
  EXPECT_FALSE(pack_pair_panels(nan.w));
  EXPECT_EQ(nan.w.pair_panels, nullptr);
  RandomWeight plain(Kind::kFP8, 40, 256, 128, 110, 130, false, 4);
  set_gemv_isa(Isa::kScalar);
  EXPECT_FALSE(pack_pair_panels(plain.w)) << "FP8 pair panels only where the GEMV tiles run on AVX2";
  set_kernel_isa(best);
}

// FP4 on vdpbf16ps (Isa::kAvx512Bf16; inputs exact bf16 values, as the
// FP8-quantised activations are): the same bits. A tile whose scales could
// make a product subnormal (codes below 2, whose values vdpbf16ps would
// flush, or above 252) runs again on fp32 FMAs, with the same bits.
TEST(Gemv, Fp4OnPairsEqualsReferenceBitwise) {
  const std::vector<Isa> isas = supported_isas();
  const bool dot = std::find(isas.begin(), isas.end(), Isa::kAvx512Bf16) != isas.end();
  for (const Fp4ScaleCase c : kFp4ScaleCases)
    for (const Shape& s : kShapes) {
      if (s.in % 32 != 0) continue;
      const RandomWeight rw(Kind::kFP4, s.out, s.in, 128, c.s_lo, c.s_hi, false, 11);
      const int64_t dot_tiles = gemv_dot_tile_count();
      expect_gemv_matches(rw, "fp4 on pairs", true, true);
      EXPECT_EQ(gemv_dot_tile_count() > dot_tiles, dot && c.on_pairs) << "scale codes " << c.s_lo << "-" << c.s_hi;
    }
}

// What it cannot decode in registers (FP8 NaN codes, FP8 scales past 2^7)
// it refuses, and linear() still gives the reference's bits through gemm.
TEST(Gemv, RefusesWhatItCannotDecodeAndLinearStaysExact) {
  RandomWeight nan(Kind::kFP8, 40, 256, 128, 110, 130, true, 4);
  nan.data[300] = 0xff;
  RandomWeight big(Kind::kFP8, 40, 256, 128, 120, 130, false, 5);
  big.scale[1] = 135;
  const RandomWeight ends(Kind::kFP4, 40, 256, 128, 250, 255, false, 6);
  for (const RandomWeight* rw : {&nan, &big}) {
    const std::vector<float> x = random_rows(1, 256, 9);
    std::vector<float> y(40);
    if (gemv_available(rw->w, 1)) {
      EXPECT_FALSE(gemv(rw->w, x.data(), 1, 256, y.data(), 40, false, 0, 40));
    }
  }
  expect_gemv_matches(nan, "fp8 with NaN codes", false);
  expect_gemv_matches(big, "fp8 with large scales", false);
  expect_gemv_matches(ends, "fp4 with infinite scales");
}

TEST(Gemv, AvailableOnlyWhereItCanRun) {
  const RandomWeight fp8(Kind::kFP8, 16, 64, 128, 120, 130, false, 7);
  const RandomWeight odd(Kind::kFP8, 16, 72, 128, 120, 130, false, 7);
  const RandomWeight f32(Kind::kF32, 16, 64, 128, 0, 0, false, 7);
  const Isa best = kernel_isa();
  for (Isa isa : supported_isas()) {
    set_kernel_isa(isa);
    const bool vector = isa >= Isa::kAvx2;  // gemv_avx2.h, gemv_avx512.h
    EXPECT_EQ(gemv_available(fp8.w, 1), vector) << isa_name(isa);
    EXPECT_EQ(gemv_available(fp8.w, kGemvTileInputRows), vector) << isa_name(isa);
    // FP8 past one pass of a tile: gemm's vdpbf16ps kernel where it runs.
    EXPECT_EQ(gemv_available(fp8.w, kGemvMaxRows), vector && isa != Isa::kAvx512Bf16) << isa_name(isa);
    EXPECT_FALSE(gemv_available(fp8.w, kGemvMaxRows + 1));
    EXPECT_FALSE(gemv_available(odd.w, 1));
    EXPECT_FALSE(gemv_available(f32.w, 1));
  }
  set_kernel_isa(best);
}

}  // namespace
}  // namespace dsv4
