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

#include "core/arith.h"
#include "core/cpu.h"
#include "core/formats.h"
#include "core/scratch.h"
#include "core/thread_pool.h"
#include "kernels/gemm_micro.h"

namespace dsv4 {

namespace {

constexpr int NR = kGemmNR;
constexpr int64_t KC = 1024;  // k per block: the sub-panels stream from L2
constexpr int64_t GP = 4;     // panels per task: an A micro-panel is reused GP times from L1
// Micro-tiles per chunk of A rows. A task's partial sums are MC × GP·16
// floats (48 KB with AVX2's 6-row tiles); with the KC × GP·16 B sub-block
// (256 KB) they stay in a 512 KB L2; the partial sums of all M rows
// (512 KB at M = 2048) would push the sub-block out of L2.
constexpr int64_t kTilesPerChunk = 32;
static_assert(KC % 2 == 0, "k blocks start on a pair");

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
  const int64_t lines = ceil_div<int64_t>(n, 16);
  return 16 * (lines | 1);
}

// ---- Dispatch to the BF16 pair kernel (Isa::kAvx512Bf16) ---------------------
// The only places that depend on whether this build has it. Without it no
// operand is ever packed into pairs, so the fp32 kernels take everything.

// Packs A into bf16 pairs: true when the BF16 kernel may read it;
// *min_exponent as gemm_pack_rows_bf16 gives it. Rows in blocks over the pool.
bool pack_a_pairs(const float* A, int64_t lda, int64_t M, int64_t K, int64_t ldp, bool parallel, uint32_t* out,
                  int* min_exponent) {
#ifdef DSV4_HAVE_AVX512BF16_KERNELS
  const int64_t rows_per_block = 32, blocks = ceil_div(M, rows_per_block);
  std::vector<int> ok(static_cast<size_t>(blocks)), exps(static_cast<size_t>(blocks));
  auto pack = [&](int64_t b0, int64_t b1, int) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t m0 = b * rows_per_block, rows = std::min(rows_per_block, M - m0);
      ok[size_t(b)] = gemm_pack_rows_bf16(A + m0 * lda, lda, rows, K, out + m0 * ldp, ldp, &exps[size_t(b)]);
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

// Where the pairs of the K × 16 panel from B row n0 are, null where they are
// not exact bf16 values: where the pairs already are (pair_source), else
// straight from the pair loader, else packed from the fp32 panel, which is
// then loaded into `fp32` (*fp32_loaded). `own`: room for the pairs.
const uint32_t* panel_pairs(const PanelLoader& load, const PairLoader* load_pairs, const PairSource* pair_source,
                            int64_t n0, int64_t K, float* fp32, uint32_t* own, int* min_exponent,
                            bool* fp32_loaded) {
#ifdef DSV4_HAVE_AVX512BF16_KERNELS
  if (pair_source) {
    if (const uint32_t* src = (*pair_source)(n0, min_exponent)) return src;
  } else if (load_pairs && (*load_pairs)(n0, own, min_exponent)) {
    return own;
  }
  load(n0, fp32);
  *fp32_loaded = true;
  return gemm_pack_panel_bf16(fp32, K, own, min_exponent) ? own : nullptr;
#else
  (void)load, (void)load_pairs, (void)pair_source, (void)n0, (void)K, (void)fp32, (void)own, (void)min_exponent,
      (void)fp32_loaded;
  return nullptr;
#endif
}

// gemm_micro_rows_avx512bf16 where this build has it (only reached when a
// panel was packed into pairs, which needs it).
void pair_micro_rows(int rows, int panels, const uint32_t* A, int64_t lda, const uint32_t* P, int64_t pstride,
                     int64_t kp, float* C, int64_t ldc, bool first) {
#ifdef DSV4_HAVE_AVX512BF16_KERNELS
  gemm_micro_rows_avx512bf16(rows, panels, A, lda, P, pstride, kp, C, ldc, first);
#else
  (void)rows, (void)panels, (void)A, (void)lda, (void)P, (void)pstride, (void)kp, (void)C, (void)ldc, (void)first;
#endif
}

// ---- The plan of one call ------------------------------------------------------

// What is fixed for the whole call: the kernel variant, the blocking and
// the A operand the micro-tiles read.
struct Plan {
  int64_t M = 0, K = 0, N = 0;
  MicroKernel mk{};
  int64_t MC = 0;                  // rows per chunk: kTilesPerChunk micro-tiles
  int64_t panels = 0, tasks = 0;   // 16-row panels of B; tasks of GP panels
  const float* a = nullptr;        // fp32 A (in place or a padded copy)
  int64_t lda = 0;
  // Isa::kAvx512Bf16: A also as bf16 pairs (rows of KH dwords, stride ldp);
  // null where the BF16 kernel takes no panel of this call.
  const uint32_t* a_pairs = nullptr;
  int64_t KH = 0, ldp = 0;
  int a_min_exponent = 255;
  bool dot() const { return a_pairs != nullptr; }
};

// Every task streams all of A once, so a wide product reads A N/64 times.
// When A is larger than a fair share of L3 (4 MB) and there are many
// tasks, the rows are taken in slices of 2 MB of A, each a product of its
// own (B panels decoded once per slice); the slices' rows, 0 for none.
// Slices shorter than two chunks cost more in decoding and thin tasks than
// they save, so K above ~1360 is left whole.
int64_t row_slice(int64_t M, int64_t K, int64_t N, int64_t MC) {
  const int64_t MS = (int64_t(2) << 20) / (K * 4);
  return N >= 2048 && MS >= 2 * MC && M > MS && M * K * 4 > (int64_t(4) << 20) ? MS : 0;
}

// The A operand: bf16 pairs where the BF16 kernel may take it, and the fp32
// rows, read in place unless a micro-tile's rows (more than an 8-way L1
// set holds) would share L1 sets (a stride of a multiple of 2 KB: at most
// two sets); then from a copy with padded_row_stride. AVX2's 6-row tiles
// do not need the copy.
//
// Isa::kAvx512Bf16: the BF16 kernel takes every panel pair where that is
// exact (see kDotMinBiasedExponentSum); the others run on the fp32 kernel.
// Both give the same bits, so the choice per panel changes only the speed.
//
// Both copies are in this thread's workspace (core/scratch.h); the tasks,
// on every thread, read them through the plan's pointers.
void prepare_a(Plan& p, const float* A, int64_t lda, bool parallel) {
  p.a = A;
  p.lda = lda;
  p.KH = ceil_div<int64_t>(p.K, 2);
  p.ldp = padded_row_stride(p.KH);
  if (kernel_isa() == Isa::kAvx512Bf16) {
    uint32_t* pairs = workspace<uint32_t>(Buf::kGemmAPairs, size_t(p.M * p.ldp));
    if (pack_a_pairs(A, lda, p.M, p.K, p.ldp, parallel, pairs, &p.a_min_exponent)) {
      p.a_pairs = pairs;
      return;
    }
  }
  if (p.mk.mr > 8 && p.M > 1 && (lda * 4) % 2048 == 0) {
    const int64_t ld = padded_row_stride(p.K), K = p.K;
    float* dst = workspace<float>(Buf::kGemmARows, size_t(p.M * ld));
    for_ranges(parallel, p.M, [&](int64_t r0, int64_t r1, int) {
      for (int64_t r = r0; r < r1; ++r) std::copy(A + r * lda, A + r * lda + K, dst + r * ld);
    });
    p.a = dst;
    p.lda = ld;
  }
}

// ---- One task: GP panels of B against all of A ---------------------------------

// A task's panels: panel g (of np) in fp32 at fp32 + g·K·16 and, where
// on_pairs[g], as pairs at pairs[g], which the BF16 kernel then takes.
struct TaskPanels {
  int64_t np = 0;
  const float* fp32 = nullptr;
  bool on_pairs[GP] = {};
  const uint32_t* pairs[GP] = {};
};

// Decodes the task's panels [p0, p0 + np) once, for all M rows: into
// pairs where the BF16 kernel may take them, else into fp32 panels.
TaskPanels load_panels(const Plan& p, int64_t p0, const PanelLoader& load, const PairLoader* load_pairs,
                       const PairSource* pair_source, float* fp32, uint32_t* own_pairs) {
  TaskPanels t;
  t.np = std::min(GP, p.panels - p0);
  t.fp32 = fp32;
  int64_t dot_panels = 0;
  for (int64_t g = 0; g < t.np; ++g) {
    float* b = fp32 + g * p.K * NR;
    const int64_t n0 = (p0 + g) * NR;
    bool loaded = false;
    if (p.dot()) {
      int e = 255;
      t.pairs[g] = panel_pairs(load, load_pairs, pair_source, n0, p.K, b, own_pairs + g * p.KH * NR, &e, &loaded);
      t.on_pairs[g] = t.pairs[g] && p.a_min_exponent + e >= kDotMinBiasedExponentSum;
      dot_panels += t.on_pairs[g];
    }
    if (!t.on_pairs[g] && !loaded) load(n0, b);
  }
  if (dot_panels) g_dot_panels.fetch_add(dot_panels, std::memory_order_relaxed);
  return t;
}

// One micro-tile: `rows` rows of A from row `row`, k block [k0, k0 + kc),
// their partial sums at C (row stride ldc).
struct Tile {
  int rows;
  int64_t row, k0, kc;
  float* C;
  int64_t ldc;
};

// The tile against panels [g, g + n) on one kernel: the BF16 one where the
// panels are on pairs (both, when n = 2), else the fp32 one.
void run_panels(const Plan& p, const TaskPanels& t, const Tile& tile, int64_t g, int n) {
  float* c = tile.C + g * NR;
  const bool first = tile.k0 == 0;
  if (t.on_pairs[g]) {
    // Two panels: the second one's dwords lie this far from the first's
    // (they may be in different buffers).
    const int64_t pstride =
        n == 2 ? int64_t(reinterpret_cast<intptr_t>(t.pairs[g + 1]) - reinterpret_cast<intptr_t>(t.pairs[g])) / 4
               : 0;
    return pair_micro_rows(tile.rows, n, p.a_pairs + tile.row * p.ldp + tile.k0 / 2, p.ldp,
                           t.pairs[g] + (tile.k0 / 2) * NR, pstride, ceil_div<int64_t>(tile.kc, 2), c, tile.ldc,
                           first);
  }
  p.mk.rows(tile.rows, n, p.a + tile.row * p.lda + tile.k0, p.lda, t.fp32 + g * p.K * NR + tile.k0 * NR, p.K * NR,
            tile.kc, c, tile.ldc, first);
}

// The tile against every panel of the task, mk.np at a time where both are
// on the same kernel.
void run_tile(const Plan& p, const TaskPanels& t, const Tile& tile) {
  for (int64_t g = 0; g < t.np; g += p.mk.np) {
    const int pn = int(std::min<int64_t>(p.mk.np, t.np - g));
    if (pn == 2 && t.on_pairs[g] != t.on_pairs[g + 1]) {
      run_panels(p, t, tile, g, 1);
      run_panels(p, t, tile, g + 1, 1);
    } else {
      run_panels(p, t, tile, g, pn);
    }
  }
}

// Rows [m0, m0 + mc) against the task's panels into C (row stride ldc):
// per k block, each micro-tile against each panel.
//
// The chunk's rows are in ceil(mc / MR) micro-tiles of near-equal height:
// 50 rows as 5 × 10, not 4 × 12 + 2. A short micro-tile has too few
// independent chains to hide the FMA latency (2 rows: 4 accumulators), and
// the routed experts' ~48-row products ended in one about every time.
// Which rows share a micro-tile changes no chain.
void run_chunk(const Plan& p, const TaskPanels& t, int64_t m0, int64_t mc, float* C, int64_t ldc) {
  const int64_t tiles = ceil_div<int64_t>(mc, p.mk.mr), base = mc / tiles, taller = mc % tiles;
  for (int64_t k0 = 0; k0 < p.K; k0 += KC) {
    const int64_t kc = std::min(KC, p.K - k0);
    for (int64_t ti = 0; ti < tiles; ++ti) {
      const int rows = int(base + (ti < taller ? 1 : 0));
      const int64_t i = ti * base + std::min(ti, taller);  // the first `taller` tiles have base + 1 rows
      run_tile(p, t, Tile{rows, m0 + i, k0, kc, C + i * ldc, ldc});
    }
  }
}

// Copies the chunk's finished sums (mc rows of nc, stride ldc) to the
// output from row m0, column n0, rounded to bf16 on the way out where asked
// (one pass, not a copy and a second one).
void write_chunk(const float* C, int64_t ldc, int64_t m0, int64_t mc, int64_t n0, int64_t nc, const GemmOut& out) {
  for (int64_t m = 0; m < mc; ++m) {
    const float* row = C + m * ldc;
    float* c = out.c + (m0 + m) * out.ldc + n0;
    if (out.bf16) {
      bf16r_copy(row, size_t(nc), c);
    } else {
      std::copy(row, row + nc, c);
    }
  }
}

// Tasks [t0, t1) on this thread: each decodes its GP panels once, then per
// chunk of MC rows computes and writes the chunk's outputs.
void run_tasks(const Plan& p, int64_t t0, int64_t t1, const PanelLoader& load, const PairLoader* load_pairs,
               const PairSource* pair_source, const GemmOut& out) {
  float* const B = workspace<float>(Buf::kGemmPanels, size_t(GP * p.K * NR));
  float* const C = workspace<float>(Buf::kGemmSums, size_t(p.MC * GP * NR));
  uint32_t* const Bp = p.dot() ? workspace<uint32_t>(Buf::kGemmPanelPairs, size_t(GP * p.KH * NR)) : nullptr;
  const int64_t ldc = GP * NR;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t p0 = t * GP, n0 = p0 * NR;
    const TaskPanels panels = load_panels(p, p0, load, load_pairs, pair_source, B, Bp);
    const int64_t nc = std::min(panels.np * NR, p.N - n0);
    for (int64_t m0 = 0; m0 < p.M; m0 += p.MC) {
      const int64_t mc = std::min(p.MC, p.M - m0);
      run_chunk(p, panels, m0, mc, C, ldc);
      write_chunk(C, ldc, m0, mc, n0, nc, out);
    }
  }
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
  Plan p{M, K, N, micro_kernel(kernel_isa())};
  p.MC = kTilesPerChunk * p.mk.mr;
  if (const int64_t MS = row_slice(M, K, N, p.MC)) {
    for (int64_t m0 = 0; m0 < M; m0 += MS)
      gemm(A + m0 * lda, lda, std::min(MS, M - m0), K, N, load, GemmOut{out.c + m0 * out.ldc, out.ldc, out.bf16},
           parallel, load_pairs, pair_source);
    return;
  }
  p.panels = ceil_div<int64_t>(N, NR);
  p.tasks = ceil_div(p.panels, GP);
  prepare_a(p, A, lda, parallel);
  for_ranges(parallel, p.tasks,
             [&](int64_t t0, int64_t t1, int) { run_tasks(p, t0, t1, load, load_pairs, pair_source, out); });
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
