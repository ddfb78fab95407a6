// `dsv4 bench --decode` (docs/PERFORMANCE.md, "Decode"): decode tokens/s
// for several numbers of sessions decoding together, against the limit set
// by the bytes a step reads (engine/decode_bytes.h) and the measured read
// bandwidth (core/bandwidth.h).
#pragma once
#include <cstdint>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/bandwidth.h"
#include "core/stage_timer.h"
#include "engine/engine.h"

namespace dsv4 {

struct DecodeRun {
  int streams = 0;
  int64_t context = 0;          // prompt tokens; the timed steps append positions context + 1 onwards
  int64_t steps = 0;            // timed steps (each appends one token to every session)
  double seconds = 0;           // the timed steps together
  double shared_weight_bytes = 0;   // per step: weights every session shares, routed experts aside
  double routed_expert_bytes = 0;   // per step: the routed experts the step ran (measured passes)
  double routed_expert_passes = 0;  // per step, all layers
  double cache_bytes = 0;           // per step, all sessions
  DecodeBytes one_stream;           // one session alone at the first timed position, by part
  StageTimes stages;                // the timed steps together, by stage (core/stage_timer.h)

  double bytes_per_step() const { return shared_weight_bytes + routed_expert_bytes + cache_bytes; }
  double tokens_per_second() const { return double(streams) * double(steps) / seconds; }
  // Achieved bytes/s over the read bandwidth.
  double bandwidth_fraction(double gbps) const { return bytes_per_step() * double(steps) / seconds / (gbps * 1e9); }
  // Tokens/s if every step read its bytes at the full read bandwidth.
  double limit_tokens_per_second(double gbps) const { return double(streams) * gbps * 1e9 / bytes_per_step(); }
};

// `streams` sessions forked from `base` (the prefilled prompt, whose greedy
// next token is `next`), stream s fed a token of its own first (so that their routing and caches part), then greedy: one untimed
// step, then `steps` timed ones, all streams in one append_batch per step
// (Session::append when there is one).
DecodeRun bench_decode(Engine& e, const Session& base, int32_t next, int streams, int64_t steps);

nlohmann::json decode_runs_json(const std::vector<DecodeRun>& runs, double gbps);
void print_decode_runs(const std::vector<DecodeRun>& runs, const BandwidthResult& bw, double bw_start,
                       double bw_end);

}  // namespace dsv4
