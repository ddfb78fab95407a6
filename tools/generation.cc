#include "generation.h"

#include <cerrno>
#include <cstdlib>
#include <limits>

#include "core/error.h"
#include "progress.h"

namespace dsv4::cli {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

TokenStream::TokenStream(const Tokenizer* tok, std::vector<std::string> stops, Sink out) : out_(std::move(out)) {
  if (tok) text_.emplace(*tok, std::move(stops));
}

void TokenStream::add(int32_t id, bool eos) {
  if (text_) {
    if (!eos) write(text_->push(id));
  } else {
    write((started_ ? " " : "") + std::to_string(id));
  }
  started_ = true;
}

std::string TokenStream::finish() {
  if (!text_) return std::string();
  write(text_->finish());
  return text_->text();
}

double Generation::prefill_tokens_per_second() const {
  return prompt_seconds > 0 ? double(prompt_tokens - cached_tokens) / prompt_seconds : 0.0;
}

double Generation::decode_tokens_per_second() const {
  return decode_tokens() > 0 && decode_seconds > 0 ? double(decode_tokens()) / decode_seconds : 0.0;
}

namespace {

// The resumed session with the rest of the prompt appended: the logits the
// first token is drawn from.
PrefillResult prefill(Engine& engine, const std::vector<int32_t>& prompt, const GenerationParams& p, Generation* g,
                      std::unique_ptr<Session>* session) {
  ProgressLine progress(p.progress);
  AppendOptions what;
  what.progress = [&](int64_t done, int64_t total) { progress.update(done, total); };
  *session = engine.resume(prompt, &g->cached_tokens);
  Session& s = **session;
  const int64_t n = int64_t(prompt.size());
  if (p.remember_before_last && s.position() < n - 1) {
    s.append(std::vector<int32_t>(prompt.begin() + s.position(), prompt.end() - 1), what);
    engine.remember(s);
  }
  return s.append(std::vector<int32_t>(prompt.begin() + s.position(), prompt.end()), what);
}

}  // namespace

Generation generate(Engine& engine, const std::vector<int32_t>& prompt, const GenerationParams& p, TokenStream& out) {
  Generation g;
  g.prompt_tokens = int64_t(prompt.size());
  const int32_t eos_id = engine.config().eos_token_id;
  const auto t0 = Clock::now();
  std::unique_ptr<Session> session;
  PrefillResult r = prefill(engine, prompt, p, &g, &session);
  g.prompt_seconds = seconds_between(t0, Clock::now());
  auto first = t0;
  for (int64_t i = 0; i < p.max_new_tokens; ++i) {
    if (p.keep_logits) g.logits.insert(g.logits.end(), r.logits.begin(), r.logits.end());
    const int32_t next = sample(r.logits, p.sampling, g.prompt_tokens + i, g.tokens);  // at position prompt + i
    const bool eos = !p.ignore_eos && next == eos_id;
    g.tokens.push_back(next);
    out.add(next, eos);
    if (i == 0) first = Clock::now();
    if (eos || out.stopped()) g.finish_reason = "stop";
    if (i + 1 == p.max_new_tokens || g.finish_reason == "stop") break;
    r = session->append({next});
  }
  g.first_token_seconds = seconds_between(t0, first);
  g.decode_seconds = seconds_between(first, Clock::now());
  g.text = out.finish();
  // The last token was drawn but never appended. Untimed: this step's
  // logits are not used, only its caches.
  if (p.append_last && session->position() < engine.position_limit())
    session->append({g.tokens.back()});
  engine.remember(*session);
  return g;
}

json generation_json(const Generation& g) {
  const int64_t decoded = g.decode_tokens();
  return json{{"prompt_tokens", g.prompt_tokens},
              {"cached_tokens", g.cached_tokens},
              {"prompt_seconds", g.prompt_seconds},
              {"prompt_tokens_per_second", g.prefill_tokens_per_second()},
              {"time_to_first_token_seconds", g.first_token_seconds},
              {"generated", g.tokens},
              {"decode_tokens", decoded},
              {"decode_seconds", g.decode_seconds},
              {"decode_tokens_per_second", decoded > 0 ? json(g.decode_tokens_per_second()) : json(nullptr)},
              {"finish_reason", g.finish_reason}};
}

json prefix_cache_json(const PrefixCacheStats& s) {
  return json{{"lookups", s.lookups}, {"hits", s.hits},           {"cached_tokens", s.cached_tokens},
              {"entries", s.entries}, {"evictions", s.evictions}, {"bytes", s.bytes}};
}

namespace {

// One --logit-bias value, ID=BIAS.
std::pair<int32_t, float> logit_bias_entry(const std::string& v) {
  const size_t eq = v.find('=');
  char* end = nullptr;
  errno = 0;
  const long long id = eq == std::string::npos ? -1 : std::strtoll(v.c_str(), &end, 10);
  bool ok = eq != std::string::npos && eq > 0 && end == v.c_str() + eq && errno == 0 &&
            id >= std::numeric_limits<int32_t>::min() && id <= std::numeric_limits<int32_t>::max();
  double bias = 0;
  if (ok) {
    const char* const b = v.c_str() + eq + 1;
    bias = std::strtod(b, &end);
    ok = *b && !*end;
  }
  if (!ok) throw Error("--logit-bias takes ID=BIAS (a token id and a number), got '" + v + "'");
  return {int32_t(id), float(bias)};
}

}  // namespace

SamplingParams sampling_params(const Options& a) {
  SamplingParams s;
  s.temperature = float(a.get_number("temp", 0));
  s.top_k = int(a.get_int_in("top-k", 0, 0, std::numeric_limits<int>::max()));
  s.top_p = float(a.get_number("top-p", 1));
  s.min_p = float(a.get_number("min-p", 0));
  s.seed = uint64_t(a.get_int("seed", 0));
  s.presence_penalty = float(a.get_number("presence-penalty", 0));
  s.frequency_penalty = float(a.get_number("frequency-penalty", 0));
  for (const std::string& v : a.get_all("logit-bias")) s.logit_bias.push_back(logit_bias_entry(v));
  // The ids are checked against the model's vocabulary once it is loaded.
  s.check(std::numeric_limits<int32_t>::max());
  return s;
}

std::vector<OptionSpec> sampling_options(int64_t default_new_tokens) {
  return {
      {"max-new-tokens", 'n', "K", "tokens to generate (per answer; default " + std::to_string(default_new_tokens) + ")"},
      {"temp", 0, "T", "sampling temperature; 0 (the default) picks the most likely token", {"temperature"}},
      {"top-k", 0, "K", "sample among the K most likely tokens only (default 0: all)"},
      {"top-p", 0, "P", "sample among the smallest set of most likely tokens whose probability reaches P (default 1)"},
      {"min-p", 0, "P", "drop tokens less likely than P times the most likely one (default 0)"},
      {"seed", 's', "N", "seed of the draws; token i depends only on the seed and its position (default 0)"},
      {"presence-penalty", 0, "P",
       "subtract P (in [-2, 2]) from the logit of every token the answer already holds (default 0)"},
      {"frequency-penalty", 0, "P",
       "subtract P (in [-2, 2]) times its count in the answer so far from each token's logit (default 0)"},
      {"logit-bias", 0, "ID=BIAS", "add BIAS (in [-100, 100]) to token ID's logit before every choice (repeatable)",
       {}, true},
      {"stop", 0, "STRING",
       "end when the text contains STRING, printed cut before it (repeatable; needs DIR/tokenizer.json)", {}, true}};
}

std::vector<OptionSpec> prefix_cache_options(int64_t default_mb) {
  return {
      {"prefix-cache-mb", 0, "MB",
       "keep the states of earlier requests, up to MB MiB, and resume a prompt from the longest one that is a prefix "
       "of it (default " + std::to_string(default_mb) + (default_mb ? "" : ": off, or 1024 with --state-dir") + ")"},
      {"snapshot-every", 0, "N",
       "inside a long prompt, also keep the state every N tokens (default 2048; 0: only at the end of a request)"},
      {"state-dir", 0, "DIR",
       "keep the cached states in files under DIR too, so that a later run resumes from them"}};
}

void set_prefix_cache(const Options& a, int64_t default_mb, EngineOptions* o) {
  // A state directory is useless with the cache off: it turns the cache on.
  if (default_mb == 0 && a.has("state-dir")) default_mb = 1024;
  const int64_t mb = a.get_int_in("prefix-cache-mb", default_mb, 0, int64_t(1) << 30, "2^30");
  o->prefix_cache_bytes = size_t(mb) << 20;
  o->snapshot_every = a.get_int_in("snapshot-every", o->snapshot_every, 0, int64_t(1) << 40, "2^40");
  o->state_dir = a.get("state-dir");
}

}  // namespace dsv4::cli
