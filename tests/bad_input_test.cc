// Hostile inputs (docs/ERRORS.md): the rows of the bad-input matrix that other
// files do not already cover, and the replay of the fuzzers' regression
// inputs. Every bad input must end `dsv4` with exit code 2 and one line
// `dsv4: error: ...` naming the file, tensor or field; never a signal, and
// never a partial output file.
//
// Rows covered elsewhere (see docs/ERRORS.md): header length beyond the file,
// overlapping / out-of-range offsets, dtype / shape / byte-size mismatches
// (checkpoint_test.cc: ParseSafetensors.*, Corrupt.*), structural config
// errors as a library call (config_test.cc: Config.RejectsBrokenStructure),
// token ids out of range, empty and over-long prompts
// (cli_test.cc: PromptLimits.BadPromptsFailCleanly), cache pool exhaustion
// (tiling_test.cc: CachePool.*).
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "../fuzz/targets.h"
#include "core/error.h"
#include "io/npy.h"
#include "io/safetensors.h"
#include "io/token_list.h"
#include "io/weight_check.h"
#include "io/synthetic.h"
#include "test_util.h"

extern char** environ;

namespace dsv4 {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::TempDir;

// ---- Running dsv4 without a shell ---------------------------------------------------

struct Outcome {
  int code = -1;    // the exit code, or -1 when killed by a signal
  int signal = 0;   // the signal that killed it
  std::string err;  // stderr (stdout goes to /dev/null)
  std::string describe() const {
    return (signal ? "signal " + std::to_string(signal) : "exit " + std::to_string(code)) + ", stderr: " + err;
  }
};

// Starts `dsv4 args...`; its stderr goes to `err_path`. Returns the pid.
pid_t spawn_dsv4(const std::vector<std::string>& args, const std::string& err_path) {
  std::vector<std::string> all = {DSV4_BIN};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& s : all) argv.push_back(s.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, DSV4_BIN, &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  return rc == 0 ? pid : -1;
}

Outcome wait_dsv4(pid_t pid, const std::string& err_path) {
  Outcome o;
  int st = 0;
  if (pid > 0 && waitpid(pid, &st, 0) == pid) {
    if (WIFEXITED(st)) o.code = WEXITSTATUS(st);
    if (WIFSIGNALED(st)) o.signal = WTERMSIG(st);
  }
  std::ifstream f(err_path);
  o.err.assign(std::istreambuf_iterator<char>(f), {});
  return o;
}

Outcome run(const TempDir& tmp, const std::vector<std::string>& args) {
  const std::string err = tmp / "stderr.txt";
  return wait_dsv4(spawn_dsv4(args, err), err);
}

// Exit code 2, no signal, exactly one line "dsv4: error: ..." holding every needle.
void expect_clean_error(const Outcome& o, const std::vector<std::string>& needles) {
  EXPECT_EQ(o.signal, 0) << o.describe();
  EXPECT_EQ(o.code, 2) << o.describe();
  EXPECT_EQ(o.err.rfind("dsv4: error: ", 0), 0u) << o.describe();
  EXPECT_EQ(std::count(o.err.begin(), o.err.end(), '\n'), 1) << o.describe();
  for (const std::string& n : needles) EXPECT_NE(o.err.find(n), std::string::npos) << "'" << n << "' not in " << o.describe();
}

// ---- Files ------------------------------------------------------------------------------

using dsv4::testing::read_bytes;
using dsv4::testing::write_bytes;

// A single-file tiny synthetic model in tmp/name (config.json + model.safetensors).
std::string tiny_model(const TempDir& tmp, const std::string& name = "m") {
  SyntheticOptions o;
  o.preset = "tiny";
  o.seed = 3;
  o.shards = 1;
  write_synthetic_model(tmp / name, o);
  return tmp / name;
}

// Where tensor `name` of a safetensors file starts (absolute file offset) and its byte size.
std::pair<size_t, size_t> tensor_range(const std::string& file, const std::string& name) {
  const auto b = read_bytes(file);
  auto views = parse_safetensors(b.data(), b.size(), file);
  for (const TensorView& v : views)
    if (v.name == name) return {size_t(v.data - b.data()), v.nbytes};
  ADD_FAILURE() << "no tensor " << name;
  return {0, 0};
}

// Overwrites `bytes` at element `index` (of width bytes.size()) of a tensor.
void poke(const std::string& file, const std::string& tensor, size_t index, const std::vector<uint8_t>& bytes) {
  auto [off, n] = tensor_range(file, tensor);
  ASSERT_LE((index + 1) * bytes.size(), n);
  auto b = read_bytes(file);
  std::copy(bytes.begin(), bytes.end(), b.begin() + std::ptrdiff_t(off + index * bytes.size()));
  write_bytes(file, b);
}

// Writes a safetensors header of `header_len` bytes whose first bytes are
// garbage; the rest of the file is a hole (sparse), so the file is cheap.
void write_garbage_header(const std::string& path, uint64_t header_len) {
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = uint8_t(header_len >> (8 * i));
    f.write(reinterpret_cast<const char*>(len), 8);
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < 4096; ++i) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      f.put(char(s >> 56));
    }
  }
  fs::resize_file(path, 8 + header_len + 64);
}

// ---- Header of 100 MB of garbage -------------------------------------------------------------

// Fails fast and without reading or allocating the header: a length over the
// format's limit is refused before anything else, and garbage under the
// limit fails at its first byte (the header is parsed in place, not copied).
TEST(BadInput, HundredMegabyteGarbageHeaderFailsFast) {
  TempDir tmp;
  const std::string dir = tiny_model(tmp);
  const std::string file = dir + "/model.safetensors";
  // The baseline: the same failure with a 4 KB header. Peak RSS of the
  // children (getrusage, KiB) only grows, so after the runs below it is
  // max(baseline, their peak).
  write_garbage_header(file, 4096);
  expect_clean_error(run(tmp, {"prefill", "--model", dir, "--prompt", "hi"}), {file, "not valid JSON"});
  rusage base{};
  getrusage(RUSAGE_CHILDREN, &base);
  for (uint64_t len : {uint64_t(100) << 20, uint64_t(99'000'000)}) {
    write_garbage_header(file, len);
    const auto t0 = std::chrono::steady_clock::now();
    const Outcome o = run(tmp, {"prefill", "--model", dir, "--prompt", "hi"});
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rusage after{};
    getrusage(RUSAGE_CHILDREN, &after);
    expect_clean_error(o, {file, len > kMaxSafetensorsHeader ? "exceeds the limit" : "not valid JSON"});
    EXPECT_LT(secs, 20.0) << "len " << len;  // generous for sanitizer builds; ~0.1 s in Release
    // Far below the ~100 MB a copy of the header (or reading it) would add.
    EXPECT_LT(after.ru_maxrss, base.ru_maxrss + 32 * 1024) << "len " << len;
  }
  // The in-memory parser agrees, on a buffer that only pretends to be long.
  std::vector<uint8_t> b(16, 'x');
  const uint64_t n = kMaxSafetensorsHeader + 1;
  for (int i = 0; i < 8; ++i) b[size_t(i)] = uint8_t(n >> (8 * i));
  b.resize(8 + n);  // zero-filled, never read
  try {
    parse_safetensors(b.data(), b.size(), "mem");
    ADD_FAILURE() << "accepted an over-long header";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exceeds the limit"), std::string::npos) << e.what();
  }
}

// ---- NaN / Inf in weights --------------------------------------------------------------------

struct NanCase {
  std::string tensor;
  size_t index;
  std::vector<uint8_t> bytes;  // one element, little-endian
  std::string value;           // as named in the message
};

const std::vector<NanCase>& nan_cases() {
  static const std::vector<NanCase> cases = {
      {"norm.weight", 5, {0xc0, 0x7f}, "NaN"},                                // BF16 NaN
      {"layers.1.hc_attn_fn", 17, {0x00, 0x00, 0x80, 0xff}, "-Inf"},          // F32 -Inf
      {"layers.0.attn.wq_a.weight", 100, {0x7f}, "NaN"},                      // F8_E4M3 NaN
      {"layers.2.ffn.experts.3.w2.scale", 0, {0xff}, "NaN"},                  // F8_E8M0 NaN
      {"embed.weight", 256 * 'h' + 1, {0x80, 0x7f}, "Inf"},                   // BF16 Inf, row of 'h'
  };
  return cases;
}

TEST(BadInput, NonFiniteWeightsFailWithCheckWeights) {
  TempDir tmp;
  const std::string clean = tiny_model(tmp, "clean");
  // A valid model passes the scan.
  Outcome ok = run(tmp, {"prefill", "--model", clean, "--prompt", "hi", "--check-weights"});
  EXPECT_EQ(ok.code, 0) << ok.describe();
  for (const NanCase& c : nan_cases()) {
    const std::string dir = tiny_model(tmp, "bad");
    const std::string file = dir + "/model.safetensors";
    poke(file, c.tensor, c.index, c.bytes);
    const std::string out = tmp / "logits.npy";
    const Outcome o = run(tmp, {"prefill", "--model", dir, "--prompt", "hi", "--check-weights", "--dump-logits", out});
    expect_clean_error(o, {file, "'" + c.tensor + "'", c.value + " at element " + std::to_string(c.index)});
    EXPECT_FALSE(fs::exists(out)) << c.tensor << ": a failed run left an output file";
  }
}

TEST(BadInput, NonFiniteWeightsPropagateWithoutTheFlag) {
  TempDir tmp;
  for (const NanCase& c : nan_cases()) {
    const std::string dir = tiny_model(tmp, "bad");
    poke(dir + "/model.safetensors", c.tensor, c.index, c.bytes);
    const std::string out = tmp / "logits.npy";
    const Outcome o = run(tmp, {"prefill", "--model", dir, "--prompt", "hi", "--dump-logits", out, "--json"});
    EXPECT_EQ(o.signal, 0) << c.tensor << ": " << o.describe();
    EXPECT_EQ(o.code, 0) << c.tensor << ": " << o.describe();
    NpyArray l = read_npy(out);
    ASSERT_EQ(l.data.size(), 1024u);
    fs::remove(out);
  }
  // The same through the library: the scan names the tensor, a clean model has none.
  const std::string dir = tiny_model(tmp, "lib");
  EXPECT_NO_THROW(check_weights_finite(Checkpoint::open(dir)));
  poke(dir + "/model.safetensors", "layers.3.attn.attn_sink", 2, {0x00, 0x00, 0xc0, 0x7f});
  try {
    check_weights_finite(Checkpoint::open(dir));
    ADD_FAILURE() << "a NaN attn_sink passed the scan";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'layers.3.attn.attn_sink' holds a non-finite value (NaN at element 2"),
              std::string::npos)
        << e.what();
  }
}

// ---- Config values that break the structure, through the binary ------------------------------

TEST(BadInput, StructuralConfigErrorsThroughTheCli) {
  TempDir tmp;
  const std::string dir = tiny_model(tmp);
  const std::string cfg = dir + "/config.json";
  const json orig = json::parse(std::ifstream(cfg));
  struct Row {
    std::string field;
    std::function<void(json&)> edit;
  };
  const Row rows[] = {
      {"head_dim", [](json& j) { j["head_dim"] = 160; }},  // head_dim - qk_rope_head_dim = 96, not a multiple of 64
      {"qk_rope_head_dim", [](json& j) { j["qk_rope_head_dim"] = 63; }},
      {"compress_ratios", [](json& j) { j["compress_ratios"] = {0, 4}; }},
      {"compress_ratios", [](json& j) { j["compress_ratios"] = {0, 4, 128, 4, 0, 0, 0}; }},
      {"n_routed_experts", [](json& j) { j["n_routed_experts"] = 0; }},
      {"num_experts_per_tok", [](json& j) { j["num_experts_per_tok"] = 9; }},  // 8 experts
      {"o_groups", [](json& j) { j["o_groups"] = 0; }},
      {"vocab_size", [](json& j) { j["vocab_size"] = "1024"; }},
      {"hidden_size", [](json& j) { j.erase("hidden_size"); }},
  };
  for (const Row& r : rows) {
    json j = orig;
    r.edit(j);
    std::ofstream(cfg) << j.dump(2);
    expect_clean_error(run(tmp, {"prefill", "--model", dir, "--prompt", "hi"}), {cfg, "'" + r.field + "'"});
  }
  // A config that validates but does not match the tensors names the tensor.
  json j = orig;
  j["n_routed_experts"] = 16;
  std::ofstream(cfg) << j.dump(2);
  expect_clean_error(run(tmp, {"prefill", "--model", dir, "--prompt", "hi"}), {"tensor '", "layers.0.ffn.gate"});
  std::ofstream(cfg) << "{\"hidden_size\": 256,";
  expect_clean_error(run(tmp, {"prefill", "--model", dir, "--prompt", "hi"}), {cfg, "invalid JSON"});
  // A directory where config.json should be is named as such.
  std::filesystem::remove(cfg);
  std::filesystem::create_directory(cfg);
  expect_clean_error(run(tmp, {"prefill", "--model", dir, "--prompt", "hi"}), {cfg, "is a directory, not a config"});
}

// A dump that cannot be written leaves nothing behind (it is written under a
// temporary name and renamed only when complete).
TEST(BadInput, NpyThatCannotBeWrittenLeavesNoFile) {
  TempDir tmp;
  const std::string target = tmp / "out.npy";
  std::filesystem::create_directory(target);  // rename onto a directory fails
  const float v[3] = {1, 2, 3};
  try {
    write_npy(target, v, {3});
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(target), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(target + ".partial"));
  write_npy(tmp / "ok.npy", v, {3});
  EXPECT_EQ(read_npy(tmp / "ok.npy").data, std::vector<float>(v, v + 3));
  EXPECT_FALSE(std::filesystem::exists(tmp / "ok.npy.partial"));
}

// ---- Token lists ----------------------------------------------------------------------------

TEST(BadInput, TokenListsBeyondInt32OddJsonAndOverMaxPosition) {
  TempDir tmp;
  const std::string dir = tiny_model(tmp);
  const std::pair<std::string, std::string> rows[] = {
      {"[0, 18446744073709551615]", "token 1 = 18446744073709551615 is out of range"},
      {"[0, 2147483648]", "token 1 = 2147483648 is out of range"},
      {"[0, 1.5]", "element 1 is not an integer"},
      {"[0, [1]]", "element 1 is not an integer"},
      {"", "invalid JSON at line 1, column 1: unexpected end of input"},
      {"[0, 1", "invalid JSON at line 1, column 6: unexpected end of input"},
      {"[0, 1024]", "vocab_size"},
  };
  for (const auto& [text, needle] : rows) {
    std::ofstream(tmp / "t.json") << text;
    expect_clean_error(run(tmp, {"prefill", "--model", dir, "--tokens", tmp / "t.json"}), {needle});
  }
  // Over max_position_embeddings (4096 in the golden tiny-a) without --max-prompt.
  std::string ids = "[0";
  for (int i = 1; i < 4097; ++i) ids += "," + std::to_string(i % 1000);
  std::ofstream(tmp / "long.json") << ids << "]";
  expect_clean_error(run(tmp, {"prefill", "--model", testing::golden_dir(), "--tokens", tmp / "long.json"}),
                     {"request of 4097 tokens", "limit of 4096"});
  // The reader itself, as the CLI uses it.
  EXPECT_EQ(parse_token_list("[0, 5, 2147483647]", "x"), (std::vector<int32_t>{0, 5, 2147483647}));
  EXPECT_THROW(parse_token_list("[-1]", "x"), Error);
}

// ---- Cache pool exhaustion leaves nothing behind ---------------------------------------------

TEST(BadInput, FullPoolIsOneLineAndLeavesNoOutput) {
  TempDir tmp;
  const std::string dir = tiny_model(tmp);
  std::string ids = "[0";
  for (int i = 1; i < 3000; ++i) ids += "," + std::to_string(3 + i % 1000);
  std::ofstream(tmp / "p.json") << ids << "]";
  const std::string out = tmp / "logits.npy";
  expect_clean_error(run(tmp, {"prefill", "--model", dir, "--tokens", tmp / "p.json", "--cache-pool-mb", "1",
                               "--dump-logits", out}),
                     {"cache pool exhausted"});
  EXPECT_FALSE(fs::exists(out));
}

// ---- Unreadable files -----------------------------------------------------------------------

// Root (as in CI) can read any file whatever its mode, so "unreadable" is
// made by putting a directory where a file is expected, which fails for
// root too; the chmod 000 case is the test below.
TEST(BadInput, DirectoriesWhereFilesAreExpected) {
  TempDir tmp;
  const std::string dir = tiny_model(tmp);
  {  // config.json
    fs::rename(dir + "/config.json", dir + "/config.bak");
    fs::create_directory(dir + "/config.json");
    expect_clean_error(run(tmp, {"prefill", "--model", dir, "--prompt", "hi"}), {dir + "/config.json"});
    fs::remove(dir + "/config.json");
    fs::rename(dir + "/config.bak", dir + "/config.json");
  }
  {  // the single-file checkpoint
    fs::rename(dir + "/model.safetensors", dir + "/model.bak");
    fs::create_directory(dir + "/model.safetensors");
    expect_clean_error(run(tmp, {"prefill", "--model", dir, "--prompt", "hi"}),
                       {dir + "/model.safetensors", "not a regular file"});
    fs::remove(dir + "/model.safetensors");
    fs::rename(dir + "/model.bak", dir + "/model.safetensors");
  }
  {  // a shard named by the index, and the index itself
    SyntheticOptions o;
    o.shards = 2;
    write_synthetic_model(tmp / "s", o);
    const std::string shard = tmp / "s/model-00002-of-00002.safetensors";
    fs::remove(shard);
    fs::create_directory(shard);
    expect_clean_error(run(tmp, {"prefill", "--model", tmp / "s", "--prompt", "hi"}), {shard, "not a regular file"});
    const std::string index = tmp / "s/model.safetensors.index.json";
    fs::remove(index);
    fs::create_directory(index);
    expect_clean_error(run(tmp, {"prefill", "--model", tmp / "s", "--prompt", "hi"}), {index});
  }
  fs::create_directory(tmp / "tokens.json");
  expect_clean_error(run(tmp, {"prefill", "--model", dir, "--tokens", tmp / "tokens.json"}), {tmp / "tokens.json"});
  fs::create_directory(tmp / "teacher.npy");
  expect_clean_error(run(tmp, {"prefill", "--model", dir, "--prompt", "hi", "--teacher-force", tmp / "teacher.npy"}),
                     {tmp / "teacher.npy"});
  expect_clean_error(run(tmp, {"prefill", "--model", tmp / "nowhere", "--prompt", "hi"}), {tmp / "nowhere"});
  std::ofstream(tmp / "plain") << "x";
  expect_clean_error(run(tmp, {"prefill", "--model", tmp / "plain", "--prompt", "hi"}), {tmp / "plain"});
}

TEST(BadInput, PermissionDeniedFiles) {
  if (geteuid() == 0) GTEST_SKIP() << "running as root, which reads files whatever their mode (CI runs as root); "
                                      "BadInput.DirectoriesWhereFilesAreExpected covers unreadable files there";
  TempDir tmp;
  const std::string dir = tiny_model(tmp);
  for (const std::string name : {"config.json", "model.safetensors"}) {
    const std::string f = dir + "/" + name;
    fs::permissions(f, fs::perms::none);
    expect_clean_error(run(tmp, {"prefill", "--model", dir, "--prompt", "hi"}), {f});
    fs::permissions(f, fs::perms::owner_read | fs::perms::owner_write);
  }
}

// ---- A checkpoint truncated while mapped ------------------------------------------------------

// dsv4 maps the checkpoint at load and reads the weights during the forward.
// The shard is truncated between the two: --teacher-force reads a FIFO after
// Model::load, so the test truncates the file once dsv4 has opened the FIFO
// (the model is loaded), then lets it go on. The next read of a vanished page
// raises SIGBUS, which the CLI turns into one line and exit code 2.
TEST(BadInput, CheckpointTruncatedWhileMappedIsACleanSigbusError) {
  TempDir tmp;
  const std::string dir = tiny_model(tmp);
  const std::string file = dir + "/model.safetensors";
  SyntheticOptions so;
  const ModelConfig c = synthetic_config(so);
  const int64_t N = 3;  // BOS, 'h', 'i'
  std::vector<float> teacher(size_t(c.num_hidden_layers * N * c.hc_mult * c.hidden_size), 0.25f);
  write_npy(tmp / "t.npy", teacher.data(), {c.num_hidden_layers, N, c.hc_mult, c.hidden_size});
  const auto npy = read_bytes(tmp / "t.npy");
  const std::string fifo = tmp / "teacher.fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  signal(SIGPIPE, SIG_IGN);  // a write to a FIFO whose reader died fails with EPIPE instead

  const std::string err = tmp / "stderr.txt";
  const pid_t pid =
      spawn_dsv4({"prefill", "--model", dir, "--prompt", "hi", "--threads", "2", "--teacher-force", fifo}, err);
  ASSERT_GT(pid, 0);
  // Wait for the reader: opening a FIFO's write end without blocking fails
  // with ENXIO until a reader has it open.
  int fd = -1;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(300);
  while (fd < 0 && std::chrono::steady_clock::now() < deadline) {
    fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (fd >= 0) break;
    int st = 0;
    if (waitpid(pid, &st, WNOHANG) == pid) {
      std::ifstream f(err);
      FAIL() << "dsv4 exited before reading the FIFO: " << std::string(std::istreambuf_iterator<char>(f), {});
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (fd < 0) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    FAIL() << "dsv4 never opened the FIFO";
  }
  // The model is loaded and mapped: truncate the checkpoint under it.
  ASSERT_EQ(::truncate(file.c_str(), 0), 0) << std::strerror(errno);
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  size_t done = 0;
  while (done < npy.size()) {
    const ssize_t w = ::write(fd, npy.data() + done, npy.size() - done);
    if (w <= 0) break;  // EPIPE: the reader is gone (the outcome says why)
    done += size_t(w);
  }
  ::close(fd);
  const Outcome o = wait_dsv4(pid, err);
  expect_clean_error(o, {"checkpoint file changed or truncated while mapped (SIGBUS)", file});
}

// ---- Fuzz regressions ------------------------------------------------------------------------

// Every input a fuzzer once failed on (fuzz/regressions/<target>/) goes
// through the same entry point again; a regression aborts this test.
TEST(FuzzRegressions, ReplayThroughTheSameEntryPoints) {
  const fs::path root = fs::path(__FILE__).parent_path().parent_path() / "fuzz" / "regressions";
  ASSERT_TRUE(fs::is_directory(root)) << root;
  int replayed = 0;
  for (const std::string& target : fuzz::target_names()) {
    const fs::path d = root / target;
    if (!fs::is_directory(d)) continue;
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(d))
      if (e.is_regular_file()) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const fs::path& f : files) {
      SCOPED_TRACE(f.string());
      const auto bytes = read_bytes(f.string());
      fuzz::run_target(target, bytes.data(), bytes.size());
      ++replayed;
    }
  }
  for (const auto& e : fs::directory_iterator(root)) {
    if (!e.is_directory()) continue;
    EXPECT_NE(std::find(fuzz::target_names().begin(), fuzz::target_names().end(), e.path().filename().string()),
              fuzz::target_names().end())
        << "regressions for an unknown target: " << e.path();
  }
  EXPECT_GT(replayed, 0);
}

}  // namespace
}  // namespace dsv4
