// Rotary position embedding on the last rd dims of a vector, interleaved
// pairs, all in fp32 exactly as MODEL.md §5 writes it (YaRN on compressed
// layers).
#pragma once
#include <cstdint>
#include <vector>

namespace dsv4 {

struct ModelConfig;

class RopeTable {
 public:
  RopeTable() = default;
  // compressed = a layer with a compressor, CSA or HCA (compress_rope_theta + YaRN).
  RopeTable(const ModelConfig& c, bool compressed);
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
