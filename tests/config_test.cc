// ModelConfig validation (config.json, MODEL.md §1) and the synthetic presets.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/config.h"
#include "io/synthetic.h"

using namespace dsv4;
using nlohmann::json;

namespace {

json tiny_json() {
  SyntheticOptions o;
  o.preset = "tiny";
  return synthetic_config(o).to_json();
}

// from_json(j) must throw a dsv4::Error naming the origin and 'field'.
void expect_field_error(const json& j, const std::string& field) {
  try {
    ModelConfig::from_json(j, "test.json");
    ADD_FAILURE() << "accepted a config with a bad '" << field << "'";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind("test.json: ", 0), 0u) << m;
    EXPECT_NE(m.find("'" + field + "'"), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
}

}  // namespace

TEST(Config, RoundTrip) {
  const json j = tiny_json();
  const ModelConfig c = ModelConfig::from_json(j, "t");
  EXPECT_EQ(c.to_json(), j);
  // Float fields are written as the decimals they were read from.
  EXPECT_EQ(j["hc_eps"].get<double>(), 1e-6);
  EXPECT_EQ(j["rms_norm_eps"].get<double>(), 1e-6);
  EXPECT_EQ(j["routed_scaling_factor"].get<double>(), 1.5);
}

TEST(Config, RejectsBrokenStructure) {
  json j = tiny_json();
  j["compress_ratios"] = {0, 4, 128};  // 4 layers need 4 or 5 entries
  expect_field_error(j, "compress_ratios");
  j["compress_ratios"] = {0, 4, 128, 4, 0, 0, 0};
  expect_field_error(j, "compress_ratios");

  j = tiny_json();
  j["compress_ratios"][1] = 1;
  expect_field_error(j, "compress_ratios[1]");
  j["compress_ratios"][1] = 1099511627776;  // 2^40 must not wrap to a valid int
  expect_field_error(j, "compress_ratios[1]");
  j["compress_ratios"][1] = "4";
  expect_field_error(j, "compress_ratios[1]");

  j = tiny_json();
  j["o_groups"] = 3;  // 4 heads
  expect_field_error(j, "o_groups");

  j = tiny_json();
  j["num_experts_per_tok"] = 9;  // 8 experts
  expect_field_error(j, "num_experts_per_tok");

  j = tiny_json();
  j["n_routed_experts"] = 0;
  expect_field_error(j, "n_routed_experts");

  j = tiny_json();
  j["n_shared_experts"] = 2;
  expect_field_error(j, "n_shared_experts");

  j = tiny_json();
  j["hidden_size"] = 1e300;  // out of range: no undefined double -> int conversion
  expect_field_error(j, "hidden_size");
  j["hidden_size"] = 256.5;
  expect_field_error(j, "hidden_size");
  j.erase("hidden_size");
  expect_field_error(j, "hidden_size");

  j = tiny_json();
  j["eos_token_id"] = 1024;
  expect_field_error(j, "eos_token_id");

  j = tiny_json();
  j["num_hash_layers"] = 5;
  expect_field_error(j, "num_hash_layers");

  j = tiny_json();
  j["index_head_dim"] = 96;
  expect_field_error(j, "index_head_dim");
}

TEST(Config, WrongTypesAreErrorsNotCrashes) {
  // json::value() would throw nlohmann's own exception for these.
  json j = tiny_json();
  j["scoring_func"] = 3;
  expect_field_error(j, "scoring_func");
  j = tiny_json();
  j["scoring_func"] = "relu";
  expect_field_error(j, "scoring_func");
  j = tiny_json();
  j["rope_scaling"]["type"] = 1;
  expect_field_error(j, "rope_scaling.type");
  j = tiny_json();
  j["quantization_config"]["scale_fmt"] = {1};
  expect_field_error(j, "quantization_config.scale_fmt");
  j = tiny_json();
  j["quantization_config"]["weight_block_size"] = {4294967424ull, 4294967424ull};
  expect_field_error(j, "quantization_config.weight_block_size");
  EXPECT_THROW(ModelConfig::from_json(json::array(), "x"), Error);
}

TEST(Presets, TinyIsGoldenTinyA) {
  const std::string golden = std::string(DSV4_SHARED) + "/golden/tiny-a/config.json";
  ASSERT_TRUE(std::filesystem::exists(golden)) << "no " << golden;
  // Identical but for max_position_embeddings, which the preset raises so
  // that long prompts fit; it changes no computed value.
  json want = ModelConfig::load(golden).to_json();
  EXPECT_EQ(want["max_position_embeddings"], 4096);
  want["max_position_embeddings"] = 65536;
  EXPECT_EQ(tiny_json(), want);
}

TEST(Presets, Flash) {
  SyntheticOptions o;
  o.preset = "flash";
  const ModelConfig c = synthetic_config(o);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.num_hidden_layers, 43);
  EXPECT_EQ(c.num_attention_heads, 64);
  EXPECT_EQ(c.head_dim, 512);
  EXPECT_EQ(c.q_lora_rank, 1024);
  EXPECT_EQ(c.o_groups, 8);
  EXPECT_EQ(c.index_n_heads, 64);
  EXPECT_EQ(c.index_topk, 512);
  EXPECT_EQ(c.n_routed_experts, 256);
  EXPECT_EQ(c.num_experts_per_tok, 6);
  EXPECT_EQ(c.moe_intermediate_size, 2048);
  EXPECT_EQ(c.num_hash_layers, 3);
  EXPECT_EQ(c.vocab_size, 129280);
  EXPECT_EQ(c.num_nextn_predict_layers, 0);
  ASSERT_EQ(c.compress_ratios.size(), 44u);
  int csa = 0, hca = 0;
  for (int L = 0; L < 44; ++L) {
    const int want = L < 2 || L == 43 ? 0 : L % 2 == 0 ? 4 : 128;
    EXPECT_EQ(c.compress_ratios[size_t(L)], want) << L;
    csa += want == 4;
    hca += want == 128;
  }
  EXPECT_EQ(csa, 21);
  EXPECT_EQ(hca, 20);
}

TEST(Presets, Overrides) {
  SyntheticOptions o;
  o.preset = "flash";
  o.layers = 4;
  ModelConfig c = synthetic_config(o);
  EXPECT_EQ(c.compress_ratios, (std::vector<int>{0, 4, 128, 4, 0}));
  EXPECT_EQ(c.num_hash_layers, 3);
  o.layers = 1;
  c = synthetic_config(o);
  EXPECT_EQ(c.compress_ratios, (std::vector<int>{0, 0}));
  EXPECT_EQ(c.num_hash_layers, 1);
  o.layers = 43;  // the preset's own count keeps its schedule
  EXPECT_EQ(synthetic_config(o).compress_ratios[2], 4);

  o = SyntheticOptions{};
  o.preset = "tiny";
  o.layers = 6;
  EXPECT_EQ(synthetic_config(o).compress_ratios, (std::vector<int>{0, 4, 128, 4, 128, 4, 0}));
  o.layers = -1;
  o.experts = 1;
  c = synthetic_config(o);
  EXPECT_EQ(c.n_routed_experts, 1);
  EXPECT_EQ(c.num_experts_per_tok, 1);
  o.experts = -1;
  o.vocab = 2;
  EXPECT_EQ(synthetic_config(o).vocab_size, 2);

  using Edit = void (*)(SyntheticOptions&);
  for (Edit bad : {Edit([](SyntheticOptions& x) { x.preset = "huge"; }), Edit([](SyntheticOptions& x) { x.layers = 0; }),
                   Edit([](SyntheticOptions& x) { x.experts = 0; }), Edit([](SyntheticOptions& x) { x.vocab = 1; })}) {
    SyntheticOptions b;
    bad(b);
    EXPECT_THROW(synthetic_config(b), Error);
  }
}
