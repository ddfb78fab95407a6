// DeepSeek-V4 chat prompts and completions, in the words of DeepSeek's
// reference encoder (`encoding/encoding_dsv4.py` of the V4 model repositories;
// its test vectors are shared/data/chat/encode_cases.json).
//
// encode_messages() turns OpenAI-style messages into the exact prompt text the
// reference's encode_messages() produces: special tokens written out as text,
// to be tokenized with the V4 tokenizer. parse_completion() and
// CompletionStreamParser turn what the model writes after that prompt back
// into content, reasoning_content and tool calls, as the reference's
// parse_message_from_completion_text() does.
//
// The messages are nlohmann::ordered_json, not nlohmann::json: the reference
// writes tool schemas and non-string tool-call arguments with Python's
// json.dumps, which keeps the keys in the order they came in, and the prompt
// must match it byte for byte. (nlohmann::json sorts keys.)
//
// Everything malformed (an unknown role, a missing required field, a tool
// result without a call, DSML the reference would reject) is a dsv4::Error
// with a one-line message naming the message index and field, e.g.
// "messages[3].tool_calls[0].function.name: missing".
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace dsv4 {

// The special tokens of the V4 prompt, as text.
inline constexpr std::string_view kBosToken = "<｜begin▁of▁sentence｜>";
inline constexpr std::string_view kEosToken = "<｜end▁of▁sentence｜>";
inline constexpr std::string_view kUserToken = "<｜User｜>";
inline constexpr std::string_view kAssistantToken = "<｜Assistant｜>";
inline constexpr std::string_view kLatestReminderToken = "<｜latest_reminder｜>";
inline constexpr std::string_view kThinkingStartToken = "<think>";
inline constexpr std::string_view kThinkingEndToken = "</think>";
inline constexpr std::string_view kDsmlToken = "｜DSML｜";

// "thinking": the model reasons inside <think>...</think> first (the prompt
// ends with <think>); "chat": it answers at once (the prompt ends with </think>).
enum class ThinkingMode { kChat, kThinking };
// None and "high" add nothing to the prompt; "max" puts the reference's
// maximum-effort instructions before the first message in thinking mode.
enum class ReasoningEffort { kNone, kHigh, kMax };

// "thinking" / "chat"; anything else is a dsv4::Error naming `field`.
ThinkingMode parse_thinking_mode(std::string_view text, std::string_view field = "thinking_mode");
// "" / "high" / "max"; anything else is a dsv4::Error naming `field`.
ReasoningEffort parse_reasoning_effort(std::string_view text, std::string_view field = "reasoning_effort");

struct EncodeOptions {
  ThinkingMode thinking_mode = ThinkingMode::kThinking;
  ReasoningEffort reasoning_effort = ReasoningEffort::kNone;
  // Reasoning of assistant turns before the last user turn is left out
  // (automatically off when any message carries tools, as in the reference).
  bool drop_thinking = true;
  // The BOS starts the prompt, unless `context` is given.
  bool add_bos = true;
  // Messages already in the prompt (a cached prefix): they shape how the new
  // messages render (tool-call order, which reasoning is dropped) but are not
  // rendered themselves. An array; null or empty when there is none.
  nlohmann::ordered_json context = nullptr;
};

// The prompt text for `messages` (an array of message objects):
//   role "system" | "developer" | "user" | "assistant" | "tool" | "latest_reminder";
//   content (string; a tool message may also give an array of {type, text} parts);
//   system/developer: tools (OpenAI function definitions), response_format;
//   assistant: reasoning_content, tool_calls [{id, type, function {name, arguments}}];
//   tool: tool_call_id;
//   the reference's extensions: task ("action", "query", "authority", "domain",
//   "title", "read_url") and wo_eos (an assistant turn left open).
// A conversation that ends with a user (or developer) turn ends with the
// assistant prefix: <｜Assistant｜><think> in thinking mode, <｜Assistant｜></think> in chat mode.
std::string encode_messages(const nlohmann::ordered_json& messages, const EncodeOptions& options = {});

// The opening of an assistant's tool-call block as encode_messages()
// renders it (what a tool call in a completion starts with): through the
// first call's name and its line break, or, with an empty name, up to the
// name's opening quote.
std::string tool_call_opening(std::string_view name);

struct ToolCall {
  std::string id;         // given by the parser: id_prefix + the call's index in the completion
  std::string name;
  std::string arguments;  // a JSON object as text
};

// What the model said, split as the reference's parser splits it.
struct ParsedCompletion {
  std::string reasoning_content;  // empty in chat mode
  std::string content;
  std::vector<ToolCall> tool_calls;
  bool ended = false;  // the end-of-sentence token closed the text
};

// Parses a whole completion: the text after the prompt, with or without its
// final <｜end▁of▁sentence｜>. A completion cut short (no </think> yet, no
// end-of-sentence) gives what it has; text the reference rejects (reasoning
// that runs into a tool call, DSML out of form, text after the
// end-of-sentence, a special token inside content or reasoning) throws
// dsv4::Error.
ParsedCompletion parse_completion(std::string_view text, ThinkingMode mode, std::string_view id_prefix = "call_");

// What a piece of completion text added.
struct CompletionDelta {
  std::string reasoning_content;
  std::string content;
  std::vector<ToolCall> tool_calls;  // whole calls, in order, each given once
  bool empty() const { return reasoning_content.empty() && content.empty() && tool_calls.empty(); }
};

// The streaming form of parse_completion(): feed() the text as it is
// generated, finish() at the end. Text that could still turn into a marker
// (the start of </think>, of a DSML block, of a special token) or that ends
// inside a UTF-8 character is held back until the next piece decides it; a
// tool call is given once its invoke block is complete. The deltas of all
// calls together equal parse_completion() of the whole text, and the errors
// are the same (raised as soon as the text rules the completion out).
class CompletionStreamParser {
 public:
  explicit CompletionStreamParser(ThinkingMode mode, std::string id_prefix = "call_");
  CompletionDelta feed(std::string_view piece);
  CompletionDelta finish();
  // The end-of-sentence token has arrived; nothing may follow it.
  bool ended() const { return phase_ == Phase::kEnded; }

 private:
  enum class Phase { kReasoning, kContent, kToolCalls, kAfterToolCalls, kEnded };
  void advance(bool final, CompletionDelta* out);
  bool advance_text(bool final, CompletionDelta* out);
  bool advance_tool_calls(bool final, CompletionDelta* out);
  bool advance_after_tool_calls(bool final);

  Phase phase_;
  std::string id_prefix_;
  std::string text_;   // everything fed so far
  size_t pos_ = 0;     // text_[0, pos_) has been accounted for
  size_t calls_ = 0;   // tool calls given so far
  bool finished_ = false;
};

}  // namespace dsv4
