#include "kernels/gemv.h"

#include <algorithm>
#include <atomic>
#include <cmath>

#include "core/cpu.h"
#include "core/formats.h"
#include "core/scratch.h"
#include "core/thread_pool.h"
#include "kernels/gemv_avx512.h"

namespace dsv4 {

namespace {
std::atomic<int64_t> g_tiles{0};
}  // namespace

int64_t gemv_tile_count() { return g_tiles.load(std::memory_order_relaxed); }

bool gemv_available(const Weight& w, int64_t M) {
#ifdef DSV4_HAVE_AVX512_KERNELS
  if (M < 1 || M > kGemvMaxRows || kernel_isa() < Isa::kAvx512) return false;
  switch (w.kind) {
    case Weight::Kind::kFP8: return w.in % 16 == 0 && w.block % 16 == 0;  // 16 codes of a row per step, in one block
    case Weight::Kind::kFP4: return w.in % 32 == 0;
    case Weight::Kind::kBF16: return w.in % 8 == 0;
    case Weight::Kind::kF32: return false;
  }
#endif
  (void)w, (void)M;
  return false;
}

bool gemv(const Weight& w, const float* x, int64_t M, int64_t ldx, float* y, int64_t ldy, bool out_bf16,
          int64_t row_begin, int64_t row_end) {
#ifdef DSV4_HAVE_AVX512_KERNELS
  const int64_t rows = row_end - row_begin;
  if (rows <= 0) return true;
  // A span of `stride` tiles, each taking every stride-th row: rows shorter
  // than a 4 KB page (FP4 experts: 1 and 2 KB) are then read one per page at
  // a time, which the L2 prefetcher follows much better: streamed FP4 expert
  // matrices on one thread went from 4.6-5.4 to 6.8-7.2 GB/s (session 17,
  // docs/PERFORMANCE.md "Decode"). A span is what the threads split, so
  // every thread still gets one; at most 8 (rows of 512 B).
  ThreadPool& pool = ThreadPool::global();
  const bool narrow = w.kind == Weight::Kind::kBF16 && M <= kGemvBf16NarrowInputRows;
  const int64_t tile_rows = narrow ? kGemvBf16TileRows : kGemvTileRows, tiles = (rows + tile_rows - 1) / tile_rows,
                stride = std::clamp<int64_t>(
                    std::min<int64_t>(4096 / std::max<int64_t>(1, w.row_bytes()), tiles / pool.size()), 1, 8),
                span = stride * tile_rows, spans = (rows + span - 1) / span;
  // Each span's outputs are written by the one thread that computes them,
  // so the split changes no bit; a refused tile refuses the whole call.
  std::atomic<bool> ok{true};
  pool.parallel_for(spans, [&](int64_t s0, int64_t s1, int) {
    for (int64_t s = s0; s < s1 && ok.load(std::memory_order_relaxed); ++s) {
      const int64_t b = row_begin + s * span, n = std::min(row_end, b + span) - b;
      float* ys = y + (b - row_begin);
      for (int64_t j = 0; j < stride && j < n; ++j) {
        g_tiles.fetch_add(1, std::memory_order_relaxed);
        // Input rows 8 at a time (the tile kernels' most): the tile's weight
        // rows are then read again from L2, not from memory.
        for (int64_t m0 = 0; m0 < M; m0 += kGemvTileInputRows)
          if (!gemv_tile_avx512(w, x + m0 * ldx, std::min(kGemvTileInputRows, M - m0), ldx, b + j, stride,
                                (n - j + stride - 1) / stride, ys + j + m0 * ldy, ldy)) {
            ok.store(false, std::memory_order_relaxed);
            return;
          }
      }
      if (out_bf16)
        for (int64_t m = 0; m < M; ++m) bf16r_inplace(ys + m * ldy, size_t(n));
    }
  });
  return ok.load();
#else
  (void)w, (void)x, (void)M, (void)ldx, (void)y, (void)ldy, (void)out_bf16, (void)row_begin, (void)row_end;
  return false;
#endif
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
