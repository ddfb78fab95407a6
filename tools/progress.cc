#include "progress.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace dsv4::cli {

ProgressLine::ProgressLine(bool wanted) : enabled_(wanted && isatty(STDERR_FILENO)) {
  if (const char* ms = std::getenv("DSV4_PROGRESS_DELAY_MS")) delay_s_ = std::atof(ms) / 1e3;
}

void ProgressLine::update(int64_t done, int64_t total) {
  if (!enabled_ || total <= 0) return;
  const Clock::time_point now = Clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  if (elapsed < delay_s_ || (drawn_ && now - last_draw_ < std::chrono::milliseconds(100))) return;
  const double rate = elapsed > 0 ? double(done) / elapsed : 0;
  char left[32] = "";
  if (rate > 0) std::snprintf(left, sizeof left, ", %.0f s left", double(total - done) / rate);
  // \r back to the line's start, \033[K erases what a longer line left.
  std::fprintf(stderr, "\rprefill: %lld/%lld tokens (%d%%), %.1f tokens/s%s\033[K", (long long)done,
               (long long)total, int(100 * done / total), rate, left);
  std::fflush(stderr);
  drawn_ = true;
  last_draw_ = now;
}

void ProgressLine::clear() {
  if (!drawn_) return;
  std::fputs("\r\033[K", stderr);
  std::fflush(stderr);
  drawn_ = false;
}

}  // namespace dsv4::cli
