// A loaded model: config, mapped checkpoint, weights and RoPE tables.
#pragma once
#include <memory>
#include <string>

#include "io/config.h"
#include "io/safetensors.h"
#include "kernels/rope.h"
#include "model/weights.h"

namespace dsv4 {

// The RoPE of a layer from the config (MODEL.md §5): SWA layers rope_theta
// without YaRN; layers with a compressor (compressed = true)
// compress_rope_theta with the config's YaRN.
RopeParams rope_params(const ModelConfig& c, bool compressed);

struct Model {
  ModelConfig config;
  Checkpoint checkpoint;  // owns the mappings the weights point into
  ModelWeights weights;
  RopeTable rope_swa;         // layers without a compressor (SWA)
  RopeTable rope_compressed;  // CSA / HCA layers (YaRN)
  ExpertRange experts;        // the routed experts held, end resolved (all of them unless EP)

  const RopeTable& rope(int layer) const {
    return config.layer_kind(layer).has_compressor() ? rope_compressed : rope_swa;
  }

  // Reads DIR/config.json and the checkpoint, validating every tensor it
  // uses: with `experts`, only those routed experts (the others' tensors are
  // not read; their weights stay empty), as one expert-parallel rank needs.
  static std::unique_ptr<Model> load(const std::string& dir, ExpertRange experts = {});
};

}  // namespace dsv4
