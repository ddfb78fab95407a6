#include "core/peak.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/bf16_simd.h"
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
#else
constexpr int kChains = 8;
#endif

// The register-only loop of every peak kernel below, written once: kChains
// independent chains of V::T (V::kLanes floats), chain j starting at
// seed + j, each iteration one step(c) per chain; the result, the sum of
// every lane of every chain, depends on every step.
//
// Shaped for GCC's target rules: a function is inlined only into one
// compiled for at least its target, so a loop marked for AVX-512F could not
// take the vdpbf16ps step (AVX512-BF16), and one marked for that could not
// serve the AVX-512F kernel. So this loop has no target attribute and each
// kernel is `flatten`, which inlines the loop, V's operations and the step
// into the kernel, compiled for the kernel's target. The vectors pass by
// reference only: by value they would cross this function's default-target
// ABI (-Wpsabi), were it ever called rather than inlined.
template <class V, class Step>
inline float run_chains(int64_t iters, float seed, const Step& step) {
  typename V::T c[kChains];
#pragma GCC unroll 16
  for (int j = 0; j < kChains; ++j) V::splat(c[j], seed + float(j));
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int j = 0; j < kChains; ++j) step(c[j]);
  }
#pragma GCC unroll 16
  for (int j = 1; j < kChains; ++j) V::add_to(c[0], c[j]);
  float v[V::kLanes];
  V::store(v, c[0]);
  float sum = 0;
  for (float f : v) sum += f;
  return sum;
}

#ifdef DSV4_PEAK_AVX2
struct Ymm {
  using T = __m256;
  static constexpr int kLanes = 8;
  static void splat(T& c, float v) { c = _mm256_set1_ps(v); }
  static void add_to(T& s, const T& c) { s = _mm256_add_ps(s, c); }
  static void store(float* p, const T& c) { _mm256_storeu_ps(p, c); }
};

// For CPUs with AVX-512F (checked by the callers); compiled for AVX-512 by
// the attributes alone.
struct Zmm {
  using T = __m512;
  static constexpr int kLanes = 16;
  __attribute__((target("avx512f"))) static void splat(T& c, float v) { c = _mm512_set1_ps(v); }
  __attribute__((target("avx512f"))) static void add_to(T& s, const T& c) { s = _mm512_add_ps(s, c); }
  __attribute__((target("avx512f"))) static void store(float* p, const T& c) { _mm512_storeu_ps(p, c); }
};

// acc = acc * a + b on 8 lanes: the values converge to b / (1 - a) and
// never overflow or go subnormal.
__attribute__((noinline, flatten)) float fma_kernel(int64_t iters, float seed) {
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(1e-3f);
  return run_chains<Ymm>(iters, seed, [=](__m256& c) { c = _mm256_fmadd_ps(c, a, b); });
}

// The same on 16 lanes, for CPUs with AVX-512F (checked by the caller).
__attribute__((noinline, flatten, target("avx512f"))) float fma_kernel_avx512(int64_t iters, float seed) {
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1e-3f);
  return run_chains<Zmm>(iters, seed,
                         [=](__m512& c) __attribute__((target("avx512f"))) { c = _mm512_fmadd_ps(c, a, b); });
}

#ifdef DSV4_HAVE_AVX512BF16_KERNELS
// vdpbf16ps (AVX512-BF16): each instruction is 32 bf16 products added into
// 16 fp32 lanes (64 flops). Only called on CPUs with AVX512-BF16
// (Isa::kAvx512Bf16 supported). acc grows by 2·2^-10 per instruction: no
// overflow, no subnormals.
__attribute__((noinline, flatten, target("avx512f,avx512bf16"))) float dpbf16_kernel(int64_t iters, float seed) {
  const __m512bh one = (__m512bh)_mm512_set1_epi16(0x3f80), small = (__m512bh)_mm512_set1_epi16(0x3a80);
  return run_chains<Zmm>(iters, seed, [=](__m512& c) __attribute__((target("avx512f,avx512bf16"))) {
    c = _mm512_dpbf16_ps(c, one, small);
  });
}
#endif

// bf16 -> fp32 of 16 packed values as two vectors: the even elements (shift
// into the high half) and the odd ones (mask the low half away). A dot
// product may pair them this way because both operands are split alike.
inline void bf16x16(const uint16_t* p, __m256& even, __m256& odd) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  even = bf16_low(v);
  odd = bf16_high(v);
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
struct Scalar {
  using T = float;
  static constexpr int kLanes = 1;
  static void splat(T& c, float v) { c = v; }
  static void add_to(T& s, const T& c) { s += c; }
  static void store(float* p, const T& c) { *p = c; }
};

// acc = acc * a + b, as above.
__attribute__((noinline, flatten)) float fma_kernel(int64_t iters, float seed) {
  return run_chains<Scalar>(iters, seed, [](float& c) { c = std::fma(c, 0.999f, 1e-3f); });
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

#ifdef DSV4_HAVE_AVX512BF16_KERNELS
// The vdpbf16ps loop (CPUs with AVX512-BF16 only).
Loop dot_loop() {
  return {dpbf16_kernel, 4.0 * 16 * kChains,
          "BF16 dot product vdpbf16ps (AVX512-BF16, 12 independent 16-lane chains per thread, 64 flops per "
          "instruction), which the GEMM kernels use where it gives the fp32 FMA chain's bits (core/cpu.h)"};
}
#endif

// The loop of the arithmetic the GEMM kernels use now (kernel_isa()).
Loop peak_loop() {
#ifdef DSV4_HAVE_AVX512BF16_KERNELS
  if (kernel_isa() == Isa::kAvx512Bf16) return dot_loop();
#endif
  return fma_loop();
}

// Iterations of `loop` that take more than `seconds` on the calling thread
// (a power of two; running it up to there also wakes the vector units).
int64_t calibrated_iters(const Loop& loop, double seconds) {
  int64_t iters = 1 << 12;
  for (;;) {
    const auto t0 = Clock::now();
    g_sink = g_sink + loop.run(iters, 1.f);
    if (since(t0) > seconds || iters > (int64_t(1) << 30)) return iters;
    iters *= 2;
  }
}

// GFLOP/s of `loop` on all threads of pool.
double measure_loop_gflops(ThreadPool& pool, double seconds, const Loop& loop) {
  const int64_t iters = calibrated_iters(loop, 2e-3);  // one item: ~2 ms on one thread
  const auto t0 = Clock::now();
  g_sink = g_sink + loop.run(iters, 2.f);
  const double item_s = since(t0);
  return best_rate(pool, seconds, loop.flops_per_iter * double(iters), item_s,
                   [&](int64_t i) { return loop.run(iters, float(i & 7)); });
}

}  // namespace

double bf16_dot_to_fma_ratio() {
#ifdef DSV4_HAVE_AVX512BF16_KERNELS
  static const double ratio = [] {
    if (supported_isas().back() != Isa::kAvx512Bf16) return 0.0;
    const Loop loops[2] = {dot_loop(), fma_loop()};  // fma_loop: AVX-512 on every AVX512-BF16 CPU
    int64_t iters[2];
    for (int i : {1, 0}) iters[i] = calibrated_iters(loops[i], 1e-3);
    // Alternated, best of three each: load from other processes that comes
    // and goes lowers both alike.
    double best[2] = {0, 0};
    for (int rep = 0; rep < 3; ++rep)
      for (int i : {0, 1}) {
        const auto t0 = Clock::now();
        g_sink = g_sink + loops[i].run(iters[i], float(rep));
        best[i] = std::max(best[i], loops[i].flops_per_iter * double(iters[i]) / since(t0));
      }
    return best[0] / best[1];
  }();
  return ratio;
#else
  return 0;
#endif
}

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
    const Loop dot = dot_loop();
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
