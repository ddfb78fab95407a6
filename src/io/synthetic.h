// Synthetic checkpoints in the official layout (CHECKPOINT.md), deterministic
// in the seed, for tests, benchmarks and the embedded default model.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "io/config.h"
#include "io/safetensors.h"

namespace dsv4 {

struct SyntheticOptions {
  std::string preset = "tiny";  // "tiny" or "flash"
  uint64_t seed = 0;
  int layers = -1;   // overrides (-1 = the preset's value)
  int experts = -1;
  int vocab = -1;
  int sliding_window = -1;
  int shards = 2;    // safetensors files (1 = a single model.safetensors)
};

// The config a preset (with overrides) describes; throws dsv4::Error on an
// unknown preset or an override that breaks the structure.
ModelConfig synthetic_config(const SyntheticOptions& o);

struct SyntheticSummary {
  size_t tensors = 0;  // tensors written
  size_t bytes = 0;    // their data bytes (the index's total_size)
};

// Writes DIR/config.json and the safetensors shards (+ index when shards > 1).
// Tensors are generated one at a time while they are written, so memory stays
// near the largest tensor whatever the model size. The same options give
// byte-identical files.
SyntheticSummary write_synthetic_model(const std::string& dir, const SyntheticOptions& o);

// The tensors a checkpoint for config `c` holds, in the official names,
// dtypes and shapes: every tensor load_weights reads (the list gen-model
// writes). `dsv4 info` checks a checkpoint against it from the headers alone.
std::vector<TensorSpec> checkpoint_tensor_specs(const ModelConfig& c);

}  // namespace dsv4
