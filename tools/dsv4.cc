// The dsv4 command: prefill, synthetic checkpoints, inspection.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/prefill.h"
#include "io/npy.h"
#include "model/model.h"
#include "model/synthetic.h"

using namespace dsv4;
using nlohmann::json;

namespace {

const char* kHelp = R"(dsv4 — DeepSeek-V4 prefill engine

usage: dsv4 <command> [options]

commands:
  prefill     run the prefill forward of a prompt and report the next token
      --model DIR             checkpoint directory (config.json + safetensors)
      --tokens FILE.json      prompt as a JSON array of token ids
      --prompt TEXT           prompt as text; until the tokenizer lands, each
                              UTF-8 byte b becomes token id (b % vocab_size)
                              after a BOS token (synthetic models only)
      --threads N             worker threads (default: all cores)
      --tile-tokens T         positions per tile (default 128; 0 = whole prompt)
      --max-prompt N          longest accepted prompt (default: max_position_embeddings)
      --cache-pool-mb MB      size of the paged cache pool (default: what the
                              request needs); a full pool is a clean error
      --dump-logits OUT.npy   last row's logits, float32 [vocab]
      --dump-hidden OUT.npy   final normalised hidden rows, float32 [N, hidden]
      --dump-residuals OUT.npy  every layer's output residual stream,
                              float32 [layers, N, hc, hidden]
      --teacher-force IN.npy  layer L takes IN[L-1] as input (same shape as
                              --dump-residuals); layer 0 takes the embedding
      --top K                 print the top-K logits (default 5)
      --json                  print one JSON object instead of text
  generate    prefill, then decode greedily from the same caches
      --model, --tokens/--prompt, --threads, --tile-tokens, --max-prompt as for prefill
      --max-new-tokens K      tokens to generate (default 16)
      --ignore-eos            do not stop at eos_token_id
      --dump-logits-all OUT.npy  float32 [K, vocab]: row i holds the logits
                              token i was chosen from (row 0 from the prefill)
      --json                  one JSON object: generated, tokens_per_second, ...
  gen-model   write a synthetic checkpoint in the official layout
      --preset tiny|flash     base configuration
      --seed S                random seed (default 0)
      --out DIR               output directory
      --layers L --experts E --vocab V   overrides
      --shards K              number of safetensors shards (default 2)
  help        this text

Errors in input (files, config, prompt) print one line and exit with code 2.
)";

struct Args {
  std::string command;
  std::map<std::string, std::string> opts;
  bool has(const std::string& k) const { return opts.count(k) != 0; }
  std::string get(const std::string& k, const std::string& d = "") const {
    auto it = opts.find(k);
    return it == opts.end() ? d : it->second;
  }
  int64_t get_int(const std::string& k, int64_t d) const {
    if (!has(k)) return d;
    const std::string& v = opts.at(k);
    char* end = nullptr;
    long long x = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end) throw Error("option --" + k + " needs an integer, got '" + v + "'");
    return x;
  }
};

const std::vector<std::string> kFlags = {"json", "ignore-eos"};

Args parse_args(int argc, char** argv) {
  Args a;
  if (argc < 2) return a;
  a.command = argv[1];
  for (int i = 2; i < argc; ++i) {
    std::string s = argv[i];
    if (s.rfind("--", 0) != 0) throw Error("unexpected argument '" + s + "'");
    s = s.substr(2);
    if (std::find(kFlags.begin(), kFlags.end(), s) != kFlags.end()) {
      a.opts[s] = "1";
      continue;
    }
    if (i + 1 >= argc) throw Error("option --" + s + " needs a value");
    a.opts[s] = argv[++i];
  }
  return a;
}

std::vector<int32_t> read_tokens_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw Error(path + ": cannot open token file");
  std::stringstream ss;
  ss << f.rdbuf();
  json j = json::parse(ss.str(), nullptr, false);
  if (j.is_discarded() || !j.is_array()) throw Error(path + ": expected a JSON array of token ids");
  std::vector<int32_t> t;
  for (size_t i = 0; i < j.size(); ++i) {
    if (!j[i].is_number_integer()) throw Error(path + ": element " + std::to_string(i) + " is not an integer");
    int64_t v = j[i].get<int64_t>();
    if (v < 0 || v > INT32_MAX) throw Error(path + ": token " + std::to_string(i) + " = " + std::to_string(v) + " is out of range");
    t.push_back(int32_t(v));
  }
  return t;
}

std::vector<int32_t> bytes_to_tokens(const std::string& text, const ModelConfig& c) {
  std::vector<int32_t> t{c.bos_token_id};
  for (unsigned char ch : text) t.push_back(int32_t(ch % c.vocab_size));
  return t;
}

void check_allowed(const Args& a, const std::vector<std::string>& allowed) {
  for (auto& kv : a.opts)
    if (std::find(allowed.begin(), allowed.end(), kv.first) == allowed.end())
      throw Error("unknown option --" + kv.first + " for '" + a.command + "' (see dsv4 --help)");
}

// What prefill and generate share: the model, the prompt and the tile walk.
struct Request {
  std::unique_ptr<Model> model;
  std::vector<int32_t> tokens;
  PrefillOptions opts;
  int64_t pool_mb = 0;  // --cache-pool-mb; 0 = exactly what the request needs

  std::unique_ptr<CachePool> make_pool(int64_t positions) const {
    if (pool_mb > 0) return std::make_unique<CachePool>(size_t(pool_mb) << 20);
    return pool_for_request(*model, positions);
  }
};

size_t peak_rss_bytes() {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return size_t(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

Request load_request(const Args& a) {
  if (!a.has("model")) throw Error(a.command + " needs --model DIR");
  if (a.has("tokens") == a.has("prompt")) throw Error(a.command + " needs exactly one of --tokens FILE or --prompt TEXT");
  if (a.has("threads")) {
    const int64_t t = a.get_int("threads", 0);
    if (t < 1 || t > 1024) throw Error("--threads must be in [1, 1024], got " + std::to_string(t));
    ThreadPool::set_threads(int(t));
  }
  Request r;
  r.model = Model::load(a.get("model"));
  const ModelConfig& c = r.model->config;
  r.tokens = a.has("tokens") ? read_tokens_file(a.get("tokens")) : bytes_to_tokens(a.get("prompt"), c);
  r.opts.tile_tokens = a.get_int("tile-tokens", 128);
  if (r.opts.tile_tokens < 0) throw Error("--tile-tokens must be >= 0");
  r.opts.max_prompt = a.get_int("max-prompt", 0);
  r.pool_mb = a.get_int("cache-pool-mb", 0);
  if (r.pool_mb < 0 || r.pool_mb > (int64_t(1) << 30)) throw Error("--cache-pool-mb must be in [0, 2^30]");
  if (r.opts.max_prompt < 0) throw Error("--max-prompt must be >= 0");
  validate_prompt(c, r.tokens, prompt_limit(c, r.opts.max_prompt));
  return r;
}

int cmd_prefill(const Args& a) {
  check_allowed(a, {"model", "tokens", "prompt", "threads", "tile-tokens", "max-prompt", "dump-logits", "dump-hidden",
                    "dump-residuals", "teacher-force", "top", "json", "cache-pool-mb"});
  Request req = load_request(a);
  auto& model = req.model;
  auto& tokens = req.tokens;
  PrefillOptions& o = req.opts;
  const ModelConfig& c = model->config;
  o.keep_hidden = a.has("dump-hidden");
  o.keep_residuals = a.has("dump-residuals");
  const int64_t N = int64_t(tokens.size()), L = c.num_hidden_layers, hc = c.hc_mult, D = c.hidden_size;
  NpyArray teacher;
  if (a.has("teacher-force")) {
    teacher = read_npy(a.get("teacher-force"));
    std::vector<int64_t> want = {L, N, hc, D};
    if (teacher.shape != want)
      throw Error(a.get("teacher-force") + ": shape " + shape_str(teacher.shape) + ", expected " + shape_str(want));
    o.teacher = teacher.data.data();
  }

  auto t0 = std::chrono::steady_clock::now();
  auto pool = req.make_pool(N);
  PrefillResult r = prefill(*model, tokens, o, pool.get());
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  if (a.has("dump-logits")) write_npy(a.get("dump-logits"), r.logits.data(), {c.vocab_size});
  if (a.has("dump-hidden")) write_npy(a.get("dump-hidden"), r.hidden.data(), {N, D});
  if (a.has("dump-residuals")) write_npy(a.get("dump-residuals"), r.residuals.data(), {L, N, hc, D});

  const int64_t topn = std::min<int64_t>(a.get_int("top", 5), c.vocab_size);
  std::vector<int32_t> order(size_t(c.vocab_size));
  for (int32_t i = 0; i < c.vocab_size; ++i) order[size_t(i)] = i;
  std::partial_sort(order.begin(), order.begin() + topn, order.end(), [&](int32_t x, int32_t y) {
    return r.logits[size_t(x)] != r.logits[size_t(y)] ? r.logits[size_t(x)] > r.logits[size_t(y)] : x < y;
  });
  if (a.has("json")) {
    json top = json::array();
    for (int64_t i = 0; i < topn; ++i) top.push_back({{"id", order[size_t(i)]}, {"logit", r.logits[size_t(order[size_t(i)])]}});
    json out = {{"n_tokens", N}, {"next_token", r.next_token}, {"seconds", secs},
                {"tokens_per_second", double(N) / secs}, {"cache_bytes", r.cache_bytes},
                {"peak_rss_bytes", peak_rss_bytes()}, {"top", top}};
    std::cout << out.dump() << std::endl;
  } else {
    std::printf("prompt: %lld tokens\nnext token: %d\ntop-%lld logits:\n", (long long)N, r.next_token, (long long)topn);
    for (int64_t i = 0; i < topn; ++i) std::printf("  %8d  %10.4f\n", order[size_t(i)], r.logits[size_t(order[size_t(i)])]);
    std::printf("prefill: %.3f s, %.1f tokens/s\n", secs, double(N) / secs);
  }
  return 0;
}

int cmd_generate(const Args& a) {
  check_allowed(a, {"model", "tokens", "prompt", "threads", "tile-tokens", "max-prompt", "max-new-tokens",
                    "ignore-eos", "dump-logits-all", "json", "cache-pool-mb"});
  Request req = load_request(a);
  const Model& m = *req.model;
  const ModelConfig& c = m.config;
  const int64_t K = a.get_int("max-new-tokens", 16);
  if (K < 1) throw Error("--max-new-tokens must be >= 1");
  const int64_t N = int64_t(req.tokens.size());
  // Check the whole request up front: a generation that would run past the
  // limit fails before any work.
  const int64_t limit = prompt_limit(c, req.opts.max_prompt);
  if (N + K - 1 > limit)
    throw Error("a prompt of " + std::to_string(N) + " tokens plus " + std::to_string(K) +
                " new tokens needs " + std::to_string(N + K - 1) + " positions, more than the limit of " +
                std::to_string(limit) + " (--max-prompt, capped by max_position_embeddings)");

  auto pool = req.make_pool(N + K - 1);
  RequestState st;
  st.init(m, pool.get());
  std::vector<int32_t> generated;
  std::vector<float> all_logits;
  auto t0 = std::chrono::steady_clock::now();
  PrefillResult r = extend(m, st, req.tokens, req.opts);
  auto t1 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < K; ++i) {
    if (a.has("dump-logits-all")) all_logits.insert(all_logits.end(), r.logits.begin(), r.logits.end());
    generated.push_back(r.next_token);
    if (i + 1 == K || (!a.has("ignore-eos") && r.next_token == c.eos_token_id)) break;
    r = extend(m, st, {r.next_token}, req.opts);
  }
  auto t2 = std::chrono::steady_clock::now();
  const double prefill_s = std::chrono::duration<double>(t1 - t0).count();
  const double decode_s = std::chrono::duration<double>(t2 - t1).count();
  const double tps = decode_s > 0 ? double(generated.size() - 1) / decode_s : 0.0;
  if (a.has("dump-logits-all"))
    write_npy(a.get("dump-logits-all"), all_logits.data(), {int64_t(generated.size()), c.vocab_size});
  if (a.has("json")) {
    json out = {{"n_prompt_tokens", N}, {"generated", generated}, {"prefill_seconds", prefill_s},
                {"decode_seconds", decode_s}, {"tokens_per_second", tps}};
    std::cout << out.dump() << std::endl;
  } else {
    std::printf("generated:");
    for (int32_t t : generated) std::printf(" %d", t);
    std::printf("\nprefill: %lld tokens in %.3f s; decode: %zu tokens, %.1f tokens/s\n", (long long)N, prefill_s,
                generated.size(), tps);
  }
  return 0;
}

int cmd_gen_model(const Args& a) {
  check_allowed(a, {"preset", "seed", "out", "layers", "experts", "vocab", "shards"});
  if (!a.has("out")) throw Error("gen-model needs --out DIR");
  if (!a.has("preset")) throw Error("gen-model needs --preset tiny|flash");
  SyntheticOptions o;
  o.preset = a.get("preset");
  const int64_t seed = a.get_int("seed", 0);
  if (seed < 0) throw Error("--seed must be >= 0, got " + std::to_string(seed));
  o.seed = uint64_t(seed);
  auto int_opt = [&](const std::string& k, int dflt) {
    const int64_t v = a.get_int(k, dflt);
    if (v < 1 || v > (int64_t(1) << 30)) throw Error("--" + k + " must be in [1, 2^30], got " + std::to_string(v));
    return int(v);
  };
  if (a.has("layers")) o.layers = int_opt("layers", 0);
  if (a.has("experts")) o.experts = int_opt("experts", 0);
  if (a.has("vocab")) o.vocab = int_opt("vocab", 0);
  o.shards = int_opt("shards", o.shards);
  auto t0 = std::chrono::steady_clock::now();
  SyntheticSummary r = write_synthetic_model(a.get("out"), o);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%s: %zu tensors, %zu bytes, %d shard%s (%.2f s)\n", a.get("out").c_str(), r.tensors, r.bytes, o.shards,
              o.shards == 1 ? "" : "s", secs);
  return 0;
}

}  // namespace


int main(int argc, char** argv) {
  try {
    Args a = parse_args(argc, argv);
    if (a.command.empty() || a.command == "help" || a.command == "--help" || a.command == "-h") {
      std::fputs(kHelp, stdout);
      return a.command.empty() ? 2 : 0;
    }
    if (a.command == "prefill") return cmd_prefill(a);
    if (a.command == "generate") return cmd_generate(a);
    if (a.command == "gen-model") return cmd_gen_model(a);
    throw Error("unknown command '" + a.command + "' (see dsv4 --help)");
  } catch (const Error& e) {
    std::fprintf(stderr, "dsv4: error: %s\n", e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "dsv4: error: out of memory\n");
    return 2;
  }
}
