#include "io/checkpoint_check.h"

#include <algorithm>

#include "io/synthetic.h"

namespace dsv4 {

std::vector<DType> accepted_dtypes(const TensorSpec& s) {
  auto ends_with = [&](const std::string& x) {
    return s.name.size() >= x.size() && s.name.compare(s.name.size() - x.size(), x.size(), x) == 0;
  };
  if (s.dtype == DType::kI8) return {DType::kI8, DType::kU8};
  if (s.dtype == DType::kI64) return {DType::kI64, DType::kI32};
  if ((s.dtype == DType::kBF16 || s.dtype == DType::kF32) && s.shape.size() == 1 &&
      (ends_with(".weight") || ends_with("gate.bias")))
    return {DType::kBF16, DType::kF32};
  return {s.dtype};
}

std::vector<std::string> check_checkpoint(const Checkpoint& ck, const ModelConfig& c, std::set<std::string>* used) {
  std::vector<std::string> problems;
  for (const TensorSpec& s : checkpoint_tensor_specs(c)) {
    const std::string name = ck.resolve(s.name);
    const TensorView* t = ck.find(name);
    if (!t) {
      problems.push_back("missing tensor '" + s.name + "' (" + dtype_name(s.dtype) + " " + shape_str(s.shape) + ")");
      continue;
    }
    used->insert(name);
    const std::vector<DType> ok = accepted_dtypes(s);
    if (std::find(ok.begin(), ok.end(), t->dtype) == ok.end()) {
      std::string want;
      for (DType d : ok) want += std::string(want.empty() ? "" : " or ") + dtype_name(d);
      problems.push_back(t->file + ": tensor '" + name + "' has dtype " + dtype_name(t->dtype) + ", expected " + want);
    }
    if (t->shape != s.shape)
      problems.push_back(t->file + ": tensor '" + name + "' has shape " + shape_str(t->shape) + ", expected " +
                         shape_str(s.shape));
  }
  return problems;
}

}  // namespace dsv4
