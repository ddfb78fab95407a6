#include "engine/kernel_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <thread>

#include "core/formats.h"
#include "core/stage_timer.h"
#include "kernels/gemm.h"
#include "kernels/linear.h"

#ifdef DSV4_HAVE_OPENBLAS
#include <cblas.h>
#include <dlfcn.h>
#endif

namespace dsv4 {

namespace {

// OpenBLAS has cblas_sbgemm (bf16 inputs, fp32 out) only when it was built
// with BUILD_BFLOAT16. Debian's 0.3.21 declares it in cblas.h but does not
// export it, so it is looked up at run time; without it the baseline is
// cblas_sgemm on the same bf16 values widened to fp32 (what an AVX2 machine
// computes for a BF16 GEMM anyway).
#ifdef DSV4_HAVE_OPENBLAS
using SbgemmFn = void (*)(enum CBLAS_ORDER, enum CBLAS_TRANSPOSE, enum CBLAS_TRANSPOSE, blasint, blasint, blasint,
                          float, const bfloat16*, blasint, const bfloat16*, blasint, float, float*, blasint);
SbgemmFn find_sbgemm() { return reinterpret_cast<SbgemmFn>(dlsym(RTLD_DEFAULT, "cblas_sbgemm")); }
#endif

}  // namespace

bool have_openblas() {
#ifdef DSV4_HAVE_OPENBLAS
  return true;
#else
  return false;
#endif
}

void prepare_openblas(int threads) {
#ifdef DSV4_HAVE_OPENBLAS
  openblas_set_num_threads(threads);
  std::vector<float> a(64 * 64, 1.f), c(64 * 64);  // OpenBLAS starts its threads on the first call
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, 64, 64, 64, 1.f, a.data(), 64, a.data(), 64, 0.f, c.data(), 64);
#endif
}

std::string openblas_routine() {
#ifdef DSV4_HAVE_OPENBLAS
  // OpenBLAS picks its kernels by CPU model at load time; one too new for it
  // gets an older family's (Debian's 0.3.21 runs AMD family 26 as Haswell,
  // AVX2 only; OPENBLAS_CORETYPE=SkylakeX selects its AVX-512 kernels).
  const std::string core = std::string(" [OpenBLAS kernels: ") + openblas_get_corename() + "]";
  if (find_sbgemm()) return "cblas_sbgemm (OpenBLAS BF16 GEMM)" + core;
  return "cblas_sgemm on the bf16 values widened to fp32 (this OpenBLAS has no cblas_sbgemm: built without "
         "BUILD_BFLOAT16)" +
         core;
#else
  return "none (no OpenBLAS found at configure time)";
#endif
}


namespace {

// Best seconds of at most `reps` runs of fn, stopping early once more than
// `budget` seconds have been spent (at least one run).
template <class F>
double best_seconds(int reps, double budget, F&& fn) {
  double best = INFINITY, spent = 0;
  for (int r = 0; r < reps && (r == 0 || spent < budget); ++r) {
    const auto t0 = Clock::now();
    fn();
    const double s = since(t0);
    best = std::min(best, s);
    spent += s;
  }
  return best;
}

// The benches' test data: xorshift64, so that every run times the same values.
struct XorShift64 {
  uint64_t x;
  uint64_t next() {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  }
  // Uniform on [-1, 1) in steps of 2^-23.
  float pm1() { return float(int64_t(next() >> 40) - (int64_t(1) << 23)) / float(int64_t(1) << 23); }
};

}  // namespace

// Panel dequantisation of a 256 x 4096 weight per format, FP8 activation
// quantisation, bf16 rounding; ns per value, best of 5 passes.
std::vector<ConversionTiming> bench_conversions() {
  const int64_t out = 256, in = 4096, values = out * in;
  XorShift64 rng{0x9E3779B97F4A7C15ull};
  // Nanoseconds per value, best of 5 passes over `values` values.
  auto ns = [&](auto&& pass) { return best_seconds(5, 1.0, pass) * 1e9 / double(values); };
  std::vector<ConversionTiming> r;

  std::vector<uint8_t> data(size_t(values * 2)), scale(size_t(values / 32));
  for (uint8_t& b : data) {
    b = uint8_t(rng.next());
    if ((b & 0x7f) == 0x7f) b = 0;  // real FP8 weights hold no NaN codes
  }
  for (uint8_t& b : scale) b = uint8_t(120 + rng.next() % 16);
  std::vector<float> panel(size_t(in * kGemmNR));
  for (Weight::Kind kind : {Weight::Kind::kFP4, Weight::Kind::kFP8, Weight::Kind::kBF16}) {
    Weight w;
    w.kind = kind;
    w.out = out;
    w.in = in;
    w.data = data.data();
    w.scale = scale.data();
    auto all_panels = [&](bool reference) {
      return [&, reference] {
        for (int64_t o0 = 0; o0 < out; o0 += kGemmNR)
          reference ? w.dequant_panel_reference(o0, out, panel.data()) : w.dequant_panel(o0, out, panel.data());
      };
    };
    const std::string name = std::string("dequant_panel ") +
                             (kind == Weight::Kind::kFP4 ? "fp4" : kind == Weight::Kind::kFP8 ? "fp8" : "bf16");
    r.push_back({name, ns(all_panels(false)), ns(all_panels(true))});
  }

  // Both are idempotent, so each pass works on the same buffer, values in [-8, 8).
  std::vector<float> act(static_cast<size_t>(values));
  auto fill_act = [&] {
    for (float& v : act) v = 8.f * rng.pm1();
  };
  fill_act();
  r.push_back({"q8_inplace (block 128)", ns([&] { q8_inplace(act.data(), act.size(), 128); }),
               ns([&] { q8_inplace_reference(act.data(), act.size(), 128); })});
  fill_act();
  r.push_back({"bf16r_inplace", ns([&] { bf16r_inplace(act.data(), act.size()); }), ns([&] {
                 for (float& v : act) v = bf16r(v);
               })});
  return r;
}

namespace {

// Random bf16 values in [-1, 1), the same for every run of a shape: A
// (activations, M x K) and B (weight, N x K), and A widened to fp32.
struct GemmOperands {
  std::vector<uint16_t> a16, b16;
  std::vector<float> a32;
  GemmOperands(const GemmShape& g) : a16(size_t(g.m * g.k)), b16(size_t(g.n * g.k)), a32(a16.size()) {
    XorShift64 rng{0x243F6A8885A308D3ull ^ uint64_t(g.m * 31 + g.k * 7 + g.n)};
    for (auto& v : a16) v = f32_to_bf16(rng.pm1());
    for (auto& v : b16) v = f32_to_bf16(rng.pm1());
    for (size_t i = 0; i < a16.size(); ++i) a32[i] = bf16_to_f32(a16[i]);
  }
};

#ifdef DSV4_HAVE_OPENBLAS
// The baseline on the same values into cb: cblas_sbgemm where exported,
// else cblas_sgemm on B widened to fp32 beforehand (not timed).
std::function<void()> openblas_gemm(const GemmShape& g, const GemmOperands& op, std::vector<float>& b32,
                                    std::vector<float>& cb) {
  const blasint M = blasint(g.m), K = blasint(g.k), N = blasint(g.n);
  if (SbgemmFn sbgemm = find_sbgemm())
    return [&, sbgemm, M, K, N] {
      sbgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.f, op.a16.data(), K, op.b16.data(), K, 0.f,
             cb.data(), N);
    };
  b32.resize(op.b16.size());
  for (size_t i = 0; i < op.b16.size(); ++i) b32[i] = bf16_to_f32(op.b16[i]);
  return [&, M, K, N] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.f, op.a32.data(), K, b32.data(), K, 0.f,
                cb.data(), N);
  };
}
#endif

double max_rel_diff(const std::vector<float>& c, const std::vector<float>& ref) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    diff = std::max(diff, std::fabs(double(c[i]) - double(ref[i])));
    scale = std::max(scale, std::fabs(double(ref[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

}  // namespace

GemmResult bench_gemm(const GemmShape& g, int reps) {
  const GemmOperands op(g);
  Weight w;
  w.kind = Weight::Kind::kBF16;
  w.out = g.n;
  w.in = g.k;
  w.data = reinterpret_cast<const uint8_t*>(op.b16.data());
  LinearOpts lo;
  lo.act_quant = false;
  lo.out_bf16 = false;
  GemmResult r;
  r.shape = g;
  const double flops = 2.0 * double(g.m) * double(g.k) * double(g.n);
  std::vector<float> c(size_t(g.m * g.n));
  auto engine = [&] { linear(w, op.a32.data(), g.m, c.data(), lo); };
#ifndef DSV4_HAVE_OPENBLAS
  r.seconds = best_seconds(reps, 2.0, engine);
#else
  std::vector<float> cb(c.size()), b32;
  const std::function<void()> openblas = openblas_gemm(g, op, b32, cb);
  // The two alternate, one timed run each per round, so that load from other
  // processes on a shared machine falls on both alike; best of the rounds.
  // Each timed run follows an untimed one of its own (caches, clocks and
  // threads warm for both alike).
  r.seconds = r.openblas_seconds = INFINITY;
  double spent = 0;
  for (int rep = 0; rep < reps && (rep == 0 || spent < 4.0); ++rep) {
    engine();
    const double e = best_seconds(1, 0, engine);
    openblas();
    const double o = best_seconds(1, 0, openblas);
    r.seconds = std::min(r.seconds, e);
    r.openblas_seconds = std::min(r.openblas_seconds, o);
    spent += 2 * (e + o);
    // OpenBLAS's idle threads spin for a while after a call; let them go to
    // sleep before the engine is timed again.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  r.openblas_gflops = flops / r.openblas_seconds / 1e9;
  r.max_rel_diff = max_rel_diff(c, cb);
#endif
  r.gflops = flops / r.seconds / 1e9;
  return r;
}

}  // namespace dsv4
