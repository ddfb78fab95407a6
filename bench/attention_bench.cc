// Sparse attention for one query (src/kernels/sparse_attention.h) at the
// Flash shape, as Google Benchmark cases, on every kernel variant this CPU
// runs (`isa:0` is the first of supported_isas(), the gemm path): flops
// per second (2 per multiply-add of the scores and of the weighted sum)
// against the number of keys: 128 (the window alone), 640 (window + a CSA
// layer's 512 chosen rows) and 1152. One thread, the keys in L2 or L3 as in
// prefill, where each query's keys are gathered from the tile's cache rows.
//
//     build/bench/dsv4_attention_bench --benchmark_repetitions=3
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include "core/cpu.h"
#include "core/formats.h"
#include "kernels/sparse_attention.h"

namespace dsv4 {
namespace {

constexpr int64_t kHeads = 64, kHeadDim = 512;  // Flash's n_heads and head_dim

void BM_AttendQuery(benchmark::State& state) {
  const std::vector<Isa> isas = supported_isas();
  const size_t which = size_t(state.range(0));
  const int64_t nkeys = state.range(1), H = kHeads, d = kHeadDim, dp = key_pair_count(d);
  if (which >= isas.size()) {
    state.SkipWithError("no such kernel variant on this CPU");
    return;
  }
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> q(size_t(H * d)), key(static_cast<size_t>(d)), sinks(static_cast<size_t>(H)), out(size_t(H * d));
  for (float& v : q) v = bf16r(u(rng));
  for (float& v : sinks) v = bf16r(u(rng));
  std::vector<uint32_t> pairs(size_t(nkeys * dp));
  std::vector<const uint32_t*> keys;
  int min_exp = 255;
  for (int64_t j = 0; j < nkeys; ++j) {
    for (float& v : key) v = u(rng);
    const int e = pack_key_row(key.data(), d, pairs.data() + j * dp);
    min_exp = e < min_exp ? e : min_exp;
    keys.push_back(pairs.data() + j * dp);
  }
  const Isa before = kernel_isa();
  set_kernel_isa(isas[which]);
  for (auto _ : state) {
    attend_query(q.data(), H, keys.data(), nkeys, d, min_exp, sinks.data(), out.data());
    benchmark::DoNotOptimize(out.data());
  }
  set_kernel_isa(before);
  state.SetLabel(isa_name(isas[which]));
  state.counters["flops"] =
      benchmark::Counter(double(4 * H * nkeys * d) * double(state.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_AttendQuery)
    ->ArgNames({"isa", "keys"})
    ->ArgsProduct({{0, 1, 2, 3}, {128, 640, 1152}})
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace dsv4

BENCHMARK_MAIN();
