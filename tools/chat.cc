#include "chat.h"

#include <cstdio>
#include <iostream>

#include "core/error.h"
#include "io/chat_format.h"

namespace dsv4::cli {

namespace {

using nlohmann::json;
using nlohmann::ordered_json;

constexpr const char* kDim = "\x1b[2m";
constexpr const char* kReset = "\x1b[0m";

void write_out(const std::string& s) {
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fflush(stdout);
}

// Streams an answer's text with the reasoning set apart from the content:
// dimmed on a terminal, inside <think>...</think> (as the model writes it)
// otherwise. Text the reference parser rejects (a special token inside the
// content, DSML out of form: random weights write anything) is shown from
// there on as it is.
class AnswerPrinter {
 public:
  AnswerPrinter(ThinkingMode mode, bool terminal) : parser_(mode), mode_(mode), terminal_(terminal) {}

  void feed(const std::string& piece) {
    fed_ += piece;
    if (raw_) return write_out(piece);
    try {
      show(parser_.feed(piece));
    } catch (const Error&) {
      show_rest_raw();
    }
  }

  void finish() {
    if (!raw_) {
      try {
        show(parser_.finish());
      } catch (const Error&) {
        show_rest_raw();
      }
    }
    if (in_reasoning_ && terminal_) write_out(kReset);
  }

 private:
  void open_reasoning() {
    if (!in_reasoning_ && !reasoning_closed_) write_out(terminal_ ? kDim : "<think>");
    in_reasoning_ = true;
  }
  void close_reasoning() {
    if (in_reasoning_) write_out(terminal_ ? std::string(kReset) + "\n" : std::string(kThinkingEndToken));
    in_reasoning_ = false;
    reasoning_closed_ = true;
  }
  void show(const CompletionDelta& d) {
    if (!d.reasoning_content.empty()) {
      open_reasoning();
      write_out(d.reasoning_content);
      reasoning_shown_ += d.reasoning_content.size();
    }
    if (!d.content.empty() || !d.tool_calls.empty()) close_reasoning();
    write_out(d.content);
    content_shown_ += d.content.size();
    for (const ToolCall& c : d.tool_calls) write_out("\n[tool call " + c.name + " " + c.arguments + "]\n");
    tool_calls_ |= !d.tool_calls.empty();
  }
  // Where the shown text ends in what was fed: the reasoning, the
  // </think> that closed it, the content (unknown once tool calls came).
  void show_rest_raw() {
    raw_ = true;
    size_t at = reasoning_shown_;
    const std::string end(kThinkingEndToken);
    if (mode_ == ThinkingMode::kThinking && fed_.compare(at, end.size(), end) == 0) at += end.size();
    at += content_shown_;
    if (!tool_calls_ && at < fed_.size()) write_out(fed_.substr(at));
  }

  CompletionStreamParser parser_;
  ThinkingMode mode_;
  bool terminal_;
  std::string fed_;
  size_t reasoning_shown_ = 0, content_shown_ = 0;
  bool in_reasoning_ = false, reasoning_closed_ = false, raw_ = false, tool_calls_ = false;
};

// The answer as the conversation keeps it: the reference parser's split, or,
// for text it rejects (or a tool call no tool was offered for), the text as
// it is, so that the next turn's prompt still starts with what was generated.
ParsedCompletion answer_of(const std::string& text, ThinkingMode mode) {
  try {
    ParsedCompletion c = parse_completion(text, mode);
    if (c.tool_calls.empty()) return c;
  } catch (const Error&) {
  }
  ParsedCompletion c;
  const size_t end = mode == ThinkingMode::kThinking ? text.find(kThinkingEndToken) : std::string::npos;
  if (end == std::string::npos) {
    c.content = text;
  } else {
    c.reasoning_content = text.substr(0, end);
    c.content = text.substr(end + kThinkingEndToken.size());
  }
  return c;
}

// What the last turn left in the prefix cache: its prompt and every token
// generated after it, and their text byte for byte.
struct History {
  std::vector<int32_t> tokens;
  std::string text;
};

// The prompt's ids for the conversation rendered as `rendered`. When it
// starts with the text of the last turn's tokens (chat mode: the earlier
// answers go back exactly as generated), those tokens are kept and only the
// rest is tokenized (it starts at a special token, where tokenizing starts
// afresh anyway): the whole last turn is then a cached prefix, even where
// the model's tokens are not the ones the tokenizer would choose for the
// same text. Otherwise (thinking mode leaves the earlier reasoning out; a
// stop string cut an answer short) the whole text is tokenized and the
// prefix cache resumes from what it has (in thinking mode: the last prompt
// but its final token, GenerationParams::remember_before_last).
std::vector<int32_t> prompt_ids(const Tokenizer& tok, const std::string& rendered, const History& h) {
  if (!h.tokens.empty() && rendered.size() > h.text.size() && rendered.starts_with(h.text)) {
    const std::string_view rest = std::string_view(rendered).substr(h.text.size());
    if (rest.starts_with(kEosToken) || rest.starts_with(kUserToken)) {
      std::vector<int32_t> ids = h.tokens;
      const std::vector<int32_t> more = tok.encode(rest);
      ids.insert(ids.end(), more.begin(), more.end());
      return ids;
    }
  }
  return tok.encode(rendered);
}

// The turn's token budget: -n, or what the position limit leaves.
int64_t answer_budget(const Engine& engine, int64_t n_prompt, int64_t wanted) {
  const int64_t limit = engine.position_limit();
  if (n_prompt > limit)
    throw Error("the conversation has grown to " + std::to_string(n_prompt) + " tokens, more than the limit of " +
                std::to_string(limit) + " (--max-context, capped by max_position_embeddings)");
  return std::min(wanted, limit - n_prompt + 1);
}

// After the answer: one line on stderr, or the turn's JSON object on stdout.
void report_turn(const ChatSettings& s, const Engine& engine, int turn, const std::vector<int32_t>& prompt,
                 const Generation& g, const ParsedCompletion& answer) {
  if (s.json) {
    json out = generation_json(g);
    out["turn"] = turn;
    out["prompt"] = prompt;
    out["text"] = answer.content;
    out["reasoning_content"] = answer.reasoning_content;
    out["prefix_cache"] = prefix_cache_json(engine.prefix_cache_stats());
    std::cout << out.dump() << std::endl;
    return;
  }
  std::string decode;
  if (g.decode_tokens() > 0) {
    char buf[64];
    std::snprintf(buf, sizeof buf, ", decode %.1f tokens/s", g.decode_tokens_per_second());
    decode = buf;
  }
  std::fprintf(stderr, "[turn %d: %lld cached + %lld new prompt tokens, %zu generated (%s), prefill %.1f tokens/s%s]\n",
               turn, (long long)g.cached_tokens, (long long)(g.prompt_tokens - g.cached_tokens), g.tokens.size(),
               g.finish_reason.c_str(), g.prefill_tokens_per_second(), decode.c_str());
}

// The next user turn: a line of `in` with something besides white space.
bool read_turn(std::istream& in, bool prompt, std::string* line) {
  for (;;) {
    if (prompt) std::fputs("> ", stderr), std::fflush(stderr);
    if (!std::getline(in, *line)) {
      if (prompt) std::fputs("\n", stderr);  // the shell's prompt on a line of its own after ^D
      return false;
    }
    if (!line->empty() && line->back() == '\r') line->pop_back();
    if (line->find_first_not_of(" \t\v\f") != std::string::npos) return true;
  }
}

}  // namespace

void run_chat(Engine& engine, const ChatSettings& s, std::istream& in) {
  const Tokenizer& tok = *engine.tokenizer();
  EncodeOptions encode;
  encode.thinking_mode = s.think ? ThinkingMode::kThinking : ThinkingMode::kChat;
  ordered_json messages = ordered_json::array();
  if (s.has_system) messages.push_back({{"role", "system"}, {"content", s.system}});
  History history;
  std::string line;
  for (int turn = 1; read_turn(in, s.terminal_in, &line); ++turn) {
    messages.push_back({{"role", "user"}, {"content", line}});
    const std::vector<int32_t> prompt = prompt_ids(tok, encode_messages(messages, encode), history);
    GenerationParams p = s.generation;
    p.remember_before_last = s.think;
    p.max_new_tokens = answer_budget(engine, int64_t(prompt.size()), p.max_new_tokens);
    AnswerPrinter printer(encode.thinking_mode, s.terminal_out);
    TokenStream out(&tok, s.stops, s.json ? TokenStream::Sink() : [&](const std::string& t) { printer.feed(t); });
    const Generation g = generate(engine, prompt, p, out);
    if (!s.json) printer.finish(), write_out("\n");
    const ParsedCompletion answer = answer_of(g.text, encode.thinking_mode);
    messages.push_back({{"role", "assistant"}, {"content", answer.content},
                        {"reasoning_content", answer.reasoning_content}});
    history.tokens = prompt;
    history.tokens.insert(history.tokens.end(), g.tokens.begin(), g.tokens.end());
    history.text = tok.decode(history.tokens);
    report_turn(s, engine, turn, prompt, g, answer);
  }
}

}  // namespace dsv4::cli
