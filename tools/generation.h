// The generation loop that `generate` and `chat` share: resume from the
// prefix cache, prefill the rest of the prompt, sample token after token,
// stream the text, stop at eos / a stop string / the token budget, time it
// all, and leave the state to the prefix cache.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "io/text_stream.h"
#include "options.h"

namespace dsv4::cli {

// The tokens of a generation as they come: their text on a model with a
// tokenizer (TextStream: whole characters only, nothing that may still
// become a stop string; eos not shown), else their ids. Whatever becomes
// final goes to `out` (nothing when it is empty: only the text is kept).
class TokenStream {
 public:
  using Sink = std::function<void(const std::string&)>;
  TokenStream(const Tokenizer* tok, std::vector<std::string> stops, Sink out);

  void add(int32_t id, bool eos);
  bool stopped() const { return text_ && text_->stopped(); }
  // Flushes what was held back; returns the whole text (empty without a tokenizer).
  std::string finish();

 private:
  void write(const std::string& s) const {
    if (out_ && !s.empty()) out_(s);
  }
  std::optional<TextStream> text_;
  Sink out_;
  bool started_ = false;
};

struct GenerationParams {
  SamplingParams sampling;
  int64_t max_new_tokens = 16;
  bool ignore_eos = false;
  bool progress = false;     // the progress line of a long prefill (terminals only)
  bool keep_logits = false;  // every row the tokens were drawn from (--dump-logits-all)
  // Also append the last token before remembering, so that the cached state
  // covers prompt + every generated token: the next chat turn starts there.
  bool append_last = false;
  // Also remember the state one token before the end of the prompt: in
  // thinking mode the next chat turn's layout parts from this prompt there
  // (its <think> becomes </think> once the reasoning is dropped).
  bool remember_before_last = false;
};

// What a generation produced, and when.
struct Generation {
  std::vector<int32_t> tokens;
  std::string text;                      // with a tokenizer; cut before a stop string
  std::string finish_reason = "length";  // or "stop": eos or a stop string
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;       // of the prompt, restored from the prefix cache
  double prompt_seconds = 0;       // resuming and prefilling the rest
  double first_token_seconds = 0;  // from the start to the first token out
  double decode_seconds = 0;       // from the first token out to the last: tokens.size() − 1 steps
  std::vector<float> logits;       // with keep_logits: [tokens.size(), vocab]
  int64_t decode_tokens() const { return int64_t(tokens.size()) - 1; }
  // New prompt tokens per second of prefill (0 when none took time).
  double prefill_tokens_per_second() const;
  double decode_tokens_per_second() const;
};

// Runs one generation of `prompt` on `engine` (its cache pool already
// sized), streaming into `out`, and hands the final state to
// engine.remember().
Generation generate(Engine& engine, const std::vector<int32_t>& prompt, const GenerationParams& p, TokenStream& out);

// The figures generate --json and chat --json share: prompt_tokens,
// cached_tokens, prompt_seconds, prompt_tokens_per_second (of the tokens
// prefilled), time_to_first_token_seconds, generated, decode_tokens,
// decode_seconds, decode_tokens_per_second (null when none was decoded),
// finish_reason.
nlohmann::json generation_json(const Generation& g);
// The prefix cache's counters as a JSON object.
nlohmann::json prefix_cache_json(const PrefixCacheStats& s);

// ---- Options both commands take ------------------------------------------------

// --temp, --top-k, --top-p, --min-p and --seed, checked.
SamplingParams sampling_params(const Options& a);
// The sampling options, --stop and -n (whose default differs per command).
std::vector<OptionSpec> sampling_options(int64_t default_new_tokens);
// --prefix-cache-mb (default `default_mb`), --snapshot-every, --state-dir.
std::vector<OptionSpec> prefix_cache_options(int64_t default_mb);
// The engine's prefix-cache settings from those options.
void set_prefix_cache(const Options& a, int64_t default_mb, EngineOptions* o);

inline double seconds_between(std::chrono::steady_clock::time_point t0, std::chrono::steady_clock::time_point t1) {
  return std::chrono::duration<double>(t1 - t0).count();
}

}  // namespace dsv4::cli
