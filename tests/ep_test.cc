// Expert parallelism (PREFILL.md §4, src/dist/ep.h): `mpirun -np R dsv4
// prefill --requests` gives every request bitwise the logits and caches of a
// one-process, one-request run, whatever R and however uneven the requests;
// a rank that fails ends the whole job quickly; a rank loads only its experts.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "dist/ep.h"
#include "model/model.h"
#include "io/synthetic.h"
#include "test_util.h"

namespace dsv4 {
namespace {

using nlohmann::json;
using testing::TempDir;

struct Cmd {
  int exit_code = -1;  // -1: killed by a signal
  std::string output;  // stdout and stderr together
  double seconds = 0;
};

Cmd run_shell(const std::string& cmd) {
  const auto t0 = std::chrono::steady_clock::now();
  testing::RunResult out = testing::run_command(cmd + " 2>&1");
  Cmd r;
  r.exit_code = out.exit_code;
  r.output = std::move(out.output);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

bool have_mpirun() { return run_shell("command -v mpirun").exit_code == 0; }

// mpirun as root needs the two OMPI_ALLOW_* variables; the single-copy
// mechanism is off because containers often forbid the ptrace it relies on;
// no core binding, as the ranks share a couple of cores with the threads.
// `timeout` makes a hang a test failure (exit 124) instead of a stuck suite.
// In the ASan build, leak checking is off for the ranks only: Open MPI keeps
// allocations from MPI_Init in components it unloads, which LeakSanitizer
// reports (and cannot suppress: their frames have no module left); address
// and UB checks stay on, and every one-process run keeps leak checking.
std::string mpirun(int ranks, int timeout_s = 240) {
  return "ASAN_OPTIONS=\"${ASAN_OPTIONS:-}:detect_leaks=0\" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
         "OMPI_MCA_btl_vader_single_copy_mechanism=none timeout " + std::to_string(timeout_s) + " mpirun --oversubscribe --bind-to none -np " +
         std::to_string(ranks) + " ";
}

std::string tokens_json(const std::vector<int32_t>& t) {
  std::string s = "[";
  for (size_t i = 0; i < t.size(); ++i) s += (i ? "," : "") + std::to_string(t[i]);
  return s + "]";
}

// The JSON lines of a run that carry an "index", by index.
std::map<int64_t, json> results_by_index(const std::string& output) {
  std::map<int64_t, json> out;
  std::istringstream in(output);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] != '{') continue;
    json j = json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("index")) out[j["index"].get<int64_t>()] = j;
  }
  return out;
}

struct Reference {
  int64_t n_tokens = 0;
  int next_token = -1;
  uint64_t cache_bytes = 0;
  std::string cache_checksum;
  std::vector<uint8_t> logits_npy;  // the whole --dump-logits file
};

// One tiny synthetic model (8 experts: divisible by 1, 2 and 4), prompts of
// uneven lengths, and each prompt's one-process, one-request result.
class Ep : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new TempDir;
    SyntheticOptions o;
    o.preset = "tiny";
    o.seed = 11;
    write_synthetic_model(model_dir(), o);
    const ModelConfig c = synthetic_config(o);
    ASSERT_EQ(c.n_routed_experts % 4, 0);
    std::mt19937 rng(5);
    for (int64_t n : {1, 129, 700, 2000}) {
      std::vector<int32_t> t(static_cast<size_t>(n));
      for (auto& v : t) v = int32_t(rng() % uint32_t(c.vocab_size));
      prompts_.push_back(t);
    }
    refs_.resize(prompts_.size());
  }
  static void TearDownTestSuite() {
    delete tmp_;
    tmp_ = nullptr;
    prompts_.clear();
    refs_.clear();
  }
  void SetUp() override {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun is not installed (scripts/setup.sh installs openmpi-bin)";
  }

  static std::string model_dir() { return *tmp_ / "m"; }

  // Prompt i's one-process, one-request result (made on first use).
  static const Reference& ref(size_t i) {
    Reference& out = refs_[i];
    if (!out.logits_npy.empty()) return out;
    const std::string tf = *tmp_ / ("p" + std::to_string(i) + ".json");
    std::ofstream(tf) << tokens_json(prompts_[i]);
    const std::string lf = *tmp_ / ("ref" + std::to_string(i) + ".npy");
    const Cmd r = run_shell(std::string(DSV4_BIN) + " prefill --model " + model_dir() + " --tokens " + tf +
                            " --json --dump-logits " + lf);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    const size_t at = r.output.find('{');
    if (r.exit_code != 0 || at == std::string::npos) return out;
    const json j = json::parse(r.output.substr(at));
    out.n_tokens = j["n_tokens"].get<int64_t>();
    out.next_token = j["next_token"].get<int>();
    out.cache_bytes = j["cache_bytes"].get<uint64_t>();
    out.cache_checksum = j["cache_checksum"].get<std::string>();
    out.logits_npy = testing::read_bytes(lf);
    EXPECT_FALSE(out.logits_npy.empty());
    return out;
  }

  // Writes a request file holding the prompts `which` (in that order).
  static std::string request_file(const std::string& name, const std::vector<size_t>& which) {
    std::string s = "[";
    for (size_t i = 0; i < which.size(); ++i) s += (i ? "," : "") + tokens_json(prompts_[which[i]]);
    const std::string path = *tmp_ / name;
    std::ofstream(path) << s << "]";
    return path;
  }

  // Runs the requests `which` on `ranks` ranks and checks every result
  // against the one-process, one-request reference, bit for bit.
  static void expect_matches_single(int ranks, const std::vector<size_t>& which) {
    const std::string tag = "r" + std::to_string(ranks) + "_" + std::to_string(which.size());
    const std::string logits_dir = *tmp_ / ("logits_" + tag);
    const Cmd r = run_shell(mpirun(ranks) + DSV4_BIN + " prefill --threads 1 --model " + model_dir() +
                            " --requests " + request_file(tag + ".json", which) + " --json --ep-stats --dump-logits " +
                            logits_dir);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto got = results_by_index(r.output);
    ASSERT_EQ(got.size(), which.size()) << r.output;
    for (size_t i = 0; i < which.size(); ++i) {
      SCOPED_TRACE("R = " + std::to_string(ranks) + ", request " + std::to_string(i) + " (" +
                   std::to_string(prompts_[which[i]].size()) + " tokens)");
      const Reference& ref = Ep::ref(which[i]);
      ASSERT_FALSE(ref.logits_npy.empty()) << "no reference result";
      ASSERT_TRUE(got.count(int64_t(i))) << r.output;
      const json& j = got.at(int64_t(i));
      ASSERT_FALSE(j.contains("error")) << j.dump();
      EXPECT_EQ(j["n_tokens"].get<int64_t>(), ref.n_tokens);
      EXPECT_EQ(j["next_token"].get<int>(), ref.next_token);
      EXPECT_EQ(j["cache_bytes"].get<uint64_t>(), ref.cache_bytes);
      EXPECT_EQ(j["cache_checksum"].get<std::string>(), ref.cache_checksum);
      EXPECT_TRUE(testing::read_bytes(logits_dir + "/" + std::to_string(i) + ".npy") == ref.logits_npy)
          << "logits differ from the one-process run";
    }
    // Exactly one stats line (from rank 0): every rank took the same steps.
    const size_t at = r.output.find("{\"ep_stats\"");
    ASSERT_NE(at, std::string::npos) << r.output;
    const json st = json::parse(r.output.substr(at, r.output.find('\n', at) - at))["ep_stats"];
    EXPECT_EQ(st["ranks"].get<int>(), ranks);
    EXPECT_GT(st["steps"].get<int64_t>(), 0);
    if (ranks > 1) {
      EXPECT_GT(st["all_to_all_bytes"].get<uint64_t>(), 0u);
    } else {
      EXPECT_EQ(st["all_to_all_bytes"].get<uint64_t>(), 0u);
    }
  }

  static TempDir* tmp_;
  static std::vector<std::vector<int32_t>> prompts_;
  static std::vector<Reference> refs_;
};

TempDir* Ep::tmp_ = nullptr;
std::vector<std::vector<int32_t>> Ep::prompts_;
std::vector<Reference> Ep::refs_;

TEST_F(Ep, OneRankMatchesSingleRequestRuns) { expect_matches_single(1, {0, 1, 2, 3}); }

TEST_F(Ep, TwoRanksMatchSingleRequestRuns) { expect_matches_single(2, {3, 0, 2, 1}); }

TEST_F(Ep, FourRanksMatchSingleRequestRuns) { expect_matches_single(4, {0, 1, 2, 3}); }

// Two requests on four ranks: ranks 2 and 3 have none and still take part
// in every MoE step with zero rows.
TEST_F(Ep, FourRanksTwoRequestsIdleRanksJoin) { expect_matches_single(4, {3, 1}); }

TEST_F(Ep, ExpertsNotDivisibleByRanksIsAClearError) {
  const Cmd r = run_shell(mpirun(3, 60) + DSV4_BIN + " prefill --threads 1 --model " + model_dir() + " --requests " +
                          request_file("nd.json", {0, 1}) + " --json");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("8 routed experts, which is not divisible by the 3 MPI ranks"), std::string::npos)
      << r.output;
  EXPECT_LT(r.seconds, 30) << r.output;
}

// Rank 1 gets a checkpoint path that does not exist, then one whose shard is
// truncated: the job ends non-zero with rank 1's message, promptly, while
// the other ranks are already waiting in the first collective.
TEST_F(Ep, BrokenCheckpointOnOneRankEndsTheJob) {
  const std::string broken = *tmp_ / "broken";
  std::filesystem::create_directories(broken);
  for (const auto& e : std::filesystem::directory_iterator(model_dir()))
    std::filesystem::copy_file(e.path(), std::filesystem::path(broken) / e.path().filename());
  for (const auto& e : std::filesystem::directory_iterator(broken))
    if (e.path().filename().string().find("-00002-of-") != std::string::npos)
      std::filesystem::resize_file(e.path(), std::filesystem::file_size(e.path()) / 2);
  const std::string reqs = request_file("bc.json", {1, 2, 0});
  for (const std::string& bad : {std::string("/nonexistent/dsv4-model"), broken}) {
    SCOPED_TRACE(bad);
    const std::string cmd = mpirun(2, 60) + "sh -c 'if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then M=" + bad +
                            "; else M=" + model_dir() + "; fi; exec " + DSV4_BIN +
                            " prefill --threads 1 --model \"$M\" --requests " + reqs + " --json'";
    const Cmd r = run_shell(cmd);
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.exit_code, 124) << "the job hung until timeout killed it\n" << r.output;
    EXPECT_NE(r.output.find("dsv4: error: "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(bad), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("(rank 1)"), std::string::npos) << r.output;
    EXPECT_LT(r.seconds, 30) << r.output;
  }
}

// dsv4 bench under mpirun: per prompt length the R = 1 and the R-rank times,
// the speed-up, the all-to-all traffic per MoE step, and a bitwise check of
// every request's logits and caches between the two.
TEST_F(Ep, BenchReportsStepsTrafficAndSpeedup) {
  const Cmd r = run_shell(mpirun(2, 120) + DSV4_BIN + " bench --threads 1 --model " + model_dir() +
                          " --tokens 64,200 --chunk-tokens 128 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json j = json::parse(r.output.substr(r.output.find("{\"")), nullptr, false);
  ASSERT_TRUE(j.is_object()) << r.output;
  EXPECT_EQ(j["ranks"], 2);
  ASSERT_EQ(j["prefill_ep"].size(), 2u) << r.output;
  const ModelConfig c = ModelConfig::load(model_dir() + "/config.json");
  for (const json& p : j["prefill_ep"]) {
    const int64_t n = p["n_tokens"].get<int64_t>();
    EXPECT_TRUE(p["results_identical"].get<bool>()) << p.dump();
    // One MoE step per layer and chunk round.
    EXPECT_EQ(p["steps"].get<int64_t>(), c.num_hidden_layers * ((n + 127) / 128)) << p.dump();
    EXPECT_EQ(p["per_step"].size(), size_t(p["steps"].get<int64_t>()));
    EXPECT_GT(p["all_to_all_bytes_per_step"].get<double>(), 0) << p.dump();
    EXPECT_GT(p["seconds_r1"].get<double>(), 0);
    EXPECT_GT(p["speedup"].get<double>(), 0);
  }
  const Cmd bad = run_shell(mpirun(2, 60) + DSV4_BIN + " bench --preset tiny --tokens 64");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("needs --model DIR"), std::string::npos) << bad.output;
}

// A request that does not get its cache pages on its rank is a result (its
// error, exit code 2), not an abort: the other requests still complete, and
// rank 0 prints every result.
TEST_F(Ep, PoolExhaustionIsReportedPerRequest) {
  // 1 MiB per rank holds the 1-token request but not the 2000-token one.
  const Cmd r = run_shell(mpirun(2, 60) + DSV4_BIN + " prefill --threads 1 --cache-pool-mb 1 --model " + model_dir() +
                          " --requests " + request_file("pool.json", {0, 3}) + " --json");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  const auto got = results_by_index(r.output);
  ASSERT_EQ(got.size(), 2u) << r.output;
  EXPECT_FALSE(got.at(0).contains("error")) << r.output;
  EXPECT_EQ(got.at(0)["cache_checksum"].get<std::string>(), ref(0).cache_checksum);
  ASSERT_TRUE(got.at(1).contains("error")) << r.output;
  EXPECT_NE(got.at(1)["error"].get<std::string>().find("--cache-pool-mb"), std::string::npos) << r.output;
}

// Partial loading: a rank's model holds its experts only and never looks at
// the others' tensors (here they are missing from the checkpoint).
TEST(EpLoad, RankLoadsOnlyItsExperts) {
  TempDir tmp;
  SyntheticOptions o;
  o.seed = 3;
  write_synthetic_model(tmp / "full", o);
  const ModelConfig c = synthetic_config(o);
  const ExpertRange held = dist::expert_range(c.n_routed_experts, 1, 2);
  EXPECT_EQ(held.begin, c.n_routed_experts / 2);
  EXPECT_EQ(held.end, c.n_routed_experts);
  {
    Checkpoint full = Checkpoint::open(tmp / "full");
    SafetensorsWriter w;
    size_t dropped = 0;
    for (const auto& [name, t] : full.tensors()) {
      if (!dist::holds_tensor(name, held)) {
        ++dropped;
        continue;
      }
      w.add(name, t.dtype, t.shape, std::vector<uint8_t>(t.data, t.data + t.nbytes));
    }
    EXPECT_GT(dropped, 0u);
    w.write_dir(tmp / "half", 2);
    std::filesystem::copy_file(tmp / "full/config.json", tmp / "half/config.json");
  }
  EXPECT_THROW(Model::load(tmp / "half"), Error);
  auto m = Model::load(tmp / "half", held);
  EXPECT_EQ(m->experts.begin, held.begin);
  EXPECT_EQ(m->experts.end, held.end);
  for (const LayerWeights& l : m->weights.layers) {
    ASSERT_EQ(int64_t(l.ffn.experts.size()), c.n_routed_experts);
    for (int64_t e = 0; e < c.n_routed_experts; ++e)
      EXPECT_EQ(l.ffn.experts[size_t(e)].w1.data != nullptr, e >= held.begin) << "expert " << e;
  }
  EXPECT_THROW(dist::expert_range(c.n_routed_experts, 0, 3), Error);
  EXPECT_TRUE(dist::holds_tensor("layers.0.ffn.experts.7.w1.weight", held));
  EXPECT_FALSE(dist::holds_tensor("layers.0.ffn.experts.1.w1.weight", held));
  EXPECT_TRUE(dist::holds_tensor("layers.0.ffn.shared_experts.w1.weight", held));
  EXPECT_EQ(dist::requests_of_rank(7, 1, 3), (std::vector<int64_t>{1, 4}));
}

}  // namespace
}  // namespace dsv4
