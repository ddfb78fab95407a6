#include "bench.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "bench_decode.h"
#include "core/arith.h"
#include "core/bandwidth.h"
#include "core/cpu.h"
#include "core/error.h"
#include "core/peak.h"
#include "core/stage_timer.h"
#include "core/thread_pool.h"
#include "dist/mpi.h"
#include "engine/engine.h"
#include "engine/flops.h"
#include "engine/kernel_bench.h"
#include "io/synthetic.h"

namespace dsv4 {

namespace {

using nlohmann::json;

// ---- Progress on stderr -----------------------------------------------------------
//
// Drawn only when stderr is a terminal, and only once the run has taken more
// than a second: `[#####     ] 3/9 prefill N=2048  12.3 s`. A step's share
// of the bar grows with its elapsed time against its expected time (when
// one is known), never past the step's end.
class Progress {
 public:
  explicit Progress(int steps) : steps_(std::max(1, steps)), enabled_(isatty(STDERR_FILENO) == 1) {
    if (enabled_) ticker_ = std::thread([this] { tick(); });
  }
  ~Progress() { finish(/*ok=*/false); }

  void begin(const std::string& label, double expected_seconds = 0) {
    std::lock_guard<std::mutex> l(mu_);
    label_ = label;
    expected_ = expected_seconds;
    step_start_ = Clock::now();
  }
  void end() {
    std::lock_guard<std::mutex> l(mu_);
    ++done_;
    expected_ = 0;
  }
  // Stops the ticker; a drawn bar ends with its line (full when ok).
  void finish(bool ok = true) {
    if (!ticker_.joinable()) return;
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    ticker_.join();
    if (drawn_ && ok)
      std::fprintf(stderr, "\r[%s] done in %.1f s%*s\n", std::string(kWidth, '#').c_str(), since(start_), 40, "");
    else if (drawn_)
      std::fprintf(stderr, "\n");
  }

 private:
  static constexpr int kWidth = 30;

  void tick() {
    std::unique_lock<std::mutex> l(mu_);
    while (!stop_) {
      cv_.wait_for(l, std::chrono::milliseconds(200));
      if (stop_ || since(start_) < 1.0) continue;
      double frac = double(done_);
      if (expected_ > 0) frac += std::min(0.99, since(step_start_) / expected_);
      frac = std::min(1.0, frac / steps_);
      const int fill = int(frac * kWidth);
      std::fprintf(stderr, "\r[%s%s] %d/%d %-28s %7.1f s", std::string(size_t(fill), '#').c_str(),
                   std::string(size_t(kWidth - fill), ' ').c_str(), std::min(done_ + 1, steps_), steps_,
                   label_.c_str(), since(start_));
      std::fflush(stderr);
      drawn_ = true;
    }
  }

  const int steps_;
  const bool enabled_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::thread ticker_;
  Clock::time_point start_ = Clock::now(), step_start_ = Clock::now();
  std::string label_;
  double expected_ = 0;
  int done_ = 0;
  bool stop_ = false, drawn_ = false;
};

// ---- The model ---------------------------------------------------------------------

// A directory under $TMPDIR (or /tmp), removed with everything in it.
struct TempModelDir {
  std::string path;
  TempModelDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "dsv4-bench-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw Error("cannot create a temporary directory under " + tmpl);
    path = tmpl;
  }
  ~TempModelDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

// The checkpoint the bench runs: --model DIR, or a preset generated into a
// temporary directory.
struct BenchModel {
  std::unique_ptr<TempModelDir> tmp;  // set when generated
  std::string dir, source;
  SyntheticOptions synthetic;
  double generate_seconds = 0, load_seconds = 0;
};

// Validates the preset and that its checkpoint fits the free space; nothing
// is written yet.
BenchModel plan_model(const BenchOptions& o) {
  BenchModel m;
  m.dir = m.source = o.model_dir;
  if (!m.dir.empty()) return m;
  m.synthetic = o.synthetic;
  m.synthetic.shards = 1;
  const ModelConfig c = synthetic_config(m.synthetic);
  size_t bytes = 0;
  for (const TensorSpec& s : checkpoint_tensor_specs(c)) bytes += s.nbytes();
  m.tmp = std::make_unique<TempModelDir>();
  const auto space = std::filesystem::space(m.tmp->path);
  if (bytes + (size_t(1) << 30) > space.available)
    throw Error("preset '" + m.synthetic.preset + "' needs " + std::to_string(bytes >> 20) + " MiB for its checkpoint, " +
                std::to_string(space.available >> 20) + " MiB are free under " +
                std::filesystem::temp_directory_path().string() + " (use --layers/--experts, or --model DIR)");
  m.dir = m.tmp->path;
  m.source = "preset " + m.synthetic.preset + " (seed " + std::to_string(m.synthetic.seed) + ", generated)";
  return m;
}

EngineOptions engine_options(const BenchOptions& o, const std::string& dir, bool expert_parallel) {
  EngineOptions eo;
  eo.model_dir = dir;
  eo.threads = o.threads;
  eo.tile_tokens = o.tile_tokens;
  eo.chunk_tokens = o.chunk_tokens;
  eo.expert_parallel = expert_parallel;
  return eo;
}

std::unique_ptr<Engine> load_bench_engine(const BenchOptions& o, const std::string& dir, bool expert_parallel) {
  return Engine::load(engine_options(o, dir, expert_parallel));
}

// Writes the preset's checkpoint when there is one, then loads the engine
// (two progress steps, or one for --model).
std::unique_ptr<Engine> generate_and_load(const BenchOptions& o, Progress& progress, BenchModel& model) {
  if (model.tmp) {
    progress.begin("generating the model");
    const auto t0 = Clock::now();
    write_synthetic_model(model.dir, model.synthetic);
    model.generate_seconds = since(t0);
    progress.end();
  }
  progress.begin("loading the model");
  const auto t0 = Clock::now();
  std::unique_ptr<Engine> engine = load_bench_engine(o, model.dir, false);
  model.load_seconds = since(t0);
  progress.end();
  return engine;
}

void check_lengths(const BenchOptions& o, const Engine& e) {
  for (int64_t n : o.tokens)
    if (n > e.position_limit())
      throw Error("--tokens " + std::to_string(n) + " is over the model's limit of " +
                  std::to_string(e.position_limit()) + " positions (max_position_embeddings)");
}

// Deterministic prompt: a 64-bit LCG, the high bits mod vocab_size. A shorter
// prompt is a prefix of a longer one.
std::vector<int32_t> bench_prompt(int64_t n, int vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (int64_t i = 0; i < n; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    t[size_t(i)] = int32_t((x >> 33) % uint64_t(vocab));
  }
  return t;
}

// ---- Prefill -------------------------------------------------------------------------

struct PrefillRun {
  int64_t n_tokens = 0;
  double seconds = 0;
  FlopCounts flops;
  std::array<double, size_t(Stage::kCount)> stages{};
  uint64_t checksum = 0;
  int32_t next_token = -1;
};

// One prompt of n tokens in a fresh session with a pool of its own size.
PrefillRun bench_prefill(Engine& e, int64_t n) {
  PrefillRun r;
  r.n_tokens = n;
  const std::vector<int32_t> tokens = bench_prompt(n, e.config().vocab_size);
  StageTimes::global().reset();
  const auto t0 = Clock::now();
  e.set_cache_pool_bytes(e.cache_bytes_for(n));
  const PrefillResult res = e.new_session()->append(tokens);
  r.seconds = since(t0);
  r.stages = StageTimes::global().seconds;
  r.flops = prefill_flops(e.config(), n);
  r.checksum = logits_checksum(res.logits);
  r.next_token = res.next_token;
  return r;
}

// ---- Expert parallelism ------------------------------------------------------------

// Request r of the EP bench: the bench prompt with every id after BOS moved by r.
std::vector<int32_t> ep_request(int64_t n, int r, int vocab) {
  std::vector<int32_t> t = bench_prompt(n, vocab);
  for (size_t i = 1; i < t.size(); ++i) t[i] = int32_t((int64_t(t[i]) + 7919 * r) % vocab);
  return t;
}

struct RankResults {
  std::vector<uint64_t> logits, caches;  // per request
};

// R = 1: rank 0 alone, all R requests in one batch, every expert local.
double run_all_on_one_rank(Engine& full, const std::vector<std::vector<int32_t>>& all, RankResults* ref) {
  const size_t R = all.size();
  full.set_cache_pool_bytes(R * full.cache_bytes_for(int64_t(all[0].size())));
  std::vector<std::unique_ptr<Session>> sessions;
  std::vector<Session*> batch;
  for (size_t r = 0; r < R; ++r) {
    sessions.push_back(full.new_session());
    batch.push_back(sessions.back().get());
  }
  const auto t0 = Clock::now();
  std::vector<PrefillResult> res = full.append_batch(batch, all);
  const double secs = since(t0);
  for (size_t r = 0; r < R; ++r) {
    ref->logits.push_back(logits_checksum(res[r].logits));
    ref->caches.push_back(batch[r]->cache_checksum());
  }
  return secs;
}

// R ranks, request r on rank r with the experts split; rank 0 gets every
// rank's outcome. Returns this rank's seconds.
double run_split(Engine& part, const std::vector<int32_t>& mine, std::vector<dist::RequestOutcome>* got) {
  const int me = dist::rank();
  part.set_cache_pool_bytes(part.cache_bytes_for(int64_t(mine.size())));
  std::unique_ptr<Session> s = part.new_session();
  dist::barrier();
  const auto t0 = Clock::now();
  PrefillResult res = s->append(mine);
  const double secs = since(t0);
  dist::RequestOutcome o;
  o.index = me;
  o.n_tokens = int64_t(mine.size());
  o.next_token = res.next_token;
  o.cache_checksum = s->cache_checksum();
  o.logits = std::move(res.logits);
  *got = dist::gather_outcomes({o});
  return secs;
}

json ep_run_json(int64_t n, int R, double t1, const dist::EpTotals& t, bool identical) {
  json steps = json::array();
  for (size_t i = 0; i < t.step_bytes.size(); ++i)
    steps.push_back({{"bytes", t.step_bytes[i]}, {"seconds", t.step_comm_seconds[i]}});
  return {{"n_tokens", n},
          {"requests", R},
          {"seconds_r1", t1},
          {"seconds", t.wall_seconds},
          {"speedup", t.wall_seconds > 0 ? t1 / t.wall_seconds : 0.0},
          {"tokens_per_second", double(R * n) / t.wall_seconds},
          {"steps", t.steps},
          {"all_to_all_bytes_per_step", t.steps ? double(t.bytes_sent) / double(t.steps) : 0.0},
          {"all_to_all_seconds", t.comm_seconds},
          {"per_step", steps},
          {"results_identical", identical}};
}

void print_ep_runs(const json& runs, int R) {
  std::printf("expert parallelism: %d ranks, %d threads per rank; one request of N tokens per rank\n", R,
              ThreadPool::global().size());
  std::printf("  %6s %10s %10s %8s %11s %14s %10s  %s\n", "N", "R=1 s", "R s", "speedup", "tokens/s",
              "a2a bytes/step", "a2a s", "bitwise");
  for (const json& r : runs)
    std::printf("  %6lld %10.3f %10.3f %7.2fx %11.1f %14.0f %10.3f  %s\n", (long long)r["n_tokens"].get<int64_t>(),
                r["seconds_r1"].get<double>(), r["seconds"].get<double>(), r["speedup"].get<double>(),
                r["tokens_per_second"].get<double>(), r["all_to_all_bytes_per_step"].get<double>(),
                r["all_to_all_seconds"].get<double>(), r["results_identical"].get<bool>() ? "yes" : "NO");
}

// Under mpirun: expert-parallel prefill (PREFILL.md §4). Per prompt length,
// R requests (one per rank, request r a variant of the bench prompt) run
// first in one process on rank 0 with every expert (R = 1), then on R ranks
// with the experts split (each rank its own request). Reports both times,
// the speed-up, the all-to-all bytes and seconds per MoE step, and whether
// every request's logits and cache checksum came out bitwise the same.
int run_bench_ep(const BenchOptions& o) {
  if (o.model_dir.empty())
    throw Error("under mpirun, bench needs --model DIR (every rank maps the same checkpoint)");
  const int me = dist::rank(), R = dist::size();
  std::unique_ptr<Engine> part = load_bench_engine(o, o.model_dir, /*expert_parallel=*/true);
  std::unique_ptr<Engine> full = me == 0 ? load_bench_engine(o, o.model_dir, false) : nullptr;
  check_lengths(o, *part);
  const int vocab = part->config().vocab_size;
  json runs = json::array();
  for (int64_t n : o.tokens) {
    std::vector<std::vector<int32_t>> all;
    for (int r = 0; r < R; ++r) all.push_back(ep_request(n, r, vocab));
    RankResults ref;
    const double t1 = me == 0 ? run_all_on_one_rank(*full, all, &ref) : 0;
    dist::barrier();
    std::vector<dist::RequestOutcome> got;
    const double secs = run_split(*part, all[size_t(me)], &got);
    const dist::EpTotals t = part->take_expert_parallel_totals(secs);
    if (me != 0) continue;
    bool identical = got.size() == size_t(R);
    for (const dist::RequestOutcome& g : got)
      identical = identical && logits_checksum(g.logits) == ref.logits[size_t(g.index)] &&
                  g.cache_checksum == ref.caches[size_t(g.index)];
    runs.push_back(ep_run_json(n, R, t1, t, identical));
  }
  if (me != 0) return 0;
  if (o.json)
    std::cout << json{{"ranks", R}, {"threads", ThreadPool::global().size()}, {"prefill_ep", runs}}.dump() << std::endl;
  else
    print_ep_runs(runs, R);
  return 0;
}

// ---- One process ---------------------------------------------------------------------

// Everything one bench run measured.
struct BenchReport {
  BenchModel model;
  const ModelConfig* config = nullptr;
  size_t checkpoint_bytes = 0;
  int threads = 0;
  PeakResult peak;
  double peak_start = 0, peak_end = 0;
  std::vector<GemmResult> gemms;
  std::vector<std::string> warnings;  // printed after the progress bar
  std::vector<ConversionTiming> conversions;
  std::vector<PrefillRun> runs;
  double total_seconds = 0;

  double fraction(double flops, double secs) const {
    return peak.gflops > 0 ? flops / (peak.gflops * 1e9) / secs : 0.0;
  }
};

void measure_gemms(const BenchOptions& o, Progress& progress, BenchReport& rep) {
  if (!o.gemm_shapes.empty()) prepare_openblas(rep.threads);
  for (const GemmShape& g : o.gemm_shapes) {
    const double flops = 2.0 * double(g.m) * double(g.k) * double(g.n);
    progress.begin("gemm " + std::to_string(g.m) + "x" + std::to_string(g.k) + "x" + std::to_string(g.n),
                   2 * o.gemm_reps * flops / (0.5 * rep.peak_start * 1e9));
    rep.gemms.push_back(bench_gemm(g, o.gemm_reps));
    progress.end();
    const GemmResult& r = rep.gemms.back();
    if (r.max_rel_diff > 1e-3) {
      char msg[200];
      std::snprintf(msg, sizeof msg, "gemm %lldx%lldx%lld: engine and OpenBLAS results differ by %.3g (relative)",
                    (long long)g.m, (long long)g.k, (long long)g.n, r.max_rel_diff);
      rep.warnings.push_back(msg);
    }
  }
}

// Warm-up, not reported: every page of the mapped weights read once, then
// a short prefill (first-use allocations). The prefill alone would reach
// only the experts its few tokens are routed to, and the first measured run
// would pay for mapping in the rest: a cost of the first request after
// loading, not of prefill.
void warm_up(const BenchOptions& o, Progress& progress, Engine& e) {
  progress.begin("paging in the weights", 1.0);
  e.page_in_weights();
  progress.end();
  bench_prefill(e, std::min<int64_t>(16, o.tokens.front()));
}

void measure_prefills(const BenchOptions& o, Progress& progress, Engine& e, BenchReport& rep) {
  double rate = 0;  // model flops per second of the last run, for the progress estimate
  for (int64_t n : o.tokens) {
    progress.begin("prefill N=" + std::to_string(n), rate > 0 ? prefill_flops(e.config(), n).total() / rate : 0);
    rep.runs.push_back(bench_prefill(e, n));
    rate = rep.runs.back().flops.total() / rep.runs.back().seconds;
    progress.end();
  }
}

json report_json(const BenchOptions& o, const BenchReport& rep);
void print_report(const BenchOptions& o, const BenchReport& rep);

// ---- Decode ----------------------------------------------------------------------------

// Every session of a --decode run ends at context + 1 + decode_tokens
// positions (the prompt, one untimed step, the timed ones).
void check_decode_lengths(const BenchOptions& o, const Engine& e) {
  const int64_t end = o.context + 1 + o.decode_tokens;
  if (end > e.position_limit())
    throw Error("--context " + std::to_string(o.context) + ": with --decode-tokens " +
                std::to_string(o.decode_tokens) + " and one untimed step the sessions reach " + std::to_string(end) +
                " positions, over the model's limit of " + std::to_string(e.position_limit()) +
                " (max_position_embeddings)");
}

json decode_report_json(const BenchModel& model, const Engine& e, const BandwidthResult& bw, double bw_start,
                        double bw_end, const std::vector<DecodeRun>& runs, double total_seconds) {
  const ModelConfig& cfg = e.config();
  json m = {{"source", model.source},           {"layers", cfg.num_hidden_layers},
            {"hidden_size", cfg.hidden_size},   {"n_routed_experts", cfg.n_routed_experts},
            {"vocab_size", cfg.vocab_size},     {"checkpoint_bytes", e.checkpoint_bytes()},
            {"load_seconds", model.load_seconds}};
  return {{"model", m},
          {"threads", bw.threads},
          {"kernel_isa", isa_name(kernel_isa())},
          {"gemv_isa", isa_name(gemv_isa())},
          {"read_bandwidth_gbps", bw.gbps},
          {"read_bandwidth",
           {{"gbps", bw.gbps}, {"gbps_start", bw_start}, {"gbps_end", bw_end}, {"buffer_bytes", bw.buffer_bytes},
            {"llc_bytes", bw.llc_bytes}, {"threads", bw.threads}}},
          {"decode", decode_runs_json(runs, bw.gbps)},
          {"total_seconds", total_seconds}};
}

// --decode: the read bandwidth at the start and at the end (the larger
// counts: other processes lower it), between them one prompt of --context
// tokens prefilled once and every --streams count decoded from forks of it.
// The start is taken before the model loads: with a Flash-sized model
// resident (its packed panels on 2 MB pages, the page cache full of the
// checkpoint) the buffer got 4 KB pages and read 22-26 GB/s where the same
// machine gave 29-30 (the Xeon of session 28), which would flatter every
// fraction of the bandwidth.
int run_bench_decode(const BenchOptions& o) {
  if (dist::active()) throw Error("bench --decode runs in one process, not under mpirun");
  ThreadPool& pool = ThreadPool::global();
  BenchModel model = plan_model(o);
  Progress progress(4 + (model.tmp ? 1 : 0) + int(o.streams.size()));
  const auto t_all = Clock::now();
  progress.begin("read bandwidth", 4 * o.peak_seconds);
  BandwidthResult bw = measure_read_bandwidth(pool, o.peak_seconds, o.bandwidth_bytes);
  const double bw_start = bw.gbps;
  progress.end();
  std::unique_ptr<Engine> e = generate_and_load(o, progress, model);
  check_decode_lengths(o, *e);  // before the prefill and decode
  progress.begin("page-in, prefill N=" + std::to_string(o.context));
  e->page_in_weights();
  const int64_t most = *std::max_element(o.streams.begin(), o.streams.end());
  e->set_cache_pool_bytes(size_t(1 + most) * e->cache_bytes_for(o.context + 1 + o.decode_tokens));
  std::unique_ptr<Session> base = e->new_session();
  const int32_t next = base->append(bench_prompt(o.context, e->config().vocab_size)).next_token;
  progress.end();
  std::vector<DecodeRun> runs;
  for (int64_t s : o.streams) {
    progress.begin("decode, " + std::to_string(s) + " streams");
    runs.push_back(bench_decode(*e, *base, next, int(s), o.decode_tokens));
    progress.end();
  }
  progress.begin("read bandwidth", 4 * o.peak_seconds);
  const double bw_end = measure_read_bandwidth(pool, o.peak_seconds, o.bandwidth_bytes).gbps;
  bw.gbps = std::max(bw_start, bw_end);
  progress.end();
  progress.finish();
  if (o.json)
    std::cout << decode_report_json(model, *e, bw, bw_start, bw_end, runs, since(t_all)).dump() << std::endl;
  else
    print_decode_runs(runs, bw, bw_start, bw_end);
  return 0;
}

}  // namespace

int run_bench(const BenchOptions& o) {
  if (o.tokens.empty()) throw Error("bench needs at least one prompt length (--tokens)");
  engine_options(o, o.model_dir, false).check();  // before any work
  if (o.gemm_reps < 1) throw Error("--gemm-reps must be >= 1");
  if (o.threads > 0) ThreadPool::set_threads(o.threads);
  if (o.decode) return run_bench_decode(o);
  if (dist::active()) return run_bench_ep(o);
  ThreadPool& pool = ThreadPool::global();
  BenchReport rep;
  rep.threads = pool.size();
  rep.model = plan_model(o);  // a bad preset fails before any timing
  // Steps: [generate], load, peak, each gemm shape, conversions, page-in,
  // each prompt length, peak again.
  Progress progress(5 + (rep.model.tmp ? 1 : 0) + int(o.gemm_shapes.size()) + int(o.tokens.size()));
  const auto t_all = Clock::now();
  std::unique_ptr<Engine> engine = generate_and_load(o, progress, rep.model);
  rep.config = &engine->config();
  rep.checkpoint_bytes = engine->checkpoint_bytes();
  check_lengths(o, *engine);  // a bad length fails before any timing

  progress.begin("peak microbenchmark", 6 * o.peak_seconds);
  rep.peak = measure_peak(pool, o.peak_seconds);
  rep.peak_start = rep.peak.gflops;
  progress.end();
  measure_gemms(o, progress, rep);
  progress.begin("conversion kernels", 1.0);
  rep.conversions = bench_conversions();
  progress.end();
  warm_up(o, progress, *engine);
  measure_prefills(o, progress, *engine, rep);
  // The peak once more: other processes may have held a core at the start.
  progress.begin("peak microbenchmark", 3 * o.peak_seconds);
  rep.peak_end = measure_peak_gflops(pool, o.peak_seconds);
  rep.peak.gflops = std::max(rep.peak_start, rep.peak_end);
  progress.end();
  rep.total_seconds = since(t_all);
  progress.finish();
  for (const std::string& w : rep.warnings) std::fprintf(stderr, "dsv4 bench: warning: %s\n", w.c_str());
  if (o.json)
    std::cout << report_json(o, rep).dump() << std::endl;
  else
    print_report(o, rep);
  return 0;
}

// ---- The report ------------------------------------------------------------------------

namespace {

json model_json(const BenchReport& rep) {
  const ModelConfig& cfg = *rep.config;
  json m = {{"source", rep.model.source},
            {"layers", cfg.num_hidden_layers},
            {"hidden_size", cfg.hidden_size},
            {"n_routed_experts", cfg.n_routed_experts},
            {"vocab_size", cfg.vocab_size},
            {"checkpoint_bytes", rep.checkpoint_bytes},
            {"load_seconds", rep.model.load_seconds}};
  if (rep.model.tmp) m["generate_seconds"] = rep.model.generate_seconds;
  return m;
}

json peak_json(const BenchReport& rep) {
  const PeakResult& p = rep.peak;
  return {{"method", p.method},           {"gflops", p.gflops},
          {"gflops_start", rep.peak_start}, {"gflops_end", rep.peak_end},
          {"gflops_1thread", p.gflops_1thread}, {"fma_gflops", p.fma_gflops},
          {"bf16_dot_gflops", p.bf16_dot_gflops}, {"bf16_insn_gflops", p.bf16_insn_gflops},
          {"threads", p.threads}};
}

json gemms_json(const BenchReport& rep) {
  json ga = json::array();
  for (const GemmResult& r : rep.gemms) {
    json e = {{"m", r.shape.m}, {"k", r.shape.k}, {"n", r.shape.n}, {"seconds", r.seconds}, {"gflops", r.gflops},
              {"fraction_of_peak", rep.peak.gflops > 0 ? r.gflops / rep.peak.gflops : 0.0}};
    if (have_openblas()) {
      e["openblas_seconds"] = r.openblas_seconds;
      e["openblas_gflops"] = r.openblas_gflops;
      e["vs_openblas"] = r.gflops / r.openblas_gflops;
      e["max_rel_diff"] = r.max_rel_diff;
    } else {
      e["openblas_gflops"] = nullptr;
    }
    ga.push_back(e);
  }
  return ga;
}

json prefills_json(const BenchReport& rep) {
  json pa = json::array();
  for (const PrefillRun& r : rep.runs) {
    json stages = json::object(), stage_gflop = json::object();
    for (int s = 0; s < int(Stage::kCount); ++s) {
      stages[stage_name(Stage(s))] = r.stages[size_t(s)];
      stage_gflop[stage_name(Stage(s))] = r.flops.stage(Stage(s)) / 1e9;
    }
    pa.push_back({{"n_tokens", r.n_tokens},
                  {"seconds", r.seconds},
                  {"tokens_per_second", double(r.n_tokens) / r.seconds},
                  {"model_gflop", r.flops.total() / 1e9},
                  {"gflops", r.flops.total() / r.seconds / 1e9},
                  {"flop_limited_fraction", rep.fraction(r.flops.total(), r.seconds)},
                  {"logits_checksum", hex16(r.checksum)},
                  {"next_token", r.next_token},
                  {"stage_seconds", stages},
                  {"stage_gflop", stage_gflop}});
  }
  return pa;
}

json report_json(const BenchOptions& o, const BenchReport& rep) {
  json j;
  j["model"] = model_json(rep);
  j["threads"] = rep.threads;
  j["tile_tokens"] = o.tile_tokens;
  j["chunk_tokens"] = o.chunk_tokens;
  j["kernel_isa"] = isa_name(kernel_isa());
  j["gemv_isa"] = isa_name(gemv_isa());
  j["peak_gflops"] = rep.peak.gflops;
  j["peak"] = peak_json(rep);
  j["openblas"] = openblas_routine();
  j["gemm"] = gemms_json(rep);
  json ca = json::array();
  for (const ConversionTiming& t : rep.conversions)
    ca.push_back({{"name", t.name},
                  {"ns_per_value", t.ns_per_value},
                  {"reference_ns_per_value", t.reference_ns_per_value},
                  {"speedup", t.reference_ns_per_value / t.ns_per_value}});
  j["conversions"] = ca;
  j["prefill"] = prefills_json(rep);
  j["total_seconds"] = rep.total_seconds;
  return j;
}

void print_machine(const BenchOptions& o, const BenchReport& rep) {
  const ModelConfig& cfg = *rep.config;
  const PeakResult& p = rep.peak;
  std::printf("model: %s\n  %d layers, hidden %d, %d routed experts, vocab %d; %.2f GB; loaded in %.2f s\n",
              rep.model.source.c_str(), cfg.num_hidden_layers, cfg.hidden_size, cfg.n_routed_experts, cfg.vocab_size,
              double(rep.checkpoint_bytes) / 1e9, rep.model.load_seconds);
  std::printf("threads: %d, tile_tokens: %lld, chunk_tokens: %lld, GEMM kernels: %s, GEMV kernels: %s\n\n",
              rep.threads, (long long)o.tile_tokens, (long long)o.chunk_tokens, isa_name(kernel_isa()),
              isa_name(gemv_isa()));
  std::printf("peak: %.1f GFLOP/s on %d threads (start %.1f, end %.1f; %.1f on one thread)\n  %s\n", p.gflops,
              p.threads, rep.peak_start, rep.peak_end, p.gflops_1thread, p.method.c_str());
  std::printf("  fp32 FMA: %.1f GFLOP/s", p.fma_gflops);
  if (p.bf16_insn_gflops > 0) std::printf("; BF16 dot instructions (vdpbf16ps): %.1f GFLOP/s", p.bf16_insn_gflops);
  std::printf("\n  bf16 dot product (convert + FMA, L1 data): %.1f GFLOP/s\n\n", p.bf16_dot_gflops);
}

void print_kernels(const BenchReport& rep) {
  if (!rep.gemms.empty()) {
    std::printf("GEMM, BF16 weight and activations, fp32 out: engine linear() vs OpenBLAS\n  OpenBLAS: %s\n",
                openblas_routine().c_str());
    std::printf("  %6s %6s %6s  %10s %7s  %10s %8s  %9s\n", "M", "K", "N", "GFLOP/s", "%peak", "OpenBLAS", "ratio",
                "max rel");
    for (const GemmResult& r : rep.gemms)
      std::printf("  %6lld %6lld %6lld  %10.1f %6.1f%%  %10.1f %7.2fx  %9.2g\n", (long long)r.shape.m,
                  (long long)r.shape.k, (long long)r.shape.n, r.gflops, 100 * r.gflops / rep.peak.gflops,
                  r.openblas_gflops, r.openblas_gflops > 0 ? r.gflops / r.openblas_gflops : 0.0, r.max_rel_diff);
    std::printf("\n");
  }
  std::printf("conversions, one thread, ns per value: vectorised / plain reference\n");
  for (const ConversionTiming& t : rep.conversions)
    std::printf("  %-24s %7.3f / %7.3f = %5.1fx faster\n", t.name.c_str(), t.ns_per_value, t.reference_ns_per_value,
                t.reference_ns_per_value / t.ns_per_value);
  std::printf("\n");
}

void print_prefills(const BenchReport& rep) {
  std::printf("prefill\n  %6s %9s %9s %10s %9s %8s  %-16s %6s\n", "N", "seconds", "tokens/s", "model GF", "GFLOP/s",
              "%peak", "logits checksum", "next");
  for (const PrefillRun& r : rep.runs)
    std::printf("  %6lld %9.3f %9.1f %10.1f %9.2f %7.2f%%  %-16s %6d\n", (long long)r.n_tokens, r.seconds,
                double(r.n_tokens) / r.seconds, r.flops.total() / 1e9, r.flops.total() / r.seconds / 1e9,
                100 * rep.fraction(r.flops.total(), r.seconds), hex16(r.checksum).c_str(), r.next_token);
  std::printf("\nseconds per stage (model GFLOP in brackets)\n  %6s", "N");
  for (int s = 0; s < int(Stage::kCount); ++s) std::printf(" %17s", stage_name(Stage(s)));
  std::printf(" %8s\n", "other");
  for (const PrefillRun& r : rep.runs) {
    std::printf("  %6lld", (long long)r.n_tokens);
    double sum = 0;
    for (int s = 0; s < int(Stage::kCount); ++s) {
      char cell[64];
      std::snprintf(cell, sizeof cell, "%.3f [%.1f]", r.stages[size_t(s)], r.flops.stage(Stage(s)) / 1e9);
      std::printf(" %17s", cell);
      sum += r.stages[size_t(s)];
    }
    std::printf(" %8.3f\n", r.seconds - sum);
  }
}

void print_report(const BenchOptions& o, const BenchReport& rep) {
  print_machine(o, rep);
  print_kernels(rep);
  print_prefills(rep);
  std::printf("\ntotal %.1f s\n", rep.total_seconds);
}

}  // namespace

// ---- Options ---------------------------------------------------------------------------

std::vector<GemmShape> BenchOptions::default_gemm_shapes() {
  // Prefill shapes: Flash's hidden 4096 and low-rank 1024 inputs, from a
  // narrow output up to the 32768-wide wq_b, for 512 rows and for a
  // 2048-row chunk (where A no longer stays in cache between tasks).
  return {{512, 4096, 512},   {512, 4096, 4096},   {512, 1024, 4096}, {512, 4096, 32768},
          {2048, 4096, 512},  {2048, 1024, 4096},  {2048, 4096, 4096}};
}

namespace {
int64_t parse_positive(const std::string& s, const std::string& what) {
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end || v < 1 || v > (int64_t(1) << 31))
    throw Error(what + ": expected a positive integer, got '" + s + "'");
  return v;
}
std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t b = 0;
  for (;;) {
    const size_t e = s.find(sep, b);
    out.push_back(s.substr(b, e == std::string::npos ? std::string::npos : e - b));
    if (e == std::string::npos) return out;
    b = e + 1;
  }
}
}  // namespace

std::vector<int64_t> parse_token_counts(const std::string& s) {
  std::vector<int64_t> r;
  for (const std::string& p : split(s, ',')) r.push_back(parse_positive(p, "--tokens"));
  return r;
}

std::vector<int64_t> parse_stream_counts(const std::string& s) {
  std::vector<int64_t> r;
  for (const std::string& p : split(s, ',')) {
    r.push_back(parse_positive(p, "--streams"));
    if (r.back() > 4096) throw Error("--streams: expected at most 4096 sessions, got '" + p + "'");
  }
  return r;
}

std::vector<GemmShape> parse_gemm_shapes(const std::string& s) {
  if (s == "default") return BenchOptions::default_gemm_shapes();
  if (s == "none") return {};
  std::vector<GemmShape> r;
  for (const std::string& p : split(s, ',')) {
    const auto d = split(p, 'x');
    if (d.size() != 3) throw Error("--gemm-shapes: expected default, none or MxKxN,..., got '" + p + "'");
    r.push_back({parse_positive(d[0], "--gemm-shapes M"), parse_positive(d[1], "--gemm-shapes K"),
                 parse_positive(d[2], "--gemm-shapes N")});
  }
  return r;
}

}  // namespace dsv4
