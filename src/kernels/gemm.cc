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
constexpr int MR = 4;        // A rows per micro-kernel call
constexpr int64_t MC = 192;  // A rows per block: MC·K fp32 stays in the shared cache

void store_row(const float* acc, float* c, int nc, bool bf16) {
  for (int j = 0; j < nc; ++j) c[j] = bf16 ? bf16r(acc[j]) : acc[j];
}

#ifdef DSV4_GEMM_AVX2
// R rows of A against one packed panel: 2·R accumulators of 8 lanes, one
// FMA chain per output in ascending k.
template <int R>
void micro_avx2(const float* A, int64_t lda, const float* P, int64_t K, float* C, int64_t ldc, int nc, bool bf16) {
  __m256 c0[R], c1[R];
  for (int r = 0; r < R; ++r) c0[r] = c1[r] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    const __m256 b0 = _mm256_loadu_ps(P + k * NR), b1 = _mm256_loadu_ps(P + k * NR + 8);
    for (int r = 0; r < R; ++r) {
      const __m256 a = _mm256_broadcast_ss(A + r * lda + k);
      c0[r] = _mm256_fmadd_ps(a, b0, c0[r]);
      c1[r] = _mm256_fmadd_ps(a, b1, c1[r]);
    }
  }
  alignas(32) float tmp[NR];
  for (int r = 0; r < R; ++r) {
    _mm256_store_ps(tmp, c0[r]);
    _mm256_store_ps(tmp + 8, c1[r]);
    store_row(tmp, C + r * ldc, nc, bf16);
  }
}
#endif

template <int R>
void micro_scalar(const float* A, int64_t lda, const float* P, int64_t K, float* C, int64_t ldc, int nc, bool bf16) {
  for (int r = 0; r < R; ++r) {
    float acc[NR] = {0};
    for (int64_t k = 0; k < K; ++k)
      for (int j = 0; j < NR; ++j) acc[j] = std::fma(A[r * lda + k], P[k * NR + j], acc[j]);
    store_row(acc, C + r * ldc, nc, bf16);
  }
}

template <int R>
void micro(const float* A, int64_t lda, const float* P, int64_t K, float* C, int64_t ldc, int nc, bool bf16) {
#ifdef DSV4_GEMM_AVX2
  micro_avx2<R>(A, lda, P, K, C, ldc, nc, bf16);
#else
  micro_scalar<R>(A, lda, P, K, C, ldc, nc, bf16);
#endif
}

void panel_rows(const float* A, int64_t lda, int64_t rows, const float* P, int64_t K, float* C, int64_t ldc, int nc,
                bool bf16) {
  int64_t i = 0;
  for (; i + MR <= rows; i += MR) micro<MR>(A + i * lda, lda, P, K, C + i * ldc, ldc, nc, bf16);
  switch (rows - i) {
    case 3: micro<3>(A + i * lda, lda, P, K, C + i * ldc, ldc, nc, bf16); break;
    case 2: micro<2>(A + i * lda, lda, P, K, C + i * ldc, ldc, nc, bf16); break;
    case 1: micro<1>(A + i * lda, lda, P, K, C + i * ldc, ldc, nc, bf16); break;
    default: break;
  }
}

}  // namespace

void gemm(const float* A, int64_t lda, int64_t M, int64_t K, int64_t N, const PanelLoader& load, const GemmOut& out,
          bool parallel) {
  if (M <= 0 || N <= 0) return;
  const int64_t panels = (N + NR - 1) / NR;
  // With few rows the panel loads (dequantisation) dominate: load each panel
  // once for all M. With many rows, block M so the A block stays in cache.
  const int64_t mc = M <= 2 * MC ? M : MC;
  auto body = [&](int64_t p0, int64_t p1, int) {
    std::vector<float> panel(size_t(K * NR));
    for (int64_t m0 = 0; m0 < M; m0 += mc) {
      const int64_t mb = std::min(mc, M - m0);
      for (int64_t p = p0; p < p1; ++p) {
        load(p * NR, panel.data());
        const int nc = int(std::min<int64_t>(NR, N - p * NR));
        panel_rows(A + m0 * lda, lda, mb, panel.data(), K, out.c + m0 * out.ldc + p * NR, out.ldc, nc, out.bf16);
      }
    }
  };
  if (parallel)
    ThreadPool::global().parallel_for(panels, body);
  else
    body(0, panels, 0);
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
