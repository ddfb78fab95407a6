// `dsv4 prefill --check-weights`: a scan of the mapped weights for values
// that are not finite (NaN or Inf), which a checkpoint can carry without
// breaking any structural check.
#pragma once
#include <functional>
#include <string>

#include "io/safetensors.h"

namespace dsv4 {

// True for the dtypes that can hold a NaN or an Inf: F32, BF16, F16
// (NaN/Inf), F8_E4M3 (NaN: S.1111.111) and F8_E8M0 (NaN: 0xFF). The integer
// dtypes (I8/U8 packed FP4, I32, I64) cannot.
bool dtype_has_nonfinite(DType t);

// The index of the first element of `t` that is NaN or Inf, or -1.
int64_t first_nonfinite(const TensorView& t);

// Scans every tensor of `ck` for which used(name) holds (all when `used` is
// empty), in parallel, and throws dsv4::Error naming the file, the tensor,
// the element and its value for the first one (in name order) that holds a
// NaN or an Inf.
void check_weights_finite(const Checkpoint& ck, const std::function<bool(const std::string&)>& used = {});

}  // namespace dsv4
