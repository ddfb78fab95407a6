// The V4 prompt encoder and completion parser (src/io/chat_format.h) against
// DeepSeek's published test vectors (shared/data/chat/encode_cases.json) and
// against rules of the reference encoder (encoding_dsv4.py) that the vectors
// do not reach. The expected strings of the rule tests were derived by hand
// from reading the reference's logic (its render_message, merge_tool_messages,
// sort_tool_results_by_call_order, _drop_thinking_messages and
// parse_message_from_completion_text), not produced by running it.
#include "io/chat_format.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "core/error.h"
#include "io/tokenizer.h"
#include "test_util.h"

namespace dsv4 {
namespace {

using ojson = nlohmann::ordered_json;
using dsv4::testing::shared_dir;

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

const ojson& cases() {
  static const ojson doc = ojson::parse(slurp(shared_dir() + "/data/chat/encode_cases.json"));
  return doc;
}

EncodeOptions mode(ThinkingMode m) {
  EncodeOptions o;
  o.thinking_mode = m;
  return o;
}
const EncodeOptions kThink = mode(ThinkingMode::kThinking);
const EncodeOptions kChat = mode(ThinkingMode::kChat);

const std::string B(kBosToken);
const std::string E(kEosToken);

// ---- The published vectors ---------------------------------------------------------------

TEST(ChatFormat, OfficialVectorsByteForByte) {
  ASSERT_EQ(cases().size(), 4u);
  for (const ojson& c : cases()) {
    const EncodeOptions o = mode(parse_thinking_mode(c["thinking_mode"].get<std::string>()));
    EXPECT_EQ(encode_messages(c["messages"], o), c["expected"].get<std::string>()) << c["name"];
  }
}

const Tokenizer* v4_tokenizer() {
  static std::unique_ptr<Tokenizer> tok = [] {
    const std::string file = std::string(DSV4_TOKENIZER_DIR) + "/tokenizer.json";
    return std::filesystem::exists(file) ? Tokenizer::load(file) : nullptr;
  }();
  return tok.get();
}

size_t count(std::string_view text, std::string_view what) {
  size_t n = 0;
  for (size_t p = text.find(what); p != std::string_view::npos; p = text.find(what, p + what.size())) ++n;
  return n;
}

// Every marker of the expected prompts is one token of the V4 tokenizer, and
// the ids decode back to the text.
TEST(ChatFormat, OfficialVectorsTokenizeAndRoundTrip) {
  const Tokenizer* t = v4_tokenizer();
  ASSERT_NE(t, nullptr) << "the V4 tokenizer is missing under " << DSV4_TOKENIZER_DIR << " (scripts/setup.sh builds it)";
  for (const ojson& c : cases()) {
    const std::string text = c["expected"];
    const std::vector<int32_t> ids = t->encode(text);
    EXPECT_EQ(t->decode(ids), text) << c["name"];
    EXPECT_EQ(ids.front(), t->token_id(kBosToken)) << c["name"];
    for (std::string_view marker : {kBosToken, kEosToken, kUserToken, kAssistantToken, kThinkingStartToken,
                                    kThinkingEndToken, kDsmlToken, kLatestReminderToken}) {
      const int32_t id = t->token_id(marker);
      ASSERT_GE(id, 0) << marker;
      EXPECT_EQ(static_cast<size_t>(std::count(ids.begin(), ids.end(), id)), count(text, marker))
          << c["name"] << " " << marker;
    }
  }
}

// The reference's own test: the two assistant turns of vector 1 parse back.
TEST(ChatFormat, OfficialVectorOneParsesBack) {
  const std::string prompt = cases()[0]["expected"];
  const std::string marker = std::string(kAssistantToken) + std::string(kThinkingStartToken);
  const size_t first = prompt.find(marker) + marker.size();
  const ParsedCompletion tc =
      parse_completion(std::string_view(prompt).substr(first, prompt.find(kUserToken, first) - first), ThinkingMode::kThinking);
  EXPECT_EQ(tc.reasoning_content, "The user wants to know the weather in Beijing. I should use the get_weather tool.");
  EXPECT_EQ(tc.content, "");
  ASSERT_EQ(tc.tool_calls.size(), 1u);
  EXPECT_EQ(tc.tool_calls[0].name, "get_weather");
  EXPECT_EQ(tc.tool_calls[0].arguments, R"({"location": "Beijing", "unit": "celsius"})");
  EXPECT_EQ(tc.tool_calls[0].id, "call_0");
  EXPECT_TRUE(tc.ended);

  const ParsedCompletion last =
      parse_completion(std::string_view(prompt).substr(prompt.rfind(marker) + marker.size()), ThinkingMode::kThinking);
  EXPECT_EQ(last.reasoning_content, "Got the weather data. Let me format a nice response.");
  EXPECT_EQ(last.content, "The weather in Beijing is currently sunny with a temperature of 22°C and 45% humidity.");
  EXPECT_TRUE(last.tool_calls.empty());
}

// ---- Rules the vectors leave out -------------------------------------------------------------

ojson msgs(std::initializer_list<ojson> list) { return ojson(list); }
ojson msg(std::string role, std::string content) { return ojson{{"role", role}, {"content", content}}; }

TEST(ChatFormat, OneTurnEndsWithTheAssistantPrefix) {
  const ojson m = msgs({msg("system", "Be brief."), msg("user", "Hi")});
  EXPECT_EQ(encode_messages(m, kThink), B + "Be brief.<｜User｜>Hi<｜Assistant｜><think>");
  EXPECT_EQ(encode_messages(m, kChat), B + "Be brief.<｜User｜>Hi<｜Assistant｜></think>");
  EXPECT_EQ(encode_messages(msgs({msg("user", "Hi")}), kChat), B + "<｜User｜>Hi<｜Assistant｜></think>");
  // render_v4_chat is this encoder for one system and one user message.
  EXPECT_EQ(render_v4_chat("Be brief.", "Hi", true), encode_messages(m, kThink));
  EXPECT_EQ(render_v4_chat("", "Hi", false), encode_messages(msgs({msg("system", ""), msg("user", "Hi")}), kChat));
  EncodeOptions no_bos = kChat;
  no_bos.add_bos = false;
  EXPECT_EQ(encode_messages(m, no_bos), "Be brief.<｜User｜>Hi<｜Assistant｜></think>");
}

// "max" puts its instructions first (after the BOS) in thinking mode only;
// "high" adds nothing.
TEST(ChatFormat, ReasoningEffort) {
  const ojson m = msgs({msg("system", "S"), msg("user", "U")});
  EncodeOptions o = kThink;
  o.reasoning_effort = ReasoningEffort::kMax;
  const std::string got = encode_messages(m, o);
  ASSERT_TRUE(got.starts_with(B + "Reasoning Effort: Absolute maximum with no shortcuts permitted.\nYou MUST be very thorough"));
  EXPECT_TRUE(got.ends_with("no assumption is left unchecked.\n\nS<｜User｜>U<｜Assistant｜><think>"));
  o.reasoning_effort = ReasoningEffort::kHigh;
  EXPECT_EQ(encode_messages(m, o), encode_messages(m, kThink));
  o = kChat;
  o.reasoning_effort = ReasoningEffort::kMax;
  EXPECT_EQ(encode_messages(m, o), encode_messages(m, kChat));
  EXPECT_EQ(parse_reasoning_effort(""), ReasoningEffort::kNone);
  EXPECT_EQ(parse_reasoning_effort("max"), ReasoningEffort::kMax);
  EXPECT_THROW(parse_reasoning_effort("low"), Error);
  EXPECT_THROW(parse_thinking_mode("think"), Error);
}

ojson assistant(std::string content, std::string reasoning) {
  return ojson{{"role", "assistant"}, {"content", content}, {"reasoning_content", reasoning}};
}

// Without tools, reasoning before the last user turn is dropped and those
// turns were answered without thinking; drop_thinking=false keeps it all.
TEST(ChatFormat, ReasoningKeptOnlyAfterTheLastUserTurn) {
  const ojson m = msgs({msg("user", "A"), assistant("a", "ra"), msg("user", "B"), assistant("b", "rb"), msg("user", "C")});
  EXPECT_EQ(encode_messages(m, kThink),
            B + "<｜User｜>A<｜Assistant｜></think>a" + E + "<｜User｜>B<｜Assistant｜></think>b" + E +
                "<｜User｜>C<｜Assistant｜><think>");
  EncodeOptions keep = kThink;
  keep.drop_thinking = false;
  EXPECT_EQ(encode_messages(m, keep),
            B + "<｜User｜>A<｜Assistant｜><think>ra</think>a" + E + "<｜User｜>B<｜Assistant｜><think>rb</think>b" + E +
                "<｜User｜>C<｜Assistant｜><think>");
  // Chat mode: no reasoning at all, every turn opens with </think>.
  EXPECT_EQ(encode_messages(m, kChat), B + "<｜User｜>A<｜Assistant｜></think>a" + E + "<｜User｜>B<｜Assistant｜></think>b" +
                                           E + "<｜User｜>C<｜Assistant｜></think>");
}

ojson weather_tools() {
  return ojson::parse(R"([{"type": "function", "function": {"name": "w", "parameters": {"type": "object", "b": 1, "a": 2}}}])");
}

ojson call(std::string id, std::string name, std::string args) {
  return ojson{{"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", args}}}};
}

// Tools anywhere keep every turn's reasoning; schemas keep their key order.
TEST(ChatFormat, ToolsKeepEarlierReasoning) {
  ojson sys = msg("system", "S");
  sys["tools"] = weather_tools();
  const ojson m = msgs({sys, msg("user", "A"), assistant("a", "ra"), msg("user", "B")});
  const std::string got = encode_messages(m, kThink);
  EXPECT_NE(got.find("\n\n## Tools\n\n"), std::string::npos);
  EXPECT_NE(got.find(R"({"name": "w", "parameters": {"type": "object", "b": 1, "a": 2}})"), std::string::npos);
  EXPECT_TRUE(got.ends_with("invoke tool calls.\n<｜User｜>A<｜Assistant｜><think>ra</think>a" + E +
                            "<｜User｜>B<｜Assistant｜><think>"));
}

// Results come in the order of the calls, in one user turn, joined by blank
// lines; a user message after them joins the same turn.
TEST(ChatFormat, ToolResultsSortedAndMerged) {
  ojson a = assistant("", "r");
  a["tool_calls"] = ojson::array({call("c1", "f", R"({"x": "1"})"), call("c2", "g", R"({"y": 2})")});
  ojson t2 = msg("tool", "R2");
  t2["tool_call_id"] = "c2";
  ojson t1 = msg("tool", "R1");
  t1["tool_call_id"] = "c1";
  const ojson m = msgs({msg("user", "Q"), a, t2, t1, msg("user", "more")});
  EXPECT_EQ(encode_messages(m, kChat),
            B + "<｜User｜>Q<｜Assistant｜></think>\n\n<｜DSML｜tool_calls>\n"
                "<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"x\" string=\"true\">1</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
                "<｜DSML｜invoke name=\"g\">\n<｜DSML｜parameter name=\"y\" string=\"false\">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
                "</｜DSML｜tool_calls>" + E +
                "<｜User｜><tool_result>R1</tool_result>\n\n<tool_result>R2</tool_result>\n\nmore<｜Assistant｜></think>");
}

TEST(ChatFormat, ConsecutiveUserTurnsJoin) {
  EXPECT_EQ(encode_messages(msgs({msg("user", "a"), msg("user", "b")}), kChat), B + "<｜User｜>a\n\nb<｜Assistant｜></think>");
}

// A tool message may give content parts: text parts joined by blank lines.
TEST(ChatFormat, ToolResultParts) {
  ojson a = assistant("", "");
  a["tool_calls"] = ojson::array({call("c", "f", "{}")});
  ojson t = ojson::parse(R"({"role": "tool", "tool_call_id": "c", "content": [{"type": "text", "text": "x"}, {"type": "image"}, {"type": "text", "text": "y"}]})");
  const std::string got = encode_messages(msgs({msg("user", "Q"), a, t}), kChat);
  EXPECT_TRUE(got.ends_with("<｜DSML｜invoke name=\"f\">\n\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>" + E +
                            "<｜User｜><tool_result>x\n\n[Unsupported image]\n\ny</tool_result><｜Assistant｜></think>"))
      << got;
}

// Arguments: strings as they are, other values as Python's json.dumps writes
// them (", " and ": ", floats as repr, non-ASCII kept, control characters
// escaped); arguments that are not JSON become one string parameter.
TEST(ChatFormat, ToolCallParameters) {
  ojson a = assistant("", "");
  a["tool_calls"] = ojson::array(
      {call("c", "f", R"({"s": "é\n<", "n": 1.0, "big": 1e16, "small": 0.00001, "p": 0.0001, "x": 123.456, "i": -7, "b": true, "z": null, "o": {"k": [1, "二", "\u0001"]}})"),
       call("d", "g", "not json")});
  const std::string got = encode_messages(msgs({msg("user", "Q"), a}), kChat);
  const std::string want =
      "<｜DSML｜invoke name=\"f\">\n"
      "<｜DSML｜parameter name=\"s\" string=\"true\">é\n<</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"n\" string=\"false\">1.0</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"big\" string=\"false\">1e+16</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"small\" string=\"false\">1e-05</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"p\" string=\"false\">0.0001</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"x\" string=\"false\">123.456</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"i\" string=\"false\">-7</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"b\" string=\"false\">true</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"z\" string=\"false\">null</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"o\" string=\"false\">{\"k\": [1, \"二\", \"\\u0001\"]}</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n"
      "<｜DSML｜invoke name=\"g\">\n"
      "<｜DSML｜parameter name=\"arguments\" string=\"true\">not json</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>";
  EXPECT_NE(got.find(want), std::string::npos) << got;

  // More of Python's float repr: positional up to 1e16, two-digit exponents.
  a["tool_calls"] = ojson::array({call("c", "f", R"({"a": [1e15, -0.0, 2.5e-7, 1.5e300, 0.1, 1E2, 12345678901234567890]})")});
  EXPECT_NE(encode_messages(msgs({msg("user", "Q"), a}), kChat)
                .find("[1000000000000000.0, -0.0, 2.5e-07, 1.5e+300, 0.1, 100.0, 12345678901234567890]"),
            std::string::npos);
}

// The opening a required tool call is forced to write is the encoder's own
// (an assistant turn that only calls renders it right after </think>), and
// the parser takes a completion that starts with it as a call.
TEST(ChatFormat, ToolCallOpeningIsTheEncodersAndParses) {
  ojson a = assistant("", "");
  a["tool_calls"] = ojson::array({call("c", "get_time", R"({"tz": "UTC"})")});
  const std::string rendered = encode_messages(msgs({msg("user", "Q"), a}), kChat);
  const std::string after_think = std::string(kThinkingEndToken) + tool_call_opening("get_time");
  EXPECT_NE(rendered.find(after_think), std::string::npos) << rendered;
  const std::string opening = tool_call_opening("");
  EXPECT_EQ(tool_call_opening("get_time").substr(0, opening.size()), opening);
  const std::string rest = "get_time\">\n<｜DSML｜parameter name=\"tz\" string=\"true\">UTC</｜DSML｜parameter>\n"
                           "</｜DSML｜invoke>\n</｜DSML｜tool_calls>" + std::string(kEosToken);
  const ParsedCompletion p = parse_completion(opening + rest, ThinkingMode::kChat);
  ASSERT_EQ(p.tool_calls.size(), 1u);
  EXPECT_EQ(p.tool_calls[0].name, "get_time");
  EXPECT_EQ(p.tool_calls[0].arguments, R"({"tz": "UTC"})");
  EXPECT_EQ(p.content, "");
}

// Before the last user turn, a developer turn is left out in thinking mode
// (when reasoning is dropped); chat mode keeps it.
TEST(ChatFormat, EarlierDeveloperTurnsDroppedWithThinking) {
  const ojson m = msgs({msg("developer", "D"), assistant("x", "r"), msg("user", "U")});
  EXPECT_EQ(encode_messages(m, kThink), B + "x" + E + "<｜User｜>U<｜Assistant｜><think>");
  EXPECT_EQ(encode_messages(m, kChat), B + "<｜User｜>D<｜Assistant｜></think>x" + E + "<｜User｜>U<｜Assistant｜></think>");
}

TEST(ChatFormat, ResponseFormat) {
  ojson sys = msg("system", "S");
  sys["response_format"] = ojson::parse(R"({"type": "json_object", "z": 1, "a": 2})");
  EXPECT_EQ(encode_messages(msgs({sys, msg("user", "U")}), kChat),
            B + "S\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n"
                "{\"type\": \"json_object\", \"z\": 1, \"a\": 2}<｜User｜>U<｜Assistant｜></think>");
}

// wo_eos leaves the last assistant turn open, to be continued.
TEST(ChatFormat, OpenAssistantTurn) {
  ojson a = assistant("Part", "r");
  a["wo_eos"] = true;
  EXPECT_EQ(encode_messages(msgs({msg("user", "U"), a}), kThink), B + "<｜User｜>U<｜Assistant｜><think>r</think>Part");
}

// A task other than "action" puts its token straight after the turn, and the
// answer to it carries no reasoning block.
TEST(ChatFormat, Tasks) {
  ojson u = msg("user", "U");
  u["task"] = "title";
  EXPECT_EQ(encode_messages(msgs({u, assistant("T", "r")}), kThink), B + "<｜User｜>U<｜title｜>T" + E);
  u["task"] = "action";
  EXPECT_EQ(encode_messages(msgs({u}), kThink), B + "<｜User｜>U<｜Assistant｜><think><｜action｜>");
}

// latest_reminder: its token and text; the turn before it closes as if the
// assistant came next.
TEST(ChatFormat, LatestReminder) {
  const ojson m = msgs({msg("user", "U"), msg("latest_reminder", "R"), msg("user", "V")});
  EXPECT_EQ(encode_messages(m, kChat), B + "<｜User｜>U<｜Assistant｜></think><｜latest_reminder｜>R<｜User｜>V<｜Assistant｜></think>");
}

// With a context (a prefix already in the cache) only the new messages are
// rendered, without a BOS, but the context decides how they render.
TEST(ChatFormat, Context) {
  EncodeOptions o = kChat;
  o.context = msgs({msg("user", "A"), assistant("a", "")});
  EXPECT_EQ(encode_messages(msgs({msg("user", "B")}), o), "<｜User｜>B<｜Assistant｜></think>");
  ojson a = assistant("", "");
  a["tool_calls"] = ojson::array({call("c1", "f", "{}"), call("c2", "f", "{}")});
  o.context = msgs({msg("user", "Q"), a});
  ojson t2 = msg("tool", "2"), t1 = msg("tool", "1");
  t2["tool_call_id"] = "c2";
  t1["tool_call_id"] = "c1";
  EXPECT_EQ(encode_messages(msgs({t2, t1}), o), "<｜User｜><tool_result>1</tool_result>\n\n<tool_result>2</tool_result><｜Assistant｜></think>");
}

// ---- Errors name the message and the field -----------------------------------------------

void expect_error(const ojson& m, const std::string& fragment) {
  try {
    encode_messages(m, kThink);
    ADD_FAILURE() << "no error; wanted " << fragment;
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(fragment), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

TEST(ChatFormat, MalformedMessages) {
  expect_error(msgs({msg("user", "a"), msg("robot", "b")}), "messages[1].role: unknown role \"robot\"");
  expect_error(msgs({ojson{{"content", "x"}}}), "messages[0].role: missing");
  expect_error(msgs({ojson{{"role", "user"}}}), "messages[0].content: missing");
  expect_error(msgs({ojson{{"role", "user"}, {"content", 5}}}), "messages[0].content: expected a string");
  expect_error(msgs({msg("developer", "")}), "messages[0].content: empty");
  expect_error(msgs({ojson{{"role", "latest_reminder"}}}), "messages[0].content: missing");
  ojson a = assistant("", "");
  a["tool_calls"] = ojson::parse(R"([{"id": "c", "function": {"arguments": "{}"}}])");
  expect_error(msgs({msg("user", "q"), a}), "messages[1].tool_calls[0].function.name: missing");
  a["tool_calls"] = ojson::parse(R"([{"id": "c", "function": {"name": "f"}}])");
  expect_error(msgs({msg("user", "q"), a}), "messages[1].tool_calls[0].function.arguments: missing");
  a["tool_calls"] = ojson::parse(R"([{"id": "c", "function": {"name": "f", "arguments": "[1]"}}])");
  expect_error(msgs({msg("user", "q"), a}), "messages[1].tool_calls[0].function.arguments: not a JSON object");
  expect_error(msgs({msg("user", "q"), msg("tool", "r")}), "messages[1].role: a tool result with no assistant tool call");
  a["tool_calls"] = ojson::array({call("c1", "f", "{}")});
  ojson t = msg("tool", "r");
  t["tool_call_id"] = "c9";
  expect_error(msgs({msg("user", "q"), a, t}), "messages[2].tool_call_id: \"c9\" matches no call");
  ojson u = msg("user", "q");
  u["task"] = "dance";
  expect_error(msgs({u}), "messages[0].task: unknown task");
  ojson s = msg("system", "s");
  s["tools"] = ojson::parse(R"([{"type": "function"}])");
  expect_error(msgs({s}), "messages[0].tools[0].function: missing");
  expect_error(ojson::object(), "messages: expected an array");
  expect_error(msgs({ojson("hi")}), "messages[0]: expected a message object");
}

// ---- Parsing completions -------------------------------------------------------------------

// What the model wrote for the last assistant turn of `prompt` (after its
// assistant prefix).
std::string completion_of(const std::string& prompt, ThinkingMode m) {
  const std::string marker = std::string(kAssistantToken) +
                             std::string(m == ThinkingMode::kThinking ? kThinkingStartToken : kThinkingEndToken);
  return prompt.substr(prompt.rfind(marker) + marker.size());
}

TEST(ChatFormat, RoundTripReasoningContentAndToolCalls) {
  ojson sys = msg("system", "S");
  sys["tools"] = weather_tools();
  ojson a = assistant("Let me look.", "Think <b> & \"q\".");
  a["tool_calls"] = ojson::array({call("x", "w", R"({"city": "Paris", "days": 3, "opts": {"u": "c", "l": [1, 2.5]}})"),
                                  call("y", "w", R"({})"), call("z", "v", R"({"q": "multi\nline"})")});
  for (ThinkingMode m : {ThinkingMode::kThinking, ThinkingMode::kChat}) {
    const std::string prompt = encode_messages(msgs({sys, msg("user", "U"), a}), mode(m));
    const ParsedCompletion p = parse_completion(completion_of(prompt, m), m, "id-");
    EXPECT_EQ(p.reasoning_content, m == ThinkingMode::kThinking ? "Think <b> & \"q\"." : "");
    EXPECT_EQ(p.content, "Let me look.");
    EXPECT_TRUE(p.ended);
    ASSERT_EQ(p.tool_calls.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(p.tool_calls[i].id, "id-" + std::to_string(i));
      EXPECT_EQ(p.tool_calls[i].name, a["tool_calls"][i]["function"]["name"]);
      EXPECT_EQ(p.tool_calls[i].arguments, a["tool_calls"][i]["function"]["arguments"]);
    }
  }
}

TEST(ChatFormat, ParseCutShortAndChat) {
  ParsedCompletion p = parse_completion("still thinking", ThinkingMode::kThinking);
  EXPECT_EQ(p.reasoning_content, "still thinking");
  EXPECT_FALSE(p.ended);
  p = parse_completion("r</think>partial answer", ThinkingMode::kThinking);
  EXPECT_EQ(p.reasoning_content, "r");
  EXPECT_EQ(p.content, "partial answer");
  EXPECT_FALSE(p.ended);
  p = parse_completion("Hello" + E, ThinkingMode::kChat);
  EXPECT_EQ(p.content, "Hello");
  EXPECT_EQ(p.reasoning_content, "");
  EXPECT_TRUE(p.ended);
}

const char* const kBadCompletions[] = {
    "no end of reasoning<｜end▁of▁sentence｜>",
    "r\n\n<｜DSML｜tool_calls>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>",
    "r</think>answer<｜end▁of▁sentence｜>more",
    "r</think>a <think> b<｜end▁of▁sentence｜>",
    "r</think>a ｜DSML｜ b",
    "r</think>a\n\n<｜DSML｜tool_c",
    "r</think>a<｜begin▁of▁sentence｜>",
    "r</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke nam=\"f\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
    "r</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"true\">1</｜DSML｜parameter>\n"
    "<｜DSML｜parameter name=\"a\" string=\"true\">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
    "r</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"maybe\">1</｜DSML｜parameter>\n"
    "</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
    "r</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>trailing",
    "r</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke>\n",
    "r</think>\n\n<｜DSML｜tool_calls> \n</｜DSML｜tool_calls>",
};

TEST(ChatFormat, ParseRejectsWhatTheReferenceRejects) {
  for (const char* text : kBadCompletions) EXPECT_THROW(parse_completion(text, ThinkingMode::kThinking), Error) << text;
}

// ---- Streaming -------------------------------------------------------------------------------

struct Collected {
  ParsedCompletion whole;
  bool ended = false;
};

Collected stream(const std::vector<std::string_view>& pieces, ThinkingMode m) {
  CompletionStreamParser parser(m);
  Collected c;
  const auto add = [&](CompletionDelta d) {
    c.whole.reasoning_content += d.reasoning_content;
    c.whole.content += d.content;
    for (ToolCall& t : d.tool_calls) c.whole.tool_calls.push_back(std::move(t));
  };
  for (std::string_view p : pieces) add(parser.feed(p));
  add(parser.finish());
  c.ended = parser.ended();
  return c;
}

void expect_same(const ParsedCompletion& a, const Collected& b, const std::string& where) {
  EXPECT_EQ(a.reasoning_content, b.whole.reasoning_content) << where;
  EXPECT_EQ(a.content, b.whole.content) << where;
  EXPECT_EQ(a.ended, b.ended) << where;
  ASSERT_EQ(a.tool_calls.size(), b.whole.tool_calls.size()) << where;
  for (size_t i = 0; i < a.tool_calls.size(); ++i) {
    EXPECT_EQ(a.tool_calls[i].id, b.whole.tool_calls[i].id) << where;
    EXPECT_EQ(a.tool_calls[i].name, b.whole.tool_calls[i].name) << where;
    EXPECT_EQ(a.tool_calls[i].arguments, b.whole.tool_calls[i].arguments) << where;
  }
}

// Calls `check` with the text as one piece, cut in two at every byte, and cut
// into single bytes.
void for_each_split(std::string_view text, const std::function<void(const std::vector<std::string_view>&, const std::string&)>& check) {
  check({text}, "whole");
  for (size_t i = 0; i <= text.size(); ++i) check({text.substr(0, i), text.substr(i)}, "split at " + std::to_string(i));
  std::vector<std::string_view> bytes;
  for (size_t i = 0; i < text.size(); ++i) bytes.push_back(text.substr(i, 1));
  check(bytes, "byte by byte");
}

std::vector<std::pair<std::string, ThinkingMode>> good_completions() {
  std::vector<std::pair<std::string, ThinkingMode>> out;
  const std::string p1 = cases()[0]["expected"];
  out.push_back({completion_of(p1, ThinkingMode::kThinking), ThinkingMode::kThinking});
  const std::string marker = "<｜Assistant｜><think>";
  const size_t first = p1.find(marker) + marker.size();
  out.push_back({p1.substr(first, p1.find("<｜User｜>", first) - first), ThinkingMode::kThinking});
  out.push_back({completion_of(cases()[2]["expected"], ThinkingMode::kThinking), ThinkingMode::kThinking});
  out.push_back({"关于热海\n\n| a | b |\n<tag> </thin k>" + E, ThinkingMode::kChat});
  out.push_back({"reasoning cut off mid-wo", ThinkingMode::kThinking});
  out.push_back({"r</think>ends in a newline\n", ThinkingMode::kThinking});
  out.push_back({"r</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n"
                 "<｜DSML｜parameter name=\"a\" string=\"false\">{\"k\": [1, 2]}</｜DSML｜parameter>\n"
                 "<｜DSML｜parameter name=\"b\" string=\"true\">x</｜DSML｜invoke> y</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
                 "<｜DSML｜invoke name=\"g\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>" + E,
                 ThinkingMode::kThinking});
  out.push_back({"r</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke", ThinkingMode::kThinking});
  return out;
}

TEST(ChatFormat, StreamingEqualsWholeTextAtEverySplit) {
  for (const auto& [text, m] : good_completions()) {
    const ParsedCompletion whole = parse_completion(text, m);
    for_each_split(text, [&](const std::vector<std::string_view>& pieces, const std::string& how) {
      expect_same(whole, stream(pieces, m), how + " of " + text.substr(0, 40));
    });
  }
}

TEST(ChatFormat, StreamingRejectsWhatTheWholeParserRejects) {
  for (const char* text : kBadCompletions) {
    for_each_split(text, [&](const std::vector<std::string_view>& pieces, const std::string& how) {
      EXPECT_THROW(stream(pieces, ThinkingMode::kThinking), Error) << how << " of " << text;
    });
  }
}

// Text that may begin a marker, or ends inside a UTF-8 character, waits.
TEST(ChatFormat, StreamingHoldsBackPossibleMarkers) {
  CompletionStreamParser p(ThinkingMode::kThinking);
  EXPECT_EQ(p.feed("abc</th").reasoning_content, "abc");
  CompletionDelta d = p.feed("ink>Hi\n");
  EXPECT_EQ(d.reasoning_content, "");
  EXPECT_EQ(d.content, "Hi");
  EXPECT_EQ(p.feed("\nok").content, "\n\nok");
  EXPECT_EQ(p.feed("<｜end▁of").content, "");
  // No longer a possible marker, but half of 二.
  EXPECT_EQ(p.feed("\xE4\xBA").content, "<｜end▁of");
  EXPECT_EQ(p.feed("\x8C").content, "二");
  EXPECT_EQ(p.feed(std::string(kEosToken)).content, "");
  EXPECT_TRUE(p.ended());
  EXPECT_THROW(p.feed("more"), Error);
}

}  // namespace
}  // namespace dsv4
