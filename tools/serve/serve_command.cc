#include "serve/serve_command.h"

#include "core/error.h"
#include "generation.h"
#include "serve/server.h"

namespace dsv4::serve {

namespace {

constexpr int64_t kDefaultPrefixCacheMb = 1024;
constexpr int64_t kMaxMb = int64_t(1) << 30;

cli::CommandSpec make_spec() {
  std::vector<cli::OptionSpec> o = {
      {"model", 'm', "DIR",
       "checkpoint directory (config.json, safetensors, tokenizer.json; without tokenizer.json only /v1/completions "
       "with token-id prompts)"},
      {"host", 0, "H", "address to listen on (default 127.0.0.1)"},
      {"port", 0, "P", "port (default 8080; 0 picks a free one, printed on stderr)"},
      {"parallel", 0, "N", "requests running at once; the others wait in the queue (default 4)"},
      {"max-queue", 0, "Q", "requests waiting at most; one more gets 429 (default 64)"},
      {"prefill-chunk", 0, "N",
       "prompt positions the requests still prefilling append together per step, the oldest first (default 2048: "
       "smaller gives the streams beside a long prompt more tokens per second, larger prefills faster)"},
      {"max-context", 'c', "N", "most positions a request may take, prompt plus answer (default: the model's)"},
      {"cache-pool-mb", 0, "MB",
       "the sessions' cache pool (default: room for --parallel requests at --max-context, at most a quarter of "
       "the memory)"}};
  for (cli::OptionSpec& p : cli::prefix_cache_options(kDefaultPrefixCacheMb)) o.push_back(p);
  std::vector<cli::OptionSpec> more = {
      {"api-key", 0, "KEY", "every endpoint but / and /health needs the header Authorization: Bearer KEY"},
      {"cors-origin", 0, "ORIGIN",
       "let browser pages from ORIGIN (e.g. http://localhost:3000; * for any) call the API: CORS headers and "
       "preflights (repeatable; default: none, only the chat page at / itself)",
       {}, true},
      {"model-name", 0, "NAME",
       "the id in /v1/models and the model a request must name (default: the model directory's last component)"},
      {"max-body-mb", 0, "MB", "larger request bodies get 413 (default 8)"},
      {"shutdown-timeout", 0, "S", "on SIGINT/SIGTERM, seconds in-flight requests get to finish (default 10)"},
      {"keepalive-seconds", 0, "S", "an SSE comment line this often while a stream has nothing to send (default 5)"},
      {"threads", 't', "N", "engine threads (default: all cores)"}};
  o.insert(o.end(), more.begin(), more.end());
  return cli::CommandSpec{
      "serve",
      "an OpenAI-compatible HTTP server (chat completions, completions, a chat page at /)",
      "--model DIR [--port P] [options]",
      "Listens at once (\"dsv4 serve: listening on http://HOST:PORT\" on stderr), then loads the model "
      "(\"dsv4 serve: model NAME ready (...)\"); until then /health and the API answer 503. Requests run together, "
      "batched continuously, each resumed from the prefix cache. SIGINT or SIGTERM: new requests get 503, the "
      "running ones get --shutdown-timeout seconds to finish, and the process exits 0. The endpoints, fields and "
      "errors are in docs/SERVER.md.",
      o};
}

double seconds_option(const cli::Options& a, const std::string& name, double fallback) {
  const double s = a.get_number(name, fallback);
  if (!(s > 0 && s <= 86400)) throw Error("--" + name + " must be a number of seconds in (0, 86400]");
  return s;
}

}  // namespace

const cli::CommandSpec& serve_command() {
  static const cli::CommandSpec spec = make_spec();
  return spec;
}

int run_serve(const cli::Options& a, const std::string& version) {
  if (!a.has("model")) throw Error("serve needs --model DIR");
  ServeOptions s;
  s.engine.model_dir = a.get("model");
  s.engine.threads = a.has("threads") ? int(a.get_int_in("threads", 0, 1, 1024)) : 0;
  if (a.has("max-context")) s.engine.max_positions = a.get_int_in("max-context", 0, 1, int64_t(1) << 40, "2^40");
  cli::set_prefix_cache(a, kDefaultPrefixCacheMb, &s.engine);
  s.engine.check();
  s.host = a.get("host", s.host);
  s.port = int(a.get_int_in("port", s.port, 0, 65535));
  s.parallel = int(a.get_int_in("parallel", s.parallel, 1, 4096));
  s.max_queue = int(a.get_int_in("max-queue", s.max_queue, 0, 1 << 20));
  if (a.has("prefill-chunk")) s.prefill_chunk = a.get_int_in("prefill-chunk", 0, 1, int64_t(1) << 30, "2^30");
  s.cache_pool_bytes = size_t(a.get_int_in("cache-pool-mb", 0, 0, kMaxMb, "2^30")) << 20;
  s.api_key = a.get("api-key");
  s.cors_origins = a.get_all("cors-origin");
  for (const std::string& o : s.cors_origins)
    if (o != "*" && (!(o.starts_with("http://") || o.starts_with("https://")) || o.ends_with("/")))
      throw Error("--cors-origin takes * or an origin such as http://localhost:3000 (scheme, host, port; no path), got '" +
                  o + "'");
  s.model_name = a.get("model-name");
  s.max_body_bytes = size_t(a.get_int_in("max-body-mb", 8, 1, 1 << 20, "2^20")) << 20;
  s.shutdown_timeout_seconds = seconds_option(a, "shutdown-timeout", s.shutdown_timeout_seconds);
  s.keepalive_seconds = seconds_option(a, "keepalive-seconds", s.keepalive_seconds);
  s.version = version;
  return serve(s);
}

}  // namespace dsv4::serve
