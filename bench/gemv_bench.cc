// The decode GEMV (src/kernels/gemv.h) on Flash-sized matrices, as Google
// Benchmark cases: bytes of weight (with scales) per second for 1, 2, 4, 8 and 16
// input rows, with the weight in cache (one matrix, read again and again) and
// streamed from memory (matrices cycled through 512 MiB), on 1 thread and on
// all of them, with the inputs the engine gives them (FP8-quantised, or
// bf16 for the head, which is packed into pair panels as the engine packs
// it). Block scales are those of real weights (2^-12 to 2^-3). The
// gap between "in cache" and "streamed" is what the row-per-lane layout costs
// in memory traffic, the gap between "streamed" and the read bandwidth
// (`dsv4 bench --decode`) what decode can still gain (docs/PERFORMANCE.md).
//
//     build/bench/dsv4_gemv_bench --benchmark_filter='fp4' --benchmark_repetitions=3
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <random>
#include <vector>

#include "core/cpu.h"
#include "core/formats.h"
#include "core/scratch.h"
#include "core/thread_pool.h"
#include "kernels/gemv.h"

namespace dsv4 {
namespace {

using Kind = Weight::Kind;

// The matrices lie one after another in one block on 2 MB pages, as the
// engine's mapped weights do once the page cache holds them in 2 MB folios.
struct Matrices {
  std::shared_ptr<uint8_t> block;
  std::vector<Weight> w;
  std::vector<std::shared_ptr<const void>> packed;  // BF16 pair panels, FP4 and FP8 panels: as the engine packs them
  size_t bytes_each = 0;
};

// `count` random matrices out × in of `kind`, scale codes in [s_lo, s_hi];
// FP4 and FP8 repacked as panels where `panels` (and the CPU's kernels read them).
Matrices make(Kind kind, int64_t out, int64_t in, int count, int s_lo, int s_hi, bool panels) {
  std::mt19937 rng(7);
  size_t data_bytes = 0, scale_bytes = 0;
  switch (kind) {
    case Kind::kFP4:
      data_bytes = size_t(out * in / 2);
      scale_bytes = size_t(out * in / 32);
      break;
    case Kind::kFP8:
      data_bytes = size_t(out * in);
      scale_bytes = size_t(((out + 127) / 128) * ((in + 127) / 128));
      break;
    default: data_bytes = size_t(out * in * 2); break;
  }
  Matrices m;
  m.bytes_each = data_bytes + scale_bytes;
  const size_t stride = (m.bytes_each + 63) / 64 * 64;
  m.block = huge_page_block(stride * size_t(count));
  for (int c = 0; c < count; ++c) {
    uint8_t* d = m.block.get() + stride * size_t(c);
    uint8_t* s = d + data_bytes;
    for (size_t i = 0; i < data_bytes; ++i) d[i] = uint8_t(rng());
    if (kind == Kind::kFP8)  // no NaN codes, and no subnormal ones (1 in 16 uniform codes; ~2 in 10^4 of
      for (size_t i = 0; i < data_bytes; ++i) {  // real weights, each a slow microcode assist on Intel CPUs)
        if ((d[i] & 0x7f) == 0x7f) d[i] ^= 1;
        if ((d[i] & 0x78) == 0) d[i] |= 0x08;
      }
    if (kind == Kind::kBF16)
      for (size_t i = 1; i < data_bytes; i += 2) d[i] = uint8_t(0x3c + rng() % 4);  // sign-less values near 2^-7
    for (size_t i = 0; i < scale_bytes; ++i) s[i] = uint8_t(s_lo + int(rng() % uint32_t(s_hi - s_lo + 1)));
    Weight w;
    w.kind = kind;
    w.out = out;
    w.in = in;
    w.block = 128;
    w.data = d;
    w.scale = scale_bytes ? s : nullptr;
    if (kind == Kind::kBF16) m.packed.push_back(pack_pair_panels(w));
    if (panels) m.packed.push_back(pack_quant_panels(w));
    m.w.push_back(w);
  }
  return m;
}

// args: input rows, streamed (0: one matrix in cache), threads (0: all).
void run(benchmark::State& state, Kind kind, int64_t out, int64_t in, int s_lo, int s_hi, bool panels = false) {
  const int64_t M = state.range(0);
  const bool streamed = state.range(1) != 0;
  ThreadPool::set_threads(int(state.range(2)));
  const size_t each = make(kind, out, in, 1, s_lo, s_hi, false).bytes_each;
  const Matrices m = make(kind, out, in, streamed ? int((size_t(512) << 20) / each) : 1, s_lo, s_hi, panels);
  if (!gemv_available(m.w[0], M)) {
    state.SkipWithError("gemv is not available here (no AVX-512)");
    return;
  }
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  std::vector<float> x(size_t(M * in)), y(size_t(M * out));
  for (auto& v : x) v = nd(rng);
  // The inputs the engine gives: FP8-quantised for FP8/FP4 weights (which
  // the vdpbf16ps tiles take), bf16 values for the head.
  if (kind == Kind::kBF16) {
    for (auto& v : x) v = bf16r(v);
  } else {
    std::vector<float> q(x.size());
    act_quant_rows(x.data(), M, in, in, quant_linear_opts(128, true), q.data());
    x = q;
  }
  size_t next = 0;
  for (auto _ : state) {
    const Weight& w = m.w[next];
    next = (next + 1) % m.w.size();
    if (!gemv(w, x.data(), M, in, y.data(), out, false, 0, out)) state.SkipWithError("gemv refused the weight");
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(m.bytes_each));
  ThreadPool::set_threads(0);
}

void rows_and_placement(benchmark::internal::Benchmark* b) {
  for (int threads : {1, 0})
    for (int streamed : {0, 1})
      for (int M : {1, 2, 4, 8, 16}) b->Args({M, streamed, threads});
  b->ArgNames({"rows", "streamed", "threads"})->UseRealTime();
}

// A routed expert's w1 (Flash: moe_inter_dim 2048 × dim 4096), in the
// checkpoint's rows and repacked as the engine repacks experts.
BENCHMARK_CAPTURE(run, fp4_expert, Kind::kFP4, 2048, 4096, 115, 124)->Apply(rows_and_placement);
BENCHMARK_CAPTURE(run, fp4_expert_panels, Kind::kFP4, 2048, 4096, 115, 124, true)->Apply(rows_and_placement);
// Its w2 (dim 4096 × moe_inter_dim 2048): rows of 1 KB.
BENCHMARK_CAPTURE(run, fp4_expert_w2, Kind::kFP4, 4096, 2048, 115, 124)->Apply(rows_and_placement);
BENCHMARK_CAPTURE(run, fp4_expert_w2_panels, Kind::kFP4, 4096, 2048, 115, 124, true)->Apply(rows_and_placement);
// An attention projection (FP8, 128 × 128 blocks).
BENCHMARK_CAPTURE(run, fp8_projection, Kind::kFP8, 4096, 4096, 115, 124)->Apply(rows_and_placement);
BENCHMARK_CAPTURE(run, fp8_projection_panels, Kind::kFP8, 4096, 4096, 115, 124, true)->Apply(rows_and_placement);
// A slice of the bf16 head.
BENCHMARK_CAPTURE(run, bf16_head_slice, Kind::kBF16, 8192, 4096, 0, 0)->Apply(rows_and_placement);

}  // namespace
}  // namespace dsv4

// DSV4_ISA picks the kernel variant, as for the dsv4 command.
int main(int argc, char** argv) {
  if (const char* isa = std::getenv("DSV4_ISA")) dsv4::set_kernel_isa(dsv4::parse_isa(isa, "DSV4_ISA"));
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
