#include "kernels/gemm.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define DSV4_GEMM_AVX2 1
#endif

#include "core/cpu.h"
#include "core/formats.h"
#include "core/thread_pool.h"
#include "kernels/gemm_micro.h"

namespace dsv4 {

namespace {

constexpr int NR = kGemmNR;
constexpr int64_t KC = 1024;  // k per block (measured: 256 → 1024 gave +3%; the sub-panels stream from L2)
constexpr int64_t GP = 4;     // panels per task: an A micro-panel is reused GP times from L1
// Micro-tiles per chunk of A rows. A task's partial sums are MC × GP·16
// floats (48 KB with AVX2's 6-row tiles); with the KC × GP·16 B sub-block
// (256 KB) they stay in a 512 KB L2. Without the chunks the partial sums of
// all M rows (512 KB at M = 2048) pushed the sub-block out of L2 and
// large-M products fell to ~55% of peak.
constexpr int64_t kTilesPerChunk = 32;

// The portable variant (and the one tests compare the others with).
struct Scalar {
  using T = float;
  static constexpr int kLanes = 1, kRows = 4, kPanels = 1;
  static T zero() { return 0.f; }
  static T load(const float* p) { return *p; }
  static void store(float* p, T v) { *p = v; }
  static T broadcast(const float* p) { return *p; }
  static T fma(T a, T b, T c) { return std::fma(a, b, c); }
};

#ifdef DSV4_GEMM_AVX2
// 6 rows: 12 accumulators + 2 panel vectors + 1 broadcast of 16 registers.
struct Ymm {
  using T = __m256;
  static constexpr int kLanes = 8, kRows = 6, kPanels = 1;
  static T zero() { return _mm256_setzero_ps(); }
  static T load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, T v) { _mm256_storeu_ps(p, v); }
  static T broadcast(const float* p) { return _mm256_broadcast_ss(p); }
  static T fma(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
};
#endif

struct MicroKernel {
  int mr, np;  // A rows and panels per micro-tile
  GemmMicroRows rows;
};

MicroKernel micro_kernel(Isa isa) {
  switch (isa) {
#ifdef DSV4_GEMM_AVX2
    case Isa::kAvx2: return {Ymm::kRows, Ymm::kPanels, micro_rows<Ymm>};
#endif
#ifdef DSV4_HAVE_AVX512_KERNELS
    case Isa::kAvx512:
    case Isa::kAvx512Bf16:  // for the panels that the BF16 kernel cannot take
      return {kGemmMRAvx512, kGemmNPAvx512, gemm_micro_rows_avx512};
#endif
    default: return {Scalar::kRows, Scalar::kPanels, micro_rows<Scalar>};
  }
}

std::atomic<int64_t> g_dot_panels{0};

// fn(i0, i1, thread) over [0, n): on the pool, or on this thread alone.
template <class Fn>
void for_ranges(bool parallel, int64_t n, const Fn& fn) {
  if (parallel)
    ThreadPool::global().parallel_for(n, fn);
  else
    fn(0, n, 0);
}

// Row stride for a copy of rows of n 4-byte values (A's bf16 pairs or fp32
// values): an odd number of 64-byte lines. A micro-tile reads its rows in
// step, and rows a multiple of 4 KB apart (K = 4096: pairs 8 KB, fp32
// 16 KB) all fall in one L1 set, which holds only 8 lines on Zen 4: 12 rows
// then evict each other at every k step. An odd number of lines puts 64
// consecutive rows in 64 different sets.
int64_t padded_row_stride(int64_t n) {
  const int64_t lines = (n + 15) / 16;
  return 16 * (lines | 1);
}

// Packs A into bf16 pairs (Isa::kAvx512Bf16): true when the BF16 kernel may
// read it; *min_exponent as gemm_pack_rows_bf16 gives it. Rows in blocks
// over the pool.
bool pack_a_pairs(const float* A, int64_t lda, int64_t M, int64_t K, int64_t ldp, bool parallel,
                  std::vector<uint32_t>& out, int* min_exponent) {
#ifdef DSV4_HAVE_AVX512BF16_KERNELS
  const int64_t rows_per_block = 32, blocks = (M + rows_per_block - 1) / rows_per_block;
  if (out.size() < size_t(M * ldp)) out.resize(size_t(M * ldp));
  std::vector<int> ok(static_cast<size_t>(blocks)), exps(static_cast<size_t>(blocks));
  auto pack = [&](int64_t b0, int64_t b1, int) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t m0 = b * rows_per_block, rows = std::min(rows_per_block, M - m0);
      ok[size_t(b)] = gemm_pack_rows_bf16(A + m0 * lda, lda, rows, K, out.data() + m0 * ldp, ldp, &exps[size_t(b)]);
    }
  };
  for_ranges(parallel, blocks, pack);
  *min_exponent = 255;
  for (int64_t b = 0; b < blocks; ++b) {
    if (!ok[size_t(b)]) return false;
    *min_exponent = std::min(*min_exponent, exps[size_t(b)]);
  }
  return true;
#else
  (void)A, (void)lda, (void)M, (void)K, (void)ldp, (void)parallel, (void)out, (void)min_exponent;
  return false;
#endif
}

}  // namespace

int64_t gemm_dot_panel_count() { return g_dot_panels.load(std::memory_order_relaxed); }

void gemm(const float* A, int64_t lda, int64_t M, int64_t K, int64_t N, const PanelLoader& load, const GemmOut& out,
          bool parallel, const PairLoader* load_pairs, const PairSource* pair_source) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {  // empty sums
    for (int64_t m = 0; m < M; ++m) std::fill(out.c + m * out.ldc, out.c + m * out.ldc + N, 0.f);
    return;
  }
  // Every task streams all of A once, so a wide product reads A N/64 times.
  // When A is larger than a fair share of L3 (4 MB) and there are many
  // tasks, the rows are taken in slices of 2 MB of A, each a product of its
  // own (B panels decoded once per slice). Measured side by side against
  // OpenBLAS: 2048×1024×4096 0.89–0.91x → 0.93–0.97x. Slices shorter than two
  // chunks cost more in decoding and thin tasks than they save (2048×4096×4096:
  // 0.85–0.92x → 0.80–0.85x), so K above ~1360 is left whole.
  const MicroKernel mk = micro_kernel(kernel_isa());
  const int64_t MR = mk.mr, MC = kTilesPerChunk * MR;
  const int64_t MS = (int64_t(2) << 20) / (K * 4);
  if (N >= 2048 && MS >= 2 * MC && M > MS && M * K * 4 > (int64_t(4) << 20)) {
    for (int64_t m0 = 0; m0 < M; m0 += MS)
      gemm(A + m0 * lda, lda, std::min(MS, M - m0), K, N, load, GemmOut{out.c + m0 * out.ldc, out.ldc, out.bf16},
           parallel, load_pairs, pair_source);
    return;
  }
  const int64_t panels = (N + NR - 1) / NR, tasks = (panels + GP - 1) / GP;
  // Isa::kAvx512Bf16: A and each panel are also packed into bf16 pairs, and
  // the BF16 kernel takes every panel pair where that is exact (see
  // kDotMinBiasedExponentSum); the others run on the fp32 kernel. Both give
  // the same bits, so the choice per panel changes only the speed.
  // Kept per thread from call to call (a fresh vector was zero-filled every
  // call: the attention's per-query products are small and many). No gemm
  // runs inside another on one thread: the row slices above return first.
  // The tasks below run on other threads: they reach this thread's buffer
  // through the reference, not through the thread_local name.
  thread_local std::vector<uint32_t> a_pairs;
  std::vector<uint32_t>& Ap = a_pairs;
  int a_exp = 255;
  const int64_t KH = (K + 1) / 2, ldp = padded_row_stride(KH);
  const bool dot = kernel_isa() == Isa::kAvx512Bf16 && pack_a_pairs(A, lda, M, K, ldp, parallel, Ap, &a_exp);
  static_assert(KC % 2 == 0, "k blocks start on a pair");
  // The fp32 kernels read A in place, unless a micro-tile's rows (more than
  // an 8-way L1 set holds) would share L1 sets (a stride of a multiple of
  // 2 KB: at most two sets); then from a copy (padded_row_stride). Measured
  // with DSV4_ISA=avx512 on Zen 4, alternately: 512x1024x4096 69-86% ->
  // 87-91% of the fp32 peak. AVX2's 6-row tiles showed no difference.
  thread_local std::vector<float> a_rows;
  if (!dot && MR > 8 && M > 1 && (lda * 4) % 2048 == 0) {
    const int64_t ld = padded_row_stride(K);
    if (a_rows.size() < size_t(M * ld)) a_rows.resize(size_t(M * ld));
    float* dst = a_rows.data();
    for_ranges(parallel, M, [&](int64_t r0, int64_t r1, int) {
      for (int64_t r = r0; r < r1; ++r) std::copy(A + r * lda, A + r * lda + K, dst + r * ld);
    });
    A = dst;
    lda = ld;
  }
  // Each task: GP panels (dequantised once, for all M), then per chunk of
  // MC rows, per k block, each micro-tile of A against each panel.
  auto body = [&](int64_t t0, int64_t t1, int) {
    thread_local std::vector<float> B, C;
    thread_local std::vector<uint32_t> Bp;
    B.resize(size_t(GP * K * NR));
    C.resize(size_t(MC * GP * NR));
    if (dot) Bp.resize(size_t(GP * KH * NR));
    const int64_t ldc = GP * NR;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t p0 = t * GP, np = std::min(GP, panels - p0);
      const int64_t n0 = p0 * NR, nc = std::min(np * NR, N - n0);
      // pairs[g]: panel g runs on the BF16 kernel (from bp[g]), else on the
      // fp32 one (from B).
      bool pairs[GP] = {};
      const uint32_t* bp[GP] = {};
      int64_t dot_panels = 0;
      for (int64_t g = 0; g < np; ++g) {
        float* b = B.data() + g * K * NR;
        bool loaded = false;
#ifdef DSV4_HAVE_AVX512BF16_KERNELS
        if (dot) {
          uint32_t* own = Bp.data() + g * KH * NR;
          bp[g] = own;
          int e = 255;
          // Where the pairs already are, else straight to pairs where the
          // loader can, else through the fp32 panel.
          bool exact = false;
          if (pair_source) {
            if (const uint32_t* src = (*pair_source)((p0 + g) * NR, &e)) {
              bp[g] = src;
              exact = true;
            }
          } else {
            exact = load_pairs && (*load_pairs)((p0 + g) * NR, own, &e);
          }
          if (!exact) {
            load((p0 + g) * NR, b);
            loaded = true;
            exact = gemm_pack_panel_bf16(b, K, own, &e);
          }
          pairs[g] = exact && a_exp + e >= kDotMinBiasedExponentSum;
          dot_panels += pairs[g];
        }
#endif
        if (!pairs[g] && !loaded) load((p0 + g) * NR, b);
      }
      if (dot_panels) g_dot_panels.fetch_add(dot_panels, std::memory_order_relaxed);
      for (int64_t m0 = 0; m0 < M; m0 += MC) {
        const int64_t mc = std::min(MC, M - m0);
        for (int64_t k0 = 0; k0 < K; k0 += KC) {
          const int64_t kc = std::min(KC, K - k0);
          // The chunk's rows in ceil(mc / MR) micro-tiles of near-equal
          // height: 50 rows as 5 × 10, not 4 × 12 + 2. A short micro-tile
          // has too few independent chains to hide the FMA latency (2 rows:
          // 4 accumulators), and the routed experts' ~48-row products ended
          // in one about every time. Which rows share a micro-tile changes
          // no chain.
          const int64_t tiles = (mc + MR - 1) / MR, base = mc / tiles, taller = mc % tiles;
          for (int64_t ti = 0; ti < tiles; ++ti) {
            const int rows = int(base + (ti < taller ? 1 : 0));
            const int64_t i = ti * base + std::min(ti, taller);  // the first `taller` tiles have base + 1 rows
            const float* a = A + (m0 + i) * lda + k0;
            // Panels [g, g + n) on one kernel.
            auto run = [&](int64_t g, int n) {
              float* c = C.data() + i * ldc + g * NR;
#ifdef DSV4_HAVE_AVX512BF16_KERNELS
              if (pairs[g]) {
                // Two panels: the second one's dwords lie this far from the
                // first's (they may be in different buffers).
                const int64_t pstride =
                    n == 2 ? int64_t(reinterpret_cast<intptr_t>(bp[g + 1]) - reinterpret_cast<intptr_t>(bp[g])) / 4
                           : 0;
                return gemm_micro_rows_avx512bf16(rows, n, Ap.data() + (m0 + i) * ldp + k0 / 2, ldp,
                                                  bp[g] + (k0 / 2) * NR, pstride, (kc + 1) / 2, c, ldc, k0 == 0);
              }
#endif
              mk.rows(rows, n, a, lda, B.data() + g * K * NR + k0 * NR, K * NR, kc, c, ldc, k0 == 0);
            };
            for (int64_t g = 0; g < np; g += mk.np) {
              const int pn = int(std::min<int64_t>(mk.np, np - g));
              if (pn == 2 && pairs[g] != pairs[g + 1]) {
                run(g, 1);
                run(g + 1, 1);
              } else {
                run(g, pn);
              }
            }
          }
        }
        for (int64_t m = 0; m < mc; ++m) {
          const float* row = C.data() + m * ldc;
          float* c = out.c + (m0 + m) * out.ldc + n0;
          if (out.bf16) {
            bf16r_copy(row, size_t(nc), c);  // rounded on the way out: one pass, not a copy and a second one
          } else {
            std::copy(row, row + nc, c);
          }
        }
      }
    }
  };
  for_ranges(parallel, tasks, body);
}

void gemm_reference(const float* A, int64_t lda, int64_t M, int64_t K, int64_t N, const PanelLoader& load,
                    const GemmOut& out) {
  std::vector<float> panel(size_t(K * NR));
  for (int64_t n0 = 0; n0 < N; n0 += NR) {
    load(n0, panel.data());
    for (int64_t m = 0; m < M; ++m)
      for (int64_t j = 0; j < NR && n0 + j < N; ++j) {
        float acc = 0.f;
        for (int64_t k = 0; k < K; ++k) acc = std::fma(A[m * lda + k], panel[size_t(k * NR + j)], acc);
        out.c[m * out.ldc + n0 + j] = out.bf16 ? bf16r(acc) : acc;
      }
  }
}

PanelLoader dense_rows_loader(const float* B, int64_t ldb, int64_t N, int64_t K) {
  return [=](int64_t n0, float* panel) {
    for (int j = 0; j < NR; ++j) {
      const int64_t n = n0 + j;
      if (n < N) {
        const float* row = B + n * ldb;
        for (int64_t k = 0; k < K; ++k) panel[k * NR + j] = row[k];
      } else {
        for (int64_t k = 0; k < K; ++k) panel[k * NR + j] = 0.f;
      }
    }
  };
}

bool gathered_rows_pairs(const float* const* rows, int64_t N, int64_t K, int64_t n0, uint32_t* pairs,
                         int* min_exponent) {
#ifdef DSV4_HAVE_AVX512BF16_KERNELS
  if (kernel_isa() != Isa::kAvx512Bf16) return false;
  const float* panel_rows[NR];
  for (int j = 0; j < NR; ++j) panel_rows[j] = n0 + j < N ? rows[n0 + j] : nullptr;
  return gemm_pack_gathered_rows_bf16(panel_rows, K, pairs, min_exponent);
#else
  (void)rows, (void)N, (void)K, (void)n0, (void)pairs, (void)min_exponent;
  return false;
#endif
}

PairLoader dense_rows_pair_loader(const float* B, int64_t ldb, int64_t N, int64_t K) {
  return [=](int64_t n0, uint32_t* pairs, int* min_exponent) {
    const float* rows[NR];
    for (int j = 0; j < NR; ++j) rows[j] = n0 + j < N ? B + (n0 + j) * ldb : nullptr;
    return gathered_rows_pairs(rows, NR, K, 0, pairs, min_exponent);
  };
}

}  // namespace dsv4
