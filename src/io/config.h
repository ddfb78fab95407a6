// The model configuration, read from a HuggingFace config.json with the
// official field names (MODEL.md §1). Nothing about a particular model size is
// assumed anywhere else: every dimension comes from here.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace dsv4 {

enum class ScoringFunc { kSqrtSoftplus, kSoftmax, kSigmoid };

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
  bool is_hash_layer(int layer) const { return layer < num_hash_layers; }

  // Parses and validates; throws dsv4::Error naming `origin` and the field.
  static ModelConfig from_json(const nlohmann::json& j, const std::string& origin);
  static ModelConfig load(const std::string& path);
  nlohmann::json to_json() const;
};

}  // namespace dsv4
