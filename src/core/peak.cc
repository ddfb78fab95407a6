#include "core/peak.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/cpu.h"
#include "core/stage_timer.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define DSV4_PEAK_AVX2 1
#endif

namespace dsv4 {

namespace {

#ifdef DSV4_PEAK_AVX2
constexpr int kChains = 12;  // independent FMA chains: > latency (4-5) x FMA ports (2)

// kChains accumulators of 8 lanes, acc = acc * a + b; the values converge to
// b / (1 - a) and never overflow or go subnormal.
__attribute__((noinline)) float fma_kernel(int64_t iters, float seed) {
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(1e-3f);
  __m256 c0 = _mm256_set1_ps(seed), c1 = _mm256_set1_ps(seed + 1), c2 = _mm256_set1_ps(seed + 2),
         c3 = _mm256_set1_ps(seed + 3), c4 = _mm256_set1_ps(seed + 4), c5 = _mm256_set1_ps(seed + 5),
         c6 = _mm256_set1_ps(seed + 6), c7 = _mm256_set1_ps(seed + 7), c8 = _mm256_set1_ps(seed + 8),
         c9 = _mm256_set1_ps(seed + 9), c10 = _mm256_set1_ps(seed + 10), c11 = _mm256_set1_ps(seed + 11);
  for (int64_t i = 0; i < iters; ++i) {
    c0 = _mm256_fmadd_ps(c0, a, b);
    c1 = _mm256_fmadd_ps(c1, a, b);
    c2 = _mm256_fmadd_ps(c2, a, b);
    c3 = _mm256_fmadd_ps(c3, a, b);
    c4 = _mm256_fmadd_ps(c4, a, b);
    c5 = _mm256_fmadd_ps(c5, a, b);
    c6 = _mm256_fmadd_ps(c6, a, b);
    c7 = _mm256_fmadd_ps(c7, a, b);
    c8 = _mm256_fmadd_ps(c8, a, b);
    c9 = _mm256_fmadd_ps(c9, a, b);
    c10 = _mm256_fmadd_ps(c10, a, b);
    c11 = _mm256_fmadd_ps(c11, a, b);
  }
  __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(c0, c1), _mm256_add_ps(c2, c3)),
                           _mm256_add_ps(_mm256_add_ps(c4, c5), _mm256_add_ps(c6, c7)));
  s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(c8, c9), _mm256_add_ps(c10, c11)));
  alignas(32) float v[8];
  _mm256_store_ps(v, s);
  return v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
}

// Chain j of the 16-lane loops below starts at seed + j; their result is
// the sum of every lane of every chain.
__attribute__((always_inline, target("avx512f"))) inline void start_chains(__m512 (&c)[kChains], float seed) {
#pragma GCC unroll 16
  for (int j = 0; j < kChains; ++j) c[j] = _mm512_set1_ps(seed + float(j));
}
__attribute__((always_inline, target("avx512f"))) inline float sum_chains(const __m512 (&c)[kChains]) {
  __m512 s = c[0];
#pragma GCC unroll 16
  for (int j = 1; j < kChains; ++j) s = _mm512_add_ps(s, c[j]);
  alignas(64) float v[16];
  _mm512_store_ps(v, s);
  float sum = 0;
  for (float f : v) sum += f;
  return sum;
}

// The same on 16-lane vectors, for CPUs with AVX-512F (checked by the
// caller); compiled for AVX-512 by the attribute alone.
__attribute__((noinline, target("avx512f"))) float fma_kernel_avx512(int64_t iters, float seed) {
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1e-3f);
  __m512 c[kChains];
  start_chains(c, seed);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int j = 0; j < kChains; ++j) c[j] = _mm512_fmadd_ps(c[j], a, b);
  }
  return sum_chains(c);
}

#ifdef DSV4_HAVE_AVX512BF16_KERNELS
// vdpbf16ps (AVX512-BF16) in kChains independent chains: each instruction
// is 32 bf16 products added into 16 fp32 lanes (64 flops). Only called on
// CPUs with AVX512-BF16 (Isa::kAvx512Bf16 supported).
// acc grows by 2·2^-10 per instruction: no overflow, no subnormals.
__attribute__((noinline, target("avx512f,avx512bf16"))) float dpbf16_kernel(int64_t iters, float seed) {
  const __m512bh one = (__m512bh)_mm512_set1_epi16(0x3f80), small = (__m512bh)_mm512_set1_epi16(0x3a80);
  __m512 c[kChains];
  start_chains(c, seed);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int j = 0; j < kChains; ++j) c[j] = _mm512_dpbf16_ps(c[j], one, small);
  }
  return sum_chains(c);
}
#endif

// bf16 -> fp32 of 16 packed values as two vectors: the even elements (shift
// into the high half) and the odd ones (mask the low half away). A dot
// product may pair them this way because both operands are split alike.
inline void bf16x16(const uint16_t* p, __m256& even, __m256& odd) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  even = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  odd = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(int(0xffff0000u))));
}

// `reps` dot products of x and y (n bf16 values, n a multiple of 32).
__attribute__((noinline)) float bf16_dot_kernel(const uint16_t* x, const uint16_t* y, int64_t n, int64_t reps) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  float total = 0;
  for (int64_t r = 0; r < reps; ++r) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t i = 0; i < n; i += 32) {
      __m256 xe, xo, ye, yo, xe2, xo2, ye2, yo2;
      bf16x16(x + i, xe, xo);
      bf16x16(y + i, ye, yo);
      bf16x16(x + i + 16, xe2, xo2);
      bf16x16(y + i + 16, ye2, yo2);
      a0 = _mm256_fmadd_ps(xe, ye, a0);
      a1 = _mm256_fmadd_ps(xo, yo, a1);
      a2 = _mm256_fmadd_ps(xe2, ye2, a2);
      a3 = _mm256_fmadd_ps(xo2, yo2, a3);
    }
    acc[r & 3] = _mm256_add_ps(acc[r & 3], _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  }
  for (int j = 0; j < 4; ++j) {
    alignas(32) float v[8];
    _mm256_store_ps(v, acc[j]);
    for (float f : v) total += f;
  }
  return total;
}
#else
constexpr int kChains = 8;
__attribute__((noinline)) float fma_kernel(int64_t iters, float seed) {
  float c[kChains];
  for (int j = 0; j < kChains; ++j) c[j] = seed + float(j);
  for (int64_t i = 0; i < iters; ++i)
    for (int j = 0; j < kChains; ++j) c[j] = std::fma(c[j], 0.999f, 1e-3f);
  float s = 0;
  for (float v : c) s += v;
  return s;
}
__attribute__((noinline)) float bf16_dot_kernel(const uint16_t* x, const uint16_t* y, int64_t n, int64_t reps) {
  float total = 0;
  for (int64_t r = 0; r < reps; ++r)
    for (int64_t i = 0; i < n; ++i) {
      uint32_t a = uint32_t(x[i]) << 16, b = uint32_t(y[i]) << 16;
      float fa, fb;
      __builtin_memcpy(&fa, &a, 4);
      __builtin_memcpy(&fb, &b, 4);
      total = std::fma(fa, fb, total);
    }
  return total;
}
#endif

volatile float g_sink = 0;  // keeps the kernels' results alive

// Runs `items` calls of item(i) spread over the pool; returns wall seconds.
template <class F>
double timed_items(ThreadPool& pool, int64_t items, F&& item) {
  std::vector<float> out(size_t(items), 0.f);
  const auto t0 = Clock::now();
  if (pool.size() == 1) {
    for (int64_t i = 0; i < items; ++i) out[size_t(i)] = item(i);
  } else {
    pool.parallel_for(items, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) out[size_t(i)] = item(i);
    });
  }
  const double s = since(t0);
  float sum = 0;
  for (float v : out) sum += v;
  g_sink = g_sink + sum;
  return s;
}

// Best GFLOP/s of three runs of about `seconds`: `item(i)` does
// `flops_per_item` flops; the item size was picked so that one item takes a
// couple of milliseconds.
template <class F>
double best_rate(ThreadPool& pool, double seconds, double flops_per_item, double item_seconds, F&& item) {
  const int64_t items =
      std::max<int64_t>(int64_t(pool.size()) * 8, int64_t(seconds * pool.size() / std::max(item_seconds, 1e-6)));
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const double s = timed_items(pool, items, item);
    best = std::max(best, flops_per_item * double(items) / s / 1e9);
  }
  return best;
}

// A register-only loop: `run` returns a value that depends on every step.
struct Loop {
  float (*run)(int64_t iters, float seed);
  double flops_per_iter;
  const char* what;
};

// The fp32 FMA loop of the widest vectors this CPU has.
Loop fma_loop() {
#ifdef DSV4_PEAK_AVX2
  if (supported_isas().back() >= Isa::kAvx512)
    return {fma_kernel_avx512, 2.0 * 16 * kChains, "fp32 FMA (AVX-512, 12 independent 16-lane chains per thread)"};
  return {fma_kernel, 2.0 * 8 * kChains, "fp32 FMA (AVX2, 12 independent 8-lane chains per thread)"};
#else
  return {fma_kernel, 2.0 * kChains, "scalar fp32 FMA (built without AVX2+FMA)"};
#endif
}

// The loop of the arithmetic the GEMM kernels use now (kernel_isa()).
Loop peak_loop() {
#ifdef DSV4_HAVE_AVX512BF16_KERNELS
  if (kernel_isa() == Isa::kAvx512Bf16)
    return {dpbf16_kernel, 4.0 * 16 * kChains,
            "BF16 dot product vdpbf16ps (AVX512-BF16, 12 independent 16-lane chains per thread, 64 flops per "
            "instruction), which the GEMM kernels use where it gives the fp32 FMA chain's bits (core/cpu.h)"};
#endif
  return fma_loop();
}

// GFLOP/s of `loop` on all threads of pool.
double measure_loop_gflops(ThreadPool& pool, double seconds, const Loop& loop) {
  // Calibrate one item to ~2 ms on one thread.
  int64_t iters = 1 << 14;
  for (;;) {
    const auto t0 = Clock::now();
    g_sink = g_sink + loop.run(iters, 1.f);
    if (since(t0) > 2e-3 || iters > (int64_t(1) << 30)) break;
    iters *= 2;
  }
  const auto t0 = Clock::now();
  g_sink = g_sink + loop.run(iters, 2.f);
  const double item_s = since(t0);
  return best_rate(pool, seconds, loop.flops_per_iter * double(iters), item_s,
                   [&](int64_t i) { return loop.run(iters, float(i & 7)); });
}

}  // namespace

double measure_peak_gflops(ThreadPool& pool, double seconds) { return measure_loop_gflops(pool, seconds, peak_loop()); }

PeakResult measure_peak(ThreadPool& pool, double seconds) {
  PeakResult r;
  r.threads = pool.size();
  const Loop peak = peak_loop(), fma = fma_loop();
  r.method = peak.what;
  r.gflops = measure_loop_gflops(pool, seconds, peak);
  {
    ThreadPool one(1);
    r.gflops_1thread = measure_loop_gflops(one, seconds / 2, peak);
  }
  r.fma_gflops = peak.run == fma.run ? r.gflops : measure_loop_gflops(pool, seconds, fma);
#ifdef DSV4_HAVE_AVX512BF16_KERNELS
  if (supported_isas().back() == Isa::kAvx512Bf16) {
    const Loop dot{dpbf16_kernel, 4.0 * 16 * kChains, ""};
    r.bf16_insn_gflops = peak.run == dot.run ? r.gflops : measure_loop_gflops(pool, seconds, dot);
  }
#endif

  // BF16 dot products over 2 x 4 KiB of bf16 (L1-resident), per thread.
  const int64_t n = 2048;
  std::vector<uint16_t> x(static_cast<size_t>(n)), y(static_cast<size_t>(n));
  uint32_t s = 12345;
  for (int64_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    x[size_t(i)] = uint16_t(0x3f00 | ((s >> 16) & 0x7f));  // values in [0.5, 1)
    s = s * 1664525u + 1013904223u;
    y[size_t(i)] = uint16_t(0x3f00 | ((s >> 16) & 0x7f));
  }
  int64_t reps = 64;
  for (;;) {
    const auto t1 = Clock::now();
    g_sink = g_sink + bf16_dot_kernel(x.data(), y.data(), n, reps);
    if (since(t1) > 2e-3 || reps > (int64_t(1) << 26)) break;
    reps *= 2;
  }
  const auto t0 = Clock::now();
  g_sink = g_sink + bf16_dot_kernel(x.data(), y.data(), n, reps);
  const double dot_item_s = since(t0);
  r.bf16_dot_gflops = best_rate(pool, seconds, 2.0 * double(n) * double(reps), dot_item_s,
                                [&](int64_t) { return bf16_dot_kernel(x.data(), y.data(), n, reps); });
  return r;
}

}  // namespace dsv4
