#include "kernels/gemv.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "core/cpu.h"
#include "core/formats.h"
#include "core/scratch.h"
#include "core/thread_pool.h"
#include "kernels/gemm.h"
#include "kernels/gemm_micro.h"
#include "kernels/gemv_avx2.h"
#include "kernels/gemv_avx512.h"

namespace dsv4 {

namespace {

std::atomic<int64_t> g_tiles{0}, g_dot_tiles{0};

// The smallest biased exponent of n bf16 values' non-zero ones (255 for
// none), or -1 where one is subnormal, infinite or NaN (values vdpbf16ps
// would not take as they are), in one pass the compiler vectorises.
[[maybe_unused]] int min_dot_exponent(const uint8_t* values, int64_t n) {
  int lo = 255, bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, values + 2 * i, 2);
    const int mag = h & 0x7fff, e = mag >> 7;
    bad |= mag != 0 && (e == 0 || e == 255);
    lo = std::min(lo, mag != 0 ? e : 255);
  }
  return bad ? -1 : lo;
}

// The input rows as pairs for the vdpbf16ps tiles (gemv_isa() is
// Isa::kAvx512Bf16, every value an exact bf16 value): over pair panels
// where no product or sum can be subnormal (gemm.h), and for FP4 weights
// and FP8 panels, whose tiles check their scales against min_exponent. xp
// null otherwise.
struct DotInput {
  const uint32_t* xp = nullptr;
  // Rows are ld dwords apart: w.in / 2 plus one 64-byte line. Rows a
  // multiple of 4 KB apart share L1 sets, and 16 of them (16 streams
  // decoding together) evicted one another at every step (FP8 panels, 16
  // rows: ~2 GB/s on one Zen 4 thread, against ~4.5 expected from 8 rows).
  int64_t ld = 0;
  int min_exponent = 0;
};

DotInput dot_input(const Weight& w, bool panels, const float* x, int64_t M, int64_t ldx) {
  DotInput in;
#ifdef DSV4_HAVE_AVX512BF16_KERNELS
  const bool pairs = panels && w.pair_min_exponent != Weight::kNoPairDot;
  if (gemv_isa() != Isa::kAvx512Bf16 || (!pairs && w.kind != Weight::Kind::kFP4 && !w.fp8_panels)) return in;
  // Past one set of input rows BF16 and FP8 panel tiles are bound by
  // arithmetic: where vdpbf16ps lost to fp32 FMA (core/cpu.h default_isa;
  // the gemm runs fp32), fp32 FMAs take them (run_tile).
  if ((pairs || w.fp8_panels) && M > kGemvTileInputRows && kernel_isa() != Isa::kAvx512Bf16) return in;
  // The gemm's packing of A rows: the same pairs, and the same check.
  in.ld = w.in / 2 + 16;
  uint32_t* const xp = workspace<uint32_t>(Buf::kGemvInputPairs, size_t(M * in.ld));
  if (!gemm_pack_rows_bf16(x, ldx, M, w.in, xp, in.ld, &in.min_exponent)) return in;
  if (!pairs || in.min_exponent + w.pair_min_exponent >= kDotMinBiasedExponentSum) in.xp = xp;
#else
  (void)w, (void)panels, (void)x, (void)M, (void)ldx;
#endif
  return in;
}

// Whether FP4 or FP8 tiles from row o0 read w's panels (Weight::fp4_panels,
// Weight::fp8_panels): the vdpbf16ps tiles, whose tiles must start a panel,
// and the AVX2 FP4 tiles, whose groups of 8 rows read half a panel.
bool reads_quant_panels(const Weight& w, int64_t o0, int64_t stride) {
  if (stride != 1) return false;
  if (gemv_isa() == Isa::kAvx2) return w.fp4_panels != nullptr && o0 % 8 == 0;
  return (w.fp4_panels != nullptr || w.fp8_panels != nullptr) && o0 % 16 == 0 && gemv_isa() == Isa::kAvx512Bf16;
}

// Rows b + j, b + j + stride, ... (n of them) for input rows [m0, m0 + mr)
// on vdpbf16ps, where `in` allows it; false where an FP4 or FP8 tile finds
// a scale it cannot take.
bool dot_tile(const Weight& w, const DotInput& in, int64_t m0, int64_t mr, int64_t b, int64_t j, int64_t stride,
              int64_t n, float* ys, int64_t ldy) {
#ifdef DSV4_HAVE_AVX512BF16_KERNELS
  if (!in.xp) return false;
  const int64_t kp = in.ld;
  const uint32_t* const xp = in.xp + m0 * kp;
  float* const y = ys + m0 * ldy;
  const bool panels = reads_quant_panels(w, b, stride);
  switch (w.kind) {
    case Weight::Kind::kBF16: gemv_pair_tile_avx512bf16(w, xp, mr, kp, b, n, y, ldy); return true;
    case Weight::Kind::kFP4:
      return panels ? gemv_fp4_panel_tile_avx512bf16(w, xp, mr, kp, in.min_exponent, b, n, y, ldy)
                    : gemv_fp4_tile_avx512bf16(w, xp, mr, kp, in.min_exponent, b + j, stride,
                                               (n - j + stride - 1) / stride, y + j, ldy);
    case Weight::Kind::kFP8:
      return panels && gemv_fp8_panel_tile_avx512bf16(w, xp, mr, kp, in.min_exponent, b, n, y, ldy);
    case Weight::Kind::kF32: return false;
  }
#endif
  (void)w, (void)in, (void)m0, (void)mr, (void)b, (void)j, (void)stride, (void)n, (void)ys, (void)ldy;
  return false;
}

// The same rows on vdpbf16ps where dot_tile takes them, else on fp32 FMAs
// (gemv_tile_avx512, kGemvTileInputRows input rows at a time); false where
// those cannot decode a value either.
bool run_tile(const Weight& w, const DotInput& in, const float* x, int64_t m0, int64_t mr, int64_t ldx, int64_t b,
              int64_t j, int64_t stride, int64_t n, float* ys, int64_t ldy) {
  const int64_t count = (n - j + stride - 1) / stride;
  if (gemv_isa() == Isa::kAvx2) {
    const int64_t tile_rows = gemv_avx2_tile_rows(mr);
    for (int64_t c = 0; c < count; c += tile_rows)
      if (!gemv_tile_avx2(w, x + m0 * ldx, mr, ldx, b + j + c * stride, stride, std::min(tile_rows, count - c),
                          ys + j + c * stride + m0 * ldy, ldy))
        return false;
    return true;
  }
#ifdef DSV4_HAVE_AVX512_KERNELS
  if (dot_tile(w, in, m0, mr, b, j, stride, n, ys, ldy)) {
    g_dot_tiles.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  // Panel tiles can be longer than the fp32 tiles' kGemvTileRows.
  if (mr > kGemvTileInputRows && w.kind == Weight::Kind::kBF16 && gemv_reads_pair_panels(w, b + j, stride)) {
    for (int64_t c = 0; c < count; c += kGemvTileRows)
      gemv_pair_panel_tile_avx512(w, x + m0 * ldx, mr, ldx, b + j + c, std::min(kGemvTileRows, count - c),
                                  ys + j + c + m0 * ldy, ldy);
    return true;
  }
#ifdef DSV4_HAVE_AVX512BF16_KERNELS
  if (mr > kGemvTileInputRows && w.kind == Weight::Kind::kFP8 && reads_quant_panels(w, b + j, stride)) {
    bool ok = true;
    for (int64_t c = 0; c < count && ok; c += 16)  // a panel (16 rows) at a time
      ok = gemv_fp8_panel_fma_tile(w, x + m0 * ldx, mr, ldx, b + j + c, std::min<int64_t>(16, count - c),
                                   ys + j + c + m0 * ldy, ldy);
    if (ok) return true;
  }
#endif
  for (int64_t c = 0; c < count; c += kGemvTileRows)
    for (int64_t m = m0; m < m0 + mr; m += kGemvTileInputRows)
      if (!gemv_tile_avx512(w, x + m * ldx, std::min(kGemvTileInputRows, m0 + mr - m), ldx, b + j + c * stride,
                            stride, std::min(kGemvTileRows, count - c), ys + j + c * stride + m * ldy, ldy))
        return false;
  return true;
#else
  (void)in;
  return false;
#endif
}

// Rows per tile of FP4 or FP8 panels on vdpbf16ps: up to
// kGemvPanelTileRows, so that a group of panels has the chains it wants
// (gemv_avx512bf16.cc panel_tile), but at least 4 tiles a thread, so that
// the threads' shares differ by at most a quarter.
int64_t quant_panel_tile_rows(int64_t rows, int threads) {
  int64_t t = kGemvPanelTileRows;
  while (t > kGemvTileRows && rows < 4 * threads * t) t /= 2;
  return t;
}

// Row o of w as bf16 values (BF16: as stored; FP8: dequant_row's values,
// false where one is not exactly a bf16 value).
bool bf16_row(const Weight& w, int64_t o, float* scratch, uint16_t* dst) {
  if (w.kind == Weight::Kind::kBF16) {
    std::memcpy(dst, w.data + o * w.row_bytes(), size_t(w.in) * 2);
    return true;
  }
  w.dequant_row(o, scratch);
  for (int64_t k = 0; k < w.in; ++k) {
    uint32_t b;
    std::memcpy(&b, &scratch[k], 4);
    if ((b & 0xffff) != 0 || std::isnan(scratch[k])) return false;
    dst[k] = uint16_t(b >> 16);
  }
  return true;
}

bool pair_panels_pay(const Weight& w) {
  if (w.in % 8 != 0 || w.out <= 0 || supported_isas().back() < Isa::kAvx2) return false;
  if (w.kind == Weight::Kind::kBF16) return true;
  // FP8 where the GEMV tiles would decode it on AVX2: there the decoding,
  // not the memory, held the attention projections (Zen 3, session 29).
  return w.kind == Weight::Kind::kFP8 && gemv_isa() == Isa::kAvx2;
}

}  // namespace

std::shared_ptr<const uint32_t> pack_pair_panels(Weight& w) {
  if (!pair_panels_pay(w)) return nullptr;
  const int64_t panels = (w.out + 15) / 16, kp = w.in / 2;
  const std::shared_ptr<uint8_t> block = huge_page_block(size_t(panels * kp * 16) * 4);
  uint32_t* const p = reinterpret_cast<uint32_t*>(block.get());
  const std::shared_ptr<const uint32_t> owner(block, p);
  std::vector<int> lo(size_t(panels), 255);
  std::atomic<bool> exact{true};
  ThreadPool::global().parallel_for(panels, [&](int64_t p0, int64_t p1, int) {
    std::vector<float> scratch(size_t(w.in));
    std::vector<uint16_t> rows(size_t(16 * w.in));
    for (int64_t q = p0; q < p1 && exact.load(std::memory_order_relaxed); ++q) {
      const int64_t n = std::min<int64_t>(16, w.out - 16 * q);
      for (int64_t i = 0; i < n; ++i) {
        uint16_t* const row = rows.data() + i * w.in;
        if (!bf16_row(w, 16 * q + i, scratch.data(), row)) {
          exact.store(false, std::memory_order_relaxed);
          return;
        }
        lo[size_t(q)] = std::min(lo[size_t(q)], min_dot_exponent(reinterpret_cast<uint8_t*>(row), w.in));
      }
      std::fill(rows.begin() + n * w.in, rows.end(), uint16_t(0));  // rows past `out` are zeros
      // Values 2j and 2j + 1 of a row: 2j to the high half.
      uint32_t* const panel = p + q * kp * 16;
      for (int64_t j = 0; j < kp; ++j)
        for (int64_t i = 0; i < 16; ++i)
          panel[j * 16 + i] = uint32_t(rows[size_t(i * w.in + 2 * j)]) << 16 | rows[size_t(i * w.in + 2 * j + 1)];
    }
  });
  if (!exact.load()) return nullptr;
  const int min_exponent = *std::min_element(lo.begin(), lo.end());
  w.pair_panels = p;
  w.pair_min_exponent = min_exponent < 0 ? Weight::kNoPairDot : min_exponent;
  return owner;
}

int64_t gemv_tile_count() { return g_tiles.load(std::memory_order_relaxed); }
int64_t gemv_dot_tile_count() { return g_dot_tiles.load(std::memory_order_relaxed); }

bool gemv_reads_pair_panels(const Weight& w, int64_t o0, int64_t stride) {
  return w.pair_panels != nullptr && stride == 1 && o0 % 16 == 0 &&
         (w.kind == Weight::Kind::kBF16 || gemv_isa() == Isa::kAvx2);
}

namespace {

// Where the GEMV tiles read FP4 panels: the vdpbf16ps and the AVX2 ones.
bool fp4_panels_pay() {
#ifdef DSV4_HAVE_AVX512BF16_KERNELS
  if (gemv_isa() == Isa::kAvx512Bf16) return true;
#endif
  return gemv_isa() == Isa::kAvx2;
}

}  // namespace

size_t quant_panel_bytes(const Weight& w) {
  if (w.out <= 0) return 0;
  const int64_t panels = (w.out + 15) / 16;
  if (w.kind == Weight::Kind::kFP4 && w.in % 32 == 0 && fp4_panels_pay())
    return size_t(panels * (w.in / 8) * 16 * 4 + panels * (w.in / 32) * 16 + 63) / 64 * 64;
#ifdef DSV4_HAVE_AVX512BF16_KERNELS
  if (w.kind == Weight::Kind::kFP8 && w.in % 16 == 0 && w.block % 16 == 0 && gemv_isa() == Isa::kAvx512Bf16)
    return size_t(panels * w.in * 16);
#endif
  return 0;
}

bool pack_quant_panels(Weight& w, void* dst) {
  if (quant_panel_bytes(w) == 0) return false;
  const int64_t panels = (w.out + 15) / 16;
  uint32_t* const p = static_cast<uint32_t*>(dst);
#ifdef DSV4_HAVE_AVX512BF16_KERNELS
  if (w.kind == Weight::Kind::kFP8) {
    std::atomic<bool> ok{true};
    ThreadPool::global().parallel_for(panels, [&](int64_t p0, int64_t p1, int) {
      for (int64_t q = p0; q < p1; ++q)
        if (!pack_fp8_panel_avx512bf16(w, q, p + q * w.in * 4)) ok.store(false, std::memory_order_relaxed);
    });
    if (ok.load()) w.fp8_panels = p;
    return ok.load();
  }
#endif
  const int64_t steps = w.in / 8, blocks = w.in / 32;
  uint8_t* const scales = reinterpret_cast<uint8_t*>(p + panels * steps * 16);
  std::atomic<bool> ok{true};
  ThreadPool::global().parallel_for(panels, [&](int64_t p0, int64_t p1, int) {
    for (int64_t q = p0; q < p1; ++q) {
#ifdef DSV4_HAVE_AVX512BF16_KERNELS
      if (gemv_isa() == Isa::kAvx512Bf16) {
        pack_fp4_panel_avx512bf16(w, q, p + q * steps * 16, scales + q * blocks * 16);
        continue;
      }
#endif
      if (!pack_fp4_panel_avx2(w, q, p + q * steps * 16, scales + q * blocks * 16))
        ok.store(false, std::memory_order_relaxed);
    }
  });
  if (!ok.load()) return false;
  w.fp4_panels = p;
  w.fp4_panel_scales = scales;
  return true;
}

std::shared_ptr<const uint8_t> pack_quant_panels(Weight& w) {
  const size_t bytes = quant_panel_bytes(w);
  if (bytes == 0) return nullptr;
  std::shared_ptr<uint8_t> block = huge_page_block(bytes);
  return pack_quant_panels(w, block.get()) ? block : nullptr;
}

bool gemv_available(const Weight& w, int64_t M) {
  if (M < 1 || M > kGemvMaxRows || gemv_isa() < Isa::kAvx2) return false;
  switch (w.kind) {
    // 16 codes of a row per step, in one block. Under Isa::kAvx512Bf16 the
    // gemm multiplies FP8 rows decoded once into bf16 pairs on vdpbf16ps;
    // past one pass of a tile it beat gemv's second pass (16 decode
    // streams on Zen 4: attention projections 118-125 -> 75-82 ms a step).
    // FP8 panels take up to 16 rows in one pass (kGemvPanelInputRows).
    case Weight::Kind::kFP8:
      return w.in % 16 == 0 && w.block % 16 == 0 &&
             (M <= kGemvTileInputRows || kernel_isa() != Isa::kAvx512Bf16 || w.fp8_panels);
    case Weight::Kind::kFP4: return w.in % 32 == 0;
    case Weight::Kind::kBF16: return w.in % 8 == 0;
    case Weight::Kind::kF32: return false;
  }
  return false;
}

bool gemv(const Weight& w, const float* x, int64_t M, int64_t ldx, float* y, int64_t ldy, bool out_bf16,
          int64_t row_begin, int64_t row_end) {
  const int64_t rows = row_end - row_begin;
  if (rows <= 0) return true;
  // A span of `stride` tiles, each taking every stride-th row: rows shorter
  // than a 4 KB page (FP4 experts: 1 and 2 KB) are then read one per page at
  // a time, which the L2 prefetcher follows much better: streamed FP4 expert
  // matrices on one thread went from 4.6-5.4 to 6.8-7.2 GB/s (session 17,
  // docs/PERFORMANCE.md "Decode"). A span is what the threads split, so
  // every thread still gets one; at most 8 (rows of 512 B).
  // Pair panels are read 32 rows (two sequential streams) at a time, and
  // on vdpbf16ps where that gives the same bits: the input rows are exact
  // bf16 values and no product or sum can be subnormal (gemm.h).
  // The AVX2 tiles (gemv_avx2.h) read the rows, or pair panels, in tiles of
  // gemv_avx2_tile_rows and up to kGemvAvx2TileInputRows input rows a pass.
  ThreadPool& pool = ThreadPool::global();
  const bool avx2 = gemv_isa() == Isa::kAvx2;
  const bool panels = gemv_reads_pair_panels(w, row_begin, 1) || reads_quant_panels(w, row_begin, 1);
  const DotInput in = dot_input(w, panels, x, M, ldx);
  const bool narrow = !avx2 && w.kind == Weight::Kind::kBF16 && M <= kGemvBf16NarrowInputRows && !panels;
  const bool quant_panels = in.xp && panels && w.kind != Weight::Kind::kBF16;
  const int64_t tile_rows = avx2           ? gemv_avx2_tile_rows(std::min(M, kGemvAvx2TileInputRows))
                            : narrow       ? kGemvBf16TileRows
                            : quant_panels ? quant_panel_tile_rows(rows, pool.size())
                                           : kGemvTileRows,
                tiles = (rows + tile_rows - 1) / tile_rows,
                stride = panels ? 1
                                : std::clamp<int64_t>(std::min<int64_t>(4096 / std::max<int64_t>(1, w.row_bytes()),
                                                                        tiles / pool.size()),
                                                      1, 8),
                span = stride * tile_rows, spans = (rows + span - 1) / span,
                pass_rows = avx2 ? kGemvAvx2TileInputRows : panels ? kGemvPanelInputRows : kGemvTileInputRows;
  // Each span's outputs are written by the one thread that computes them,
  // so the split changes no bit; a refused tile refuses the whole call.
  std::atomic<bool> ok{true};
  pool.parallel_for(spans, [&](int64_t s0, int64_t s1, int) {
    for (int64_t s = s0; s < s1 && ok.load(std::memory_order_relaxed); ++s) {
      const int64_t b = row_begin + s * span, n = std::min(row_end, b + span) - b;
      float* ys = y + (b - row_begin);
      for (int64_t j = 0; j < stride && j < n; ++j) {
        g_tiles.fetch_add(1, std::memory_order_relaxed);
        // Input rows 8 at a time (the fp32 tiles' most; 16 for the
        // vdpbf16ps tiles on panels): the tile's weight rows are then read
        // again from L2, not from memory.
        for (int64_t m0 = 0; m0 < M; m0 += pass_rows)
          if (!run_tile(w, in, x, m0, std::min(pass_rows, M - m0), ldx, b, j, stride, n, ys, ldy)) {
            ok.store(false, std::memory_order_relaxed);
            return;
          }
      }
      if (out_bf16)
        for (int64_t m = 0; m < M; ++m) bf16r_inplace(ys + m * ldy, size_t(n));
    }
  });
  return ok.load();
}

void gemv_reference(const Weight& w, const float* x, int64_t M, int64_t ldx, float* y, int64_t ldy, bool out_bf16,
                    int64_t row_begin, int64_t row_end) {
  float* const row = workspace<float>(Buf::kPanelRow, size_t(w.in));
  for (int64_t o = row_begin; o < row_end; ++o) {
    w.dequant_row(o, row);
    for (int64_t m = 0; m < M; ++m) {
      float acc = 0.f;
      for (int64_t k = 0; k < w.in; ++k) acc = std::fma(x[m * ldx + k], row[k], acc);
      y[m * ldy + (o - row_begin)] = out_bf16 ? bf16r(acc) : acc;
    }
  }
}

}  // namespace dsv4
