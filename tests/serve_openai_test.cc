// The OpenAI protocol of `dsv4 serve` without HTTP (tools/serve/openai.h):
// each 400/404 of docs/SERVER.md's errors table that the body alone decides,
// the fields, and the shapes of responses, chunks and logprobs.
#include "serve/openai.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.h"

namespace dsv4::serve {
namespace {

const Tokenizer* v4_tokenizer() {
  static std::unique_ptr<Tokenizer> tok = [] {
    const std::string file = std::string(DSV4_TOKENIZER_DIR) + "/tokenizer.json";
    return std::filesystem::exists(file) ? Tokenizer::load(file) : nullptr;
  }();
  return tok.get();
}

class ServeOpenAI : public ::testing::Test {
 protected:
  void SetUp() override {
    model.tokenizer = v4_tokenizer();
    if (!model.tokenizer) GTEST_SKIP() << "no V4 tokenizer under " << DSV4_TOKENIZER_DIR;
    model.name = "m";
    model.position_limit = 4096;
    model.bos_id = model.tokenizer->token_id(kBosToken);
    model.eos_id = model.tokenizer->token_id(kEosToken);
    model.vocab_size = model.tokenizer->size();
  }

  ApiRequest chat(const ojson& body) { return parse_request(Endpoint::kChat, body.dump(), model, 7); }
  ApiRequest completion(const ojson& body) { return parse_request(Endpoint::kCompletions, body.dump(), model, 7); }

  // The ApiError a body gives.
  ApiError error_of(Endpoint e, const std::string& text) {
    try {
      parse_request(e, text, model, 7);
    } catch (const ApiError& err) {
      return err;
    }
    ADD_FAILURE() << "no error for " << text;
    return ApiError(0, "", "", "");
  }
  void expect_error(Endpoint e, const ojson& body, int status, const std::string& code, const std::string& param) {
    const ApiError err = error_of(e, body.dump());
    EXPECT_EQ(err.status, status) << body.dump();
    EXPECT_EQ(err.code, code) << body.dump() << ": " << err.message;
    EXPECT_EQ(err.param, param) << body.dump();
  }

  static ojson hello() { return ojson{{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "Hello"}}}}}; }
  static ojson with(ojson body, const std::string& key, const ojson& value) {
    body[key] = value;
    return body;
  }

  ModelInfo model;
};

TEST_F(ServeOpenAI, ErrorBodyHasOpenAIShape) {
  const ojson b = invalid_value("top_p", "bad").body();
  EXPECT_EQ(b.dump(), R"({"error":{"message":"bad","type":"invalid_request_error","param":"top_p","code":"invalid_value"}})");
  EXPECT_TRUE(ApiError(500, "server_error", "internal_error", "x").body()["error"]["param"].is_null());
}

TEST_F(ServeOpenAI, MalformedJsonIsInvalidJson) {
  EXPECT_EQ(error_of(Endpoint::kChat, "{\"model\": ").code, "invalid_json");
  EXPECT_EQ(error_of(Endpoint::kChat, "[1, 2]").code, "invalid_type");
}

TEST_F(ServeOpenAI, WrongTypesAndRanges) {
  const Endpoint c = Endpoint::kChat;
  expect_error(c, with(hello(), "messages", 5), 400, "invalid_type", "messages");
  expect_error(c, with(hello(), "max_tokens", "x"), 400, "invalid_type", "max_tokens");
  expect_error(c, with(hello(), "max_tokens", -1), 400, "invalid_value", "max_tokens");
  expect_error(c, with(hello(), "max_completion_tokens", 0), 400, "invalid_value", "max_completion_tokens");
  expect_error(c, with(hello(), "temperature", -1), 400, "invalid_value", "temperature");
  expect_error(c, with(hello(), "temperature", "hot"), 400, "invalid_type", "temperature");
  expect_error(c, with(hello(), "top_p", 1.5), 400, "invalid_value", "top_p");
  expect_error(c, with(hello(), "top_k", -2), 400, "invalid_value", "top_k");
  expect_error(c, with(hello(), "stream", "yes"), 400, "invalid_type", "stream");
  expect_error(c, with(hello(), "top_logprobs", 21), 400, "invalid_value", "top_logprobs");
  expect_error(c, with(hello(), "stop", 3), 400, "invalid_type", "stop");
  expect_error(c, with(hello(), "stop", ojson::array({"a", 1})), 400, "invalid_type", "stop[1]");
  expect_error(c, with(hello(), "presence_penalty", 2.5), 400, "invalid_value", "presence_penalty");
  expect_error(c, with(hello(), "frequency_penalty", "x"), 400, "invalid_type", "frequency_penalty");
  expect_error(c, with(hello(), "logit_bias", 3), 400, "invalid_type", "logit_bias");
  expect_error(c, with(hello(), "logit_bias", {{"a", 1}}), 400, "invalid_value", "logit_bias");
  expect_error(c, with(hello(), "logit_bias", {{"1", "x"}}), 400, "invalid_type", "logit_bias.1");
  expect_error(c, with(hello(), "logit_bias", {{"1", 101}}), 400, "invalid_value", "logit_bias");
  expect_error(c, with(hello(), "logit_bias", {{"1", 1}, {"01", 1}}), 400, "invalid_value", "logit_bias");
  expect_error(c, with(hello(), "thinking", {{"type", "sometimes"}}), 400, "invalid_value", "thinking.type");
  expect_error(c, with(hello(), "reasoning_effort", "extreme"), 400, "invalid_value", "reasoning_effort");
  expect_error(c, with(hello(), "tool_choice", "required"), 400, "invalid_value", "tool_choice");
  expect_error(c, with(hello(), "stream_options", {{"include_usage", 1}}), 400, "invalid_type",
               "stream_options.include_usage");
}

TEST_F(ServeOpenAI, MissingAndEmptyFields) {
  ojson no_messages = hello();
  no_messages.erase("messages");
  expect_error(Endpoint::kChat, no_messages, 400, "missing_field", "messages");
  ojson no_model = hello();
  no_model.erase("model");
  expect_error(Endpoint::kChat, no_model, 400, "missing_field", "model");
  expect_error(Endpoint::kChat, with(hello(), "messages", ojson::array()), 400, "invalid_value", "messages");
  expect_error(Endpoint::kCompletions, ojson{{"model", "m"}}, 400, "missing_field", "prompt");
}

TEST_F(ServeOpenAI, MessageErrorsNameTheField) {
  expect_error(Endpoint::kChat, with(hello(), "messages", {{{"role", "bogus"}, {"content", "x"}}}), 400,
               "invalid_value", "messages[0].role");
}

TEST_F(ServeOpenAI, UnknownModelIs404) {
  expect_error(Endpoint::kChat, with(hello(), "model", "gpt-4"), 404, "model_not_found", "model");
}

TEST_F(ServeOpenAI, OnlyNOfOne) {
  expect_error(Endpoint::kChat, with(hello(), "n", 2), 400, "invalid_value", "n");
  EXPECT_NO_THROW(chat(with(hello(), "n", 1)));
}

TEST_F(ServeOpenAI, PromptAtTheLimitIsContextLengthExceeded) {
  model.position_limit = 64;
  std::string long_text;
  for (int i = 0; i < 100; ++i) long_text += "word ";
  const ojson body = with(hello(), "messages", {{{"role", "user"}, {"content", long_text}}});
  const ApiError e = error_of(Endpoint::kChat, body.dump());
  EXPECT_EQ(e.code, "context_length_exceeded");
  EXPECT_NE(e.message.find("maximum context length is 64 tokens; the prompt has "), std::string::npos) << e.message;
  // Exactly at the limit is too long too: nothing would be left to generate.
  std::vector<int32_t> ids(64, 5);
  expect_error(Endpoint::kCompletions, ojson{{"model", "m"}, {"prompt", ids}}, 400, "context_length_exceeded", "prompt");
  ids.pop_back();
  EXPECT_EQ(completion(ojson{{"model", "m"}, {"prompt", ids}}).generation.prompt.size(), 63u);
}

TEST_F(ServeOpenAI, ChatDefaults) {
  const ApiRequest r = chat(hello());
  EXPECT_EQ(r.thinking, ThinkingMode::kChat);
  EXPECT_EQ(r.generation.sampling.temperature, 1.0f);
  EXPECT_EQ(r.generation.sampling.seed, 7u);  // the server's fresh seed
  EXPECT_EQ(r.generation.top_logprobs, -1);
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.generation.remember_before_last);
  const std::string prompt = model.tokenizer->decode(r.generation.prompt);
  EXPECT_EQ(prompt, std::string(kBosToken) + std::string(kUserToken) + "Hello" + std::string(kAssistantToken) +
                        std::string(kThinkingEndToken));
  // max_tokens: what the context leaves.
  EXPECT_EQ(r.generation.max_tokens, 4096 - int64_t(r.generation.prompt.size()));
}

TEST_F(ServeOpenAI, ChatFields) {
  ojson body = hello();
  body["thinking"] = {{"type", "enabled"}};
  body["temperature"] = 0;
  body["top_p"] = 0.5;
  body["top_k"] = 3;
  body["min_p"] = 0.1;
  body["seed"] = 42;
  body["stop"] = "x";
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  body["logprobs"] = true;
  body["top_logprobs"] = 2;
  body["max_completion_tokens"] = 5;
  body["max_tokens"] = 9;
  body["ignore_eos"] = true;
  body["return_token_ids"] = true;
  body["unknown_field"] = "ignored";
  const ApiRequest r = chat(body);
  EXPECT_EQ(r.thinking, ThinkingMode::kThinking);
  EXPECT_TRUE(r.generation.remember_before_last);
  EXPECT_TRUE(model.tokenizer->decode(r.generation.prompt).ends_with(std::string(kThinkingStartToken)));
  EXPECT_EQ(r.generation.sampling.temperature, 0.0f);
  EXPECT_EQ(r.generation.sampling.top_p, 0.5f);
  EXPECT_EQ(r.generation.sampling.top_k, 3);
  EXPECT_EQ(r.generation.sampling.min_p, 0.1f);
  EXPECT_EQ(r.generation.sampling.seed, 42u);
  EXPECT_EQ(r.generation.stop, std::vector<std::string>{"x"});
  EXPECT_TRUE(r.stream && r.include_usage && r.logprobs && r.return_token_ids && r.generation.ignore_eos);
  EXPECT_EQ(r.generation.top_logprobs, 2);
  EXPECT_EQ(r.generation.max_tokens, 5);  // max_completion_tokens wins
}

TEST_F(ServeOpenAI, ReasoningEffortMapsToHighOrMax) {
  ojson body = with(hello(), "thinking", {{"type", "enabled"}});
  const std::string none = model.tokenizer->decode(chat(body).generation.prompt);
  for (const char* e : {"low", "medium", "high"})
    EXPECT_EQ(model.tokenizer->decode(chat(with(body, "reasoning_effort", e)).generation.prompt), none) << e;
  const std::string max = model.tokenizer->decode(chat(with(body, "reasoning_effort", "max")).generation.prompt);
  EXPECT_NE(max, none);
  EXPECT_EQ(model.tokenizer->decode(chat(with(body, "reasoning_effort", "xhigh")).generation.prompt), max);
}

TEST_F(ServeOpenAI, ToolsGoInThePromptUnlessToolChoiceNone) {
  const ojson tools = ojson::array(
      {{{"type", "function"},
        {"function", {{"name", "get_weather"}, {"description", "d"}, {"parameters", {{"type", "object"}}}}}}});
  const ojson body = with(hello(), "tools", tools);
  const std::string with_tools = model.tokenizer->decode(chat(body).generation.prompt);
  EXPECT_NE(with_tools.find("get_weather"), std::string::npos);
  const std::string none = model.tokenizer->decode(chat(with(body, "tool_choice", "none")).generation.prompt);
  EXPECT_EQ(none.find("get_weather"), std::string::npos);
  EXPECT_EQ(none, model.tokenizer->decode(chat(hello()).generation.prompt));
}

// tool_choice "required" or a named function: the answer is made to open a
// tool-call block, at once (chat) or after </think> (thinking); the prompt
// is the one "auto" gives.
TEST_F(ServeOpenAI, ToolChoiceRequiredOrNamedForcesACallsOpening) {
  const ojson tools = ojson::array(
      {{{"type", "function"}, {"function", {{"name", "get_weather"}, {"parameters", {{"type", "object"}}}}}},
       {{"type", "function"}, {"function", {{"name", "get_time"}, {"parameters", {{"type", "object"}}}}}}});
  const ojson body = with(hello(), "tools", tools);
  const ApiRequest automatic = chat(body);
  EXPECT_TRUE(automatic.generation.forced.empty());
  const ApiRequest required = chat(with(body, "tool_choice", "required"));
  EXPECT_EQ(required.generation.prompt, automatic.generation.prompt);
  EXPECT_EQ(model.tokenizer->decode(required.generation.forced), tool_call_opening(""));
  EXPECT_TRUE(tool_call_opening("").ends_with("invoke name=\""));
  EXPECT_EQ(required.generation.answer_after, -1);
  const ojson named = {{"type", "function"}, {"function", {{"name", "get_time"}}}};
  const ApiRequest one = chat(with(with(body, "tool_choice", named), "thinking", {{"type", "enabled"}}));
  EXPECT_EQ(model.tokenizer->decode(one.generation.forced), tool_call_opening("get_time"));
  EXPECT_TRUE(tool_call_opening("get_time").ends_with("invoke name=\"get_time\">\n"));
  EXPECT_EQ(model.tokenizer->decode(std::vector<int32_t>{one.generation.answer_after}), std::string(kThinkingEndToken));
  const Endpoint c = Endpoint::kChat;
  expect_error(c, with(hello(), "tool_choice", "required"), 400, "invalid_value", "tool_choice");
  expect_error(c, with(body, "tool_choice", {{"type", "function"}, {"function", {{"name", "nope"}}}}), 400,
               "invalid_value", "tool_choice");
  expect_error(c, with(body, "tool_choice", {{"type", 3}, {"function", {{"name", "get_time"}}}}), 400,
               "invalid_value", "tool_choice");
  expect_error(c, with(body, "tool_choice", 5), 400, "invalid_type", "tool_choice");
}

// response_format goes on the system message, where the encoder renders it
// (one is added in front when there is none); "text" changes nothing.
TEST_F(ServeOpenAI, ResponseFormatGoesToTheSystemMessage) {
  const ojson schema = {{"type", "json_schema"},
                        {"json_schema", {{"name", "answer"}, {"schema", {{"type", "object"}}}}}};
  const std::string plain = model.tokenizer->decode(chat(hello()).generation.prompt);
  EXPECT_EQ(model.tokenizer->decode(chat(with(hello(), "response_format", {{"type", "text"}})).generation.prompt), plain);
  const std::string json_mode =
      model.tokenizer->decode(chat(with(hello(), "response_format", {{"type", "json_object"}})).generation.prompt);
  ojson system = hello();
  system["messages"].insert(system["messages"].begin(),
                            ojson{{"role", "system"}, {"content", ""}, {"response_format", {{"type", "json_object"}}}});
  system.erase("response_format");
  EXPECT_EQ(json_mode, model.tokenizer->decode(chat(system).generation.prompt));
  EXPECT_NE(json_mode.find("## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n"
                           "{\"type\": \"json_object\"}"),
            std::string::npos)
      << json_mode;
  const std::string with_schema = model.tokenizer->decode(chat(with(hello(), "response_format", schema)).generation.prompt);
  EXPECT_NE(with_schema.find("\"json_schema\": {\"name\": \"answer\""), std::string::npos) << with_schema;
  const Endpoint c = Endpoint::kChat;
  expect_error(c, with(hello(), "response_format", "json"), 400, "invalid_type", "response_format");
  expect_error(c, with(hello(), "response_format", {{"type", "xml"}}), 400, "invalid_value", "response_format");
  expect_error(c, with(hello(), "response_format", {{"type", "json_schema"}}), 400, "invalid_type",
               "response_format.json_schema");
}

TEST_F(ServeOpenAI, CompletionPrompts) {
  const ApiRequest text = completion(ojson{{"model", "m"}, {"prompt", "Once upon"}});
  EXPECT_EQ(text.generation.prompt.front(), model.bos_id);
  EXPECT_EQ(text.generation.max_tokens, 16);
  EXPECT_EQ(completion(ojson{{"model", "m"}, {"prompt", {1, 2, 3}}}).generation.prompt, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(completion(ojson{{"model", "m"}, {"prompt", {{1, 2}}}}).generation.prompt, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(completion(ojson{{"model", "m"}, {"prompt", {"Once upon"}}}).generation.prompt, text.generation.prompt);
  const ApiRequest lp = completion(ojson{{"model", "m"}, {"prompt", "x"}, {"logprobs", 3}});
  EXPECT_TRUE(lp.logprobs);
  EXPECT_EQ(lp.generation.top_logprobs, 3);
  const Endpoint c = Endpoint::kCompletions;
  expect_error(c, ojson{{"model", "m"}, {"prompt", {"a", "b"}}}, 400, "invalid_value", "prompt");
  expect_error(c, ojson{{"model", "m"}, {"prompt", ojson::array()}}, 400, "invalid_value", "prompt");
  expect_error(c, ojson{{"model", "m"}, {"prompt", {-1}}}, 400, "invalid_value", "prompt");
  expect_error(c, ojson{{"model", "m"}, {"prompt", 5}}, 400, "invalid_type", "prompt");
  expect_error(c, ojson{{"model", "m"}, {"prompt", "x"}, {"echo", true}}, 400, "invalid_value", "echo");
  expect_error(c, ojson{{"model", "m"}, {"prompt", "x"}, {"suffix", "y"}}, 400, "invalid_value", "suffix");
  expect_error(c, ojson{{"model", "m"}, {"prompt", "x"}, {"logprobs", 21}}, 400, "invalid_value", "logprobs");
}

TEST_F(ServeOpenAI, NoTokenizerTakesTokenIdsOnly) {
  model.tokenizer = nullptr;
  model.vocab_size = 100;
  EXPECT_EQ(completion(ojson{{"model", "m"}, {"prompt", {1, 2}}}).generation.prompt.size(), 2u);
  expect_error(Endpoint::kCompletions, ojson{{"model", "m"}, {"prompt", "x"}}, 400, "invalid_value", "prompt");
  expect_error(Endpoint::kChat, hello(), 400, "invalid_value", "messages");
  expect_error(Endpoint::kCompletions, ojson{{"model", "m"}, {"prompt", {1}}, {"stop", "a"}}, 400, "invalid_value",
               "stop");
  std::vector<TokenOut> t(2);
  t[0].id = 4, t[1].id = 9;
  EXPECT_EQ(ids_text(t, false), "4 9");
}

TEST_F(ServeOpenAI, TokenizeAndDetokenize) {
  const std::vector<int32_t> ids = tokenize_request(R"({"content": "Hello"})", model);
  EXPECT_EQ(ids.front(), model.bos_id);
  EXPECT_EQ(tokenize_request(R"({"content": "Hello", "add_special": false})", model),
            std::vector<int32_t>(ids.begin() + 1, ids.end()));
  EXPECT_EQ(detokenize_request(ojson{{"tokens", ids}}.dump(), model), std::string(kBosToken) + "Hello");
  EXPECT_THROW(detokenize_request(R"({"tokens": [-5]})", model), ApiError);
  EXPECT_THROW(tokenize_request(R"({})", model), ApiError);
}

// ---- Answers ----------------------------------------------------------------------------

Answer answer_of(const std::string& text, Finish finish, std::vector<TokenOut> tokens = {}) {
  Answer a;
  a.text = text;
  a.tokens = std::move(tokens);
  a.final_update.finish = finish;
  a.final_update.prompt_tokens = 5;
  a.final_update.completion_tokens = 3;
  a.final_update.cached_tokens = 2;
  return a;
}

TEST_F(ServeOpenAI, ChatResponseShape) {
  const ApiRequest r = chat(hello());
  const ojson out = chat_response(r, answer_of("Hi there", Finish::kStop), model, "chatcmpl-1", 100);
  EXPECT_EQ(out["id"], "chatcmpl-1");
  EXPECT_EQ(out["object"], "chat.completion");
  EXPECT_EQ(out["created"], 100);
  EXPECT_EQ(out["model"], "m");
  const ojson& choice = out["choices"][0];
  EXPECT_EQ(choice["index"], 0);
  EXPECT_EQ(choice["message"]["role"], "assistant");
  EXPECT_EQ(choice["message"]["content"], "Hi there");
  EXPECT_FALSE(choice["message"].contains("reasoning_content"));  // chat mode
  EXPECT_FALSE(choice["message"].contains("tool_calls"));
  EXPECT_TRUE(choice["logprobs"].is_null());
  EXPECT_EQ(choice["finish_reason"], "stop");
  EXPECT_EQ(out["usage"].dump(),
            R"({"prompt_tokens":5,"completion_tokens":3,"total_tokens":8,"prompt_tokens_details":{"cached_tokens":2}})");
  EXPECT_EQ(chat_response(r, answer_of("Hi", Finish::kLength), model, "x", 0)["choices"][0]["finish_reason"], "length");
}

TEST_F(ServeOpenAI, ThinkingSplitsReasoning) {
  const ApiRequest r = chat(with(hello(), "thinking", {{"type", "enabled"}}));
  const ojson m = chat_response(r, answer_of("Let me think.</think>Hello!", Finish::kStop), model, "x", 0)["choices"][0]["message"];
  EXPECT_EQ(m["reasoning_content"], "Let me think.");
  EXPECT_EQ(m["content"], "Hello!");
}

TEST_F(ServeOpenAI, ToolCallsFinishWithToolCalls) {
  const std::string text =
      "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"x\" string=\"true\">1"
      "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
  const ojson choice = chat_response(chat(hello()), answer_of(text, Finish::kStop), model, "x", 0)["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u);
  const ojson& call = choice["message"]["tool_calls"][0];
  EXPECT_EQ(call["id"], "call_0");
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"]["name"], "f");
  EXPECT_EQ(call["function"]["arguments"], R"({"x": "1"})");
}

// Random weights write anything: text the parser rejects is content, from
// where the parsing failed, never an error.
TEST_F(ServeOpenAI, RejectedTextFallsBackToRawContent) {
  const std::string text = "Hi <｜User｜> more </think> text";
  const ojson m = chat_response(chat(hello()), answer_of(text, Finish::kLength), model, "x", 0)["choices"][0]["message"];
  EXPECT_EQ(m["content"], text);
  const ApiRequest think = chat(with(hello(), "thinking", {{"type", "enabled"}}));
  const ojson t = chat_response(think, answer_of("why</think>Hi <｜User｜> x", Finish::kStop), model, "x", 0);
  EXPECT_EQ(t["choices"][0]["message"]["reasoning_content"], "why");
  EXPECT_EQ(t["choices"][0]["message"]["content"], "Hi <｜User｜> x");
  // Streamed: the deltas add up to the same.
  AnswerSplitter s(ThinkingMode::kChat);
  std::string content;
  for (const char* piece : {"Hi ", "<｜Us", "er｜> more", " </think> text"}) content += s.feed(piece).content;
  content += s.finish().content;
  EXPECT_EQ(content, text);
}

TEST_F(ServeOpenAI, ChatLogprobsShape) {
  ojson body = with(hello(), "logprobs", true);
  body["top_logprobs"] = 1;
  body["return_token_ids"] = true;
  const ApiRequest r = chat(body);
  const int32_t hi = model.tokenizer->encode("Hi").front();
  TokenOut t;
  t.id = hi;
  t.logprob = -0.5f;
  t.top = {{hi, -0.5f}};
  const ojson out = chat_response(r, answer_of("Hi", Finish::kStop, {t}), model, "x", 0);
  const ojson& lp = out["choices"][0]["logprobs"]["content"][0];
  EXPECT_EQ(lp["token"], "Hi");
  EXPECT_EQ(lp["logprob"], -0.5);
  EXPECT_EQ(lp["bytes"], ojson::array({'H', 'i'}));
  ASSERT_EQ(lp["top_logprobs"].size(), 1u);
  EXPECT_EQ(lp["top_logprobs"][0]["token"], "Hi");
  EXPECT_EQ(out["choices"][0]["token_ids"], ojson::array({hi}));
  EXPECT_EQ(out["prompt_token_ids"], r.generation.prompt);
}

TEST_F(ServeOpenAI, CompletionResponseAndLogprobsShape) {
  const ApiRequest r = completion(ojson{{"model", "m"}, {"prompt", "x"}, {"logprobs", 1}});
  const std::vector<int32_t> ids = model.tokenizer->encode("Hi there");
  std::vector<TokenOut> tokens;
  for (int32_t id : ids) tokens.push_back(TokenOut{id, -1.0f, {{id, -1.0f}}});
  const ojson out = completion_response(r, answer_of("Hi there", Finish::kLength, tokens), model, "cmpl-1", 0);
  EXPECT_EQ(out["object"], "text_completion");
  const ojson& choice = out["choices"][0];
  EXPECT_EQ(choice["text"], "Hi there");
  EXPECT_EQ(choice["finish_reason"], "length");
  const ojson& lp = choice["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), ids.size());
  EXPECT_EQ(lp["token_logprobs"][0], -1.0);
  EXPECT_TRUE(lp["top_logprobs"][0].is_object());
  EXPECT_EQ(lp["text_offset"][0], 0);
  EXPECT_EQ(lp["text_offset"][1], lp["tokens"][0].get<std::string>().size());
}

TEST_F(ServeOpenAI, ChatStreamChunks) {
  const ApiRequest r = chat(with(with(hello(), "stream", true), "stream_options", {{"include_usage", true}}));
  ChunkWriter w(r, model, "chatcmpl-3", 9);
  Update a;
  a.text = "Hel";
  std::vector<ojson> c = w.chunks(a);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(c[0]["choices"][0]["delta"].dump(), R"({"role":"assistant","content":""})");
  EXPECT_EQ(c[1]["choices"][0]["delta"]["content"], "Hel");
  EXPECT_TRUE(c[1]["choices"][0]["finish_reason"].is_null());
  Update b;
  b.text = "lo";
  b.finish = Finish::kStop;
  b.prompt_tokens = 4;
  b.completion_tokens = 2;
  c = w.chunks(b);
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[0]["choices"][0]["delta"]["content"], "lo");
  EXPECT_EQ(c[1]["choices"][0]["delta"], ojson::object());
  EXPECT_EQ(c[1]["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(c[2]["choices"], ojson::array());
  EXPECT_EQ(c[2]["usage"]["total_tokens"], 6);
}

TEST_F(ServeOpenAI, CompletionStreamChunks) {
  const ApiRequest r = completion(ojson{{"model", "m"}, {"prompt", "x"}, {"stream", true}});
  ChunkWriter w(r, model, "cmpl-3", 9);
  Update u;
  u.text = "abc";
  u.finish = Finish::kLength;
  const std::vector<ojson> c = w.chunks(u);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0]["object"], "text_completion");
  EXPECT_EQ(c[0]["choices"][0]["text"], "abc");
  EXPECT_EQ(c[1]["choices"][0]["finish_reason"], "length");
}

TEST_F(ServeOpenAI, ErroredStreamGetsNoFinishChunk) {
  const ApiRequest r = chat(with(hello(), "stream", true));
  ChunkWriter w(r, model, "x", 0);
  Update u;
  u.finish = Finish::kError;
  u.error = "boom";
  const std::vector<ojson> c = w.chunks(u);
  ASSERT_EQ(c.size(), 1u);  // the role chunk only
  EXPECT_EQ(c[0]["choices"][0]["delta"]["role"], "assistant");
}

TEST_F(ServeOpenAI, MessageErrorParam) {
  EXPECT_EQ(message_error("messages[3].tool_calls[0].function.name: missing").param,
            "messages[3].tool_calls[0].function.name");
  EXPECT_EQ(message_error("messages[3].tool_calls[0].function.name: missing").code, "missing_field");
  EXPECT_EQ(message_error("something odd").param, "messages");
}

}  // namespace
}  // namespace dsv4::serve
