#include "io/chat_format.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <optional>
#include <unordered_map>

#include "core/error.h"

namespace dsv4 {
namespace {

using ojson = nlohmann::ordered_json;

// ---- The fixed texts of the prompt ---------------------------------------------------
// These are prompt data, and must match the reference's to the byte.

// The `## Tools` block; the schemas go between its two halves.
constexpr std::string_view kToolsHead =
    "## Tools\n\n"
    "You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "
    "\"<｜DSML｜tool_calls>\" block like the following:\n\n"
    "<｜DSML｜tool_calls>\n"
    "<｜DSML｜invoke name=\"$TOOL_NAME\">\n"
    "<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜parameter>\n"
    "...\n"
    "</｜DSML｜invoke>\n"
    "<｜DSML｜invoke name=\"$TOOL_NAME2\">\n"
    "...\n"
    "</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls>\n\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, "
    "booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
    "<think>...</think> BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n";
constexpr std::string_view kToolsTail =
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";

constexpr std::string_view kResponseFormatHead =
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

constexpr std::string_view kReasoningEffortMax =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root "
    "cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial "
    "scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, considered "
    "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";

// DSML markers. A parameter's end is searched without its '<' because the
// reference's parameter pattern keeps that '<' as the last character of what
// precedes it.
constexpr std::string_view kToolCallsStart = "\n\n<｜DSML｜tool_calls";
constexpr std::string_view kToolCallsOpen = "<｜DSML｜tool_calls>";
constexpr std::string_view kToolCallsClose = "</｜DSML｜tool_calls>";
constexpr std::string_view kInvokeOpen = "<｜DSML｜invoke";
constexpr std::string_view kInvokeClose = "</｜DSML｜invoke";
constexpr std::string_view kParameterOpen = "<｜DSML｜parameter";
constexpr std::string_view kParameterEnd = "/｜DSML｜parameter";

// The internal tasks and the token each adds.
std::optional<std::string_view> task_token(std::string_view task) {
  static const std::pair<std::string_view, std::string_view> kTasks[] = {
      {"action", "<｜action｜>"}, {"query", "<｜query｜>"}, {"authority", "<｜authority｜>"},
      {"domain", "<｜domain｜>"}, {"title", "<｜title｜>"}, {"read_url", "<｜read_url｜>"}};
  for (const auto& [name, token] : kTasks)
    if (name == task) return token;
  return std::nullopt;
}

// ---- JSON written as Python's json.dumps(ensure_ascii=False) writes it ----------------
// ", " and ": " as separators, keys in their given order, non-ASCII text as is,
// floats as Python's repr.

void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

// Python's repr of a float: the shortest digits that read back the same,
// positional for exponents -4..15 (with at least one decimal), otherwise
// d.ddde+XX.
std::string python_float(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string s(buf, res.ptr);
  std::string out;
  if (s[0] == '-') {
    out = "-";
    s.erase(0, 1);
  }
  const size_t e = s.find('e');
  const int exp = std::stoi(s.substr(e + 1));
  std::string digits = s.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  if (exp >= 16 || exp < -4) {
    out += digits[0];
    if (digits.size() > 1) out += "." + digits.substr(1);
    char ebuf[16];
    std::snprintf(ebuf, sizeof ebuf, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    return out + ebuf;
  }
  if (exp < 0) return out + "0." + std::string(-exp - 1, '0') + digits;
  const size_t int_digits = exp + 1;
  if (digits.size() <= int_digits) return out + digits + std::string(int_digits - digits.size(), '0') + ".0";
  return out + digits.substr(0, int_digits) + "." + digits.substr(int_digits);
}

void append_json(std::string& out, const ojson& v) {
  switch (v.type()) {
    case ojson::value_t::object: {
      out += '{';
      bool first = true;
      for (const auto& [key, value] : v.items()) {
        if (!first) out += ", ";
        first = false;
        append_json_string(out, key);
        out += ": ";
        append_json(out, value);
      }
      out += '}';
      return;
    }
    case ojson::value_t::array: {
      out += '[';
      for (size_t i = 0; i < v.size(); ++i) {
        if (i) out += ", ";
        append_json(out, v[i]);
      }
      out += ']';
      return;
    }
    case ojson::value_t::string: append_json_string(out, v.get_ref<const std::string&>()); return;
    case ojson::value_t::boolean: out += v.get<bool>() ? "true" : "false"; return;
    case ojson::value_t::number_integer: out += std::to_string(v.get<int64_t>()); return;
    case ojson::value_t::number_unsigned: out += std::to_string(v.get<uint64_t>()); return;
    case ojson::value_t::number_float: out += python_float(v.get<double>()); return;
    default: out += "null"; return;
  }
}

std::string to_json(const ojson& v) {
  std::string out;
  append_json(out, v);
  return out;
}

std::string json_string(std::string_view s) {
  std::string out;
  append_json_string(out, s);
  return out;
}

// Python's truth value of a JSON value (the reference tests fields with `if x:`).
bool truthy(const ojson* v) {
  if (!v || v->is_null()) return false;
  if (v->is_string()) return !v->get_ref<const std::string&>().empty();
  if (v->is_object() || v->is_array()) return !v->empty();
  if (v->is_boolean()) return v->get<bool>();
  if (v->is_number_float()) return v->get<double>() != 0.0;
  if (v->is_number()) return v->get<int64_t>() != 0;
  return true;
}


// ---- Messages, read and checked ------------------------------------------------------

// One block of a user turn: its own text, or a tool's result merged into it.
struct Block {
  bool tool_result = false;
  std::string text;
  std::string tool_use_id;
};

struct Call {
  std::string id;
  std::string name;
  const ojson* arguments = nullptr;
};

// A message in the form the reference renders: the fields it reads, with
// absent values already turned into what it turns them into ("" for a missing
// content or reasoning).
struct Message {
  std::string role;
  std::string where;  // "messages[3]", for errors
  std::string content;
  std::vector<Block> blocks;  // user turns, after merging
  std::string reasoning;
  std::vector<Call> tool_calls;
  const ojson* tools = nullptr;            // set only when truthy
  const ojson* response_format = nullptr;  // set only when truthy
  std::optional<std::string> task;
  bool wo_eos = false;
  std::string tool_call_id;  // tool messages
};

[[noreturn]] void fail(const std::string& where, std::string_view field, std::string_view problem) {
  throw Error(where + (field.empty() ? "" : ".") + std::string(field) + ": " + std::string(problem));
}

const ojson* member(const ojson& obj, std::string_view key) {
  const auto it = obj.find(std::string(key));
  return it == obj.end() ? nullptr : &*it;
}

// A field that may be absent or null; otherwise it must be a string.
std::optional<std::string> optional_string(const ojson& msg, std::string_view key, const std::string& where) {
  const ojson* v = member(msg, key);
  if (!v || v->is_null()) return std::nullopt;
  if (!v->is_string()) fail(where, key, "expected a string, got " + std::string(v->type_name()));
  return v->get<std::string>();
}

std::string required_string(const ojson& msg, std::string_view key, const std::string& where) {
  std::optional<std::string> s = optional_string(msg, key, where);
  if (!s) fail(where, key, "missing");
  return *s;
}

// A tool's result: text, or a list of content parts whose text parts are
// joined by blank lines (other parts are named as unsupported, as the
// reference does).
std::string tool_result_text(const ojson& msg, const std::string& where) {
  const ojson* c = member(msg, "content");
  if (!c || c->is_null()) fail(where, "content", "missing");
  if (c->is_string()) return c->get<std::string>();
  if (!c->is_array()) fail(where, "content", "expected a string or an array of parts");
  std::string out;
  for (size_t i = 0; i < c->size(); ++i) {
    const ojson& part = (*c)[i];
    const std::string at = where + ".content[" + std::to_string(i) + "]";
    if (!part.is_object()) fail(at, "", "expected an object");
    const std::string type = optional_string(part, "type", at).value_or("");
    if (i) out += "\n\n";
    out += type == "text" ? optional_string(part, "text", at).value_or("") : "[Unsupported " + type + "]";
  }
  return out;
}

std::vector<Call> read_tool_calls(const ojson& msg, const std::string& where) {
  std::vector<Call> calls;
  const ojson* tcs = member(msg, "tool_calls");
  if (!truthy(tcs)) return calls;
  if (!tcs->is_array()) fail(where, "tool_calls", "expected an array");
  for (size_t i = 0; i < tcs->size(); ++i) {
    const ojson& tc = (*tcs)[i];
    const std::string at = where + ".tool_calls[" + std::to_string(i) + "]";
    if (!tc.is_object()) fail(at, "", "expected an object");
    const ojson* fn = member(tc, "function");
    if (!fn || !fn->is_object()) fail(at, "function", "missing");
    Call call;
    call.name = optional_string(*fn, "name", at + ".function").value_or("");
    if (call.name.empty()) fail(at, "function.name", "missing");
    call.arguments = member(*fn, "arguments");
    if (!call.arguments || call.arguments->is_null()) fail(at, "function.arguments", "missing");
    // The reference takes the id from the call, or failing that its function.
    call.id = optional_string(tc, "id", at).value_or("");
    if (call.id.empty()) call.id = optional_string(*fn, "id", at + ".function").value_or("");
    calls.push_back(std::move(call));
  }
  return calls;
}

const ojson* read_tools(const ojson& msg, const std::string& where) {
  const ojson* tools = member(msg, "tools");
  if (!truthy(tools)) return nullptr;
  if (!tools->is_array()) fail(where, "tools", "expected an array");
  for (size_t i = 0; i < tools->size(); ++i) {
    const ojson* fn = (*tools)[i].is_object() ? member((*tools)[i], "function") : nullptr;
    if (!fn || !fn->is_object()) fail(where, "tools[" + std::to_string(i) + "].function", "missing");
  }
  return tools;
}

// The fields of one message, checked for its role.
Message read_message(const ojson& msg, const std::string& where) {
  if (!msg.is_object()) fail(where, "", "expected a message object");
  Message m;
  m.where = where;
  m.role = required_string(msg, "role", where);
  const std::string& r = m.role;
  if (r == "user" || r == "latest_reminder") {
    m.content = required_string(msg, "content", where);
  } else if (r == "developer") {
    m.content = required_string(msg, "content", where);
    if (m.content.empty()) fail(where, "content", "empty (a developer message needs text)");
  } else if (r == "system" || r == "assistant") {
    m.content = optional_string(msg, "content", where).value_or("");
  } else if (r == "tool") {
    m.content = tool_result_text(msg, where);
    m.tool_call_id = optional_string(msg, "tool_call_id", where).value_or("");
  } else {
    fail(where, "role", "unknown role \"" + r + "\" (system, user, assistant, tool, developer, latest_reminder)");
  }
  if (r == "assistant") {
    m.reasoning = optional_string(msg, "reasoning_content", where).value_or("");
    m.tool_calls = read_tool_calls(msg, where);
  }
  m.tools = read_tools(msg, where);
  if (const ojson* rf = member(msg, "response_format"); truthy(rf)) m.response_format = rf;
  m.task = optional_string(msg, "task", where);
  if (m.task && !task_token(*m.task)) fail(where, "task", "unknown task \"" + *m.task + "\"");
  if (const ojson* w = member(msg, "wo_eos"); w && !w->is_null()) {
    if (!w->is_boolean()) fail(where, "wo_eos", "expected true or false");
    m.wo_eos = w->get<bool>();
  }
  return m;
}

std::vector<Message> read_messages(const ojson& list, std::string_view name) {
  std::vector<Message> out;
  if (list.is_null()) return out;
  if (!list.is_array()) throw Error(std::string(name) + ": expected an array of messages");
  for (size_t i = 0; i < list.size(); ++i) out.push_back(read_message(list[i], std::string(name) + "[" + std::to_string(i) + "]"));
  return out;
}

// A tool result must answer a call: some assistant turn before it made tool
// calls, and when it names a call id, the latest of those turns has that id
// (unless its calls carry no ids at all, as some clients send them).
void check_tool_results(const std::vector<Message>& messages) {
  const std::vector<Call>* calls = nullptr;
  for (const Message& m : messages) {
    if (m.role == "assistant" && !m.tool_calls.empty()) calls = &m.tool_calls;
    if (m.role != "tool") continue;
    if (!calls) fail(m.where, "role", "a tool result with no assistant tool call before it");
    if (m.tool_call_id.empty()) continue;
    const bool any_id = std::any_of(calls->begin(), calls->end(), [](const Call& c) { return !c.id.empty(); });
    const bool match = std::any_of(calls->begin(), calls->end(), [&](const Call& c) { return c.id == m.tool_call_id; });
    if (any_id && !match) fail(m.where, "tool_call_id", "\"" + m.tool_call_id + "\" matches no call of the last assistant turn with tool calls");
  }
}


// ---- The reference's passes over the messages ------------------------------------------

// V4 has no tool role: each tool result becomes a block of a user turn, joined
// to the user turn before it when there is one, and a user turn that follows
// such a turn (without a task) joins it too.
std::vector<Message> merge_tool_messages(const std::vector<Message>& messages) {
  std::vector<Message> merged;
  for (const Message& m : messages) {
    const bool after_user = !merged.empty() && merged.back().role == "user";
    if (m.role == "tool") {
      Block b{true, m.content, m.tool_call_id};
      if (after_user) {
        merged.back().blocks.push_back(std::move(b));
      } else {
        Message u;
        u.role = "user";
        u.where = m.where;
        u.blocks.push_back(std::move(b));
        merged.push_back(std::move(u));
      }
    } else if (m.role == "user") {
      Block b{false, m.content, ""};
      if (after_user && !merged.back().task) {
        merged.back().blocks.push_back(std::move(b));
      } else {
        // Only these fields survive; tools on a user turn are not rendered.
        Message u;
        u.role = "user";
        u.where = m.where;
        u.content = m.content;
        u.blocks.push_back(std::move(b));
        u.task = m.task;
        u.wo_eos = m.wo_eos;
        merged.push_back(std::move(u));
      }
    } else {
      merged.push_back(m);
    }
  }
  return merged;
}

// Several results in one user turn are put in the order of the calls of the
// latest assistant turn with tool calls (a result with an unknown id ranks as
// the first call; equal ranks keep their order).
void sort_tool_results_by_call_order(std::vector<Message>& messages) {
  std::unordered_map<std::string, size_t> order;
  for (Message& m : messages) {
    if (m.role == "assistant" && !m.tool_calls.empty()) {
      order.clear();
      for (size_t i = 0; i < m.tool_calls.size(); ++i)
        if (!m.tool_calls[i].id.empty()) order[m.tool_calls[i].id] = i;
    } else if (m.role == "user") {
      std::vector<Block> results;
      for (const Block& b : m.blocks)
        if (b.tool_result) results.push_back(b);
      if (results.size() < 2 || order.empty()) continue;
      const auto rank = [&](const Block& b) {
        const auto it = order.find(b.tool_use_id);
        return it == order.end() ? size_t{0} : it->second;
      };
      std::stable_sort(results.begin(), results.end(), [&](const Block& a, const Block& b) { return rank(a) < rank(b); });
      size_t next = 0;
      for (Block& b : m.blocks)
        if (b.tool_result) b = results[next++];
    }
  }
}

// The last user or developer turn, or -1.
long find_last_user_index(const std::vector<Message>& messages) {
  for (long i = static_cast<long>(messages.size()) - 1; i >= 0; --i)
    if (messages[i].role == "user" || messages[i].role == "developer") return i;
  return -1;
}

// Before the last user turn, assistant turns lose their reasoning and
// developer turns are left out entirely.
std::vector<Message> drop_thinking_messages(const std::vector<Message>& messages) {
  const long last_user = find_last_user_index(messages);
  std::vector<Message> kept;
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role == "user" || role == "system" || role == "tool" || role == "latest_reminder" ||
        static_cast<long>(i) >= last_user) {
      kept.push_back(messages[i]);
    } else if (role == "assistant") {
      kept.push_back(messages[i]);
      kept.back().reasoning.clear();
    }
  }
  return kept;
}

// ---- Rendering ---------------------------------------------------------------------------

std::string render_tools(const ojson& tools) {
  std::string out(kToolsHead);
  for (size_t i = 0; i < tools.size(); ++i) {
    if (i) out += '\n';
    append_json(out, tools[i]["function"]);
  }
  out += kToolsTail;
  return out;
}

// The tools and response format a system or developer turn carries.
std::string render_instructions(const Message& m) {
  std::string out;
  if (m.tools) out += "\n\n" + render_tools(*m.tools);
  if (m.response_format) out += "\n\n" + std::string(kResponseFormatHead) + to_json(*m.response_format);
  return out;
}

// The parameters of a call: the arguments' JSON object, one parameter per key
// in its order; strings as they are, anything else as JSON. Arguments that are
// not JSON text become one string parameter named "arguments".
std::string render_call_parameters(const Call& call, const std::string& where) {
  ojson args;
  if (call.arguments->is_string()) {
    args = ojson::parse(call.arguments->get_ref<const std::string&>(), nullptr, false);
    if (args.is_discarded()) args = ojson::object({{"arguments", *call.arguments}});
  } else {
    args = ojson::object({{"arguments", *call.arguments}});
  }
  if (!args.is_object()) fail(where, "function.arguments", "not a JSON object");
  std::string out;
  for (const auto& [key, value] : args.items()) {
    if (!out.empty()) out += '\n';
    const bool is_string = value.is_string();
    out += "<｜DSML｜parameter name=\"" + key + "\" string=\"" + (is_string ? "true" : "false") + "\">";
    out += is_string ? value.get<std::string>() : to_json(value);
    out += "</｜DSML｜parameter>";
  }
  return out;
}

// One call's first line.
std::string invoke_line(std::string_view name) {
  return std::string(kInvokeOpen) + " name=\"" + std::string(name) + "\">\n";
}

std::string render_tool_calls(const Message& m) {
  std::string out = "\n\n";
  out += kToolCallsOpen;
  out += '\n';
  for (size_t i = 0; i < m.tool_calls.size(); ++i) {
    const Call& c = m.tool_calls[i];
    if (i) out += '\n';
    out += invoke_line(c.name);
    out += render_call_parameters(c, m.where + ".tool_calls[" + std::to_string(i) + "]");
    out += "\n</｜DSML｜invoke>";
  }
  out += '\n';
  out += kToolCallsClose;
  return out;
}

struct RenderState {
  const std::vector<Message>& messages;
  ThinkingMode mode;
  bool drop_thinking;
  long last_user;
};

std::string render_assistant(const RenderState& s, size_t index) {
  const Message& m = s.messages[index];
  // A turn answering a task carries no reasoning block.
  const bool after_task = index > 0 && s.messages[index - 1].task.has_value();
  std::string out;
  if (s.mode == ThinkingMode::kThinking && !after_task &&
      (!s.drop_thinking || static_cast<long>(index) > s.last_user))
    out += m.reasoning + std::string(kThinkingEndToken);
  out += m.content;
  if (!m.tool_calls.empty()) out += render_tool_calls(m);
  if (!m.wo_eos) out += kEosToken;
  return out;
}

std::string render_user(const Message& m) {
  std::string out(kUserToken);
  for (size_t i = 0; i < m.blocks.size(); ++i) {
    if (i) out += "\n\n";
    const Block& b = m.blocks[i];
    out += b.tool_result ? "<tool_result>" + b.text + "</tool_result>" : b.text;
  }
  return out;
}

// What closes a turn when the next one is the assistant's (or a reminder), or
// when it is the last: a task's token, or after a user turn the assistant
// prefix with the thinking marker that opens its answer.
std::string render_transition(const RenderState& s, size_t index) {
  const Message& m = s.messages[index];
  const bool thinking = s.mode == ThinkingMode::kThinking;
  if (m.task) {
    const std::string token(*task_token(*m.task));
    if (*m.task != "action") return token;
    return std::string(kAssistantToken) + std::string(thinking ? kThinkingStartToken : kThinkingEndToken) + token;
  }
  if (m.role != "user" && m.role != "developer") return "";
  const bool open_thinking = thinking && (!s.drop_thinking || static_cast<long>(index) >= s.last_user);
  return std::string(kAssistantToken) + std::string(open_thinking ? kThinkingStartToken : kThinkingEndToken);
}

std::string render_message(const RenderState& s, size_t index, ReasoningEffort effort) {
  const Message& m = s.messages[index];
  std::string out;
  if (index == 0 && s.mode == ThinkingMode::kThinking && effort == ReasoningEffort::kMax) out += kReasoningEffortMax;
  if (m.role == "system") {
    out += m.content + render_instructions(m);
  } else if (m.role == "developer") {
    out += std::string(kUserToken) + m.content + render_instructions(m);
  } else if (m.role == "user") {
    out += render_user(m);
  } else if (m.role == "latest_reminder") {
    out += std::string(kLatestReminderToken) + m.content;
  } else {
    out += render_assistant(s, index);
  }
  const bool last = index + 1 == s.messages.size();
  if (last || s.messages[index + 1].role == "assistant" || s.messages[index + 1].role == "latest_reminder")
    out += render_transition(s, index);
  return out;
}

}  // namespace

ThinkingMode parse_thinking_mode(std::string_view text, std::string_view field) {
  if (text == "thinking") return ThinkingMode::kThinking;
  if (text == "chat") return ThinkingMode::kChat;
  throw Error(std::string(field) + ": \"" + std::string(text) + "\" is not \"thinking\" or \"chat\"");
}

ReasoningEffort parse_reasoning_effort(std::string_view text, std::string_view field) {
  if (text.empty()) return ReasoningEffort::kNone;
  if (text == "high") return ReasoningEffort::kHigh;
  if (text == "max") return ReasoningEffort::kMax;
  throw Error(std::string(field) + ": \"" + std::string(text) + "\" is not \"high\" or \"max\"");
}

std::string encode_messages(const nlohmann::ordered_json& messages, const EncodeOptions& options) {
  const std::vector<Message> raw_context = read_messages(options.context, "context");
  const std::vector<Message> raw_messages = read_messages(messages, "messages");
  std::vector<Message> all = raw_context;
  all.insert(all.end(), raw_messages.begin(), raw_messages.end());
  check_tool_results(all);

  const std::vector<Message> context = merge_tool_messages(raw_context);
  std::vector<Message> full = context;
  const std::vector<Message> merged = merge_tool_messages(raw_messages);
  full.insert(full.end(), merged.begin(), merged.end());
  sort_tool_results_by_call_order(full);

  // Reasoning is never dropped from a conversation that uses tools.
  const bool uses_tools = std::any_of(full.begin(), full.end(), [](const Message& m) { return m.tools != nullptr; });
  const bool drop = options.drop_thinking && !uses_tools;
  size_t first = context.size();
  if (options.thinking_mode == ThinkingMode::kThinking && drop) {
    full = drop_thinking_messages(full);
    first = drop_thinking_messages(context).size();
  }

  std::string prompt = options.add_bos && context.empty() ? std::string(kBosToken) : std::string();
  const RenderState state{full, options.thinking_mode, drop, find_last_user_index(full)};
  for (size_t i = first; i < full.size(); ++i) prompt += render_message(state, i, options.reasoning_effort);
  return prompt;
}


// ---- Parsing completions --------------------------------------------------------------
namespace {

struct Found {
  bool found = false;
  std::string_view stop;
  size_t at = 0;   // where the stop starts, or the end of the text
  size_t end = 0;  // just past the stop, or the end of the text
};

// The earliest of `stops` at or after `pos` (no two of the stops searched
// together contain one another, so an earliest stop found stays the earliest
// however much text follows).
Found find_first(std::string_view text, size_t pos, std::initializer_list<std::string_view> stops) {
  Found f;
  f.at = f.end = text.size();
  for (std::string_view s : stops) {
    const size_t at = text.find(s, pos);
    if (at != std::string_view::npos && at < f.at) {
      f = {true, s, at, at + s.size()};
    }
  }
  return f;
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// What follows "<｜DSML｜invoke": ` name="NAME">` and a newline. (Python's `$`
// also matches before one final newline, so a second newline is accepted.)
std::string parse_invoke_name(std::string_view header) {
  std::string_view r = header;
  while (!r.empty() && is_space(r.front())) r.remove_prefix(1);
  constexpr std::string_view kName = "name=\"";
  if (r.starts_with(kName)) {
    r.remove_prefix(kName.size());
    if (r.ends_with("\">\n\n")) return std::string(r.substr(0, r.size() - 4));
    if (r.ends_with("\">\n")) return std::string(r.substr(0, r.size() - 3));
  }
  throw Error("tool call: invoke header out of form: " + json_string(header));
}

struct Parameter {
  std::string name;
  std::string value;
  bool is_string = false;
};

// What lies between "<｜DSML｜parameter" and "/｜DSML｜parameter":
// ` name="NAME" string="true|false">VALUE<`. The name ends at the first
// ` string="..."` marker; the value runs to the final '<'.
Parameter parse_parameter(std::string_view body) {
  constexpr std::string_view kName = " name=\"";
  if (body.starts_with(kName)) {
    const std::string_view r = body.substr(kName.size());
    for (size_t i = 0; i < r.size(); ++i) {
      for (const bool is_string : {true, false}) {
        const std::string_view marker = is_string ? "\" string=\"true\">" : "\" string=\"false\">";
        if (r.compare(i, marker.size(), marker) != 0) continue;
        std::string_view value = r.substr(i + marker.size());
        if (value.ends_with('<')) value.remove_suffix(1);
        else if (value.ends_with("<\n")) value.remove_suffix(2);
        else continue;
        return {std::string(r.substr(0, i)), std::string(value), is_string};
      }
    }
  }
  throw Error("tool call: parameter out of form: " + json_string(body));
}

// The arguments as a JSON object text: string values quoted, the others
// written as the model wrote them.
std::string arguments_json(const std::vector<Parameter>& params) {
  std::string out = "{";
  for (const Parameter& p : params) {
    if (out.size() > 1) out += ", ";
    out += json_string(p.name) + ": " + (p.is_string ? json_string(p.value) : p.value);
  }
  return out + "}";
}

void expect_between(std::string_view text, std::string_view want) {
  if (text != want)
    throw Error("tool call: expected " + json_string(want) + " between DSML tags, got " + json_string(text));
}

enum class Step { kNeedMore, kCall, kBlockEnd, kEnd };

// The parameters of an invoke whose header ended at `stop`; *pos just past it.
Step parse_invoke_parameters(std::string_view text, size_t* pos, bool final, std::string_view stop,
                             std::vector<Parameter>* params) {
  while (stop == kParameterOpen) {
    const Found body = find_first(text, *pos, {kParameterEnd});
    if (!body.found && !final) return Step::kNeedMore;
    Parameter p = parse_parameter(text.substr(*pos, body.at - *pos));
    for (const Parameter& q : *params)
      if (q.name == p.name) throw Error("tool call: parameter " + json_string(p.name) + " given twice");
    params->push_back(std::move(p));
    const Found next = find_first(text, body.end, {kParameterOpen, kInvokeClose});
    if (!next.found && !final) return Step::kNeedMore;
    expect_between(text.substr(body.end, next.at - body.end), ">\n");
    stop = next.found ? next.stop : std::string_view();
    *pos = next.end;
  }
  return Step::kCall;
}

// One step through a tool-call block, from just after its opening marker or
// after the previous invoke: the next whole call, the block's end, or the end
// of the text. Before `final`, a step that needs text not yet there changes
// nothing and asks for more.
Step next_tool_call(std::string_view text, size_t* pos, bool final, ToolCall* call) {
  if (*pos >= text.size()) return final ? Step::kEnd : Step::kNeedMore;
  const Found open = find_first(text, *pos, {kInvokeOpen, kToolCallsClose});
  if (!open.found && !final) return Step::kNeedMore;
  expect_between(text.substr(*pos, open.at - *pos), ">\n");
  if (!open.found) throw Error("tool call: the block ends without </｜DSML｜tool_calls>");
  if (open.stop == kToolCallsClose) {
    *pos = open.end;
    return Step::kBlockEnd;
  }
  const Found header = find_first(text, open.end, {kParameterOpen, kInvokeClose});
  if (!header.found && !final) return Step::kNeedMore;
  ToolCall c;
  c.name = parse_invoke_name(text.substr(open.end, header.at - open.end));
  size_t p = header.end;
  std::vector<Parameter> params;
  const Step s = parse_invoke_parameters(text, &p, final, header.found ? header.stop : std::string_view(), &params);
  if (s == Step::kNeedMore) return s;
  c.arguments = arguments_json(params);
  *call = std::move(c);
  *pos = p;
  return Step::kCall;
}

// Content and reasoning may hold none of the markers: none may start in
// text[pos, end) (and one that starts there must end before any stop marker
// starts, as no stop marker can begin inside a special token).
void check_no_special_tokens(std::string_view text, size_t pos, size_t end, std::string_view field) {
  for (std::string_view t : {kBosToken, kEosToken, kThinkingStartToken, kThinkingEndToken, kDsmlToken})
    if (text.find(t, pos) < end)
      throw Error("completion: " + std::string(field) + " holds the special token " + std::string(t));
}
void check_no_special_tokens(std::string_view text, std::string_view field) {
  check_no_special_tokens(text, 0, text.size(), field);
}

}  // namespace

ParsedCompletion parse_completion(std::string_view text, ThinkingMode mode, std::string_view id_prefix) {
  ParsedCompletion r;
  size_t pos = 0;
  if (mode == ThinkingMode::kThinking) {
    const Found f = find_first(text, 0, {kThinkingEndToken, kToolCallsStart});
    // A completion cut off while still reasoning is all reasoning.
    const bool cut_short = !f.found && text.find(kEosToken) == std::string_view::npos;
    if (f.stop != kThinkingEndToken && !cut_short) throw Error("completion: the reasoning has no </think>");
    r.reasoning_content = text.substr(0, f.at);
    pos = f.end;
  }
  const Found f = find_first(text, pos, {kEosToken, kToolCallsStart});
  r.content = text.substr(pos, f.at - pos);
  pos = f.end;
  r.ended = f.stop == kEosToken;
  if (f.stop == kToolCallsStart) {
    for (;;) {
      ToolCall call;
      const Step s = next_tool_call(text, &pos, true, &call);
      if (s != Step::kCall) break;
      call.id = std::string(id_prefix) + std::to_string(r.tool_calls.size());
      r.tool_calls.push_back(std::move(call));
    }
    const Found eos = find_first(text, pos, {kEosToken});
    if (eos.at != pos) throw Error("completion: text after the tool calls: " + json_string(text.substr(pos, eos.at - pos)));
    pos = eos.end;
    r.ended = eos.found;
  }
  if (pos != text.size()) throw Error("completion: text after the end of sentence: " + json_string(text.substr(pos)));
  check_no_special_tokens(r.content, "content");
  check_no_special_tokens(r.reasoning_content, "reasoning_content");
  return r;
}

std::string tool_call_opening(std::string_view name) {
  std::string out = "\n\n" + std::string(kToolCallsOpen) + "\n";
  if (!name.empty()) return out + invoke_line(name);
  std::string line = invoke_line("");
  return out + line.substr(0, line.size() - 3);  // up to name="
}

// ---- Streaming ------------------------------------------------------------------------------
namespace {

// How much of text[pos, size) can be given out now: all of it but a tail that
// could still grow into a marker or a special token, and but a UTF-8
// character not yet whole.
size_t safe_end(std::string_view text, size_t pos) {
  static constexpr std::string_view kWatched[] = {kBosToken,          kEosToken,         kThinkingStartToken,
                                                  kThinkingEndToken, kDsmlToken,        kToolCallsStart};
  size_t end = text.size();
  for (size_t k = std::min<size_t>(text.size() - pos, 64); k > 0; --k) {
    const std::string_view tail = text.substr(text.size() - k);
    if (std::any_of(std::begin(kWatched), std::end(kWatched), [&](std::string_view w) { return w.size() > k && w.starts_with(tail); })) {
      end = text.size() - k;
      break;
    }
  }
  // The last character's first byte, at most 4 bytes back.
  size_t lead = end;
  while (lead > pos && end - lead < 4) {
    --lead;
    if ((static_cast<unsigned char>(text[lead]) & 0xC0) != 0x80) break;
  }
  if (lead < end) {
    const auto b = static_cast<unsigned char>(text[lead]);
    const size_t len = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 1;
    if (lead + len > end) end = lead;
  }
  return end;
}

}  // namespace

CompletionStreamParser::CompletionStreamParser(ThinkingMode mode, std::string id_prefix)
    : phase_(mode == ThinkingMode::kThinking ? Phase::kReasoning : Phase::kContent), id_prefix_(std::move(id_prefix)) {}

CompletionDelta CompletionStreamParser::feed(std::string_view piece) {
  if (finished_) throw Error("completion: text fed after finish()");
  text_ += piece;
  CompletionDelta out;
  advance(false, &out);
  // Nothing before pos_ is looked at again.
  text_.erase(0, pos_);
  pos_ = 0;
  return out;
}

CompletionDelta CompletionStreamParser::finish() {
  CompletionDelta out;
  if (finished_) return out;
  advance(true, &out);
  finished_ = true;
  return out;
}

void CompletionStreamParser::advance(bool final, CompletionDelta* out) {
  for (bool moved = true; moved;) {
    switch (phase_) {
      case Phase::kReasoning:
      case Phase::kContent: moved = advance_text(final, out); break;
      case Phase::kToolCalls: moved = advance_tool_calls(final, out); break;
      case Phase::kAfterToolCalls: moved = advance_after_tool_calls(final); break;
      case Phase::kEnded:
        if (pos_ < text_.size())
          throw Error("completion: text after the end of sentence: " + json_string(std::string_view(text_).substr(pos_)));
        moved = false;
        break;
    }
  }
}

// Reasoning runs to </think>, content to the end of sentence or a tool-call
// block; whatever is safely before such a marker is given out at once.
bool CompletionStreamParser::advance_text(bool final, CompletionDelta* out) {
  const std::string_view text = text_;
  const bool reasoning = phase_ == Phase::kReasoning;
  std::string& sink = reasoning ? out->reasoning_content : out->content;
  const std::string_view field = reasoning ? "reasoning_content" : "content";
  const Found f = reasoning ? find_first(text, pos_, {kThinkingEndToken, kToolCallsStart})
                            : find_first(text, pos_, {kEosToken, kToolCallsStart});
  if (!f.found) {
    // A special token already whole in the text is an error even when part
    // of it is held back.
    const size_t end = final ? text.size() : safe_end(text, pos_);
    check_no_special_tokens(text, pos_, end, field);
    sink += text.substr(pos_, end - pos_);
    pos_ = end;
    return false;
  }
  check_no_special_tokens(text.substr(pos_, f.at - pos_), field);
  if (reasoning && f.stop != kThinkingEndToken) throw Error("completion: the reasoning has no </think>");
  sink += text.substr(pos_, f.at - pos_);
  pos_ = f.end;
  phase_ = reasoning ? Phase::kContent : f.stop == kEosToken ? Phase::kEnded : Phase::kToolCalls;
  return true;
}

bool CompletionStreamParser::advance_tool_calls(bool final, CompletionDelta* out) {
  size_t p = pos_;
  ToolCall call;
  switch (next_tool_call(text_, &p, final, &call)) {
    case Step::kNeedMore: return false;
    case Step::kCall:
      call.id = id_prefix_ + std::to_string(calls_++);
      out->tool_calls.push_back(std::move(call));
      break;
    case Step::kBlockEnd:
    case Step::kEnd: phase_ = Phase::kAfterToolCalls; break;
  }
  pos_ = p;
  return true;
}

// Only the end of sentence may follow a tool-call block.
bool CompletionStreamParser::advance_after_tool_calls(bool final) {
  const std::string_view rest = std::string_view(text_).substr(pos_);
  if (rest.starts_with(kEosToken)) {
    pos_ += kEosToken.size();
    phase_ = Phase::kEnded;
    return true;
  }
  if (kEosToken.starts_with(rest) && (!final || rest.empty())) return false;
  throw Error("completion: text after the tool calls: " + json_string(rest));
}

}  // namespace dsv4
