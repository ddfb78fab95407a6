// `dsv4 bench` end to end on a tiny synthetic model: the JSON it prints, and
// logits checksums that do not change across runs or thread counts.
#include <gtest/gtest.h>

#include <cstdlib>

#include <nlohmann/json.hpp>

#include "core/cpu.h"
#include "test_util.h"

namespace dsv4 {
namespace {

using nlohmann::json;
using testing::run_dsv4;

// Runs `dsv4 <args>` and captures stdout alone (stderr is dropped).
testing::RunResult run_stdout(const std::string& args) {
  return testing::run_command(std::string(DSV4_BIN) + " " + args + " 2>/dev/null");
}

// The bench on tiny shapes; stdout must be exactly one JSON object.
json bench_json(const std::string& extra) {
  auto r = run_stdout("bench --preset tiny --tokens 64,128 --gemm-shapes 64x256x128,32x128x64 --gemm-reps 1 "
                      "--peak-seconds 0.02 --json " + extra);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  json j = json::parse(r.output, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << r.output;
  return j;
}

std::vector<std::string> checksums(const json& j) {
  std::vector<std::string> r;
  for (const json& p : j.at("prefill")) r.push_back(p.at("logits_checksum").get<std::string>());
  return r;
}

TEST(Bench, JsonFieldsAndDeterministicChecksums) {
  const json a = bench_json("--threads 2");
  ASSERT_TRUE(a.is_object());
  ASSERT_TRUE(a.contains("peak_gflops"));
  EXPECT_TRUE(a["peak_gflops"].is_number());
  EXPECT_GT(a["peak_gflops"].get<double>(), 0.0);
  EXPECT_EQ(a.at("threads").get<int>(), 2);

  ASSERT_TRUE(a.contains("gemm") && a["gemm"].is_array());
  ASSERT_EQ(a["gemm"].size(), 2u);
  const json& g = a["gemm"][0];
  EXPECT_EQ(g.at("m").get<int>(), 64);
  EXPECT_EQ(g.at("k").get<int>(), 256);
  EXPECT_EQ(g.at("n").get<int>(), 128);
  EXPECT_TRUE(g.at("gflops").is_number());
  EXPECT_GT(g["gflops"].get<double>(), 0.0);
  ASSERT_TRUE(g.contains("openblas_gflops"));
  EXPECT_TRUE(g["openblas_gflops"].is_number() || g["openblas_gflops"].is_null());
  if (g.contains("max_rel_diff")) {
    EXPECT_LT(g["max_rel_diff"].get<double>(), 1e-3);
  }

  // Each conversion kernel timed against its plain reference.
  ASSERT_TRUE(a.contains("conversions") && a["conversions"].is_array());
  EXPECT_EQ(a["conversions"].size(), 5u);
  for (const json& t : a["conversions"]) {
    EXPECT_FALSE(t.at("name").get<std::string>().empty());
    for (const char* k : {"ns_per_value", "reference_ns_per_value", "speedup"})
      EXPECT_GT(t.at(k).get<double>(), 0.0) << k;
  }

  ASSERT_TRUE(a.contains("prefill") && a["prefill"].is_array());
  ASSERT_EQ(a["prefill"].size(), 2u);
  const int64_t lengths[] = {64, 128};
  for (size_t i = 0; i < 2; ++i) {
    const json& p = a["prefill"][i];
    EXPECT_EQ(p.at("n_tokens").get<int64_t>(), lengths[i]);
    for (const char* k : {"seconds", "tokens_per_second", "gflops", "flop_limited_fraction"}) {
      ASSERT_TRUE(p.contains(k)) << k;
      EXPECT_TRUE(p[k].is_number()) << k;
      EXPECT_GT(p[k].get<double>(), 0.0) << k;
    }
    EXPECT_NEAR(p["tokens_per_second"].get<double>() * p["seconds"].get<double>(), double(lengths[i]), 1e-6 * lengths[i]);
    EXPECT_NEAR(p["flop_limited_fraction"].get<double>(),
                p["gflops"].get<double>() / a["peak_gflops"].get<double>(), 1e-9);
    const std::string cs = p.at("logits_checksum").get<std::string>();
    EXPECT_EQ(cs.size(), 16u);
    EXPECT_EQ(cs.find_first_not_of("0123456789abcdef"), std::string::npos) << cs;
    EXPECT_TRUE(p.at("next_token").is_number_integer());
    ASSERT_TRUE(p.contains("stage_seconds") && p["stage_seconds"].is_object());
    for (const char* s : {"projections", "compressors", "indexer", "attention", "gate", "experts", "hc", "head"})
      EXPECT_TRUE(p["stage_seconds"].contains(s)) << s;
  }
  EXPECT_NE(checksums(a)[0], checksums(a)[1]);

  // Same checksums on a second run and on one thread.
  const json b = bench_json("--threads 2");
  const json c = bench_json("--threads 1");
  EXPECT_EQ(checksums(a), checksums(b));
  EXPECT_EQ(checksums(a), checksums(c));
  EXPECT_EQ(c.at("threads").get<int>(), 1);

  // The scalar GEMM kernels (DSV4_ISA, core/cpu.h) change the speed only.
  ::setenv("DSV4_ISA", "scalar", 1);
  const json d = bench_json("--threads 2");
  ::unsetenv("DSV4_ISA");
  EXPECT_EQ(d.at("kernel_isa").get<std::string>(), "scalar");
  EXPECT_EQ(d.at("gemv_isa").get<std::string>(), "scalar");
  EXPECT_EQ(checksums(a), checksums(d));
  // So do the GEMV tiles' alone (DSV4_GEMV_ISA).
  ::setenv("DSV4_GEMV_ISA", "avx2", 1);
  const json e = bench_json("--threads 2");
  ::unsetenv("DSV4_GEMV_ISA");
  EXPECT_EQ(e.at("gemv_isa").get<std::string>(), "avx2");
  EXPECT_EQ(checksums(a), checksums(e));
}

TEST(Bench, BadOptionsFailCleanly) {
  for (const std::string args : {"bench --tokens 0", "bench --tokens 12,x", "bench --gemm-shapes 1x2",
                                  "bench --preset huge", "bench --model /nonexistent/dir",
                                  "bench --model /tmp --preset tiny", "bench --threads 0", "bench --bogus 1"}) {
    auto r = run_dsv4(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find("dsv4: error:"), std::string::npos) << args << "\n" << r.output;
  }
  ::setenv("DSV4_ISA", "sse9", 1);
  auto r = run_dsv4("bench --preset tiny --tokens 16");
  ::unsetenv("DSV4_ISA");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("dsv4: error: DSV4_ISA: expected scalar, avx2, avx512 or avx512bf16, got 'sse9'"),
            std::string::npos)
      << r.output;
}

// --decode on the tiny preset: the fields, and the byte counts that do not
// depend on timing (one stream runs exactly k experts in every layer).
TEST(Bench, DecodeJson) {
  auto r = run_stdout("bench --preset tiny --decode --streams 1,2 --context 16 --decode-tokens 2 --json "
                      "--peak-seconds 0.02 --bandwidth-mb 64 --threads 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json j = json::parse(r.output, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(j.is_object()) << r.output;
  EXPECT_FALSE(j.contains("prefill"));
  EXPECT_FALSE(j.contains("gemm"));
  const double gbps = j.at("read_bandwidth_gbps").get<double>();
  EXPECT_GT(gbps, 0.0);
  EXPECT_EQ(j.at("read_bandwidth").at("buffer_bytes").get<int64_t>(), int64_t(64) << 20);
  EXPECT_EQ(j.at("kernel_isa").get<std::string>(), isa_name(kernel_isa()));
  EXPECT_EQ(j.at("gemv_isa").get<std::string>(), isa_name(gemv_isa()));
  ASSERT_TRUE(j.contains("decode") && j["decode"].is_array());
  ASSERT_EQ(j["decode"].size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const json& d = j["decode"][i];
    EXPECT_EQ(d.at("streams").get<int>(), int(i) + 1);
    EXPECT_EQ(d.at("context").get<int64_t>(), 16);
    EXPECT_EQ(d.at("steps").get<int64_t>(), 2);
    for (const char* k : {"tokens_per_second", "bandwidth_fraction", "bytes_per_step", "limit_tokens_per_second",
                          "cache_bytes_per_step", "shared_weight_bytes_per_step", "seconds"})
      EXPECT_GT(d.at(k).get<double>(), 0.0) << k;
    EXPECT_NEAR(d["bytes_per_step"].get<double>(),
                d["shared_weight_bytes_per_step"].get<double>() + d["routed_expert_bytes_per_step"].get<double>() +
                    d["cache_bytes_per_step"].get<double>(),
                1e-6 * d["bytes_per_step"].get<double>());
    EXPECT_NEAR(d["limit_tokens_per_second"].get<double>(),
                (i + 1) * gbps * 1e9 / d["bytes_per_step"].get<double>(), 1e-6 * d["limit_tokens_per_second"].get<double>());
    EXPECT_NEAR(d["bandwidth_fraction"].get<double>(),
                d["tokens_per_second"].get<double>() / d["limit_tokens_per_second"].get<double>(), 1e-9);
    // Every stage, each timed, and with "other" they make up the step.
    const json& ms = d.at("stage_ms_per_step");
    double sum = 0;
    for (const char* k : {"projections", "compressors", "indexer", "attention", "gate", "experts", "hc", "head"}) {
      EXPECT_GT(ms.at(k).get<double>(), 0.0) << k;
      sum += ms.at(k).get<double>();
    }
    sum += ms.at("other").get<double>();
    EXPECT_EQ(ms.size(), 9u);
    const double step_ms = 1e3 * d["seconds"].get<double>() / 2;
    EXPECT_NEAR(sum, step_ms, 1e-6 * step_ms);
  }
  // Tiny: 4 layers, top-2 of 8 experts, one FP4 expert 52224 bytes.
  const json& one = j["decode"][0];
  EXPECT_EQ(one["routed_expert_passes_per_step"].get<double>(), 8.0);
  EXPECT_EQ(one["routed_expert_bytes_per_step"].get<double>(), 8 * 52224.0);
  EXPECT_NEAR(one["bytes_per_step"].get<double>(), one["bytes_per_token_one_stream"].get<double>(),
              1e-2 * one["bytes_per_step"].get<double>());
  const double two = j["decode"][1]["routed_expert_passes_per_step"].get<double>();
  EXPECT_GE(two, 8.0);
  EXPECT_LE(two, 16.0);
  EXPECT_NEAR(j["decode"][1]["cache_bytes_per_step"].get<double>(), 2 * one["cache_bytes_per_step"].get<double>(),
              1e-9 * one["cache_bytes_per_step"].get<double>());
}

TEST(Bench, DecodeBadOptionsFailCleanly) {
  const std::pair<std::string, std::string> cases[] = {
      {"bench --preset tiny --decode --streams 0", "dsv4: error: --streams: expected a positive integer, got '0'"},
      {"bench --preset tiny --decode --streams 1,x", "dsv4: error: --streams: expected a positive integer, got 'x'"},
      {"bench --preset tiny --decode --context 0", "dsv4: error: --context must be in [1, 2^31], got 0"},
      {"bench --preset tiny --decode --context 65520 --decode-tokens 32",
       "dsv4: error: --context 65520: with --decode-tokens 32 and one untimed step the sessions reach 65553 "
       "positions, over the model's limit of 65536 (max_position_embeddings)"},
      {"bench --preset tiny --streams 4", "dsv4: error: --streams needs --decode"},
      {"bench --preset tiny --decode --tokens 16", "dsv4: error: --tokens cannot be combined with --decode"}};
  for (const auto& [args, want] : cases) {
    auto r = run_dsv4(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(want + "\n"), std::string::npos) << args << "\n" << r.output;
  }
}

}  // namespace
}  // namespace dsv4
