#include "io/weight_check.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"

namespace dsv4 {

bool dtype_has_nonfinite(DType t) {
  return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16 || t == DType::kF8E4M3 || t == DType::kF8E8M0;
}

namespace {

// Loads through memcpy: mapped tensor data need not be aligned.
template <class T>
int64_t scan(const uint8_t* p, int64_t n, T mask) {
  for (int64_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, p + size_t(i) * sizeof(T), sizeof(T));
    if ((v & mask) == mask) return i;  // exponent all ones: Inf or NaN
  }
  return -1;
}

std::string value_name(const TensorView& t, int64_t i) {
  switch (t.dtype) {
    case DType::kF32: {
      uint32_t v;
      std::memcpy(&v, t.data + 4 * i, 4);
      return (v & 0x007fffffu) ? "NaN" : (v >> 31) ? "-Inf" : "Inf";
    }
    case DType::kBF16: case DType::kF16: {
      uint16_t v;
      std::memcpy(&v, t.data + 2 * i, 2);
      const uint16_t frac = t.dtype == DType::kBF16 ? 0x007f : 0x03ff;
      return (v & frac) ? "NaN" : (v >> 15) ? "-Inf" : "Inf";
    }
    default:
      return "NaN";
  }
}

}  // namespace

int64_t first_nonfinite(const TensorView& t) {
  const int64_t n = int64_t(t.nbytes / std::max<size_t>(dtype_size(t.dtype), 1));
  switch (t.dtype) {
    case DType::kF32: return scan<uint32_t>(t.data, n, 0x7f800000u);
    case DType::kBF16: return scan<uint16_t>(t.data, n, 0x7f80);
    case DType::kF16: return scan<uint16_t>(t.data, n, 0x7c00);
    case DType::kF8E4M3: return scan<uint8_t>(t.data, n, 0x7f);  // E4M3FN: only S.1111.111 is NaN, no Inf
    case DType::kF8E8M0: return scan<uint8_t>(t.data, n, 0xff);
    default: return -1;
  }
}

void check_weights_finite(const Checkpoint& ck, const std::function<bool(const std::string&)>& used) {
  std::vector<const TensorView*> todo;
  for (const auto& kv : ck.tensors())
    if (dtype_has_nonfinite(kv.second.dtype) && (!used || used(kv.first))) todo.push_back(&kv.second);
  std::vector<int64_t> bad(todo.size(), -1);
  parallel_for_each(int64_t(todo.size()), [&](int64_t k) { bad[size_t(k)] = first_nonfinite(*todo[size_t(k)]); });
  for (size_t k = 0; k < todo.size(); ++k) {
    if (bad[k] < 0) continue;
    const TensorView& t = *todo[k];
    throw Error(t.file + ": tensor '" + t.name + "' holds a non-finite value (" + value_name(t, bad[k]) +
                " at element " + std::to_string(bad[k]) + " of " + std::to_string(t.numel()) + ")");
  }
}

}  // namespace dsv4
