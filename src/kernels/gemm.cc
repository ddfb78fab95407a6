#include "kernels/gemm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define DSV4_GEMM_AVX2 1
#endif

#include "core/formats.h"
#include "core/thread_pool.h"

namespace dsv4 {

namespace {

constexpr int NR = kGemmNR;
constexpr int MR = 6;        // A rows per micro-tile: 12 accumulators + 2 B + 1 A of 16 ymm registers
constexpr int64_t KC = 1024; // k per block (measured: 256 → 1024 gave +3%; the sub-panels stream from L2)
constexpr int64_t GP = 4;    // panels per task: an A micro-panel is reused GP times from L1

// A packed by micro-tiles: Ap[t][k][MR] holds A[t·MR + r][k] (zeros past M),
// so the micro-kernel reads its broadcasts sequentially.
void pack_a(const float* A, int64_t lda, int64_t M, int64_t K, float* Ap, bool parallel) {
  const int64_t tiles = (M + MR - 1) / MR;
  auto tile = [&](int64_t t) {
    float* dst = Ap + t * K * MR;
    for (int r = 0; r < MR; ++r) {
      const int64_t m = t * MR + r;
      if (m < M) {
        const float* src = A + m * lda;
        for (int64_t k = 0; k < K; ++k) dst[k * MR + r] = src[k];
      } else {
        for (int64_t k = 0; k < K; ++k) dst[k * MR + r] = 0.f;
      }
    }
  };
  if (parallel)
    parallel_for_each(tiles, tile, 4);
  else
    for (int64_t t = 0; t < tiles; ++t) tile(t);
}

// C[R][16] (row stride ldc, fp32 partial sums) continues its FMA chains over
// kc more k: C = fma(A[r][k], P[k][j], C) in ascending k. `first`: the
// chains start here from 0. Splitting K into blocks keeps every chain one
// chain: the fp32 partial sum is stored and reloaded exactly.
#ifdef DSV4_GEMM_AVX2
// The loops over r are unrolled so that the accumulators live in registers.
template <int R>
void micro_avx2(const float* Ap, const float* P, int64_t kc, float* C, int64_t ldc, bool first) {
  __m256 c0[R], c1[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    c0[r] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(C + r * ldc);
    c1[r] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(C + r * ldc + 8);
  }
  for (int64_t k = 0; k < kc; ++k) {
    const __m256 b0 = _mm256_loadu_ps(P + k * NR), b1 = _mm256_loadu_ps(P + k * NR + 8);
  #pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
      const __m256 a = _mm256_broadcast_ss(Ap + k * MR + r);
      c0[r] = _mm256_fmadd_ps(a, b0, c0[r]);
      c1[r] = _mm256_fmadd_ps(a, b1, c1[r]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(C + r * ldc, c0[r]);
    _mm256_storeu_ps(C + r * ldc + 8, c1[r]);
  }
}
#endif

template <int R>
void micro_scalar(const float* Ap, const float* P, int64_t kc, float* C, int64_t ldc, bool first) {
  for (int r = 0; r < R; ++r) {
    float* c = C + r * ldc;
    if (first) std::fill(c, c + NR, 0.f);
    for (int64_t k = 0; k < kc; ++k)
      for (int j = 0; j < NR; ++j) c[j] = std::fma(Ap[k * MR + r], P[k * NR + j], c[j]);
  }
}

template <int R>
void micro(const float* Ap, const float* P, int64_t kc, float* C, int64_t ldc, bool first) {
#ifdef DSV4_GEMM_AVX2
  micro_avx2<R>(Ap, P, kc, C, ldc, first);
#else
  micro_scalar<R>(Ap, P, kc, C, ldc, first);
#endif
}

void micro_rows(int rows, const float* Ap, const float* P, int64_t kc, float* C, int64_t ldc, bool first) {
  switch (rows) {
    case 6: micro<6>(Ap, P, kc, C, ldc, first); break;
    case 5: micro<5>(Ap, P, kc, C, ldc, first); break;
    case 4: micro<4>(Ap, P, kc, C, ldc, first); break;
    case 3: micro<3>(Ap, P, kc, C, ldc, first); break;
    case 2: micro<2>(Ap, P, kc, C, ldc, first); break;
    default: micro<1>(Ap, P, kc, C, ldc, first); break;
  }
}

}  // namespace

void gemm(const float* A, int64_t lda, int64_t M, int64_t K, int64_t N, const PanelLoader& load, const GemmOut& out,
          bool parallel) {
  if (M <= 0 || N <= 0) return;
  const int64_t panels = (N + NR - 1) / NR, tasks = (panels + GP - 1) / GP, tiles = (M + MR - 1) / MR;
  std::vector<float> Ap(size_t(tiles * MR * K));  // shared by the workers
  pack_a(A, lda, M, K, Ap.data(), parallel);
  // Each task: GP panels (dequantised once, for all M), then for each k
  // block, each micro-tile of A against each panel.
  auto body = [&](int64_t t0, int64_t t1, int) {
    thread_local std::vector<float> B, C;
    B.resize(size_t(GP * K * NR));
    C.resize(size_t(tiles * MR * GP * NR));
    const int64_t ldc = GP * NR;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t p0 = t * GP, np = std::min(GP, panels - p0);
      for (int64_t g = 0; g < np; ++g) load((p0 + g) * NR, B.data() + g * K * NR);
      for (int64_t k0 = 0; k0 < K; k0 += KC) {
        const int64_t kc = std::min(KC, K - k0);
        for (int64_t i = 0; i < tiles; ++i) {
          const int rows = int(std::min<int64_t>(MR, M - i * MR));
          const float* a = Ap.data() + i * K * MR + k0 * MR;
          for (int64_t g = 0; g < np; ++g)
            micro_rows(rows, a, B.data() + g * K * NR + k0 * NR, kc, C.data() + i * MR * ldc + g * NR, ldc, k0 == 0);
        }
      }
      const int64_t n0 = p0 * NR, nc = std::min(np * NR, N - n0);
      for (int64_t m = 0; m < M; ++m) {
        const float* acc = C.data() + m * ldc;
        float* c = out.c + m * out.ldc + n0;
        for (int64_t j = 0; j < nc; ++j) c[j] = out.bf16 ? bf16r(acc[j]) : acc[j];
      }
    }
  };
  if (parallel)
    ThreadPool::global().parallel_for(tasks, body);
  else
    body(0, tasks, 0);
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

}  // namespace dsv4
