// The one progress line `prefill` and `generate` keep on stderr during a
// long prefill: only on a terminal, never in --json output or on a pipe.
#pragma once
#include <chrono>
#include <cstdint>

namespace dsv4::cli {

class ProgressLine {
 public:
  // Shown when `wanted` and stderr is a terminal, once the work has taken
  // longer than a second (DSV4_PROGRESS_DELAY_MS overrides the delay).
  explicit ProgressLine(bool wanted);
  ~ProgressLine() { clear(); }

  // "prefill: 4096/8192 tokens (50%), 142.1 tokens/s, 29 s left", redrawn
  // at most ten times a second.
  void update(int64_t done, int64_t total);
  // Erases the line if it was drawn (before the results are printed).
  void clear();

 private:
  using Clock = std::chrono::steady_clock;
  bool enabled_ = false;
  bool drawn_ = false;
  double delay_s_ = 1.0;
  Clock::time_point start_ = Clock::now();
  Clock::time_point last_draw_{};
};

}  // namespace dsv4::cli
