#include "bench_decode.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/cpu.h"
#include "core/error.h"
#include "core/stage_timer.h"

namespace dsv4 {

namespace {

using nlohmann::json;

// Stream s's first token: the prompt's greedy next token moved by s, so
// that forks of one prompt route and fill their caches differently.
int32_t first_token(int32_t next, int s, int vocab) { return int32_t((int64_t(next) + 7919 * int64_t(s)) % vocab); }

// One step of every stream: appends tokens[s] to sessions[s], then holds
// each one's greedy next token in tokens.
void step(Engine& e, const std::vector<Session*>& sessions, std::vector<int32_t>& tokens) {
  if (sessions.size() == 1) {
    tokens[0] = sessions[0]->append({tokens[0]}).next_token;
    return;
  }
  std::vector<std::vector<int32_t>> in;
  for (int32_t t : tokens) in.push_back({t});
  const std::vector<PrefillResult> res = e.append_batch(sessions, in);
  for (size_t s = 0; s < res.size(); ++s) {
    if (!res[s].error.empty()) throw Error("decode stream " + std::to_string(s) + ": " + res[s].error);
    tokens[s] = res[s].next_token;
  }
}

// The byte counts of a run whose timed steps appended positions
// [first, first + steps), with `passes` routed expert passes in all.
void count_bytes(const Engine& e, int64_t first, int64_t passes, DecodeRun& r) {
  const double n = double(r.steps);
  for (int64_t t = first; t < first + r.steps; ++t) {
    const DecodeBytes b = e.decode_step_bytes(t);
    r.shared_weight_bytes += b.shared_weights() / n;
    r.cache_bytes += double(r.streams) * b.cache() / n;
  }
  r.routed_expert_passes = double(passes) / n;
  r.routed_expert_bytes = r.routed_expert_passes * routed_expert_bytes(e.config(), e.weight_formats());
  r.one_stream = e.decode_step_bytes(first);
}

json parts_json(const DecodeBytes& b) {
  return {{"attention", b.attention},
          {"compressors", b.compressors},
          {"indexer", b.indexer},
          {"hc", b.hc},
          {"gate", b.gate},
          {"routed_experts", b.routed_experts},
          {"shared_experts", b.shared_experts},
          {"head", b.head},
          {"window", b.window},
          {"compressed", b.compressed},
          {"indexer_rows", b.indexer_rows},
          {"compressor_ring", b.compressor_ring}};
}

// Milliseconds per step in each stage, in stage order, then in none of
// them ("other": embedding, final norm, sampling, batching, the gaps).
std::vector<std::pair<std::string, double>> stage_ms(const DecodeRun& r) {
  std::vector<std::pair<std::string, double>> ms;
  const double steps = double(std::max<int64_t>(1, r.steps));
  double staged = 0;
  for (int i = 0; i < int(Stage::kCount); ++i) {
    ms.emplace_back(stage_name(Stage(i)), 1e3 * r.stages.seconds[size_t(i)] / steps);
    staged += r.stages.seconds[size_t(i)];
  }
  ms.emplace_back("other", 1e3 * (r.seconds - staged) / steps);
  return ms;
}

json stage_ms_json(const DecodeRun& r) {
  json j = json::object();
  for (const auto& [name, ms] : stage_ms(r)) j[name] = ms;
  return j;
}

}  // namespace

DecodeRun bench_decode(Engine& e, const Session& base, int32_t next, int streams, int64_t steps) {
  DecodeRun r;
  r.streams = streams;
  r.steps = steps;
  std::vector<std::unique_ptr<Session>> owned;
  std::vector<Session*> sessions;
  std::vector<int32_t> tokens;
  for (int s = 0; s < streams; ++s) {
    owned.push_back(base.fork());
    sessions.push_back(owned.back().get());
    tokens.push_back(first_token(next, s, e.config().vocab_size));
  }
  r.context = base.position();
  step(e, sessions, tokens);  // untimed: first-use allocations at this batch size
  StageTimes::global().reset();
  const auto t0 = Clock::now();
  for (int64_t i = 0; i < steps; ++i) step(e, sessions, tokens);
  r.seconds = since(t0);
  r.stages = StageTimes::global();
  count_bytes(e, r.context + 1, r.stages.routed_expert_passes, r);
  return r;
}

json decode_runs_json(const std::vector<DecodeRun>& runs, double gbps) {
  json a = json::array();
  for (const DecodeRun& r : runs)
    a.push_back({{"streams", r.streams},
                 {"context", r.context},
                 {"steps", r.steps},
                 {"seconds", r.seconds},
                 {"tokens_per_second", r.tokens_per_second()},
                 {"tokens_per_second_per_stream", r.tokens_per_second() / r.streams},
                 {"bytes_per_step", r.bytes_per_step()},
                 {"shared_weight_bytes_per_step", r.shared_weight_bytes},
                 {"routed_expert_bytes_per_step", r.routed_expert_bytes},
                 {"routed_expert_passes_per_step", r.routed_expert_passes},
                 {"cache_bytes_per_step", r.cache_bytes},
                 {"bytes_per_token_one_stream", r.one_stream.total()},
                 {"bytes_per_token_one_stream_by_part", parts_json(r.one_stream)},
                 {"achieved_gbps", r.bytes_per_step() * double(r.steps) / r.seconds / 1e9},
                 {"bandwidth_fraction", r.bandwidth_fraction(gbps)},
                 {"stage_ms_per_step", stage_ms_json(r)},
                 {"limit_tokens_per_second", r.limit_tokens_per_second(gbps)}});
  return a;
}

void print_decode_runs(const std::vector<DecodeRun>& runs, const BandwidthResult& bw, double bw_start,
                       double bw_end) {
  std::printf("read bandwidth: %.2f GB/s on %d threads (start %.2f, end %.2f; buffer %zu MiB, LLC %zu KiB)\n",
              bw.gbps, bw.threads, bw_start, bw_end, bw.buffer_bytes >> 20, bw.llc_bytes >> 10);
  std::printf("GEMM kernels: %s, GEMV kernels: %s\n\n", isa_name(kernel_isa()), isa_name(gemv_isa()));
  std::printf("decode: streams forked from one prefilled prompt of 'context' tokens, each fed its own first token\n"
              "(untimed), then timed steps of greedy tokens\n");
  std::printf("  %7s %7s %6s %9s %10s %9s %10s %9s %8s %9s %10s\n", "streams", "context", "steps", "tokens/s",
              "per stream", "ms/step", "MB/step", "experts", "GB/s", "%bandw", "limit t/s");
  for (const DecodeRun& r : runs)
    std::printf("  %7d %7lld %6lld %9.2f %10.2f %9.1f %10.1f %9.1f %8.2f %8.1f%% %10.2f\n", r.streams,
                (long long)r.context, (long long)r.steps, r.tokens_per_second(), r.tokens_per_second() / r.streams,
                1e3 * r.seconds / double(r.steps), r.bytes_per_step() / 1e6, r.routed_expert_passes,
                r.bytes_per_step() * double(r.steps) / r.seconds / 1e9, 100 * r.bandwidth_fraction(bw.gbps),
                r.limit_tokens_per_second(bw.gbps));
  if (!runs.empty())
    std::printf("  one stream alone reads %.1f MB per token (at position %lld); 'experts': routed expert passes\n"
                "  per step over all layers, measured\n",
                runs.front().one_stream.total() / 1e6, (long long)runs.front().context + 1);
  std::printf("\n  ms per step by stage:\n  %7s", "streams");
  for (const auto& [name, ms] : stage_ms(DecodeRun{})) std::printf(" %11s", name.c_str());
  std::printf("\n");
  for (const DecodeRun& r : runs) {
    std::printf("  %7d", r.streams);
    for (const auto& [name, ms] : stage_ms(r)) std::printf(" %11.1f", ms);
    std::printf("\n");
  }
}

}  // namespace dsv4
