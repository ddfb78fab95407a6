#include "serve/server.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include <httplib.h>

#include "core/error.h"
#include "serve/chat_page.h"
#include "serve/client_socket.h"
#include "serve/metrics.h"
#include "serve/openai.h"
#include "serve/scheduler.h"

namespace dsv4::serve {

namespace {

using Clock = std::chrono::steady_clock;
using httplib::DataSink;
using httplib::Request;
using httplib::Response;

// Set by SIGINT/SIGTERM; a watcher thread acts on it. A lock-free atomic is
// both safe to store from a signal handler and race-free to read from another
// thread (a volatile sig_atomic_t is only the former).
std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the stop flag is set from a signal handler");
extern "C" void on_stop_signal(int) { g_stop_signal.store(1); }

void install_signal_handlers() {
  struct sigaction sa = {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is a failed write, not the end of the process
}

void send_json(Response& res, int status, const ojson& body) {
  res.status = status;
  res.set_content(json_text(body), "application/json");
}

void send_error(Response& res, const ApiError& e) {
  if (e.status == 429) res.set_header("Retry-After", "1");
  send_json(res, e.status, e.body());
}

ApiError loading_error() { return ApiError(503, "server_error", "loading", "The model is still loading."); }
ApiError shutting_down_error() {
  return ApiError(503, "server_error", "shutting_down", "The server is shutting down.");
}

// The endpoints and their methods: a known path asked with another method
// is a 405, an unknown one a 404.
const std::map<std::string, std::string> kRoutes = {
    {"/", "GET"},          {"/health", "GET"},           {"/v1/models", "GET"},
    {"/metrics", "GET"},   {"/v1/chat/completions", "POST"}, {"/v1/completions", "POST"},
    {"/tokenize", "POST"}, {"/detokenize", "POST"}};
constexpr std::string_view kModelPrefix = "/v1/models/";  // GET /v1/models/{id}

// The method `path` takes; empty for no endpoint.
std::string route_method(const std::string& path) {
  if (const auto route = kRoutes.find(path); route != kRoutes.end()) return route->second;
  return path.size() > kModelPrefix.size() && path.starts_with(kModelPrefix) ? "GET" : "";
}

// The model directory's last component ("models/default/" → "default").
std::string default_model_name(const std::string& dir) {
  std::filesystem::path p(dir);
  if (p.filename().empty()) p = p.parent_path();
  return p.filename().string();
}

size_t physical_memory_bytes() { return size_t(sysconf(_SC_PHYS_PAGES)) * size_t(sysconf(_SC_PAGESIZE)); }

class Server {
 public:
  explicit Server(const ServeOptions& o);
  int run();

 private:
  enum class State { kLoading, kReady, kShuttingDown };

  void add_routes();
  void load();
  void watch();
  httplib::Server::HandlerResponse before_routing(const Request& req, Response& res);
  void on_http_error(const Request& req, Response& res);

  void handle_generate(const Request& req, Response& res, Endpoint endpoint);
  std::shared_ptr<RequestStream> submit(const GenerationRequest& g);
  void answer_whole(const Request& req, Response& res, const ApiRequest& r, RequestStream& stream,
                    const std::string& id);
  void answer_stream(Response& res, std::shared_ptr<ApiRequest> r, std::shared_ptr<RequestStream> stream,
                     const std::string& id);
  ojson model_object() const;
  void handle_models(Response& res);
  void handle_model(const std::string& id, Response& res);
  bool cors(const Request& req, Response& res) const;
  void handle_metrics(Response& res);
  uint64_t fresh_seed();

  ServeOptions options_;
  httplib::Server http_;
  std::atomic<State> state_{State::kLoading};
  // loaded_: the engine, scheduler and model_ are set (handlers read them
  // only after seeing it).
  std::atomic<bool> loaded_{false}, load_failed_{false}, loader_done_{false}, watcher_stop_{false};
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Scheduler> scheduler_;
  ModelInfo model_;
  int64_t started_ = std::time(nullptr);
  std::atomic<uint64_t> next_id_{0};
  std::atomic<int> in_flight_{0};  // generation requests not yet answered in full
  std::mutex seed_mu_;
  std::mt19937_64 seeds_{std::random_device{}()};
};

Server::Server(const ServeOptions& o) : options_(o) {
  if (options_.model_name.empty()) options_.model_name = default_model_name(o.engine.model_dir);
  http_.set_payload_max_length(o.max_body_bytes);
  // One thread per connection: every stream holds one while it runs, so
  // there are enough for every running and queued request, and some more;
  // at most 1024 (connections past that wait in httplib's own queue).
  const size_t threads = std::min<size_t>(size_t(o.parallel) + size_t(o.max_queue) + 16, 1024);
  http_.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  add_routes();
}

// ---- Routing ---------------------------------------------------------------------------

void Server::add_routes() {
  http_.set_pre_routing_handler([this](const Request& req, Response& res) { return before_routing(req, res); });
  http_.set_error_handler([this](const Request& req, Response& res) { on_http_error(req, res); });
  http_.set_exception_handler([](const Request&, Response& res, std::exception_ptr ep) {
    std::string what = "unknown error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, ApiError(500, "server_error", "internal_error", what));
  });
  http_.Get("/", [](const Request&, Response& res) {
    res.set_content(std::string(kChatPage), "text/html; charset=utf-8");
  });
  http_.Get("/health", [this](const Request&, Response& res) {
    const bool loading = !loaded_;
    send_json(res, loading ? 503 : 200, ojson{{"status", loading ? "loading" : "ok"}});
  });
  http_.Get("/v1/models", [this](const Request&, Response& res) { handle_models(res); });
  http_.Get("/v1/models/(.+)", [this](const Request& req, Response& res) { handle_model(req.matches[1], res); });
  http_.Get("/metrics", [this](const Request&, Response& res) { handle_metrics(res); });
  http_.Post("/v1/chat/completions",
             [this](const Request& req, Response& res) { handle_generate(req, res, Endpoint::kChat); });
  http_.Post("/v1/completions",
             [this](const Request& req, Response& res) { handle_generate(req, res, Endpoint::kCompletions); });
  http_.Post("/tokenize", [this](const Request& req, Response& res) {
    try {
      send_json(res, 200, ojson{{"tokens", tokenize_request(req.body, model_)}});
    } catch (const ApiError& e) {
      send_error(res, e);
    }
  });
  http_.Post("/detokenize", [this](const Request& req, Response& res) {
    try {
      send_json(res, 200, ojson{{"content", detokenize_request(req.body, model_)}});
    } catch (const ApiError& e) {
      send_error(res, e);
    }
  });
}

// Before any handler: the method, the API key, and whether the model is
// there yet. `/` and `/health` are open to all at all times.
httplib::Server::HandlerResponse Server::before_routing(const Request& req, Response& res) {
  using R = httplib::Server::HandlerResponse;
  const std::string method = route_method(req.path);
  if (method.empty()) return R::Unhandled;  // the router's 404, written by on_http_error
  // Every answer to an allowed origin carries the CORS headers, errors too.
  if (cors(req, res) && req.method == "OPTIONS") {  // a browser's preflight: no key needed
    res.status = 204;
    res.set_header("Access-Control-Allow-Methods", method + ", OPTIONS");
    res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type");
    res.set_header("Access-Control-Max-Age", "600");
    return R::Handled;
  }
  if (req.method != method) {
    send_error(res, ApiError(405, "invalid_request_error", "method_not_allowed",
                             req.method + " is not allowed on " + req.path + "; use " + method));
    return R::Handled;
  }
  if (req.path == "/" || req.path == "/health") return R::Unhandled;
  if (!options_.api_key.empty() && req.get_header_value("Authorization") != "Bearer " + options_.api_key) {
    send_error(res, ApiError(401, "invalid_request_error", "invalid_api_key",
                             "Missing or wrong API key: send the header Authorization: Bearer KEY."));
    return R::Handled;
  }
  if (!loaded_) {
    send_error(res, loading_error());
    return R::Handled;
  }
  return R::Unhandled;
}

// With --cors-origin: when the request's Origin is one of them (or they
// include *), the response says so, and true. Browsers send Origin on
// cross-origin calls and enforce the answer; without a match they refuse
// the page its response.
bool Server::cors(const Request& req, Response& res) const {
  const std::string origin = req.get_header_value("Origin");
  if (origin.empty() || options_.cors_origins.empty()) return false;
  const auto& allowed = options_.cors_origins;
  const bool any = std::find(allowed.begin(), allowed.end(), "*") != allowed.end();
  if (!any && std::find(allowed.begin(), allowed.end(), origin) == allowed.end()) return false;
  res.set_header("Access-Control-Allow-Origin", any ? "*" : origin);
  if (!any) res.set_header("Vary", "Origin");
  return true;
}

// httplib's own errors (no route, body too large, a request it cannot
// read) in the OpenAI shape; the handlers' errors already have their body.
void Server::on_http_error(const Request& req, Response& res) {
  if (!res.body.empty()) return;
  if (res.status == 404)
    send_error(res, ApiError(404, "invalid_request_error", "not_found", "There is no endpoint " + req.path + "."));
  else if (res.status == 413)
    send_error(res, ApiError(413, "invalid_request_error", "request_too_large",
                             "The request body is larger than " + std::to_string(options_.max_body_bytes >> 20) +
                                 " MiB (--max-body-mb)."));
  else if (res.status < 500)
    send_error(res, ApiError(res.status, "invalid_request_error", "invalid_request", "The request is malformed."));
  else
    send_error(res, ApiError(res.status, "server_error", "internal_error", "Internal error."));
}

// ---- Generation --------------------------------------------------------------------------

uint64_t Server::fresh_seed() {
  std::lock_guard<std::mutex> lock(seed_mu_);
  return seeds_();
}

// The request to the scheduler; its refusals as API errors.
std::shared_ptr<RequestStream> Server::submit(const GenerationRequest& g) {
  try {
    return scheduler_->submit(g);
  } catch (const QueueFull& e) {
    throw ApiError(429, "rate_limit_error", "queue_full", "Too many requests are waiting; try again shortly.");
  } catch (const ShuttingDown&) {
    throw shutting_down_error();
  } catch (const Error& e) {
    throw invalid_value("", e.what());
  }
}

void Server::handle_generate(const Request& req, Response& res, Endpoint endpoint) {
  struct InFlight {
    std::atomic<int>& n;
    explicit InFlight(std::atomic<int>& c) : n(c) { ++n; }
    ~InFlight() { --n; }
  };
  try {
    if (state_ == State::kShuttingDown) throw shutting_down_error();
    auto r = std::make_shared<ApiRequest>(parse_request(endpoint, req.body, model_, fresh_seed()));
    const std::string id = (endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id_++);
    if (r->stream) {
      std::shared_ptr<RequestStream> stream = submit(r->generation);
      ++in_flight_;  // until the stream's releaser runs
      answer_stream(res, r, std::move(stream), id);
    } else {
      InFlight guard(in_flight_);
      answer_whole(req, res, *r, *submit(r->generation), id);
    }
  } catch (const ApiError& e) {
    send_error(res, e);
  }
}

// A final update that ended in an error, as the client sees it.
ApiError update_error(const Update& u) {
  if (u.error == ShuttingDown().what()) return shutting_down_error();
  return ApiError(500, "server_error", "internal_error", u.error.empty() ? "the request failed" : u.error);
}

// How often an answer that has nothing new checks that its client is still there.
constexpr std::chrono::milliseconds kClientPoll{250};

void Server::answer_whole(const Request& req, Response& res, const ApiRequest& r, RequestStream& stream,
                          const std::string& id) {
  // Not found (-1): the client is never taken for gone, as before.
  const int client = find_connected_socket(req.remote_addr, req.remote_port, req.local_addr, req.local_port);
  Answer a;
  Update u;
  while (a.final_update.finish == Finish::kNone) {
    if (client >= 0 && peer_closed(client)) {
      stream.cancel();
      // httplib writes an answer after every handler, this empty one too: it
      // fails at once instead of reaching a client that may still read.
      shutdown(client, SHUT_RDWR);
      return;
    }
    if (!stream.next(&u, kClientPoll)) continue;
    a.tokens.insert(a.tokens.end(), u.tokens.begin(), u.tokens.end());
    a.text += u.text;
    if (u.finish != Finish::kNone) a.final_update = u;
  }
  if (a.final_update.finish == Finish::kError) throw update_error(a.final_update);
  const int64_t created = std::time(nullptr);
  send_json(res, 200, r.endpoint == Endpoint::kChat ? chat_response(r, a, model_, id, created)
                                                    : completion_response(r, a, model_, id, created));
}

// One streamed answer: what the chunked content provider keeps between calls.
struct StreamState {
  std::shared_ptr<ApiRequest> request;
  std::shared_ptr<RequestStream> stream;
  ChunkWriter writer;
  Clock::time_point last_write = Clock::now();
  StreamState(std::shared_ptr<ApiRequest> r, std::shared_ptr<RequestStream> s, const ModelInfo& m, std::string id)
      : request(r), stream(std::move(s)), writer(*r, m, std::move(id), std::time(nullptr)) {}

  bool send(DataSink& sink, const std::string& event) {
    last_write = Clock::now();
    return sink.write(event.data(), event.size());
  }
  bool send_data(DataSink& sink, const std::string& payload) { return send(sink, "data: " + payload + "\n\n"); }
};

void Server::answer_stream(Response& res, std::shared_ptr<ApiRequest> r, std::shared_ptr<RequestStream> stream,
                           const std::string& id) {
  auto st = std::make_shared<StreamState>(r, std::move(stream), model_, id);
  const auto keepalive = std::chrono::duration<double>(options_.keepalive_seconds);
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",  // exactly this: httplib compresses (and so buffers) other text/ types
      [st, keepalive](size_t, DataSink& sink) {
        Update u;
        if (!st->stream->next(&u, kClientPoll)) {
          // Nothing new: a keep-alive now and then, which also finds a client that went away.
          const bool due = Clock::now() - st->last_write >= keepalive;
          if (!sink.is_writable() || (due && !st->send(sink, ": keep-alive\n\n"))) {
            st->stream->cancel();
            return false;
          }
          return true;
        }
        for (const ojson& c : st->writer.chunks(u))
          if (!st->send_data(sink, json_text(c))) {
            st->stream->cancel();
            return false;
          }
        if (u.finish == Finish::kError) st->send_data(sink, json_text(update_error(u).body()));
        if (u.finish != Finish::kNone) {
          st->send(sink, "data: [DONE]\n\n");
          sink.done();
        }
        return true;
      },
      [st, this](bool) {
        st->stream->cancel();  // nothing when it ended; frees the request when the client left early
        --in_flight_;
      });
}

ojson Server::model_object() const {
  return ojson{{"id", model_.name}, {"object", "model"}, {"created", started_}, {"owned_by", "dsv4"},
               {"max_model_len", model_.position_limit}};
}

void Server::handle_models(Response& res) {
  send_json(res, 200, ojson{{"object", "list"}, {"data", ojson::array({model_object()})}});
}

void Server::handle_model(const std::string& id, Response& res) {
  if (id != model_.name) {
    send_error(res, ApiError(404, "invalid_request_error", "model_not_found",
                             "The model '" + id + "' does not exist; this server serves '" + model_.name + "'.",
                             "model"));
    return;
  }
  send_json(res, 200, model_object());
}

void Server::handle_metrics(Response& res) {
  res.set_content(metrics_text(scheduler_->metrics(), resident_memory_bytes()), "text/plain; version=0.0.4");
}

// ---- Life cycle ----------------------------------------------------------------------------

size_t pool_bytes(const ServeOptions& o, const Engine& engine) {
  if (o.cache_pool_bytes) return o.cache_pool_bytes;
  return default_cache_pool_bytes(engine.cache_bytes_for(engine.position_limit()), o.parallel,
                                  physical_memory_bytes());
}

// The mapped weights are read once before the server says it is ready: the
// first request would otherwise fault them in page by page (on flash4, a
// 16-token prompt answered 9.3 s after start-up and 2.5 s the next time).
void page_in_weights(const Engine& engine) {
  const auto t0 = std::chrono::steady_clock::now();
  if (const std::optional<size_t> bytes = engine.page_in_weights())
    std::fprintf(stderr, "dsv4 serve: %zu MiB of weights read in %.1f s\n", *bytes >> 20,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  else
    std::fprintf(stderr, "dsv4 serve: %zu MiB of weights, more than the memory available: they are read on first use\n",
                 engine.checkpoint_bytes() >> 20);
}

// On its own thread while the server already answers (503 "loading").
void Server::load() {
  try {
    engine_ = Engine::load(options_.engine);
    page_in_weights(*engine_);
    const size_t pool = pool_bytes(options_, *engine_);
    engine_->set_cache_pool_bytes(pool);
    model_.name = options_.model_name;
    model_.tokenizer = engine_->tokenizer();
    model_.position_limit = engine_->position_limit();
    model_.vocab_size = engine_->config().vocab_size;
    model_.eos_id = engine_->config().eos_token_id;
    model_.bos_id = model_.tokenizer && model_.tokenizer->token_id(kBosToken) >= 0
                        ? model_.tokenizer->token_id(kBosToken)
                        : engine_->config().bos_token_id;
    model_.fingerprint = "dsv4-" + options_.version;
    scheduler_ = std::make_unique<Scheduler>(
        *engine_, SchedulerOptions{options_.parallel, options_.max_queue, options_.prefill_chunk});
    loaded_ = true;
    State loading = State::kLoading;
    if (state_.compare_exchange_strong(loading, State::kReady))
      std::fprintf(stderr, "dsv4 serve: model %s ready (%lld positions, %d at once, cache pool %zu MiB%s)\n",
                   model_.name.c_str(), (long long)model_.position_limit, options_.parallel, pool >> 20,
                   model_.tokenizer ? "" : ", no tokenizer: token-id prompts only");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dsv4 serve: error: %s\n", e.what());
    load_failed_ = true;
    g_stop_signal.store(1);  // the watcher stops the server
  }
  loader_done_ = true;
}

// Waits for SIGINT/SIGTERM (or a failed load), then: no new requests, the
// scheduler lets the running ones finish until the deadline, the streams
// write their last chunks, and the server stops.
void Server::watch() {
  while (!g_stop_signal.load() && !watcher_stop_) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (watcher_stop_) return;
  const State was = state_.exchange(State::kShuttingDown);
  if (!load_failed_) std::fprintf(stderr, "dsv4 serve: shutting down\n");
  const auto deadline = std::chrono::milliseconds(int64_t(options_.shutdown_timeout_seconds * 1000));
  if (was == State::kReady) {
    scheduler_->shutdown(deadline);
    const auto until = Clock::now() + std::chrono::seconds(5);
    while (in_flight_ > 0 && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  http_.stop();
}

int Server::run() {
  const int port = options_.port == 0 ? http_.bind_to_any_port(options_.host)
                                      : (http_.bind_to_port(options_.host, options_.port) ? options_.port : -1);
  if (port < 0)
    throw Error("cannot listen on " + options_.host + ":" + std::to_string(options_.port) +
                " (in use, or not an address of this machine)");
  std::fprintf(stderr, "dsv4 serve: listening on http://%s:%d\n", options_.host.c_str(), port);
  install_signal_handlers();
  std::thread loader([this] { load(); });
  std::thread watcher([this] { watch(); });
  http_.listen_after_bind();
  watcher_stop_ = true;
  watcher.join();
  if (!loader_done_) {
    // Stopped while the model still loads: nothing to save, and the loader
    // cannot be interrupted.
    std::fflush(stderr);
    std::_Exit(0);
  }
  loader.join();
  scheduler_.reset();
  return load_failed_ ? 1 : 0;
}

}  // namespace

size_t default_cache_pool_bytes(size_t per_request, int parallel, size_t memory_bytes) {
  return std::min(per_request * size_t(std::max(parallel, 1)), memory_bytes / 4);
}

int serve(const ServeOptions& options) {
  g_stop_signal.store(0);
  Server server(options);
  return server.run();
}

}  // namespace dsv4::serve
