// Wall-clock time per forward stage (PREFILL.md §5), for `dsv4 bench`.
// Stages are entered on the calling thread only; the worker threads inside a
// stage count towards it.
#pragma once
#include <array>
#include <chrono>
#include <cstdint>

namespace dsv4 {

using Clock = std::chrono::steady_clock;
// Seconds from t0 to now.
inline double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

enum class Stage { kProjections, kCompressors, kIndexer, kAttention, kGate, kExperts, kHc, kHead, kCount };
inline const char* stage_name(Stage s) {
  static const char* names[] = {"projections", "compressors", "indexer", "attention",
                                "gate",        "experts",     "hc",      "head"};
  return names[int(s)];
}

struct StageTimes {
  std::array<double, size_t(Stage::kCount)> seconds{};
  // Passes over one routed expert's weights (one per expert with rows, per
  // MoE step, in this process): what sessions that share a decode step read
  // of the experts (docs/PERFORMANCE.md, "Decode").
  int64_t routed_expert_passes = 0;
  static StageTimes& global() {
    static StageTimes t;
    return t;
  }
  void reset() {
    seconds.fill(0.0);
    routed_expert_passes = 0;
  }
};

class ScopedStage {
 public:
  explicit ScopedStage(Stage s) : s_(s), t0_(std::chrono::steady_clock::now()) {}
  ~ScopedStage() {
    StageTimes::global().seconds[size_t(s_)] +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }

 private:
  Stage s_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace dsv4
