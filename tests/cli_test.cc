// The dsv4 command end to end: prompt limits, generate, and the command line
// itself (options, help, errors).
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "io/npy.h"
#include "io/tokenizer.h"
#include "test_util.h"

namespace dsv4 {
namespace {

using testing::golden_dir;
using testing::run_dsv4;
using testing::TempDir;

std::string write_tokens(const TempDir& tmp, const std::string& name, const std::string& json) {
  std::ofstream(tmp / name) << json;
  return tmp / name;
}

// Runs dsv4 with `input` on its standard input.
testing::RunResult run_dsv4_stdin(const std::string& input, const std::string& args) {
  return testing::run_command("printf '%s' '" + input + "' | " + std::string(DSV4_BIN) + " " + args + " 2>&1");
}

void expect_clean_error(const testing::RunResult& r, const std::string& needle) {
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(needle), std::string::npos) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
}

TEST(PromptLimits, BadPromptsFailCleanly) {
  TempDir tmp;
  const std::string m = " --model " + golden_dir();
  expect_clean_error(run_dsv4("prefill" + m + " --tokens " + write_tokens(tmp, "e.json", "[]")), "empty");
  expect_clean_error(run_dsv4("prefill" + m + " --tokens " + write_tokens(tmp, "v.json", "[0, 5, 1024]")),
                     "vocab_size");
  expect_clean_error(run_dsv4("prefill" + m + " --tokens " + write_tokens(tmp, "n.json", "[0, -3]")), "out of range");
  expect_clean_error(run_dsv4("prefill" + m + " --max-prompt 4 --tokens " +
                              write_tokens(tmp, "l.json", "[0, 1, 2, 3, 4]")),
                     "limit of 4");
  expect_clean_error(run_dsv4("prefill" + m + " --tokens " + write_tokens(tmp, "j.json", "{\"a\": 1}")), "JSON array");
  expect_clean_error(run_dsv4("generate" + m + " --max-prompt 6 --max-new-tokens 4 --tokens " +
                              write_tokens(tmp, "g.json", "[0, 1, 2, 3]")),
                     "limit of 6");
}

// Row i of --dump-logits-all equals the logits of a prefill of the prompt
// plus the first i generated tokens.
TEST(Generate, LogitsRowsMatchPrefills) {
  TempDir tmp;
  std::vector<int> prompt = {0, 17, 300, 5, 999, 42, 7};
  std::string js = "[";
  for (size_t i = 0; i < prompt.size(); ++i) js += (i ? "," : "") + std::to_string(prompt[i]);
  auto r = run_dsv4("generate --model " + golden_dir() + " --tokens " + write_tokens(tmp, "p.json", js + "]") +
                    " --max-new-tokens 4 --ignore-eos --tile-tokens 3 --json --dump-logits-all " + (tmp / "all.npy"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto pos = r.output.find("\"generated\":[");
  ASSERT_NE(pos, std::string::npos) << r.output;
  std::vector<int> gen;
  for (size_t p = pos + 13; r.output[p] != ']';) {
    size_t q = r.output.find_first_of(",]", p);
    gen.push_back(std::stoi(r.output.substr(p, q - p)));
    p = r.output[q] == ',' ? q + 1 : q;
  }
  ASSERT_EQ(gen.size(), 4u);
  NpyArray all = read_npy(tmp / "all.npy");
  ASSERT_EQ(all.shape, (std::vector<int64_t>{4, 1024}));
  std::vector<int> seq = prompt;
  for (int i = 0; i < 4; ++i) {
    std::string s = "[";
    for (size_t k = 0; k < seq.size(); ++k) s += (k ? "," : "") + std::to_string(seq[k]);
    auto pr = run_dsv4("prefill --model " + golden_dir() + " --tokens " + write_tokens(tmp, "s.json", s + "]") +
                       " --dump-logits " + (tmp / "l.npy"));
    ASSERT_EQ(pr.exit_code, 0) << pr.output;
    NpyArray l = read_npy(tmp / "l.npy");
    EXPECT_EQ(std::memcmp(l.data.data(), all.data.data() + i * 1024, 1024 * sizeof(float)), 0) << "step " << i;
    seq.push_back(gen[size_t(i)]);
  }
}

// prefill --requests: each request's logits and caches are those of its
// own run; a bad request is reported with its error and the others still run.
TEST(Requests, BatchMatchesSingleRunsAndReportsBadOnes) {
  TempDir tmp;
  const std::string m = " --model " + golden_dir();
  const std::vector<std::string> prompts = {"[0, 5, 9]", "[0, 17, 300, 5, 999, 42, 7, 8, 1, 2, 3, 4, 5, 6]", "[0]"};
  const std::string reqs = "[" + prompts[0] + ", {\"tokens\": " + prompts[1] + "}, [0, 4096], " + prompts[2] + "]";
  auto r = run_dsv4("prefill" + m + " --requests " + write_tokens(tmp, "r.json", reqs) +
                    " --tile-tokens 4 --chunk-tokens 8 --json --dump-logits " + (tmp / "out"));
  EXPECT_EQ(r.exit_code, 2) << r.output;  // request 2 has a token outside the vocabulary
  EXPECT_NE(r.output.find("\"index\":2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("vocab_size"), std::string::npos) << r.output;
  EXPECT_FALSE(std::ifstream(tmp / "out/2.npy").good());
  const size_t idx[] = {0, 1, 3};
  for (size_t j = 0; j < 3; ++j) {
    const std::string alone = tmp / ("a" + std::to_string(j) + ".npy");
    auto s = run_dsv4("prefill" + m + " --tokens " + write_tokens(tmp, "t" + std::to_string(j) + ".json", prompts[j]) +
                      " --json --dump-logits " + alone);
    ASSERT_EQ(s.exit_code, 0) << s.output;
    EXPECT_EQ(testing::read_bytes(alone), testing::read_bytes(tmp / ("out/" + std::to_string(idx[j]) + ".npy")))
        << "request " << idx[j];
    // The same cache checksum in both outputs.
    const auto one = nlohmann::json::parse(s.output.substr(s.output.find('{')));
    std::istringstream lines(r.output);
    bool found = false;
    for (std::string line; std::getline(lines, line);) {
      const auto req = nlohmann::json::parse(line, nullptr, false);
      if (req.is_discarded() || !req.is_object() || req.value("index", -1) != int(idx[j])) continue;
      found = true;
      EXPECT_EQ(req.value("cache_checksum", ""), one["cache_checksum"]) << line;
      EXPECT_EQ(req.value("next_token", -1), one["next_token"]) << line;
    }
    EXPECT_TRUE(found) << r.output;
  }
  expect_clean_error(run_dsv4("prefill" + m + " --requests " + write_tokens(tmp, "bad.json", "[{\"x\": 1}]")),
                     "request 0");
}

// ---- The command line ------------------------------------------------------------

int line_count(const std::string& s) { return int(std::count(s.begin(), s.end(), '\n')); }

TEST(CommandLine, UnknownOptionIsNamedWithTheClosestSpelling) {
  const std::string m = " --model " + golden_dir();
  expect_clean_error(run_dsv4("prefill" + m + " --prompt hi --jsn"),
                     "unknown option --jsn for 'prefill' (did you mean --json?)");
  expect_clean_error(run_dsv4("generate" + m + " --ignore-eso --prompt hi"),
                     "unknown option --ignore-eso for 'generate' (did you mean --ignore-eos?)");
  // Nothing close: no suggestion, but still unknown (not "needs a value").
  auto r = run_dsv4("prefill" + m + " --prompt hi --zzzzzz");
  expect_clean_error(r, "unknown option --zzzzzz for 'prefill'");
  EXPECT_EQ(r.output.find("did you mean"), std::string::npos) << r.output;
  // An option of another command is unknown here.
  expect_clean_error(run_dsv4("prefill" + m + " --prompt hi --max-new-tokens 3"),
                     "unknown option --max-new-tokens for 'prefill'");
}

TEST(CommandLine, UnknownOptionIsReportedBeforeTheWordAfterIt) {
  const std::string m = " --model " + golden_dir();
  expect_clean_error(run_dsv4("generate" + m + " --prompt hi --ignore-eso yes"), "unknown option --ignore-eso");
  expect_clean_error(run_dsv4("generate" + m + " --prompt hi yes"), "unexpected argument 'yes'");
  // After --, a word that looks like an option is a stray argument.
  expect_clean_error(run_dsv4("info" + m + " -- --json"), "unexpected argument '--json'");
}

TEST(CommandLine, ValueAfterEqualsSignAndShortForms) {
  const auto ref = run_dsv4("info --model " + golden_dir());
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  EXPECT_EQ(run_dsv4("info --model=" + golden_dir()).output, ref.output);
  EXPECT_EQ(run_dsv4("info -m " + golden_dir()).output, ref.output);
  // -p, -n, -t: the same generation as the long forms.
  auto generated = [](const std::string& args) {
    auto r = run_dsv4("generate --model " + golden_dir() + " --ignore-eos --json " + args);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    const auto j = nlohmann::json::parse(r.output.substr(std::min(r.output.find('{'), r.output.size())), nullptr, false);
    return j.is_object() ? j["generated"].dump() : "error: " + r.output;
  };
  const std::string want = generated("--prompt hello --max-new-tokens 3 --threads 2");
  EXPECT_EQ(nlohmann::json::parse(want).size(), 3u) << want;
  EXPECT_EQ(generated("-p hello -n 3 -t 2"), want);
  EXPECT_EQ(generated("--prompt=hello --max-new-tokens=3 --threads=2"), want);
  expect_clean_error(run_dsv4("generate --model " + golden_dir() + " -p hi -t 0"), "--threads must be in [1, 1024], got 0");
  expect_clean_error(run_dsv4("generate -m " + golden_dir() + " -p hi --json=1"), "option --json takes no value");
}

TEST(CommandLine, SeedShortForm) {
  TempDir tmp;
  for (const std::string form : {"--seed 7", "-s 7"}) {
    auto r = run_dsv4("gen-model --preset tiny --layers 2 --vocab 300 --shards 1 --out " + (tmp / form.substr(0, 2)) + " " + form);
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  const std::string shard = "/model.safetensors";
  auto a = testing::read_bytes(tmp / ("--" + shard)), b = testing::read_bytes(tmp / ("-s" + shard));
  EXPECT_FALSE(a.empty());
  EXPECT_EQ(a, b);
}

TEST(CommandLine, EachCommandHasItsOwnHelp) {
  for (const std::string h : {"--help", "-h"}) {
    auto p = run_dsv4("prefill " + h);
    EXPECT_EQ(p.exit_code, 0) << p.output;
    EXPECT_EQ(p.output.rfind("usage: dsv4 prefill", 0), 0u) << p.output;
    EXPECT_NE(p.output.find("--teacher-force IN.npy"), std::string::npos) << p.output;
    EXPECT_NE(p.output.find("-m, --model DIR"), std::string::npos) << p.output;
    EXPECT_EQ(p.output.find("--max-new-tokens"), std::string::npos) << p.output;
    auto g = run_dsv4("generate --model x " + h);
    EXPECT_EQ(g.exit_code, 0) << g.output;
    EXPECT_NE(g.output.find("-n, --max-new-tokens K"), std::string::npos) << g.output;
    EXPECT_EQ(g.output.find("--teacher-force"), std::string::npos) << g.output;
  }
  // Every help line fits in 80 columns, unless it is one word (a list of
  // GEMM shapes, the chat layout).
  for (const std::string cmd : {"prefill", "generate", "bench", "tokenize"}) {
    std::istringstream lines(run_dsv4(cmd + " --help").output);
    for (std::string line; std::getline(lines, line);) {
      if (line.find(' ', line.find_first_not_of(' ')) != std::string::npos) {
        EXPECT_LE(line.size(), 80u) << line;
      }
    }
  }
  EXPECT_EQ(run_dsv4("help generate").output, run_dsv4("generate --help").output);
}

TEST(CommandLine, BareCommandIsShortAndHelpAndVersionAreNot) {
  auto bare = run_dsv4("");
  EXPECT_EQ(bare.exit_code, 2);
  EXPECT_LT(line_count(bare.output), 20) << bare.output;
  EXPECT_NE(bare.output.find("bench-tokenizer"), std::string::npos) << bare.output;
  EXPECT_NE(bare.output.find("--help"), std::string::npos) << bare.output;
  auto help = run_dsv4("--help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.output.find("DSV4_ISA"), std::string::npos) << help.output;
  EXPECT_EQ(help.output.find("--teacher-force"), std::string::npos) << help.output;
  for (const std::string v : {"--version", "-V"}) {
    auto r = run_dsv4(v);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output.rfind("dsv4 0.", 0), 0u) << r.output;
    EXPECT_EQ(line_count(r.output), 1) << r.output;
  }
  expect_clean_error(run_dsv4("prefil"), "unknown command 'prefil' (did you mean 'prefill'?)");
}

TEST(CommandLine, RulesBetweenOptions) {
  TempDir tmp;
  const std::string m = " --model " + golden_dir();
  const std::string reqs = " --requests " + write_tokens(tmp, "r.json", "[[0, 1]]");
  expect_clean_error(run_dsv4("prefill" + m + reqs + " --top 3"), "--top cannot be combined with --requests");
  expect_clean_error(run_dsv4("prefill" + m + reqs + " --dump-hidden h.npy"),
                     "--dump-hidden cannot be combined with --requests");
  expect_clean_error(run_dsv4("prefill" + m + " --prompt hi --ep-stats"), "--ep-stats needs --requests");
  expect_clean_error(run_dsv4("generate" + m + " --prompt hi --think"), "--think needs --chat");
  expect_clean_error(run_dsv4("bench" + m + " --seed 3"), "--seed cannot be combined with --model");
}

TEST(CommandLine, ValueTakingOptionAtTheEnd) {
  const std::string m = " --model " + golden_dir();
  expect_clean_error(run_dsv4("prefill" + m + " --prompt hi --dump-logits"), "option --dump-logits needs a value");
  expect_clean_error(run_dsv4("generate" + m + " -p"), "option -p needs a value");
}

// generate's JSON object for `args` (with the golden model, ignoring eos).
nlohmann::json generate_json(const std::string& args) {
  auto r = run_dsv4("generate --model " + golden_dir() + " --prompt hello --ignore-eos --json " + args);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  auto j = nlohmann::json::parse(r.output.substr(std::min(r.output.find('{'), r.output.size())), nullptr, false);
  return j.is_object() ? j : nlohmann::json{{"error", r.output}};
}

TEST(Generate, SamplingIsReproducibleBySeed) {
  const nlohmann::json greedy = generate_json("-n 8");
  EXPECT_EQ(greedy["finish_reason"], "length");
  EXPECT_EQ(generate_json("-n 8 --temp 0")["generated"], greedy["generated"]);
  const auto a = generate_json("-n 8 --temp 0.8 --seed 7")["generated"];
  EXPECT_EQ(a.size(), 8u) << a;
  EXPECT_EQ(generate_json("-n 8 --temperature 0.8 -s 7")["generated"], a);
  EXPECT_NE(generate_json("-n 8 --temp 0.8 --seed 8")["generated"], a);
  EXPECT_NE(a, greedy["generated"]);
  // top-k 1 is greedy at any temperature.
  EXPECT_EQ(generate_json("-n 8 --temp 5 --top-k 1 --seed 3")["generated"], greedy["generated"]);
}

TEST(Generate, PenaltiesAndLogitBiasReachTheSampler) {
  const nlohmann::json greedy = generate_json("-n 6");
  const int first = greedy["generated"][0];
  EXPECT_EQ(generate_json("-n 6 --logit-bias 7=100 --logit-bias " + std::to_string(first) + "=-100")["generated"],
            nlohmann::json(std::vector<int>(6, 7)));
  EXPECT_NE(generate_json("-n 6 --logit-bias=" + std::to_string(first) + "=-100")["generated"][0], first);
  // Negative penalties favour the answer's own tokens: fewer distinct ones
  // than the greedy answer's (the same each run).
  auto distinct = [](std::vector<int> ids) {
    std::sort(ids.begin(), ids.end());
    return std::unique(ids.begin(), ids.end()) - ids.begin();
  };
  const nlohmann::json looped = generate_json("-n 24 --presence-penalty -2 --frequency-penalty -2")["generated"];
  EXPECT_LT(distinct(looped), distinct(generate_json("-n 24")["generated"])) << looped;
  EXPECT_EQ(generate_json("-n 24 --presence-penalty -2 --frequency-penalty -2")["generated"], looped);
}

// A 2-layer synthetic model with a 256-token byte-level tokenizer (id = byte).
std::string byte_model(const TempDir& tmp) {
  const std::string dir = tmp / "bytes";
  auto r = run_dsv4("gen-model --preset tiny --layers 2 --vocab 256 --shards 1 --out " + dir);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level_alphabet()[size_t(b)]] = b;
  nlohmann::json pre = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}};
  nlohmann::json tok = {
      {"version", "1.0"}, {"added_tokens", nlohmann::json::array()},
      {"normalizer", {{"type", "Sequence"}, {"normalizers", nlohmann::json::array()}}},
      {"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", {pre}}}}, {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"byte_fallback", false},
                 {"vocab", vocab}, {"merges", nlohmann::json::array()}}}};
  std::ofstream(dir + "/tokenizer.json") << tok.dump();
  return dir;
}

TEST(Generate, StopStringsCutTheText) {
  TempDir tmp;
  const std::string m = " --model " + byte_model(tmp) + " --prompt hello --ignore-eos --json -n 40";
  auto json_of = [&](const std::string& args) {
    auto r = run_dsv4("generate" + m + args);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    auto j = nlohmann::json::parse(r.output.substr(std::min(r.output.find('{'), r.output.size())), nullptr, false);
    return j.is_object() ? j : nlohmann::json{{"text", "error: " + r.output}};
  };
  const nlohmann::json full = json_of("");
  const std::string text = full["text"];
  EXPECT_EQ(full["finish_reason"], "length");
  // The last letter or digit of the text: a stop string the shell passes as it is.
  const size_t at = text.find_last_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789");
  ASSERT_NE(at, std::string::npos) << text;
  const std::string stop = text.substr(at, 1);
  const nlohmann::json j = json_of(" --stop " + stop + " --stop zzzzzzzz");
  EXPECT_EQ(j["text"], text.substr(0, text.find(stop))) << j;
  EXPECT_EQ(j["finish_reason"], "stop");
  EXPECT_LT(j["generated"].size(), 40u) << j;
  EXPECT_EQ(json_of(" --stop zzzzzzzz")["text"], text);
}

TEST(Generate, BadSamplingOptionsFailCleanly) {
  const std::string g = "generate --model " + golden_dir() + " --prompt hi ";
  expect_clean_error(run_dsv4(g + "--temp -1"), "--temp must be");
  expect_clean_error(run_dsv4(g + "--top-p 0"), "--top-p must be");
  expect_clean_error(run_dsv4(g + "--min-p 2"), "--min-p must be");
  expect_clean_error(run_dsv4(g + "--top-k -3"), "--top-k must be");
  expect_clean_error(run_dsv4(g + "--presence-penalty 3"), "--presence-penalty must be in [-2, 2]");
  expect_clean_error(run_dsv4(g + "--frequency-penalty x"), "--frequency-penalty needs a number");
  expect_clean_error(run_dsv4(g + "--logit-bias 5"), "--logit-bias takes ID=BIAS");
  expect_clean_error(run_dsv4(g + "--logit-bias 5=x"), "--logit-bias takes ID=BIAS");
  expect_clean_error(run_dsv4(g + "--logit-bias 5=200"), "must be in [-100, 100]");
  expect_clean_error(run_dsv4(g + "--logit-bias 99999999=1"), "is outside the vocabulary");
  TempDir tmp;
  ASSERT_EQ(run_dsv4("gen-model --preset tiny --layers 2 --vocab 300 --shards 1 --out " + (tmp / "m")).exit_code, 0);
  expect_clean_error(run_dsv4("generate --model " + (tmp / "m") + " --tokens " + write_tokens(tmp, "t.json", "[1,2]") +
                              " --stop x"),
                     "tokenizer.json is missing");
}

// ---- Streamed output and the speed summary --------------------------------------

// Starts `sh -c "exec CMD"` with stdout on a pipe and returns the first bytes
// that come through, with whether the process was still running then; the
// process is killed afterwards. Output that is flushed per token arrives in
// small pieces while the generation goes on; stdio's buffering of a pipe
// would hold it back to 4096 bytes or to the exit.
std::pair<std::string, bool> first_output(const std::string& cmd) {
  int fds[2];
  if (pipe(fds) != 0) return {"pipe failed", false};
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 1);
    close(fds[0]);
    close(fds[1]);
    execl("/bin/sh", "sh", "-c", ("exec " + cmd + " 2>/dev/null").c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  close(fds[1]);
  char buf[8192];
  const ssize_t n = read(fds[0], buf, sizeof buf);
  const bool running = waitpid(pid, nullptr, WNOHANG) == 0;
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  close(fds[0]);
  return {std::string(buf, size_t(std::max<ssize_t>(n, 0))), running};
}

TEST(Generate, StreamsEachTokenThroughAPipe) {
  TempDir tmp;
  // Ids (no tokenizer) and text (a byte-level tokenizer): 4000 tokens take
  // seconds, the first one milliseconds.
  for (const std::string& model : {golden_dir(), byte_model(tmp)}) {
    const auto [first, running] =
        first_output(std::string(DSV4_BIN) + " generate --model " + model + " --prompt hello --ignore-eos -n 4000");
    EXPECT_TRUE(running) << model;
    EXPECT_FALSE(first.empty()) << model;
    EXPECT_LT(first.size(), 1000u) << model << ": " << first;
  }
}

TEST(Generate, PipedTextIsTheJsonText) {
  TempDir tmp;
  const std::string args = "generate --model " + byte_model(tmp) + " --prompt hello --ignore-eos -n 60 --temp 1 -s 3";
  auto j = nlohmann::json::parse(run_dsv4(args + " --json").output, nullptr, false);
  ASSERT_TRUE(j.is_object());
  const std::string text = j["text"];
  // A byte-level model at temperature 1 makes invalid UTF-8: the stream
  // shows it as U+FFFD exactly as the whole text does.
  auto r = testing::run_command(std::string(DSV4_BIN) + " " + args + " 2>/dev/null");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.output, text + "\n");
  EXPECT_EQ(utf8_lossy(r.output), r.output);
  // The ids without a tokenizer.
  r = testing::run_command(std::string(DSV4_BIN) + " generate --model " + golden_dir() +
                           " --prompt hello --ignore-eos -n 5 2>/dev/null");
  const nlohmann::json j5 = generate_json("-n 5");
  std::string ids;
  for (const auto& id : j5["generated"]) ids += (ids.empty() ? "" : " ") + id.dump();
  EXPECT_EQ(r.output, ids + "\n");
}

TEST(Generate, SpeedSummarySeparatesPromptFirstTokenAndDecode) {
  const nlohmann::json one = generate_json("-n 1");
  EXPECT_EQ(one["decode_tokens"], 0);
  EXPECT_TRUE(one["decode_tokens_per_second"].is_null()) << one;
  EXPECT_EQ(one["prompt_tokens"], 6);  // BOS + "hello" as bytes (no tokenizer)
  const nlohmann::json three = generate_json("-n 3");
  EXPECT_EQ(three["decode_tokens"], 2);
  EXPECT_NEAR(three["decode_tokens_per_second"].get<double>() * three["decode_seconds"].get<double>(), 2.0, 1e-6);
  EXPECT_NEAR(three["prompt_tokens_per_second"].get<double>() * three["prompt_seconds"].get<double>(), 6.0, 1e-6);
  EXPECT_GE(three["time_to_first_token_seconds"].get<double>(), three["prompt_seconds"].get<double>());
  // The text summary (stderr) says the same.
  const std::string g = std::string(DSV4_BIN) + " generate --model " + golden_dir() + " --prompt hello --ignore-eos ";
  auto r = testing::run_command(g + "-n 1 2>&1 >/dev/null");
  EXPECT_NE(r.output.find("prompt: 6 tokens in "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("first token after "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("decode: 0 tokens"), std::string::npos) << r.output;
  r = testing::run_command(g + "-n 3 2>&1 >/dev/null");
  EXPECT_NE(r.output.find("decode: 2 tokens in "), std::string::npos) << r.output;
}

// One progress line on a terminal (script(1) gives the command one), none
// on a pipe.
TEST(Prefill, ProgressLineOnATerminalOnly) {
  const std::string cmd = "DSV4_PROGRESS_DELAY_MS=0 " + std::string(DSV4_BIN) + " prefill --model " + golden_dir() +
                          " --prompt 'a longer prompt than most' --tile-tokens 4 --chunk-tokens 8";
  auto r = testing::run_command("script -qec \"" + cmd + "\" /dev/null");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\rprefill: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("/26 tokens ("), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("next token: "), std::string::npos) << r.output;
  r = testing::run_command(cmd + " 2>&1");
  EXPECT_EQ(r.output.find('\r'), std::string::npos) << r.output;
  r = testing::run_command("script -qec \"" + cmd + " --json\" /dev/null");
  EXPECT_EQ(r.output.find("\rprefill: "), std::string::npos) << r.output;
}

// ---- Inputs ------------------------------------------------------------------------

TEST(Inputs, PromptFileAndStandardInput) {
  TempDir tmp;
  const std::string p = "prefill --model " + golden_dir() + " --json ";
  auto next = [&](const std::string& args) {
    auto r = run_dsv4(args);
    auto j = nlohmann::json::parse(r.output, nullptr, false);
    return j.is_object() ? j["next_token"].dump() + "/" + j["n_tokens"].dump() : "error: " + r.output;
  };
  const std::string want = next(p + "--prompt 'two words'");
  std::ofstream(tmp / "p.txt") << "two words";
  EXPECT_EQ(next(p + "--prompt-file " + (tmp / "p.txt")), want);
  EXPECT_EQ(next(p + "-f - < " + (tmp / "p.txt")), want);
  // --tokens - and --requests -: the same ids.
  std::string ids = "[0";
  for (unsigned char ch : std::string("two words")) ids += "," + std::to_string(ch);
  ids += "]";
  auto r = run_dsv4_stdin(ids, p + "--tokens -");
  auto j = nlohmann::json::parse(r.output, nullptr, false);
  EXPECT_EQ(j.is_object() ? j["next_token"].dump() + "/" + j["n_tokens"].dump() : r.output, want);
  r = run_dsv4_stdin("[" + ids + "]", "prefill --model " + golden_dir() + " --requests - --json");
  EXPECT_NE(r.output.find(want.substr(0, want.find('/'))), std::string::npos) << r.output;
  expect_clean_error(run_dsv4(p + "--prompt x --prompt-file " + (tmp / "p.txt")), "exactly one of");
  expect_clean_error(run_dsv4(p + "--prompt-file " + (tmp / "none.txt")), "none.txt: cannot open prompt file");
}

TEST(Inputs, JsonErrorsNameLineAndColumn) {
  TempDir tmp;
  const std::string p = "prefill --model " + golden_dir() + " --tokens ";
  expect_clean_error(run_dsv4(p + write_tokens(tmp, "a.json", "[1,2\n")),
                     "a.json: invalid JSON at line 1, column 5: unexpected end of input");
  expect_clean_error(run_dsv4(p + write_tokens(tmp, "b.json", "[1,\n 2,\n x]")), "b.json: invalid JSON at line 3, column");
  expect_clean_error(run_dsv4_stdin("[1 2]", p + "-"), "standard input: invalid JSON at line 1, column 4");
  expect_clean_error(run_dsv4("prefill --model " + golden_dir() + " --requests " + write_tokens(tmp, "r.json", "[[1],")),
                     "r.json: invalid JSON at line 1, column 6");
}

TEST(Inputs, FilesAndDirectoriesAreNamedAsSuch) {
  TempDir tmp;
  const std::string file = write_tokens(tmp, "t.json", "[0,1]");
  expect_clean_error(run_dsv4("prefill --model " + file + " --prompt hi"), "t.json: is a file, not a model directory");
  expect_clean_error(run_dsv4("info --model " + file), "t.json: is a file, not a model directory");
  expect_clean_error(run_dsv4("prefill --model " + (tmp / "none") + " --prompt hi"), "none: no such model directory");
  expect_clean_error(run_dsv4("prefill --model " + golden_dir() + " --tokens " + tmp.path.string()),
                     "is a directory, not a token file");
  expect_clean_error(run_dsv4("tokenize --model " + (tmp / "none") + " -p x"), "no such tokenizer file or model directory");
}

TEST(Inputs, EmptyPromptsAreRefusedAlike) {
  TempDir tmp;
  const std::string p = "prefill --model " + golden_dir();
  expect_clean_error(run_dsv4(p + " --tokens " + write_tokens(tmp, "e.json", "[]")), "prompt is empty");
  expect_clean_error(run_dsv4(p + " --prompt ''"), "prompt is empty");
  std::ofstream(tmp / "e.txt") << "";
  expect_clean_error(run_dsv4(p + " --prompt-file " + (tmp / "e.txt")), "prompt is empty");
  expect_clean_error(run_dsv4("generate --model " + golden_dir() + " --prompt ''"), "prompt is empty");
}

TEST(Inputs, ContextLimitIsNamedForWhatItLimits) {
  const std::string g = "generate --model " + golden_dir() + " --prompt hello -n 4 ";
  for (const char* o : {"--max-context 8", "-c 8", "--max-prompt 8"})
    expect_clean_error(run_dsv4(g + o), "needs 9 positions, more than the limit of 8 (--max-context");
  EXPECT_EQ(run_dsv4(g + "--max-context 9 --json").exit_code, 0);
  EXPECT_NE(run_dsv4("generate --help").output.find("prompt plus"), std::string::npos);
}

// generate --state-dir: a second run of the same prompt resumes from the
// state the first left on disk (all of the prompt but its last token) and
// gives the same tokens; a damaged state file is refused with a warning and
// the prompt is prefilled instead, with the same answer.
TEST(Generate, StateDirResumesTheSamePromptAcrossRuns) {
  TempDir tmp;
  const std::string g = "generate --model " + golden_dir() + " --prompt 'hello there' --ignore-eos -n 6 --json " +
                        "--state-dir " + (tmp / "states");
  auto first = nlohmann::json::parse(run_dsv4(g).output, nullptr, false);
  ASSERT_TRUE(first.is_object());
  EXPECT_EQ(first["cached_tokens"], 0);
  const auto again = testing::run_command(std::string(DSV4_BIN) + " " + g + " 2>/dev/null");
  auto second = nlohmann::json::parse(again.output, nullptr, false);
  ASSERT_TRUE(second.is_object()) << again.output;
  EXPECT_EQ(second["cached_tokens"], first["prompt_tokens"].get<int64_t>() - 1);
  EXPECT_EQ(second["generated"], first["generated"]);
  // Flip one byte near the end of every state file.
  for (const auto& e : std::filesystem::directory_iterator(tmp / "states")) {
    std::vector<uint8_t> b = testing::read_bytes(e.path().string());
    ASSERT_GT(b.size(), 16u);
    b[b.size() - 9] ^= 0x40;
    testing::write_bytes(e.path().string(), b);
  }
  const auto damaged = run_dsv4(g);  // stderr too: the warning comes first
  EXPECT_NE(damaged.output.find("dsv4: warning: "), std::string::npos) << damaged.output;
  auto third = nlohmann::json::parse(damaged.output.substr(damaged.output.rfind("\n{") + 1), nullptr, false);
  ASSERT_TRUE(third.is_object()) << damaged.output;
  EXPECT_EQ(third["cached_tokens"], 0);
  EXPECT_EQ(third["generated"], first["generated"]);
}

}  // namespace
}  // namespace dsv4
