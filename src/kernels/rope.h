// Rotary position embedding on the last rd dims of a vector, interleaved
// pairs, all in fp32 exactly as MODEL.md §5 writes it. The table is built
// from explicit parameters; model/model.h rope_params reads them from the
// config.
#pragma once
#include <cstdint>
#include <vector>

namespace dsv4 {

// What a table's frequencies depend on (MODEL.md §5).
struct RopeParams {
  int rotary_dim = 0;  // rd: the rotated dims at the end of a vector (even)
  float theta = 0.f;   // base: f_p = theta^(−2p/rd) before YaRN
  // YaRN, applied when yarn_original_max_position > 0.
  float yarn_factor = 1.f;
  int yarn_original_max_position = 0;
  float yarn_beta_fast = 32.f;
  float yarn_beta_slow = 1.f;
};

class RopeTable {
 public:
  RopeTable() = default;
  explicit RopeTable(const RopeParams& p);
  int rd() const { return rd_; }
  const std::vector<float>& freqs() const { return freq_; }
  // cs[2p] = cos(pos·f_p), cs[2p+1] = sin(pos·f_p), p < rd/2.
  void cos_sin(int64_t pos, float* cs) const;
  // Rotates x[0..rd) (the rope part) by +pos (inverse: −pos); rounds to bf16.
  void rotate(float* x, const float* cs, bool inverse = false) const;

 private:
  int rd_ = 0;
  std::vector<float> freq_;
};

}  // namespace dsv4
