// The model configuration, read from a HuggingFace config.json with the
// official field names (MODEL.md §1). Nothing about a particular model size is
// assumed anywhere else: every dimension comes from here.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace dsv4 {

enum class ScoringFunc { kSqrtSoftplus, kSoftmax, kSigmoid };

// The attention of a layer (MODEL.md §1, §6–8), decided by its compress ratio.
enum class AttentionKind {
  kSlidingWindow,      // SWA, ratio 0: the raw window only
  kCompressedSparse,   // CSA: overlapping compressor windows + the lightning indexer's top-k
  kHeavilyCompressed,  // HCA: every visible compressed row
};

// What a layer's attention holds and does, asked by name instead of by
// comparing ratios.
struct LayerKind {
  // The ratio that MODEL.md §1 makes a CSA layer: the only one with the
  // indexer (§8) and with overlapping compressor windows (§7, coff = 2).
  static constexpr int kCsaRatio = 4;

  int ratio = 0;  // compress ratio r: one compressed row per r source tokens (0: none)

  AttentionKind kind() const {
    return ratio == 0 ? AttentionKind::kSlidingWindow
           : ratio == kCsaRatio ? AttentionKind::kCompressedSparse
                                : AttentionKind::kHeavilyCompressed;
  }
  bool has_compressor() const { return ratio != 0; }
  bool has_indexer() const { return kind() == AttentionKind::kCompressedSparse; }
  // coff of §7: how many consecutive blocks one compressed row pools (the
  // overlapping CSA windows take the previous block too). Both compressors
  // of a layer share it.
  int compressor_overlap() const { return has_indexer() ? 2 : 1; }
  // Compressed rows visible to the query at position t (§7: row c iff
  // c < (t+1) div r).
  int64_t visible_rows(int64_t t) const { return has_compressor() ? (t + 1) / ratio : 0; }
  // "SWA", "CSA" or "HCA".
  const char* name() const {
    switch (kind()) {
      case AttentionKind::kSlidingWindow: return "SWA";
      case AttentionKind::kCompressedSparse: return "CSA";
      case AttentionKind::kHeavilyCompressed: return "HCA";
    }
    return "?";
  }
};

struct ModelConfig {
  int hidden_size = 0;            // D
  int num_hidden_layers = 0;
  int num_attention_heads = 0;    // H
  int num_key_value_heads = 1;
  int head_dim = 0;               // d
  int qk_rope_head_dim = 0;       // rd
  int q_lora_rank = 0;
  int o_lora_rank = 0;
  int o_groups = 0;
  int sliding_window = 0;
  std::vector<int> compress_ratios;  // num_hidden_layers (+ MTP) entries
  int index_n_heads = 0;
  int index_head_dim = 0;
  int index_topk = 0;
  int n_routed_experts = 0;
  int num_experts_per_tok = 0;
  int n_shared_experts = 1;
  int moe_intermediate_size = 0;
  int num_hash_layers = 0;
  ScoringFunc scoring_func = ScoringFunc::kSqrtSoftplus;
  float routed_scaling_factor = 1.f;
  float swiglu_limit = 0.f;
  int hc_mult = 0;
  int hc_sinkhorn_iters = 0;
  float hc_eps = 0.f;
  float rms_norm_eps = 0.f;
  float rope_theta = 0.f;
  float compress_rope_theta = 0.f;
  // YaRN (compressed layers only; applies when original_max_position_embeddings > 0)
  float rope_factor = 1.f;
  int rope_original_max_position = 0;
  float rope_beta_fast = 32.f;
  float rope_beta_slow = 1.f;
  int max_position_embeddings = 0;
  int vocab_size = 0;
  int bos_token_id = 0;
  int eos_token_id = 1;
  int num_nextn_predict_layers = 0;
  // quantization_config
  int weight_block_size = 128;     // square FP8 weight blocks
  bool scale_pow2 = true;          // scale_fmt == "ue8m0"

  // Derived.
  int nope_dim() const { return head_dim - qk_rope_head_dim; }
  int ratio(int layer) const { return compress_ratios[layer]; }
  LayerKind layer_kind(int layer) const { return LayerKind{compress_ratios[size_t(layer)]}; }
  bool is_hash_layer(int layer) const { return layer < num_hash_layers; }

  // Parses and validates; throws dsv4::Error naming `origin` and the field.
  static ModelConfig from_json(const nlohmann::json& j, const std::string& origin);
  static ModelConfig load(const std::string& path);
  nlohmann::json to_json() const;
};

}  // namespace dsv4
