#include "serve/openai.h"

#include <algorithm>
#include <charconv>
#include <limits>

#include "core/error.h"

namespace dsv4::serve {

namespace {

constexpr int kMaxTopLogprobs = 20;
constexpr size_t kMaxStops = 16;
constexpr size_t kMaxLogitBias = 1024;  // entries: every draw applies them

// ---- Fields ------------------------------------------------------------------------

// The member `key` of `body`, or null when absent or null (OpenAI clients
// send null for "not given").
const ojson* field(const ojson& body, const char* key) {
  auto it = body.find(key);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

std::optional<bool> get_bool(const ojson& body, const char* key) {
  const ojson* v = field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) throw invalid_type(key, "a boolean");
  return v->get<bool>();
}

std::optional<int64_t> get_int(const ojson& body, const char* key, int64_t lo, int64_t hi) {
  const ojson* v = field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_number_integer()) throw invalid_type(key, "an integer");
  if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
    throw invalid_value(key, std::string(key) + " must be at most " + std::to_string(hi));
  const int64_t x = v->get<int64_t>();
  if (x < lo || x > hi)
    throw invalid_value(key, std::string(key) + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                                 "], got " + std::to_string(x));
  return x;
}

std::optional<double> get_number(const ojson& body, const char* key) {
  const ojson* v = field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) throw invalid_type(key, "a number");
  return v->get<double>();
}

std::optional<std::string> get_string(const ojson& body, const char* key) {
  const ojson* v = field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_string()) throw invalid_type(key, "a string");
  return v->get<std::string>();
}

// `model` must name the served model.
void check_model(const ojson& body, const ModelInfo& model) {
  const std::optional<std::string> name = get_string(body, "model");
  if (!name) throw missing_field("model");
  if (*name != model.name)
    throw ApiError(404, "invalid_request_error", "model_not_found",
                   "The model '" + *name + "' does not exist; this server serves '" + model.name + "'.", "model");
}

// Each sampling field alone through SamplingParams::check, so that the
// error names the request's field rather than the command line's option.
// `option` is the command line's name for it, which check() uses.
template <class Set>
void check_sampling(const char* param, const std::string& option, int64_t vocab, Set set) {
  SamplingParams p;
  set(p);
  try {
    p.check(vocab);
  } catch (const Error& e) {
    std::string message = e.what();
    if (const size_t at = message.find(option); at != std::string::npos) message.replace(at, option.size(), param);
    throw invalid_value(param, message);
  }
}

// logit_bias: {"ID": BIAS, ...}, the ids as decimal strings (OpenAI's
// shape, since JSON keys are strings).
std::vector<std::pair<int32_t, float>> read_logit_bias(const ojson& body) {
  const ojson* v = field(body, "logit_bias");
  if (!v) return {};
  if (!v->is_object()) throw invalid_type("logit_bias", "an object mapping token ids to numbers");
  if (v->size() > kMaxLogitBias)
    throw invalid_value("logit_bias", "logit_bias takes at most " + std::to_string(kMaxLogitBias) + " tokens");
  std::vector<std::pair<int32_t, float>> bias;
  for (const auto& [key, value] : v->items()) {
    int32_t id = -1;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (key.empty() || ec != std::errc() || end != key.data() + key.size())
      throw invalid_value("logit_bias", "logit_bias keys must be token ids, got '" + key + "'");
    if (!value.is_number()) throw invalid_type("logit_bias." + key, "a number");
    bias.emplace_back(id, float(value.get<double>()));
  }
  return bias;
}

SamplingParams read_sampling(const ojson& body, uint64_t seed, int64_t vocab) {
  SamplingParams s;
  s.temperature = float(get_number(body, "temperature").value_or(1.0));
  check_sampling("temperature", "--temp", vocab, [&](SamplingParams& p) { p.temperature = s.temperature; });
  s.top_p = float(get_number(body, "top_p").value_or(1.0));
  check_sampling("top_p", "--top-p", vocab, [&](SamplingParams& p) { p.top_p = s.top_p; });
  s.top_k = int(get_int(body, "top_k", 0, std::numeric_limits<int>::max()).value_or(0));
  s.min_p = float(get_number(body, "min_p").value_or(0.0));
  check_sampling("min_p", "--min-p", vocab, [&](SamplingParams& p) { p.min_p = s.min_p; });
  s.seed = seed;
  if (const ojson* v = field(body, "seed")) {
    if (!v->is_number_integer()) throw invalid_type("seed", "an integer");
    s.seed = v->is_number_unsigned() ? v->get<uint64_t>() : uint64_t(v->get<int64_t>());
  }
  s.presence_penalty = float(get_number(body, "presence_penalty").value_or(0.0));
  check_sampling("presence_penalty", "--presence-penalty", vocab,
                 [&](SamplingParams& p) { p.presence_penalty = s.presence_penalty; });
  s.frequency_penalty = float(get_number(body, "frequency_penalty").value_or(0.0));
  check_sampling("frequency_penalty", "--frequency-penalty", vocab,
                 [&](SamplingParams& p) { p.frequency_penalty = s.frequency_penalty; });
  s.logit_bias = read_logit_bias(body);
  check_sampling("logit_bias", "--logit-bias", vocab, [&](SamplingParams& p) { p.logit_bias = s.logit_bias; });
  return s;
}

std::vector<std::string> read_stops(const ojson& body, const ModelInfo& model) {
  const ojson* v = field(body, "stop");
  if (!v) return {};
  std::vector<std::string> stops;
  if (v->is_string()) {
    stops.push_back(v->get<std::string>());
  } else if (v->is_array()) {
    if (v->size() > kMaxStops) throw invalid_value("stop", "stop takes at most 16 strings");
    for (size_t i = 0; i < v->size(); ++i) {
      if (!(*v)[i].is_string()) throw invalid_type("stop[" + std::to_string(i) + "]", "a string");
      stops.push_back((*v)[i].get<std::string>());
    }
  } else {
    throw invalid_type("stop", "a string or an array of strings");
  }
  std::erase(stops, std::string());
  if (!stops.empty() && !model.tokenizer) throw invalid_value("stop", "stop strings need the model's tokenizer.json");
  return stops;
}

// The fields both endpoints share.
void read_common(const ojson& body, const ModelInfo& model, uint64_t seed, ApiRequest* r) {
  if (get_int(body, "n", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()).value_or(1) != 1)
    throw invalid_value("n", "only n = 1 is supported");
  r->generation.sampling = read_sampling(body, seed, model.vocab_size);
  r->generation.stop = read_stops(body, model);
  r->generation.ignore_eos = get_bool(body, "ignore_eos").value_or(false);
  r->stream = get_bool(body, "stream").value_or(false);
  if (const ojson* o = field(body, "stream_options")) {
    if (!o->is_object()) throw invalid_type("stream_options", "an object");
    if (const ojson* u = field(*o, "include_usage")) {
      if (!u->is_boolean()) throw invalid_type("stream_options.include_usage", "a boolean");
      r->include_usage = u->get<bool>();
    }
  }
  r->return_token_ids = get_bool(body, "return_token_ids").value_or(false);
}

// ---- Chat prompts --------------------------------------------------------------------

ThinkingMode read_thinking(const ojson& body) {
  const ojson* t = field(body, "thinking");
  if (!t) return ThinkingMode::kChat;
  if (!t->is_object()) throw invalid_type("thinking", "an object {\"type\": \"enabled\" | \"disabled\"}");
  const ojson* type = field(*t, "type");
  if (!type || !type->is_string()) throw invalid_value("thinking.type", "thinking.type must be \"enabled\" or \"disabled\"");
  if (*type == "enabled") return ThinkingMode::kThinking;
  if (*type == "disabled") return ThinkingMode::kChat;
  throw invalid_value("thinking.type", "thinking.type must be \"enabled\" or \"disabled\"");
}

ReasoningEffort read_effort(const ojson& body) {
  const std::optional<std::string> e = get_string(body, "reasoning_effort");
  if (!e) return ReasoningEffort::kNone;
  if (*e == "low" || *e == "medium" || *e == "high") return ReasoningEffort::kHigh;
  if (*e == "max" || *e == "xhigh") return ReasoningEffort::kMax;
  throw invalid_value("reasoning_effort", "reasoning_effort must be low, medium, high, max or xhigh, got '" + *e + "'");
}

// tool_choice: "auto" (the default: the model decides), "none" (the tools
// stay out of the prompt), "required" (a call to one of them) or
// {"type": "function", "function": {"name": N}} (a call to N).
struct ToolChoice {
  enum class Kind { kAuto, kNone, kRequired, kNamed } kind = Kind::kAuto;
  std::string name;  // kNamed
};

// The name of each tool, OpenAI's {"type": "function", "function": {"name"}}.
bool has_tool_named(const ojson& tools, const std::string& name) {
  return std::any_of(tools.begin(), tools.end(), [&](const ojson& t) {
    const ojson* fn = t.is_object() ? field(t, "function") : nullptr;
    const ojson* n = fn && fn->is_object() ? field(*fn, "name") : nullptr;
    return n && n->is_string() && *n == name;
  });
}

ToolChoice read_tool_choice(const ojson& body) {
  const ojson* v = field(body, "tool_choice");
  if (!v) return {};
  const ojson* tools = field(body, "tools");
  const bool has_tools = tools && tools->is_array() && !tools->empty();
  const std::string expected = "tool_choice must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
                               "\"function\": {\"name\": NAME}}";
  if (v->is_string()) {
    const std::string c = v->get<std::string>();
    if (c == "auto") return {};
    if (c == "none") return {ToolChoice::Kind::kNone, ""};
    if (c != "required") throw invalid_value("tool_choice", expected);
    if (!has_tools) throw invalid_value("tool_choice", "tool_choice \"required\" needs tools");
    return {ToolChoice::Kind::kRequired, ""};
  }
  if (!v->is_object()) throw invalid_type("tool_choice", "a string or an object");
  const ojson* type = field(*v, "type");
  const ojson* fn = field(*v, "function");
  const ojson* name = fn && fn->is_object() ? field(*fn, "name") : nullptr;
  if (!type || *type != "function" || !name || !name->is_string() || name->get<std::string>().empty())
    throw invalid_value("tool_choice", expected);
  if (!has_tools || !has_tool_named(*tools, *name))
    throw invalid_value("tool_choice", "tool_choice names the function '" + name->get<std::string>() +
                                           "', which is not among the tools");
  return {ToolChoice::Kind::kNamed, name->get<std::string>()};
}

// response_format: {"type": "text"} (nothing), {"type": "json_object"} or
// {"type": "json_schema", "json_schema": {...}}; null when it asks for
// nothing.
const ojson* read_response_format(const ojson& body) {
  const ojson* v = field(body, "response_format");
  if (!v) return nullptr;
  if (!v->is_object()) throw invalid_type("response_format", "an object");
  const ojson* type = field(*v, "type");
  if (!type || !type->is_string() || (*type != "text" && *type != "json_object" && *type != "json_schema"))
    throw invalid_value("response_format", "response_format.type must be \"text\", \"json_object\" or \"json_schema\"");
  if (*type == "text") return nullptr;
  if (*type == "json_schema") {
    const ojson* schema = field(*v, "json_schema");
    if (!schema || !schema->is_object()) throw invalid_type("response_format.json_schema", "an object");
  }
  return v;
}

// The tools the prompt carries: null when there are none or tool_choice
// is "none".
const ojson* prompt_tools(const ojson& body, const ToolChoice& choice) {
  const ojson* tools = field(body, "tools");
  if (tools && !tools->is_array()) throw invalid_type("tools", "an array");
  return tools && !tools->empty() && choice.kind != ToolChoice::Kind::kNone ? tools : nullptr;
}

// The messages with the request's tools and response_format on the first
// system (or developer) message, where the V4 layout carries them (the
// encoder renders them there); a system message is added in front when
// there is none.
ojson messages_with_tools(const ojson& body, const ojson* tools, const ojson* format) {
  ojson messages = body["messages"];
  if (!tools && !format) return messages;
  auto carry = [&](ojson& m) {
    if (tools) m["tools"] = *tools;
    if (format) m["response_format"] = *format;
  };
  for (ojson& m : messages)
    if (m.is_object() && (m.value("role", "") == "system" || m.value("role", "") == "developer")) {
      carry(m);
      return messages;
    }
  messages.insert(messages.begin(), ojson{{"role", "system"}, {"content", ""}});
  carry(messages[0]);
  return messages;
}

// The token that ends the reasoning (thinking mode), after which the
// answer's own constraints start; -1 in chat mode (from the start).
int32_t answer_start(const ModelInfo& model, const ApiRequest& r, const char* param) {
  if (r.thinking != ThinkingMode::kThinking) return -1;
  const std::vector<int32_t> end = model.tokenizer->encode(std::string(kThinkingEndToken));
  if (end.size() != 1) throw invalid_value(param, std::string(param) + " needs a single </think> token in the tokenizer");
  return end[0];
}

// A choice that requires a call makes the answer open a tool-call block
// (the V4 encoding has no other way to ask for one): at once in chat mode,
// after the reasoning's </think> in thinking mode. The model writes the
// rest: the name (required) and the arguments.
void force_tool_call(const ToolChoice& choice, const ModelInfo& model, ApiRequest* r) {
  if (choice.kind != ToolChoice::Kind::kRequired && choice.kind != ToolChoice::Kind::kNamed) return;
  r->generation.forced = model.tokenizer->encode(tool_call_opening(choice.name));
  r->generation.answer_after = answer_start(model, *r, "tool_choice");
}

// JSON mode: a response_format other than text makes the answer's content
// one JSON object, unless the prompt carries tools (their calls are not
// JSON text; the format is then only the prompt's instruction).
void constrain_to_json(const ojson* format, const ojson* tools, const ModelInfo& model, ApiRequest* r) {
  if (!format || tools) return;
  r->generation.json_object = true;
  r->generation.answer_after = answer_start(model, *r, "response_format");
}

// The JSON types of each message's fields, as OpenAI checks them (the
// encoder then checks what the V4 layout needs): a wrong type is
// invalid_type, a tool result without the call it answers missing_field.
void check_message_types(const ojson& messages) {
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string at = "messages[" + std::to_string(i) + "]";
    const ojson& m = messages[i];
    if (!m.is_object()) throw invalid_type(at, "an object");
    const ojson* role = field(m, "role");
    if (!role) throw missing_field(at + ".role");
    if (!role->is_string()) throw invalid_type(at + ".role", "a string");
    const ojson* content = field(m, "content");
    if (content && !content->is_string() && !content->is_array())
      throw invalid_type(at + ".content", "a string, an array of parts or null");
    for (const char* key : {"reasoning_content", "tool_call_id", "name"}) {
      const ojson* v = field(m, key);
      if (v && !v->is_string()) throw invalid_type(at + "." + key, "a string");
    }
    const ojson* calls = field(m, "tool_calls");
    if (calls && !calls->is_array()) throw invalid_type(at + ".tool_calls", "an array");
    const ojson* call_id = field(m, "tool_call_id");
    if (*role == "tool" && (!call_id || !call_id->is_string())) throw missing_field(at + ".tool_call_id");
  }
}

std::vector<int32_t> chat_prompt(const ojson& body, const ModelInfo& model, ApiRequest* r) {
  const ojson* messages = field(body, "messages");
  if (!messages) throw missing_field("messages");
  if (!messages->is_array()) throw invalid_type("messages", "an array of messages");
  if (messages->empty()) throw invalid_value("messages", "messages must not be empty");
  check_message_types(*messages);
  if (!model.tokenizer) throw invalid_value("messages", "chat needs the model's tokenizer.json");
  EncodeOptions o;
  o.thinking_mode = r->thinking = read_thinking(body);
  o.reasoning_effort = read_effort(body);
  const ToolChoice choice = read_tool_choice(body);
  const ojson* tools = prompt_tools(body, choice);
  const ojson* format = read_response_format(body);
  std::string text;
  try {
    text = encode_messages(messages_with_tools(body, tools, format), o);
  } catch (const ApiError&) {
    throw;
  } catch (const Error& e) {
    throw message_error(e.what());
  }
  force_tool_call(choice, model, r);
  constrain_to_json(format, tools, model, r);
  return model.tokenizer->encode(text);
}

// ---- Completion prompts ----------------------------------------------------------------

bool all_integers(const ojson& a) {
  return std::all_of(a.begin(), a.end(), [](const ojson& x) { return x.is_number_integer(); });
}

std::vector<int32_t> token_ids(const ojson& a, const ModelInfo& model, const char* param = "prompt") {
  std::vector<int32_t> ids;
  for (const ojson& x : a) {
    const int64_t id = x.is_number_unsigned() && x.get<uint64_t>() > uint64_t(INT32_MAX) ? -1 : x.get<int64_t>();
    if (id < 0 || id >= model.vocab_size)
      throw invalid_value(param, "token id " + x.dump() + " is outside the vocabulary [0, " +
                                        std::to_string(model.vocab_size) + ")");
    ids.push_back(int32_t(id));
  }
  return ids;
}

std::vector<int32_t> text_ids(const std::string& text, const ModelInfo& model) {
  if (!model.tokenizer) throw invalid_value("prompt", "a text prompt needs the model's tokenizer.json; send token ids");
  std::vector<int32_t> ids = model.tokenizer->encode(text);
  if (ids.empty() || ids[0] != model.bos_id) ids.insert(ids.begin(), model.bos_id);
  return ids;
}

std::vector<int32_t> completion_prompt(const ojson& body, const ModelInfo& model) {
  const ojson* p = field(body, "prompt");
  if (!p) throw missing_field("prompt");
  if (p->is_string()) return text_ids(p->get<std::string>(), model);
  if (!p->is_array()) throw invalid_type("prompt", "a string or an array of token ids");
  if (p->empty()) throw invalid_value("prompt", "prompt must not be empty");
  if (all_integers(*p)) return token_ids(*p, model);
  if (p->size() > 1) throw invalid_value("prompt", "only one prompt per request is supported");
  const ojson& one = (*p)[0];
  if (one.is_string()) return text_ids(one.get<std::string>(), model);
  if (one.is_array() && !one.empty() && all_integers(one)) return token_ids(one, model);
  throw invalid_type("prompt", "a string or an array of token ids");
}

void read_completion_fields(const ojson& body, ApiRequest* r) {
  if (get_bool(body, "echo").value_or(false)) throw invalid_value("echo", "echo is not supported");
  if (const ojson* s = field(body, "suffix"); s && !(s->is_string() && s->get<std::string>().empty()))
    throw invalid_value("suffix", "suffix is not supported");
  if (const std::optional<int64_t> n = get_int(body, "logprobs", 0, kMaxTopLogprobs)) {
    r->logprobs = true;
    r->generation.top_logprobs = int(*n);
  }
}

void read_chat_fields(const ojson& body, ApiRequest* r) {
  r->logprobs = get_bool(body, "logprobs").value_or(false);
  const int64_t top = get_int(body, "top_logprobs", 0, kMaxTopLogprobs).value_or(0);
  r->generation.top_logprobs = r->logprobs ? int(top) : -1;
  r->generation.remember_before_last = r->thinking == ThinkingMode::kThinking;
}

// max_tokens (chat: max_completion_tokens first); the default is what the
// context leaves (chat) or 16 (completions).
void read_max_tokens(const ojson& body, const ModelInfo& model, ApiRequest* r) {
  const int64_t room = model.position_limit - int64_t(r->generation.prompt.size());
  std::optional<int64_t> n;
  if (r->endpoint == Endpoint::kChat) n = get_int(body, "max_completion_tokens", 1, std::numeric_limits<int64_t>::max());
  if (!n) n = get_int(body, "max_tokens", 1, std::numeric_limits<int64_t>::max());
  r->generation.max_tokens = n.value_or(r->endpoint == Endpoint::kChat ? room : 16);
}

}  // namespace

// ---- Errors --------------------------------------------------------------------------

ApiError::ApiError(int status_, std::string type_, std::string code_, std::string message_, std::string param_)
    : status(status_), type(std::move(type_)), code(std::move(code_)), param(std::move(param_)),
      message(std::move(message_)) {}

ojson ApiError::body() const {
  return ojson{{"error", {{"message", message}, {"type", type}, {"param", param.empty() ? ojson() : ojson(param)},
                          {"code", code}}}};
}

std::string json_text(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }

ApiError invalid_type(const std::string& param, const std::string& expected) {
  return ApiError(400, "invalid_request_error", "invalid_type",
                  (param.empty() ? std::string("the body") : param) + " must be " + expected, param);
}

ApiError invalid_value(const std::string& param, const std::string& message) {
  return ApiError(400, "invalid_request_error", "invalid_value", message, param);
}

ApiError missing_field(const std::string& param) {
  return ApiError(400, "invalid_request_error", "missing_field", param + " is required", param);
}

ApiError message_error(const std::string& what) {
  const size_t colon = what.find(':');
  std::string param = colon == std::string::npos ? "messages" : what.substr(0, colon);
  if (!param.starts_with("messages")) param = "messages";
  const bool missing = what.find(": missing") != std::string::npos;
  return ApiError(400, "invalid_request_error", missing ? "missing_field" : "invalid_value", what, param);
}

ojson parse_body(const std::string& text) {
  try {
    return ojson::parse(text);
  } catch (const ojson::exception& e) {
    throw ApiError(400, "invalid_request_error", "invalid_json", std::string("the body is not JSON: ") + e.what());
  }
}

ApiRequest parse_request(Endpoint endpoint, const std::string& text, const ModelInfo& model, uint64_t seed) {
  const ojson body = parse_body(text);
  if (!body.is_object()) throw invalid_type("", "a JSON object");
  check_model(body, model);
  ApiRequest r;
  r.endpoint = endpoint;
  read_common(body, model, seed, &r);
  if (endpoint == Endpoint::kChat) {
    r.generation.prompt = chat_prompt(body, model, &r);
    read_chat_fields(body, &r);
  } else {
    read_completion_fields(body, &r);
    r.generation.prompt = completion_prompt(body, model);
  }
  const int64_t p = int64_t(r.generation.prompt.size());
  if (p >= model.position_limit)
    throw ApiError(400, "invalid_request_error", "context_length_exceeded",
                   "This model's maximum context length is " + std::to_string(model.position_limit) +
                       " tokens; the prompt has " + std::to_string(p) + " tokens.",
                   endpoint == Endpoint::kChat ? "messages" : "prompt");
  read_max_tokens(body, model, &r);
  return r;
}

std::vector<int32_t> tokenize_request(const std::string& text, const ModelInfo& model) {
  const ojson body = parse_body(text);
  if (!body.is_object()) throw invalid_type("", "a JSON object");
  const std::optional<std::string> content = get_string(body, "content");
  if (!content) throw missing_field("content");
  if (!model.tokenizer) throw invalid_value("content", "tokenizing needs the model's tokenizer.json");
  std::vector<int32_t> ids = model.tokenizer->encode(*content);
  if (get_bool(body, "add_special").value_or(true)) ids.insert(ids.begin(), model.bos_id);
  return ids;
}

std::string detokenize_request(const std::string& text, const ModelInfo& model) {
  const ojson body = parse_body(text);
  if (!body.is_object()) throw invalid_type("", "a JSON object");
  const ojson* tokens = field(body, "tokens");
  if (!tokens) throw missing_field("tokens");
  if (!tokens->is_array() || !all_integers(*tokens)) throw invalid_type("tokens", "an array of token ids");
  if (!model.tokenizer) throw invalid_value("tokens", "detokenizing needs the model's tokenizer.json");
  ModelInfo m = model;
  m.vocab_size = std::min(model.vocab_size, model.tokenizer->size());
  const std::vector<int32_t> ids = token_ids(*tokens, m, "tokens");
  try {
    return utf8_lossy(model.tokenizer->decode(ids));
  } catch (const Error& e) {
    throw invalid_value("tokens", e.what());
  }
}

// ---- Answers -------------------------------------------------------------------------

AnswerSplitter::AnswerSplitter(ThinkingMode mode) : parser_(mode), mode_(mode) {}

CompletionDelta AnswerSplitter::note(CompletionDelta d) {
  reasoning_given_ += d.reasoning_content.size();
  content_given_ += d.content.size();
  tool_calls_ |= !d.tool_calls.empty();
  return d;
}

// Where the text given so far ends in what was fed (the reasoning, the
// </think> that closed it, the content; unknown once tool calls came): the
// rest goes out as content.
CompletionDelta AnswerSplitter::rest_raw() {
  raw_ = true;
  size_t at = reasoning_given_;
  const std::string end(kThinkingEndToken);
  if (mode_ == ThinkingMode::kThinking && fed_.compare(at, end.size(), end) == 0) at += end.size();
  at += content_given_;
  CompletionDelta d;
  if (!tool_calls_ && at < fed_.size()) d.content = fed_.substr(at);
  content_given_ += d.content.size();
  return d;
}

CompletionDelta AnswerSplitter::feed(const std::string& piece) {
  fed_ += piece;
  if (raw_) {
    CompletionDelta d;
    if (!tool_calls_) d.content = piece;
    return d;
  }
  try {
    return note(parser_.feed(piece));
  } catch (const Error&) {
    return rest_raw();
  }
}

CompletionDelta AnswerSplitter::finish() {
  if (raw_) return {};
  try {
    return note(parser_.finish());
  } catch (const Error&) {
    return rest_raw();
  }
}

std::string finish_reason(Finish finish, bool tool_calls) {
  if (tool_calls) return "tool_calls";
  return finish == Finish::kLength ? "length" : "stop";
}

ojson usage_json(const Update& u) {
  return ojson{{"prompt_tokens", u.prompt_tokens},
               {"completion_tokens", u.completion_tokens},
               {"total_tokens", u.prompt_tokens + u.completion_tokens},
               {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

namespace {

std::string token_bytes(int32_t id, const ModelInfo& model) {
  if (!model.tokenizer) return std::to_string(id);
  const int32_t one[1] = {id};
  return model.tokenizer->decode(one);
}

ojson bytes_json(const std::string& b) {
  ojson a = ojson::array();
  for (unsigned char c : b) a.push_back(int(c));
  return a;
}

ojson chat_token_logprob(int32_t id, float logprob, const ModelInfo& model) {
  const std::string b = token_bytes(id, model);
  return ojson{{"token", utf8_lossy(b)}, {"logprob", logprob}, {"bytes", bytes_json(b)}};
}

ojson tool_calls_json(const std::vector<ToolCall>& calls, size_t first_index, bool with_index) {
  ojson a = ojson::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    ojson c;
    if (with_index) c["index"] = first_index + i;
    c["id"] = calls[i].id;
    c["type"] = "function";
    c["function"] = {{"name", calls[i].name}, {"arguments", calls[i].arguments}};
    a.push_back(std::move(c));
  }
  return a;
}

ojson token_ids_json(const std::vector<TokenOut>& tokens) {
  ojson a = ojson::array();
  for (const TokenOut& t : tokens) a.push_back(t.id);
  return a;
}

void append(CompletionDelta* to, CompletionDelta d) {
  to->reasoning_content += d.reasoning_content;
  to->content += d.content;
  for (ToolCall& c : d.tool_calls) to->tool_calls.push_back(std::move(c));
}

}  // namespace

std::string token_text(int32_t id, const ModelInfo& model) { return utf8_lossy(token_bytes(id, model)); }

ojson chat_logprobs(const std::vector<TokenOut>& tokens, const ModelInfo& model) {
  ojson content = ojson::array();
  for (const TokenOut& t : tokens) {
    ojson entry = chat_token_logprob(t.id, t.logprob, model);
    ojson top = ojson::array();
    for (const auto& [id, lp] : t.top) top.push_back(chat_token_logprob(id, lp, model));
    entry["top_logprobs"] = std::move(top);
    content.push_back(std::move(entry));
  }
  return ojson{{"content", std::move(content)}};
}

ojson completion_logprobs(const std::vector<TokenOut>& tokens, const ModelInfo& model, int64_t* text_offset) {
  ojson texts = ojson::array(), lps = ojson::array(), tops = ojson::array(), offsets = ojson::array();
  for (const TokenOut& t : tokens) {
    const std::string text = token_text(t.id, model);
    texts.push_back(text);
    lps.push_back(t.logprob);
    ojson top = ojson::object();
    for (const auto& [id, lp] : t.top) top.emplace(token_text(id, model), lp);  // the first of equal texts stays
    tops.push_back(std::move(top));
    offsets.push_back(*text_offset);
    *text_offset += int64_t(text.size());
  }
  return ojson{{"tokens", texts}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

std::string ids_text(const std::vector<TokenOut>& tokens, bool leading_space) {
  std::string s;
  for (const TokenOut& t : tokens) {
    if (leading_space || !s.empty()) s += ' ';
    s += std::to_string(t.id);
  }
  return s;
}

namespace {

ojson response_head(const char* object, const std::string& id, int64_t created, const ModelInfo& model) {
  return ojson{{"id", id}, {"object", object}, {"created", created}, {"model", model.name},
               {"system_fingerprint", model.fingerprint}};
}

}  // namespace

// A whole answer around its one choice: the head, the choice, usage, and
// the token ids when the request asked for them.
ojson whole_response(const char* object, ojson choice, const ApiRequest& r, const Answer& a, const ModelInfo& model,
                     const std::string& id, int64_t created) {
  if (r.return_token_ids) choice["token_ids"] = token_ids_json(a.tokens);
  ojson out = response_head(object, id, created, model);
  out["choices"] = ojson::array({std::move(choice)});
  out["usage"] = usage_json(a.final_update);
  if (r.return_token_ids) out["prompt_token_ids"] = r.generation.prompt;
  return out;
}

ojson chat_response(const ApiRequest& r, const Answer& a, const ModelInfo& model, const std::string& id,
                    int64_t created) {
  AnswerSplitter splitter(r.thinking);
  CompletionDelta d = splitter.feed(a.text);
  append(&d, splitter.finish());
  ojson message{{"role", "assistant"}, {"content", d.content}};
  if (r.thinking == ThinkingMode::kThinking) message["reasoning_content"] = d.reasoning_content;
  if (!d.tool_calls.empty()) message["tool_calls"] = tool_calls_json(d.tool_calls, 0, false);
  ojson choice{{"index", 0}, {"message", std::move(message)},
               {"logprobs", r.logprobs ? chat_logprobs(a.tokens, model) : ojson()},
               {"finish_reason", finish_reason(a.final_update.finish, splitter.had_tool_calls())}};
  return whole_response("chat.completion", std::move(choice), r, a, model, id, created);
}

ojson completion_response(const ApiRequest& r, const Answer& a, const ModelInfo& model, const std::string& id,
                          int64_t created) {
  int64_t offset = 0;
  ojson choice{{"index", 0},
               {"text", model.tokenizer ? a.text : ids_text(a.tokens, false)},
               {"finish_reason", finish_reason(a.final_update.finish, false)},
               {"logprobs", r.logprobs ? completion_logprobs(a.tokens, model, &offset) : ojson()}};
  return whole_response("text_completion", std::move(choice), r, a, model, id, created);
}

// ---- Streams ---------------------------------------------------------------------------

ChunkWriter::ChunkWriter(const ApiRequest& r, const ModelInfo& model, std::string id, int64_t created)
    : request_(r), model_(model), id_(std::move(id)), created_(created), splitter_(r.thinking) {}

ojson ChunkWriter::chunk(ojson choice) const {
  const bool chat = request_.endpoint == Endpoint::kChat;
  ojson c = response_head(chat ? "chat.completion.chunk" : "text_completion", id_, created_, model_);
  c["choices"] = choice.is_null() ? ojson::array() : ojson::array({std::move(choice)});
  return c;
}

void ChunkWriter::add_tokens(ojson& choice, const std::vector<TokenOut>& tokens) {
  if (request_.logprobs)
    choice["logprobs"] = request_.endpoint == Endpoint::kChat ? chat_logprobs(tokens, model_)
                                                              : completion_logprobs(tokens, model_, &text_offset_);
  if (request_.return_token_ids) choice["token_ids"] = token_ids_json(tokens);
}

ojson ChunkWriter::chat_choice(const CompletionDelta& d) {
  ojson delta = ojson::object();
  if (!d.reasoning_content.empty()) delta["reasoning_content"] = d.reasoning_content;
  if (!d.content.empty()) delta["content"] = d.content;
  if (!d.tool_calls.empty()) delta["tool_calls"] = tool_calls_json(d.tool_calls, tool_calls_given_, true);
  tool_calls_given_ += d.tool_calls.size();
  return ojson{{"index", 0}, {"delta", std::move(delta)}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
}

std::vector<ojson> ChunkWriter::chunks(const Update& u) {
  std::vector<ojson> out;
  const bool chat = request_.endpoint == Endpoint::kChat;
  const bool ending = u.finish != Finish::kNone && u.finish != Finish::kError;
  const bool per_token = (request_.logprobs || request_.return_token_ids) && !u.tokens.empty();
  if (chat && !started_)
    out.push_back(chunk({{"index", 0}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr},
                         {"finish_reason", nullptr}}));
  started_ = true;
  if (chat) {
    CompletionDelta d = splitter_.feed(u.text);
    if (ending) append(&d, splitter_.finish());
    if (!d.empty() || per_token) {
      ojson choice = chat_choice(d);
      if (per_token) add_tokens(choice, u.tokens);
      out.push_back(chunk(std::move(choice)));
    }
  } else {
    const std::string text = model_.tokenizer ? u.text : ids_text(u.tokens, any_tokens_);
    any_tokens_ |= !u.tokens.empty();
    if (!text.empty() || per_token) {
      ojson choice{{"index", 0}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
      if (per_token) add_tokens(choice, u.tokens);
      out.push_back(chunk(std::move(choice)));
    }
  }
  if (!ending) return out;
  const std::string reason = finish_reason(u.finish, splitter_.had_tool_calls());
  if (chat)
    out.push_back(chunk({{"index", 0}, {"delta", ojson::object()}, {"logprobs", nullptr}, {"finish_reason", reason}}));
  else
    out.push_back(chunk({{"index", 0}, {"text", ""}, {"logprobs", nullptr}, {"finish_reason", reason}}));
  if (request_.include_usage) {
    ojson c = chunk(nullptr);
    c["usage"] = usage_json(u);
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace dsv4::serve
