// dsv4 chat end to end, on a tiny model with the real V4 vocabulary and
// tokenizer: every turn is what `generate --tokens` gives for that turn's
// whole conversation prefilled fresh, the prompt is the conversation in the
// V4 layout, and each turn's prompt continues the tokens of the last one.
#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "io/chat_format.h"
#include "io/tokenizer.h"
#include "test_util.h"

namespace dsv4 {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using nlohmann::ordered_json;
using testing::run_command;
using testing::TempDir;

// The tiny preset with the real vocabulary and the V4 tokenizer.json, made
// once for all the tests here.
class ChatCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new TempDir;
    const std::string tok = std::string(DSV4_TOKENIZER_DIR) + "/tokenizer.json";
    if (!fs::exists(tok)) return;
    tokenizer_ = Tokenizer::load(tok).release();
    made_ = testing::run_dsv4("gen-model --preset tiny --layers 2 --experts 4 --vocab 129280 --out " + model() +
                              " --tokenizer " + tok);
  }
  static void TearDownTestSuite() {
    delete tmp_;
    delete tokenizer_;
  }
  void SetUp() override {
    ASSERT_NE(tokenizer_, nullptr) << "the V4 tokenizer " DSV4_TOKENIZER_DIR "/tokenizer.json is missing: run "
                                      "bash scripts/setup.sh";
    ASSERT_EQ(made_.exit_code, 0) << made_.output;
  }
  static std::string model() { return *tmp_ / "m"; }

  // dsv4 chat with `input` on its standard input; stderr goes to err.txt.
  static testing::RunResult chat(const std::string& input, const std::string& args) {
    std::ofstream(*tmp_ / "in.txt", std::ios::binary) << input;
    return run_command(std::string(DSV4_BIN) + " chat -m " + model() + " " + args + " < " + (*tmp_ / "in.txt") +
                       " 2> " + (*tmp_ / "err.txt"));
  }
  static std::string chat_stderr() {
    const std::vector<uint8_t> b = testing::read_bytes(*tmp_ / "err.txt");
    return std::string(b.begin(), b.end());
  }

  // The turns of chat --json, one object per line.
  static std::vector<json> turns(const testing::RunResult& r) {
    std::vector<json> out;
    std::istringstream lines(r.output);
    for (std::string line; std::getline(lines, line);) out.push_back(json::parse(line));
    return out;
  }

  // generate --json of `prompt` prefilled fresh.
  static json generate(const std::vector<int32_t>& prompt, const std::string& args) {
    std::ofstream(*tmp_ / "p.json") << json(prompt).dump();
    const auto r = testing::run_dsv4("generate -m " + model() + " --json --tokens " + (*tmp_ / "p.json") + " " + args);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return json::parse(r.output, nullptr, false);
  }

  // Checks every turn against the conversation it should have rendered and
  // against a fresh generate of its prompt.
  static void check_turns(const std::vector<json>& got, ThinkingMode mode, const std::string& system,
                          const std::vector<std::string>& users, const std::string& gen_args) {
    ASSERT_EQ(got.size(), users.size());
    ordered_json messages = ordered_json::array();
    if (!system.empty()) messages.push_back({{"role", "system"}, {"content", system}});
    EncodeOptions encode;
    encode.thinking_mode = mode;
    for (size_t k = 0; k < users.size(); ++k) {
      SCOPED_TRACE("turn " + std::to_string(k + 1));
      const json& t = got[k];
      EXPECT_EQ(t["turn"], k + 1);
      messages.push_back({{"role", "user"}, {"content", users[k]}});
      const auto prompt = t["prompt"].get<std::vector<int32_t>>();
      EXPECT_EQ(t["prompt_tokens"], prompt.size());
      EXPECT_EQ(tokenizer_->decode(prompt), encode_messages(messages, encode));
      const json fresh = generate(prompt, gen_args);
      EXPECT_EQ(fresh["generated"], t["generated"]);
      EXPECT_EQ(fresh["finish_reason"], t["finish_reason"]);
      messages.push_back({{"role", "assistant"}, {"content", t["text"]}, {"reasoning_content", t["reasoning_content"]}});
    }
  }

  static TempDir* tmp_;
  static Tokenizer* tokenizer_;
  static testing::RunResult made_;
};

TempDir* ChatCli::tmp_ = nullptr;
Tokenizer* ChatCli::tokenizer_ = nullptr;
testing::RunResult ChatCli::made_;

TEST_F(ChatCli, FourTurnsThroughAPipeAreFreshGenerationsOfTheWholeConversation) {
  const std::vector<std::string> users = {"Hello", "What is a paged KV cache?", "Tell me more", "Thanks, bye"};
  const auto r = chat("Hello\nWhat is a paged KV cache?\nTell me more\nThanks, bye\n", "-n 6 --json --system 'Be brief.'");
  ASSERT_EQ(r.exit_code, 0) << r.output << chat_stderr();
  const std::vector<json> got = turns(r);
  check_turns(got, ThinkingMode::kChat, "Be brief.", users, "-n 6");
  for (size_t k = 1; k < got.size(); ++k) {
    SCOPED_TRACE("turn " + std::to_string(k + 1));
    // The answers go back as they were generated: the prompt continues the
    // last turn's prompt and answer token for token, so all of them can
    // come from the prefix cache.
    std::vector<int32_t> before = got[k - 1]["prompt"].get<std::vector<int32_t>>();
    for (int32_t id : got[k - 1]["generated"]) before.push_back(id);
    const auto prompt = got[k]["prompt"].get<std::vector<int32_t>>();
    ASSERT_GT(prompt.size(), before.size());
    EXPECT_TRUE(std::equal(before.begin(), before.end(), prompt.begin()));
    EXPECT_EQ(got[k]["cached_tokens"], int64_t(before.size()));
    EXPECT_EQ(got[k]["prefix_cache"]["lookups"], k + 1);
  }
  EXPECT_EQ(got[0]["cached_tokens"], 0);
}

TEST_F(ChatCli, SampledTurnsMatchSampledGenerations) {
  const auto r = chat("Hello\nTell me more\n", "-n 5 --temp 0.9 --top-p 0.9 --seed 11 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output << chat_stderr();
  check_turns(turns(r), ThinkingMode::kChat, "", {"Hello", "Tell me more"}, "-n 5 --temp 0.9 --top-p 0.9 --seed 11");
}

// Thinking mode: the prompt opens the reasoning, and the layout drops the
// earlier turns' reasoning (which is why the prefix cache resumes from the
// longest cached prefix, not from the whole last turn).
TEST_F(ChatCli, ThinkingModeRendersAndDropsTheEarlierReasoning) {
  const auto r = chat("Hello\nTell me more\n", "-n 6 --think --json");
  ASSERT_EQ(r.exit_code, 0) << r.output << chat_stderr();
  const std::vector<json> got = turns(r);
  check_turns(got, ThinkingMode::kThinking, "", {"Hello", "Tell me more"}, "-n 6");
  for (const json& t : got) EXPECT_EQ(t["prompt"].back(), tokenizer_->token_id(kThinkingStartToken));
  // Turn 2's prompt parts from turn 1's at its <think> (</think> there now),
  // where chat kept a state for it.
  const auto first = got[0]["prompt"].get<std::vector<int32_t>>();
  const auto second = got[1]["prompt"].get<std::vector<int32_t>>();
  ASSERT_GT(second.size(), first.size());
  EXPECT_TRUE(std::equal(first.begin(), first.end() - 1, second.begin()));
  EXPECT_EQ(second[first.size() - 1], tokenizer_->token_id(kThinkingEndToken));
  EXPECT_EQ(got[1]["cached_tokens"], int64_t(first.size()) - 1);
  EXPECT_NE(got[0]["reasoning_content"], "");  // six tokens are not enough to close it
}

// Text on stdout as it streams (the answer, then a newline), the turn's
// figures on stderr; blank lines are skipped.
TEST_F(ChatCli, StreamsTheAnswersAndSkipsBlankLines) {
  const auto j = chat("Hello\nBye\n", "-n 4 --json");
  ASSERT_EQ(j.exit_code, 0) << j.output << chat_stderr();
  const std::vector<json> want = turns(j);
  const auto r = chat("\n  \nHello\n\r\n\nBye\n", "-n 4");
  ASSERT_EQ(r.exit_code, 0) << r.output << chat_stderr();
  ASSERT_EQ(want.size(), 2u);
  EXPECT_EQ(r.output, want[0]["text"].get<std::string>() + "\n" + want[1]["text"].get<std::string>() + "\n");
  const std::string err = chat_stderr();
  for (int k = 0; k < 2; ++k) {
    const std::string line = "[turn " + std::to_string(k + 1) + ": " + want[size_t(k)]["cached_tokens"].dump() +
                             " cached + " +
                             std::to_string(want[size_t(k)]["prompt_tokens"].get<int>() -
                                            want[size_t(k)]["cached_tokens"].get<int>()) +
                             " new prompt tokens, 4 generated (length), prefill ";
    EXPECT_NE(err.find(line), std::string::npos) << err;
  }
  EXPECT_NE(err.find(" tokens/s, decode "), std::string::npos) << err;
  EXPECT_EQ(err.find("[turn 3"), std::string::npos) << err;
  EXPECT_EQ(err.find("> "), std::string::npos) << err;  // no prompt on a pipe
}

TEST_F(ChatCli, ThinkingOnAPipeComesInsideThinkTags) {
  const auto r = chat("Hello\n", "-n 4 --think");
  ASSERT_EQ(r.exit_code, 0) << r.output << chat_stderr();
  EXPECT_EQ(r.output.rfind("<think>", 0), 0u) << r.output;
  EXPECT_EQ(r.output.find("\x1b["), std::string::npos) << r.output;
}

TEST_F(ChatCli, EmptyInputEndsAtOnceAndStopStringsCutTheAnswer) {
  auto r = chat("", "-n 4");
  EXPECT_EQ(r.exit_code, 0) << chat_stderr();
  EXPECT_EQ(r.output, "");
  r = chat("Hello\n", "-n 6 --json");
  ASSERT_EQ(r.exit_code, 0) << chat_stderr();
  const std::string text = turns(r)[0]["text"];
  ASSERT_GE(text.size(), 4u);
  const std::string stop = text.substr(2, 2);
  r = chat("Hello\n", "-n 6 --json --stop '" + stop + "'");
  ASSERT_EQ(r.exit_code, 0) << chat_stderr();
  EXPECT_EQ(turns(r)[0]["text"], text.substr(0, text.find(stop)));
  EXPECT_EQ(turns(r)[0]["finish_reason"], "stop");
}

TEST(ChatCliErrors, NeedsATokenizerAndAModel) {
  auto r = run_command("echo hi | " + std::string(DSV4_BIN) + " chat -m " + testing::golden_dir() + " 2>&1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("chat needs a tokenizer: " + testing::golden_dir() + "/tokenizer.json is missing"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  r = run_command("echo hi | " + std::string(DSV4_BIN) + " chat 2>&1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("chat needs --model DIR"), std::string::npos) << r.output;
  r = testing::run_dsv4("chat -m x --prefix-cache-mb -1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--prefix-cache-mb"), std::string::npos) << r.output;
}

TEST(ChatCliErrors, HelpListsEveryOption) {
  const auto r = testing::run_dsv4("chat --help");
  EXPECT_EQ(r.exit_code, 0);
  for (const char* o : {"--model", "--system", "--think", "--max-new-tokens", "--temp", "--top-k", "--top-p", "--min-p",
                        "--seed", "--stop", "--threads", "--max-context", "--json", "--prefix-cache-mb",
                        "--snapshot-every", "--state-dir"})
    EXPECT_NE(r.output.find(o), std::string::npos) << o << "\n" << r.output;
}

// generate goes through the prefix cache too, and says so in --json.
TEST(GeneratePrefixCache, JsonCarriesCachedTokensAndTheCacheCounters) {
  TempDir tmp;
  const std::string base = "generate --model " + testing::golden_dir() + " --prompt hello -n 3 --ignore-eos --json ";
  for (const std::string& extra : std::vector<std::string>{"", "--prefix-cache-mb 64", "--state-dir " + (tmp / "states")}) {
    SCOPED_TRACE(extra);
    const auto r = testing::run_dsv4(base + extra);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const json j = json::parse(r.output);
    EXPECT_EQ(j["cached_tokens"], 0);  // one request per process: nothing cached before it
    EXPECT_EQ(j["prefix_cache"]["lookups"], 1);
    for (const char* k : {"hits", "cached_tokens", "entries", "evictions", "bytes"})
      EXPECT_TRUE(j["prefix_cache"].contains(k)) << k;
  }
}

}  // namespace
}  // namespace dsv4
