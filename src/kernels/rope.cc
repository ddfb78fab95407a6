#include "kernels/rope.h"

#include <algorithm>
#include <cmath>

#include "core/formats.h"

namespace dsv4 {

RopeTable::RopeTable(const RopeParams& rp) : rd_(rp.rotary_dim) {
  const float base = rp.theta;
  const int half = rd_ / 2;
  freq_.resize(static_cast<size_t>(half));
  for (int p = 0; p < half; ++p) freq_[p] = 1.0f / std::pow(base, float(2 * p) / float(rd_));
  if (rp.yarn_original_max_position > 0) {
    // YaRN correction range, in double like the reference's math module.
    auto cd = [&](double n) {
      return rd_ * std::log(double(rp.yarn_original_max_position) / (n * 2 * M_PI)) / (2 * std::log(double(base)));
    };
    double low = std::max(std::floor(cd(rp.yarn_beta_fast)), 0.0);
    double high = std::min(std::ceil(cd(rp.yarn_beta_slow)), double(rd_ - 1));
    if (high == low) high += 0.001;
    for (int p = 0; p < half; ++p) {
      float ramp = (float(p) - float(low)) / (float(high) - float(low));
      ramp = std::clamp(ramp, 0.0f, 1.0f);
      float smooth = 1.0f - ramp;
      freq_[p] = freq_[p] / rp.yarn_factor * (1.0f - smooth) + freq_[p] * smooth;
    }
  }
}

void RopeTable::cos_sin(int64_t pos, float* cs) const {
  const float fp = float(pos);
  for (size_t p = 0; p < freq_.size(); ++p) {
    float th = fp * freq_[p];
    cs[2 * p] = std::cos(th);
    cs[2 * p + 1] = std::sin(th);
  }
}

void RopeTable::rotate(float* x, const float* cs, bool inverse) const {
  for (size_t p = 0; p < freq_.size(); ++p) {
    float c = cs[2 * p], s = inverse ? -cs[2 * p + 1] : cs[2 * p + 1];
    float x0 = x[2 * p], x1 = x[2 * p + 1];
    x[2 * p] = bf16r(x0 * c - x1 * s);
    x[2 * p + 1] = bf16r(x0 * s + x1 * c);
  }
}

}  // namespace dsv4
