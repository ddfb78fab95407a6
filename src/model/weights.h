// The model's weights as the forward uses them, loaded from a Checkpoint with
// every name, dtype and shape checked against the config (CHECKPOINT.md).
// Large matrices stay in the mapped file in their checkpoint format; small
// vectors (norms, hc mixers, biases) are copied to fp32.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/config.h"
#include "io/safetensors.h"
#include "kernels/linear.h"
#include "model/hc.h"

namespace dsv4 {

// Loads `prefix`.weight (and `prefix`.scale / .weight_scale_inv for FP8/FP4)
// with the expected kind and shape from the checkpoint.
Weight load_weight(const Checkpoint& ck, const std::string& prefix, Weight::Kind kind, int64_t out, int64_t in,
                   int block);

struct CompressorWeights {
  int ratio = 0;      // r
  int coff = 1;       // LayerKind::compressor_overlap()
  int head_dim = 0;   // output row width
  bool indexer = false;
  Weight wkv, wgate;         // BF16 [coff·hd][D]
  std::vector<float> ape;    // [r][coff·hd]
  std::vector<float> norm;   // [hd]

  // Source-token slots of the state's ring: the tokens a row can still need.
  int64_t ring_slots() const { return int64_t(coff) * ratio; }
};

// The lightning indexer of a CSA layer (MODEL.md §8; model/indexer.h).
struct IndexerWeights {
  Weight wq_b;                  // FP8 [Hi·di][q_lora_rank]
  Weight weights_proj;          // BF16 [Hi][D]
  CompressorWeights compressor; // rows of index_head_dim
};

struct AttentionWeights {
  std::vector<float> q_norm, kv_norm, attn_sink;
  Weight wq_a, wq_b, wkv, wo_a, wo_b;
  CompressorWeights compressor;  // LayerKind::has_compressor()
  IndexerWeights indexer;        // LayerKind::has_indexer()
};

struct ExpertWeights {
  Weight w1, w2, w3;
};

struct MoeWeights {
  Weight gate;                  // BF16 [E][D]
  std::vector<float> gate_bias; // [E] (non-hash layers)
  std::vector<int32_t> tid2eid; // [vocab][k] (hash layers)
  std::vector<ExpertWeights> experts;  // routed; empty entries for experts not held
  ExpertWeights shared;
};

struct LayerWeights {
  LayerKind kind;
  HcWeights hc_attn, hc_ffn;
  std::vector<float> attn_norm, ffn_norm;
  AttentionWeights attn;
  MoeWeights ffn;
  // One block that holds the layer's FP8 and FP4 panels (kernels/gemv.h
  // pack_quant_panels), where the kernels read them; null otherwise.
  std::shared_ptr<const uint8_t> quant_panels;
  // The FP8 matrices' values as pair panels (kernels/gemv.h
  // pack_pair_panels), where the GEMV tiles run on AVX2; empty otherwise.
  std::vector<std::shared_ptr<const uint32_t>> pair_panels;
};

struct ModelWeights {
  Weight embed;  // BF16 [vocab][D]
  Weight head;   // BF16 [vocab][D]
  // The head's rows as pair panels for decode (kernels/gemv.h
  // pack_pair_panels): head.pair_panels points into it; null where gemv
  // cannot read them.
  std::shared_ptr<const uint32_t> head_pair_panels;
  std::vector<float> norm;
  HcHeadWeights hc_head;
  std::vector<LayerWeights> layers;
};

// Calls f on each of a layer's quantised matrices (LayerWeights or const
// LayerWeights): the FP8 attention, indexer and shared-expert projections
// and the FP4 routed experts (empty entries too: out = 0, data null).
template <class Layer, class F>
void for_each_quant_matrix(Layer& l, F&& f) {
  for (auto* w : {&l.attn.wq_a, &l.attn.wq_b, &l.attn.wkv, &l.attn.wo_a, &l.attn.wo_b, &l.attn.indexer.wq_b,
                  &l.ffn.shared.w1, &l.ffn.shared.w2, &l.ffn.shared.w3})
    f(*w);
  for (auto& x : l.ffn.experts)
    for (auto* w : {&x.w1, &x.w2, &x.w3}) f(*w);
}

// Copies a small F32/BF16 tensor of the given shape to fp32.
std::vector<float> load_vector(const Checkpoint& ck, const std::string& name, const Shape& shape,
                               const std::vector<DType>& dtypes = {DType::kF32, DType::kBF16});

// The routed experts a process holds (expert parallelism, PREFILL.md §4):
// ids [begin, end); end = -1 means through the last expert.
struct ExpertRange {
  int64_t begin = 0, end = -1;
};

// Loads and checks every tensor the forward uses. Routed experts outside
// `experts` are neither looked up nor checked: their MoeWeights::experts
// entries stay empty (null data) and their bytes are never touched.
ModelWeights load_weights(const Checkpoint& ck, const ModelConfig& c, ExpertRange experts = {});

}  // namespace dsv4
