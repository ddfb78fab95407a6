// Minimal .npy (NumPy format 1.0/2.0) reading and writing of float32 arrays,
// for dumps and golden comparisons.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace dsv4 {

struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<float> data;
};

void write_npy(const std::string& path, const float* data, const std::vector<int64_t>& shape);
// Reads a little-endian float32 (or float64, converted) C-order array.
NpyArray read_npy(const std::string& path);

}  // namespace dsv4
