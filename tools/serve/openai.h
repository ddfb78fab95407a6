// The OpenAI protocol of `dsv4 serve` (docs/SERVER.md), free of HTTP: a
// request body in, a GenerationRequest and the answer's options out; the
// scheduler's updates in, response objects and stream chunks out; every
// error as one ApiError that the server writes in OpenAI's shape. Kept apart
// from the server so that the unit tests (tests/serve_openai_test.cc) reach
// every rule without a socket.
#pragma once
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/chat_format.h"
#include "io/tokenizer.h"
#include "serve/scheduler.h"

namespace dsv4::serve {

using ojson = nlohmann::ordered_json;

// An error as the client sees it: the status and the body's fields.
struct ApiError : std::exception {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string code;
  std::string param;  // empty: null
  std::string message;

  ApiError(int status, std::string type, std::string code, std::string message, std::string param = "");
  const char* what() const noexcept override { return message.c_str(); }
  // {"error": {"message", "type", "param", "code"}}
  ojson body() const;
};

// JSON text for the client; bytes that are not UTF-8 (a parse error quoting
// the body, a model's cut character) become U+FFFD instead of throwing.
std::string json_text(const ojson& j);

// The 400s of a request field.
ApiError invalid_type(const std::string& param, const std::string& expected);
ApiError invalid_value(const std::string& param, const std::string& message);
ApiError missing_field(const std::string& param);
// A dsv4::Error from encode_messages ("messages[3].role: ...") as a 400
// naming the field it starts with.
ApiError message_error(const std::string& what);

// What the server knows about the model it serves.
struct ModelInfo {
  std::string name;                   // --model-name: what `model` must say
  const Tokenizer* tokenizer = nullptr;  // null: token-id prompts only
  int64_t position_limit = 0;         // prompt plus answer
  int32_t bos_id = 0;
  int32_t eos_id = 1;
  int32_t vocab_size = 0;
  std::string fingerprint = "dsv4";   // system_fingerprint
};

enum class Endpoint { kChat, kCompletions };

// A request parsed and checked: what to run and how to answer.
struct ApiRequest {
  Endpoint endpoint = Endpoint::kChat;
  GenerationRequest generation;
  ThinkingMode thinking = ThinkingMode::kChat;
  bool stream = false;
  bool include_usage = false;     // stream_options.include_usage
  bool logprobs = false;          // chat: logprobs true; completions: logprobs given
  bool return_token_ids = false;
};

// The body of POST /v1/chat/completions or /v1/completions, parsed (text:
// the raw body; not JSON is invalid_json) and checked; the prompt rendered,
// tokenized and checked against the context limit. `seed` stands in for an
// absent "seed" (the server draws a fresh one per request). Throws ApiError.
ApiRequest parse_request(Endpoint endpoint, const std::string& text, const ModelInfo& model, uint64_t seed);

// POST /tokenize {"content": TEXT, "add_special": true}: the ids (the BOS
// first with add_special).
std::vector<int32_t> tokenize_request(const std::string& text, const ModelInfo& model);
// POST /detokenize {"tokens": [ids]}: their text (invalid UTF-8 as U+FFFD).
std::string detokenize_request(const std::string& text, const ModelInfo& model);

// The body as JSON, or invalid_json.
ojson parse_body(const std::string& text);

// What the model wrote, split as DeepSeek's parser splits it, piece by
// piece; text the parser rejects (random weights write anything) goes on as
// content from where it failed.
class AnswerSplitter {
 public:
  explicit AnswerSplitter(ThinkingMode mode);
  CompletionDelta feed(const std::string& piece);
  CompletionDelta finish();
  bool had_tool_calls() const { return tool_calls_; }

 private:
  CompletionDelta note(CompletionDelta d);
  CompletionDelta rest_raw();

  CompletionStreamParser parser_;
  ThinkingMode mode_;
  std::string fed_;
  size_t reasoning_given_ = 0, content_given_ = 0;
  bool raw_ = false, tool_calls_ = false;
};

// How a request ended, in OpenAI's words: "stop", "length", "tool_calls".
std::string finish_reason(Finish finish, bool tool_calls);

// usage {prompt_tokens, completion_tokens, total_tokens, prompt_tokens_details {cached_tokens}}.
ojson usage_json(const Update& final_update);

// The logprobs of some tokens: chat's {"content": [...]} or completions'
// {tokens, token_logprobs, top_logprobs, text_offset} (offsets from
// `text_offset`, which it advances).
ojson chat_logprobs(const std::vector<TokenOut>& tokens, const ModelInfo& model);
ojson completion_logprobs(const std::vector<TokenOut>& tokens, const ModelInfo& model, int64_t* text_offset);

// A token's text as the client sees it (the id on a model without a
// tokenizer).
std::string token_text(int32_t id, const ModelInfo& model);

// Everything a request produced, for the whole (not streamed) answer.
struct Answer {
  std::vector<TokenOut> tokens;
  std::string text;
  Update final_update;  // finish, usage figures
};

// The whole responses.
ojson chat_response(const ApiRequest& r, const Answer& a, const ModelInfo& model, const std::string& id,
                    int64_t created);
ojson completion_response(const ApiRequest& r, const Answer& a, const ModelInfo& model, const std::string& id,
                          int64_t created);

// The text of a completion on a model without a tokenizer: the ids joined
// by spaces.
std::string ids_text(const std::vector<TokenOut>& tokens, bool leading_space);

// The streamed answer: chunk objects for each update, in order.
class ChunkWriter {
 public:
  ChunkWriter(const ApiRequest& r, const ModelInfo& model, std::string id, int64_t created);
  // The chunks the update adds (the first call also gives the role chunk of
  // a chat answer; the final update gives the finish chunk and, with
  // include_usage, the usage chunk). An update that ended in kError gives
  // no finish chunk: the server sends error_body instead.
  std::vector<ojson> chunks(const Update& u);

 private:
  ojson chunk(ojson choice) const;
  ojson chat_choice(const CompletionDelta& d);
  void add_tokens(ojson& choice, const std::vector<TokenOut>& tokens);

  const ApiRequest& request_;
  const ModelInfo& model_;
  std::string id_;
  int64_t created_;
  AnswerSplitter splitter_;
  bool started_ = false;
  int64_t text_offset_ = 0;
  size_t tool_calls_given_ = 0;
  bool any_tokens_ = false;
};

}  // namespace dsv4::serve
