#include "io/config.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/text_file.h"

namespace dsv4 {

using nlohmann::json;

namespace {

struct Reader {
  const json& j;
  const std::string& origin;

  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw Error(origin + ": field '" + field + "' " + what);
  }
  const json& get(const json& obj, const std::string& field, const std::string& path) const {
    auto it = obj.find(field);
    if (it == obj.end()) fail(path, "is missing");
    return *it;
  }
  int integer(const std::string& field, int lo, int hi) const { return integer_in(j, field, field, lo, hi); }
  int integer_in(const json& obj, const std::string& field, const std::string& path, int lo, int hi) const {
    const json& v = get(obj, field, path);
    if (!v.is_number()) fail(path, "must be a number");
    double d = v.get<double>();
    // Range first: converting an out-of-range double to an integer is undefined.
    if (!(d >= lo && d <= hi))
      fail(path, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + v.dump());
    if (d != double(int64_t(d))) fail(path, "must be an integer, got " + v.dump());
    return int(d);
  }
  float number_in(const json& obj, const std::string& field, const std::string& path, double lo, double hi) const {
    const json& v = get(obj, field, path);
    if (!v.is_number()) fail(path, "must be a number");
    double d = v.get<double>();
    if (!(d >= lo && d <= hi)) fail(path, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + v.dump());
    return float(d);
  }
  float number(const std::string& field, double lo, double hi) const { return number_in(j, field, field, lo, hi); }
  // An optional string field (json::value would throw a non-dsv4 exception
  // when the field has another type).
  std::string string_in(const json& obj, const std::string& field, const std::string& path,
                        const std::string& dflt) const {
    auto it = obj.find(field);
    if (it == obj.end() || it->is_null()) return dflt;
    if (!it->is_string()) fail(path, "must be a string, got " + it->dump());
    return it->get<std::string>();
  }
};

constexpr int kBig = 1 << 30;

// The shortest decimal that reads back as `f`, as a double: config values are
// held as float, and writing the float's exact double value would turn 1e-6
// into 9.999999974752427e-07 in config.json.
double decimal(float f) {
  char buf[32];
  for (int digits = 6; digits <= 9; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, double(f));
    if (std::strtof(buf, nullptr) == f) break;
  }
  return std::strtod(buf, nullptr);
}

// The plain numeric fields, read by from_json and written by to_json from
// this one list. An optional field takes its default when absent or null.
template <class T>
struct Field {
  const char* name;
  T ModelConfig::*member;
  double lo, hi;
  bool optional = false;
  T dflt = T();
};
using IntField = Field<int>;
using FloatField = Field<float>;

using C = ModelConfig;
const IntField kIntFields[] = {
    {"hidden_size", &C::hidden_size, 1, kBig},
    {"num_hidden_layers", &C::num_hidden_layers, 1, 100000},
    {"num_attention_heads", &C::num_attention_heads, 1, 1 << 16},
    {"num_key_value_heads", &C::num_key_value_heads, 1, 1, true, 1},
    {"head_dim", &C::head_dim, 1, 1 << 16},
    {"qk_rope_head_dim", &C::qk_rope_head_dim, 2, 1 << 16},
    {"q_lora_rank", &C::q_lora_rank, 1, kBig},
    {"o_lora_rank", &C::o_lora_rank, 1, kBig},
    {"o_groups", &C::o_groups, 1, 1 << 16},
    {"sliding_window", &C::sliding_window, 1, kBig},
    {"index_n_heads", &C::index_n_heads, 1, 1 << 16},
    {"index_head_dim", &C::index_head_dim, 1, 1 << 16},
    {"index_topk", &C::index_topk, 1, kBig},
    {"n_routed_experts", &C::n_routed_experts, 1, 1 << 20},
    {"num_experts_per_tok", &C::num_experts_per_tok, 1, 1 << 20},
    {"n_shared_experts", &C::n_shared_experts, 0, 1 << 20, true, 1},
    {"moe_intermediate_size", &C::moe_intermediate_size, 1, kBig},
    {"num_hash_layers", &C::num_hash_layers, 0, 100000, true, 0},
    {"hc_mult", &C::hc_mult, 1, 64},
    {"hc_sinkhorn_iters", &C::hc_sinkhorn_iters, 1, 10000},
    {"max_position_embeddings", &C::max_position_embeddings, 1, kBig},
    {"vocab_size", &C::vocab_size, 1, kBig},
    {"bos_token_id", &C::bos_token_id, 0, kBig, true, 0},
    {"eos_token_id", &C::eos_token_id, 0, kBig, true, 1},
    {"num_nextn_predict_layers", &C::num_nextn_predict_layers, 0, 1000, true, 0},
};
const FloatField kFloatFields[] = {
    {"routed_scaling_factor", &C::routed_scaling_factor, 0, 1e6},
    {"swiglu_limit", &C::swiglu_limit, 0, 1e30, true, 0.f},  // 0: no clamp
    {"hc_eps", &C::hc_eps, 0, 1},
    {"rms_norm_eps", &C::rms_norm_eps, 0, 1},
    {"rope_theta", &C::rope_theta, 1e-6, 1e30},
    {"compress_rope_theta", &C::compress_rope_theta, 1e-6, 1e30},
};

bool absent(const json& j, const char* field) { return !j.contains(field) || j[field].is_null(); }

void read_dimensions(const Reader& r, ModelConfig& c) {
  for (const IntField& f : kIntFields)
    c.*f.member = f.optional && absent(r.j, f.name) ? f.dflt : r.integer(f.name, int(f.lo), int(f.hi));
  for (const FloatField& f : kFloatFields)
    c.*f.member = f.optional && absent(r.j, f.name) ? f.dflt : r.number(f.name, f.lo, f.hi);
}

// scoring_func.
void read_scoring(const Reader& r, const json& j, ModelConfig& c) {
  std::string scoring = r.string_in(j, "scoring_func", "scoring_func", "sqrtsoftplus");
  if (scoring == "sqrtsoftplus") c.scoring_func = ScoringFunc::kSqrtSoftplus;
  else if (scoring == "softmax") c.scoring_func = ScoringFunc::kSoftmax;
  else if (scoring == "sigmoid") c.scoring_func = ScoringFunc::kSigmoid;
  else r.fail("scoring_func", "must be sqrtsoftplus, softmax or sigmoid, got '" + scoring + "'");
}

// rope_scaling (YaRN), optional.
void read_rope_scaling(const Reader& r, const json& j, ModelConfig& c) {
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    const json& rs = j["rope_scaling"];
    if (!rs.is_object()) r.fail("rope_scaling", "must be an object");
    std::string type = r.string_in(rs, "type", "rope_scaling.type",
                                   r.string_in(rs, "rope_type", "rope_scaling.rope_type", "yarn"));
    if (type != "yarn") r.fail("rope_scaling.type", "must be 'yarn', got '" + type + "'");
    c.rope_factor = r.number_in(rs, "factor", "rope_scaling.factor", 1e-6, 1e9);
    c.rope_original_max_position = r.integer_in(rs, "original_max_position_embeddings",
                                                "rope_scaling.original_max_position_embeddings", 0, kBig);
    c.rope_beta_fast = rs.contains("beta_fast") ? r.number_in(rs, "beta_fast", "rope_scaling.beta_fast", 1e-6, 1e9) : 32.f;
    c.rope_beta_slow = rs.contains("beta_slow") ? r.number_in(rs, "beta_slow", "rope_scaling.beta_slow", 1e-6, 1e9) : 1.f;
  }
}

// compress_ratios: one entry per layer (+ MTP).
void read_compress_ratios(const Reader& r, const json& j, ModelConfig& c) {
  const json& cr = r.get(j, "compress_ratios", "compress_ratios");
  if (!cr.is_array()) r.fail("compress_ratios", "must be an array");
  size_t want = size_t(c.num_hidden_layers) + size_t(c.num_nextn_predict_layers);
  if (cr.size() != want && cr.size() != size_t(c.num_hidden_layers) + 1 && cr.size() != size_t(c.num_hidden_layers))
    r.fail("compress_ratios", "must have num_hidden_layers (+ MTP) = " + std::to_string(want) +
                                  " entries, got " + std::to_string(cr.size()));
  for (size_t i = 0; i < cr.size(); ++i) {
    // Read as int64 and range-checked: get<int> would silently truncate.
    if (!cr[i].is_number_integer()) r.fail("compress_ratios[" + std::to_string(i) + "]", "must be an integer");
    int64_t v = cr[i].get<int64_t>();
    if (cr[i].is_number_unsigned() && cr[i].get<uint64_t>() > uint64_t(kBig)) v = int64_t(kBig) + 1;
    if ((v != 0 && v < 2) || v > kBig)
      r.fail("compress_ratios[" + std::to_string(i) + "]", "must be 0 or in [2, " + std::to_string(kBig) +
                                                             "], got " + cr[i].dump());
    c.compress_ratios.push_back(int(v));
  }
}

// quantization_config, optional.
void read_quantization(const Reader& r, const json& j, ModelConfig& c) {
  if (j.contains("quantization_config") && !j["quantization_config"].is_null()) {
    const json& q = j["quantization_config"];
    if (!q.is_object()) r.fail("quantization_config", "must be an object");
    if (q.contains("weight_block_size")) {
      const json& b = q["weight_block_size"];
      if (!b.is_array() || b.size() != 2 || !b[0].is_number_integer() || b[0] != b[1] ||
          b[0].get<int64_t>() < 1 || b[0].get<int64_t>() > (1 << 16))
        r.fail("quantization_config.weight_block_size", "must be [B, B] with 1 <= B <= 65536, got " + b.dump());
      c.weight_block_size = b[0].get<int>();
    }
    c.scale_pow2 = r.string_in(q, "scale_fmt", "quantization_config.scale_fmt", "ue8m0") == "ue8m0";
  }
}

// What the forward relies on, across fields.
void check_structure(const Reader& r, const ModelConfig& c) {
  auto need = [&](bool ok, const std::string& field, const std::string& what) { if (!ok) r.fail(field, what); };
  need(c.qk_rope_head_dim % 2 == 0 && c.qk_rope_head_dim <= c.head_dim, "qk_rope_head_dim",
       "must be even and <= head_dim (" + std::to_string(c.head_dim) + ")");
  need(c.qk_rope_head_dim <= c.index_head_dim, "qk_rope_head_dim", "must be <= index_head_dim");
  need(c.num_attention_heads % c.o_groups == 0, "o_groups",
       "must divide num_attention_heads (" + std::to_string(c.num_attention_heads) + ")");
  need(c.num_experts_per_tok <= c.n_routed_experts, "num_experts_per_tok",
       "must be <= n_routed_experts (" + std::to_string(c.n_routed_experts) + ")");
  need(c.n_shared_experts == 1, "n_shared_experts", "must be 1");
  need((c.index_head_dim & (c.index_head_dim - 1)) == 0, "index_head_dim",
       "must be a power of two (Hadamard transform)");
  need(c.index_head_dim % 32 == 0, "index_head_dim", "must be a multiple of 32 (FP4 blocks)");
  need(c.hidden_size % 32 == 0, "hidden_size", "must be a multiple of 32 (FP4 expert scales)");
  need(c.moe_intermediate_size % 32 == 0, "moe_intermediate_size", "must be a multiple of 32 (FP4 expert scales)");
  need(c.nope_dim() % 64 == 0, "head_dim", "minus qk_rope_head_dim must be a multiple of 64 (FP8 kv blocks)");
  need(c.hidden_size % 2 == 0, "hidden_size", "must be even");
  need(c.num_hash_layers <= c.num_hidden_layers, "num_hash_layers", "must be <= num_hidden_layers");
  need(c.bos_token_id < c.vocab_size, "bos_token_id", "must be < vocab_size");
  need(c.eos_token_id < c.vocab_size, "eos_token_id", "must be < vocab_size");
}

}  // namespace

ModelConfig ModelConfig::from_json(const json& j, const std::string& origin) {
  if (!j.is_object()) throw Error(origin + ": config must be a JSON object");
  Reader r{j, origin};
  ModelConfig c;
  read_dimensions(r, c);
  read_scoring(r, j, c);
  read_rope_scaling(r, j, c);
  read_compress_ratios(r, j, c);
  read_quantization(r, j, c);
  check_structure(r, c);
  return c;
}

ModelConfig ModelConfig::load(const std::string& path) {
  return from_json(parse_json(read_text_file(path, "config"), path), path);
}

json ModelConfig::to_json() const {
  const char* sf = scoring_func == ScoringFunc::kSoftmax ? "softmax"
                   : scoring_func == ScoringFunc::kSigmoid ? "sigmoid" : "sqrtsoftplus";
  json j = {
      {"architectures", {"DeepseekV4ForCausalLM"}},
      {"model_type", "deepseek_v4"},
      {"rope_scaling", {{"type", "yarn"}, {"factor", decimal(rope_factor)},
                        {"original_max_position_embeddings", rope_original_max_position},
                        {"beta_fast", decimal(rope_beta_fast)}, {"beta_slow", decimal(rope_beta_slow)}}},
      {"compress_ratios", compress_ratios},
      {"scoring_func", sf},
      {"topk_method", "noaux_tc"},
      {"norm_topk_prob", true},
      {"hidden_act", "silu"},
      {"tie_word_embeddings", false},
      {"torch_dtype", "bfloat16"},
      {"quantization_config", {{"activation_scheme", "dynamic"}, {"fmt", "e4m3"}, {"quant_method", "fp8"},
                               {"scale_fmt", scale_pow2 ? "ue8m0" : "fp32"},
                               {"weight_block_size", {weight_block_size, weight_block_size}}}},
      {"expert_dtype", "fp4"},
  };
  for (const IntField& f : kIntFields) j[f.name] = this->*f.member;
  for (const FloatField& f : kFloatFields) j[f.name] = decimal(this->*f.member);
  return j;
}

}  // namespace dsv4
