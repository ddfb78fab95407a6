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

#include "core/cpu.h"
#include "core/error.h"
#include "core/formats.h"
#include "core/peak.h"
#include "core/stage_timer.h"
#include "core/thread_pool.h"
#include "dist/ep.h"
#include "engine/flops.h"
#include "engine/prefill.h"
#include "kernels/gemm.h"
#include "kernels/linear.h"
#include "model/model.h"
#include "io/synthetic.h"

#ifdef DSV4_HAVE_OPENBLAS
#include <cblas.h>
#include <dlfcn.h>
#endif

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

std::string hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", (unsigned long long)v);
  return buf;
}

// ---- GEMM: the engine's linear() against OpenBLAS --------------------------------------
//
// OpenBLAS has cblas_sbgemm (bf16 inputs, fp32 out) only when it was built
// with BUILD_BFLOAT16. Debian's 0.3.21 declares it in cblas.h but does not
// export it, so it is looked up at run time; without it the baseline is
// cblas_sgemm on the same bf16 values widened to fp32 (what an AVX2 machine
// computes for a BF16 GEMM anyway).
#ifdef DSV4_HAVE_OPENBLAS
using SbgemmFn = void (*)(enum CBLAS_ORDER, enum CBLAS_TRANSPOSE, enum CBLAS_TRANSPOSE, blasint, blasint, blasint,
                          float, const bfloat16*, blasint, const bfloat16*, blasint, float, float*, blasint);
SbgemmFn find_sbgemm() { return reinterpret_cast<SbgemmFn>(dlsym(RTLD_DEFAULT, "cblas_sbgemm")); }
#endif

std::string openblas_routine() {
#ifdef DSV4_HAVE_OPENBLAS
  // OpenBLAS picks its kernels by CPU model at load time; one too new for it
  // gets an older family's (Debian's 0.3.21 runs AMD family 26 as Haswell,
  // AVX2 only; OPENBLAS_CORETYPE=SkylakeX selects its AVX-512 kernels).
  const std::string core = std::string(" [OpenBLAS kernels: ") + openblas_get_corename() + "]";
  if (find_sbgemm()) return "cblas_sbgemm (OpenBLAS BF16 GEMM)" + core;
  return "cblas_sgemm on the bf16 values widened to fp32 (this OpenBLAS has no cblas_sbgemm: built without "
         "BUILD_BFLOAT16)" +
         core;
#else
  return "none (no OpenBLAS found at configure time)";
#endif
}

struct GemmResult {
  GemmShape shape;
  double seconds = 0, gflops = 0;
  double openblas_seconds = 0, openblas_gflops = 0;  // 0 when OpenBLAS is not built in
  double max_rel_diff = 0;                           // max |engine − OpenBLAS| / max |OpenBLAS|
};

volatile uint8_t g_page_in_sink = 0;  // keeps page_in's reads

// Reads one byte of every page of every tensor, in parallel over tensors.
void page_in(const Checkpoint& ck) {
  std::vector<const TensorView*> views;
  for (const auto& kv : ck.tensors()) views.push_back(&kv.second);
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  std::vector<uint8_t> sums(views.size());
  parallel_for_each(int64_t(views.size()), [&](int64_t i) {
    uint8_t s = 0;
    const TensorView& v = *views[size_t(i)];
    for (size_t b = 0; b < v.nbytes; b += page) s = uint8_t(s + v.data[b]);
    sums[size_t(i)] = s;
  });
  uint8_t total = 0;
  for (uint8_t s : sums) total = uint8_t(total + s);
  g_page_in_sink = total;
}

// Best seconds of at most `reps` runs of fn, stopping early once more than
// `budget` seconds have been spent (at least one run).
template <class F>
double best_seconds(int reps, double budget, F&& fn) {
  double best = INFINITY, spent = 0;
  for (int r = 0; r < reps && (r == 0 || spent < budget); ++r) {
    const auto t0 = Clock::now();
    fn();
    const double s = since(t0);
    best = std::min(best, s);
    spent += s;
  }
  return best;
}

// The conversions around the gemm, each against its plain reference on one
// thread (docs/PERFORMANCE.md quotes these): panel dequantisation of a
// 256 x 4096 weight per format, FP8 activation quantisation, bf16 rounding.
struct ConversionTiming {
  std::string name;
  double ns_per_value = 0, reference_ns_per_value = 0;
};

// The benches' test data: xorshift64, so that every run times the same values.
struct XorShift64 {
  uint64_t x;
  uint64_t next() {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  }
  // Uniform on [-1, 1) in steps of 2^-23.
  float pm1() { return float(int64_t(next() >> 40) - (int64_t(1) << 23)) / float(int64_t(1) << 23); }
};

std::vector<ConversionTiming> bench_conversions() {
  const int64_t out = 256, in = 4096, values = out * in;
  XorShift64 rng{0x9E3779B97F4A7C15ull};
  // Nanoseconds per value, best of 5 passes over `values` values.
  auto ns = [&](auto&& pass) { return best_seconds(5, 1.0, pass) * 1e9 / double(values); };
  std::vector<ConversionTiming> r;

  std::vector<uint8_t> data(size_t(values * 2)), scale(size_t(values / 32));
  for (uint8_t& b : data) {
    b = uint8_t(rng.next());
    if ((b & 0x7f) == 0x7f) b = 0;  // real FP8 weights hold no NaN codes
  }
  for (uint8_t& b : scale) b = uint8_t(120 + rng.next() % 16);
  std::vector<float> panel(size_t(in * kGemmNR));
  for (Weight::Kind kind : {Weight::Kind::kFP4, Weight::Kind::kFP8, Weight::Kind::kBF16}) {
    Weight w;
    w.kind = kind;
    w.out = out;
    w.in = in;
    w.data = data.data();
    w.scale = scale.data();
    auto all_panels = [&](bool reference) {
      return [&, reference] {
        for (int64_t o0 = 0; o0 < out; o0 += kGemmNR)
          reference ? w.dequant_panel_reference(o0, out, panel.data()) : w.dequant_panel(o0, out, panel.data());
      };
    };
    const std::string name = std::string("dequant_panel ") +
                             (kind == Weight::Kind::kFP4 ? "fp4" : kind == Weight::Kind::kFP8 ? "fp8" : "bf16");
    r.push_back({name, ns(all_panels(false)), ns(all_panels(true))});
  }

  // Both are idempotent, so each pass works on the same buffer, values in [-8, 8).
  std::vector<float> act(static_cast<size_t>(values));
  auto fill_act = [&] {
    for (float& v : act) v = 8.f * rng.pm1();
  };
  fill_act();
  r.push_back({"q8_inplace (block 128)", ns([&] { q8_inplace(act.data(), act.size(), 128); }),
               ns([&] { q8_inplace_reference(act.data(), act.size(), 128); })});
  fill_act();
  r.push_back({"bf16r_inplace", ns([&] { bf16r_inplace(act.data(), act.size()); }), ns([&] {
                 for (float& v : act) v = bf16r(v);
               })});
  return r;
}

GemmResult bench_gemm(const GemmShape& g, int reps) {
  const int64_t M = g.m, K = g.k, N = g.n;
  // Random bf16 values in [-1, 1): A (activations, M x K), B (weight, N x K).
  std::vector<uint16_t> a16(size_t(M * K)), b16(size_t(N * K));
  XorShift64 rng{0x243F6A8885A308D3ull ^ uint64_t(M * 31 + K * 7 + N)};
  for (auto& v : a16) v = f32_to_bf16(rng.pm1());
  for (auto& v : b16) v = f32_to_bf16(rng.pm1());
  std::vector<float> a32(a16.size());
  for (size_t i = 0; i < a16.size(); ++i) a32[i] = bf16_to_f32(a16[i]);

  Weight w;
  w.kind = Weight::Kind::kBF16;
  w.out = N;
  w.in = K;
  w.data = reinterpret_cast<const uint8_t*>(b16.data());
  LinearOpts lo;
  lo.act_quant = false;
  lo.out_bf16 = false;

  GemmResult r;
  r.shape = g;
  const double flops = 2.0 * double(M) * double(K) * double(N);
  std::vector<float> c(size_t(M * N));
  auto engine = [&] { linear(w, a32.data(), M, c.data(), lo); };
#ifndef DSV4_HAVE_OPENBLAS
  r.seconds = best_seconds(reps, 2.0, engine);
  r.gflops = flops / r.seconds / 1e9;
#else
  std::vector<float> cb(size_t(M * N)), b32;
  std::function<void()> openblas;
  if (SbgemmFn sbgemm = find_sbgemm()) {
    openblas = [&, sbgemm] {
      sbgemm(CblasRowMajor, CblasNoTrans, CblasTrans, blasint(M), blasint(N), blasint(K), 1.f, a16.data(),
             blasint(K), b16.data(), blasint(K), 0.f, cb.data(), blasint(N));
    };
  } else {
    // No BF16 GEMM in this OpenBLAS: its fp32 GEMM on the same values,
    // widened beforehand (not timed).
    b32.resize(b16.size());
    for (size_t i = 0; i < b16.size(); ++i) b32[i] = bf16_to_f32(b16[i]);
    openblas = [&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, blasint(M), blasint(N), blasint(K), 1.f, a32.data(),
                  blasint(K), b32.data(), blasint(K), 0.f, cb.data(), blasint(N));
    };
  }
  // The two alternate, one timed run each per round, so that load from other
  // processes on a shared machine falls on both alike; best of the rounds.
  // Each timed run follows an untimed one of its own (caches, clocks and
  // threads warm for both alike).
  r.seconds = r.openblas_seconds = INFINITY;
  double spent = 0;
  for (int rep = 0; rep < reps && (rep == 0 || spent < 4.0); ++rep) {
    engine();
    const double e = best_seconds(1, 0, engine);
    openblas();
    const double o = best_seconds(1, 0, openblas);
    r.seconds = std::min(r.seconds, e);
    r.openblas_seconds = std::min(r.openblas_seconds, o);
    spent += 2 * (e + o);
    // OpenBLAS's idle threads spin for a while after a call; let them go to
    // sleep before the engine is timed again.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  r.gflops = flops / r.seconds / 1e9;
  r.openblas_gflops = flops / r.openblas_seconds / 1e9;
  double diff = 0, scale = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    diff = std::max(diff, std::fabs(double(c[i]) - double(cb[i])));
    scale = std::max(scale, std::fabs(double(cb[i])));
  }
  r.max_rel_diff = scale > 0 ? diff / scale : diff;
#endif
  return r;
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

PrefillRun bench_prefill(const Model& m, int64_t n, int64_t tile_tokens, int64_t chunk_tokens) {
  PrefillRun r;
  r.n_tokens = n;
  const std::vector<int32_t> tokens = bench_prompt(n, m.config.vocab_size);
  PrefillOptions o;
  o.tile_tokens = tile_tokens;
  o.chunk_tokens = chunk_tokens;
  StageTimes::global().reset();
  const auto t0 = Clock::now();
  const PrefillResult res = prefill(m, tokens, o);
  r.seconds = since(t0);
  r.stages = StageTimes::global().seconds;
  r.flops = prefill_flops(m.config, n);
  r.checksum = logits_checksum(res.logits);
  r.next_token = res.next_token;
  return r;
}

}  // namespace

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
  const ModelConfig cfg0 = ModelConfig::load((std::filesystem::path(o.model_dir) / "config.json").string());
  const ExpertRange held = dist::expert_range(cfg0.n_routed_experts, me, R);
  std::unique_ptr<Model> part = Model::load(o.model_dir, held);
  std::unique_ptr<Model> full = me == 0 ? Model::load(o.model_dir) : nullptr;
  const ModelConfig& cfg = part->config;
  for (int64_t n : o.tokens)
    if (n > prompt_limit(cfg, 0))
      throw Error("--tokens " + std::to_string(n) + " is over the model's limit of " +
                  std::to_string(prompt_limit(cfg, 0)) + " positions (max_position_embeddings)");
  PrefillOptions po;
  po.tile_tokens = o.tile_tokens;
  po.chunk_tokens = o.chunk_tokens;
  auto request = [&](int64_t n, int r) {
    std::vector<int32_t> t = bench_prompt(n, cfg.vocab_size);
    for (size_t i = 1; i < t.size(); ++i) t[i] = int32_t((int64_t(t[i]) + 7919 * r) % cfg.vocab_size);
    return t;
  };
  json runs = json::array();
  for (int64_t n : o.tokens) {
    std::vector<std::vector<int32_t>> all(static_cast<size_t>(R));
    for (int r = 0; r < R; ++r) all[size_t(r)] = request(n, r);
    // R = 1: rank 0 alone, all R requests in one batch, every expert local.
    double t1 = 0;
    std::vector<uint64_t> ref_logits(static_cast<size_t>(R)), ref_cache(static_cast<size_t>(R));
    if (me == 0) {
      CachePool pool(size_t(R) * pool_for_request(*full, n)->total_pages() * CachePool::kDefaultPageBytes);
      std::vector<RequestState> st(static_cast<size_t>(R));
      std::vector<RequestState*> ptr;
      for (RequestState& s : st) {
        s.init(*full, &pool);
        ptr.push_back(&s);
      }
      const auto t0 = Clock::now();
      std::vector<PrefillResult> res = extend_batch(*full, ptr, all, po);
      t1 = since(t0);
      for (int r = 0; r < R; ++r) {
        ref_logits[size_t(r)] = logits_checksum(res[size_t(r)].logits);
        ref_cache[size_t(r)] = cache_checksum(*full, st[size_t(r)]);
      }
    }
    dist::barrier();
    // R ranks: request r on rank r, experts split.
    dist::MpiExpertRunner runner(cfg.n_routed_experts);
    auto pool = pool_for_request(*part, n);
    RequestState st;
    st.init(*part, pool.get());
    dist::barrier();
    const auto t0 = Clock::now();
    std::vector<PrefillResult> res = extend_batch(*part, {&st}, {all[size_t(me)]}, po, &runner);
    const double secs = since(t0);
    if (!res[0].error.empty()) throw Error(res[0].error);
    dist::RequestOutcome mine;
    mine.index = me;
    mine.n_tokens = n;
    mine.next_token = res[0].next_token;
    mine.cache_checksum = cache_checksum(*part, st);
    mine.logits = std::move(res[0].logits);
    const std::vector<dist::RequestOutcome> got = dist::gather_outcomes({mine});
    const dist::EpTotals t = runner.reduce_totals(secs);
    if (me != 0) continue;
    bool identical = got.size() == size_t(R);
    for (const dist::RequestOutcome& g : got)
      identical = identical && logits_checksum(g.logits) == ref_logits[size_t(g.index)] &&
                  g.cache_checksum == ref_cache[size_t(g.index)];
    json steps = json::array();
    for (size_t i = 0; i < t.step_bytes.size(); ++i)
      steps.push_back({{"bytes", t.step_bytes[i]}, {"seconds", t.step_comm_seconds[i]}});
    runs.push_back({{"n_tokens", n},
                    {"requests", R},
                    {"seconds_r1", t1},
                    {"seconds", t.wall_seconds},
                    {"speedup", t.wall_seconds > 0 ? t1 / t.wall_seconds : 0.0},
                    {"tokens_per_second", double(R * n) / t.wall_seconds},
                    {"steps", t.steps},
                    {"all_to_all_bytes_per_step", t.steps ? double(t.bytes_sent) / double(t.steps) : 0.0},
                    {"all_to_all_seconds", t.comm_seconds},
                    {"per_step", steps},
                    {"results_identical", identical}});
  }
  if (me != 0) return 0;
  if (o.json) {
    std::cout << json{{"ranks", R}, {"threads", ThreadPool::global().size()}, {"prefill_ep", runs}}.dump() << std::endl;
    return 0;
  }
  std::printf("expert parallelism: %d ranks, %d threads per rank; one request of N tokens per rank\n", R,
              ThreadPool::global().size());
  std::printf("  %6s %10s %10s %8s %11s %14s %10s  %s\n", "N", "R=1 s", "R s", "speedup", "tokens/s",
              "a2a bytes/step", "a2a s", "bitwise");
  for (const json& r : runs)
    std::printf("  %6lld %10.3f %10.3f %7.2fx %11.1f %14.0f %10.3f  %s\n", (long long)r["n_tokens"].get<int64_t>(),
                r["seconds_r1"].get<double>(), r["seconds"].get<double>(), r["speedup"].get<double>(),
                r["tokens_per_second"].get<double>(), r["all_to_all_bytes_per_step"].get<double>(),
                r["all_to_all_seconds"].get<double>(), r["results_identical"].get<bool>() ? "yes" : "NO");
  return 0;
}

int run_bench(const BenchOptions& o) {
  if (o.tokens.empty()) throw Error("bench needs at least one prompt length (--tokens)");
  if (o.tile_tokens < 0) throw Error("--tile-tokens must be >= 0");
  if (o.chunk_tokens < 0) throw Error("--chunk-tokens must be >= 0");
  if (o.gemm_reps < 1) throw Error("--gemm-reps must be >= 1");
  if (o.threads < 0 || o.threads > 1024) throw Error("--threads must be in [1, 1024]");
  if (o.threads > 0) ThreadPool::set_threads(o.threads);
  if (dist::active()) return run_bench_ep(o);
  ThreadPool& pool = ThreadPool::global();
  const int threads = pool.size();
#ifdef DSV4_HAVE_OPENBLAS
  openblas_set_num_threads(threads);
#endif

  // The model first: a bad --model or preset fails before any timing.
  std::unique_ptr<TempModelDir> tmp;
  std::string dir = o.model_dir, source = o.model_dir;
  SyntheticOptions so;
  if (dir.empty()) {
    so.preset = o.preset;
    so.seed = o.seed;
    so.layers = o.layers;
    so.experts = o.experts;
    so.vocab = o.vocab;
    so.shards = 1;
    const ModelConfig c = synthetic_config(so);  // validates the preset and overrides
    size_t bytes = 0;
    for (const TensorSpec& s : checkpoint_tensor_specs(c)) bytes += s.nbytes();
    tmp = std::make_unique<TempModelDir>();
    const auto space = std::filesystem::space(tmp->path);
    if (bytes + (size_t(1) << 30) > space.available)
      throw Error("preset '" + o.preset + "' needs " + std::to_string(bytes >> 20) + " MiB for its checkpoint, " +
                  std::to_string(space.available >> 20) + " MiB are free under " +
                  std::filesystem::temp_directory_path().string() + " (use --layers/--experts, or --model DIR)");
    dir = tmp->path;
    source = "preset " + o.preset + " (seed " + std::to_string(o.seed) + ", generated)";
  }

  // Steps: [generate], load, peak, each gemm shape, conversions, page-in, each prompt length, peak
  // again. The model comes first: a bad checkpoint or length fails before
  // any timing.
  Progress progress(5 + (tmp ? 1 : 0) + int(o.gemm_shapes.size()) + int(o.tokens.size()));
  const auto t_all = Clock::now();

  double gen_s = 0;
  if (tmp) {
    progress.begin("generating the model");
    const auto t0 = Clock::now();
    write_synthetic_model(dir, so);
    gen_s = since(t0);
    progress.end();
  }
  progress.begin("loading the model");
  auto t0 = Clock::now();
  std::unique_ptr<Model> model = Model::load(dir);
  const double load_s = since(t0);
  progress.end();
  const ModelConfig& cfg = model->config;
  const int64_t limit = prompt_limit(cfg, 0);
  for (int64_t n : o.tokens)
    if (n > limit)
      throw Error("--tokens " + std::to_string(n) + " is over the model's limit of " + std::to_string(limit) +
                  " positions (max_position_embeddings)");

  progress.begin("peak microbenchmark", 6 * o.peak_seconds);
  PeakResult peak = measure_peak(pool, o.peak_seconds);
  progress.end();
  const double peak_start = peak.gflops;

  std::vector<GemmResult> gemms;
  std::vector<std::string> warnings;  // printed after the progress bar
#ifdef DSV4_HAVE_OPENBLAS
  if (!o.gemm_shapes.empty()) {  // OpenBLAS starts its threads on the first call: not part of any timing
    std::vector<float> a(64 * 64, 1.f), c(64 * 64);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, 64, 64, 64, 1.f, a.data(), 64, a.data(), 64, 0.f, c.data(), 64);
  }
#endif
  for (const GemmShape& g : o.gemm_shapes) {
    const double flops = 2.0 * double(g.m) * double(g.k) * double(g.n);
    progress.begin("gemm " + std::to_string(g.m) + "x" + std::to_string(g.k) + "x" + std::to_string(g.n),
                   2 * o.gemm_reps * flops / (0.5 * peak_start * 1e9));
    gemms.push_back(bench_gemm(g, o.gemm_reps));
    progress.end();
    const GemmResult& r = gemms.back();
    if (r.max_rel_diff > 1e-3) {
      char msg[200];
      std::snprintf(msg, sizeof msg, "gemm %lldx%lldx%lld: engine and OpenBLAS results differ by %.3g (relative)",
                    (long long)g.m, (long long)g.k, (long long)g.n, r.max_rel_diff);
      warnings.push_back(msg);
    }
  }

  progress.begin("conversion kernels", 1.0);
  const std::vector<ConversionTiming> conversions = bench_conversions();
  progress.end();

  // Warm-up, not reported: every page of the mapped weights read once, then
  // a short prefill (first-use allocations). The prefill alone reached only
  // the experts its few tokens were routed to, and the first measured run
  // paid for mapping in the rest (~1 s of 14 at N = 1024 on the Flash
  // 4-layer model): a cost of the first request after loading, not of
  // prefill.
  progress.begin("paging in the weights", 1.0);
  page_in(model->checkpoint);
  progress.end();
  {
    PrefillOptions w;
    w.tile_tokens = o.tile_tokens;
    w.chunk_tokens = o.chunk_tokens;
    prefill(*model, bench_prompt(std::min<int64_t>(16, o.tokens.front()), cfg.vocab_size), w);
  }
  std::vector<PrefillRun> runs;
  double rate = 0;  // model flops per second of the last run, for the progress estimate
  for (size_t i = 0; i < o.tokens.size(); ++i) {
    const int64_t n = o.tokens[i];
    progress.begin("prefill N=" + std::to_string(n), rate > 0 ? prefill_flops(cfg, n).total() / rate : 0);
    runs.push_back(bench_prefill(*model, n, o.tile_tokens, o.chunk_tokens));
    rate = runs.back().flops.total() / runs.back().seconds;
    progress.end();
  }
  // The peak once more: other processes may have held a core at the start.
  progress.begin("peak microbenchmark", 3 * o.peak_seconds);
  const double peak_end = measure_peak_gflops(pool, o.peak_seconds);
  progress.end();
  peak.gflops = std::max(peak_start, peak_end);
  const double peak_gflops = peak.gflops;
  const double total_s = since(t_all);
  progress.finish();
  for (const std::string& w : warnings) std::fprintf(stderr, "dsv4 bench: warning: %s\n", w.c_str());

  auto fraction = [&](double flops, double secs) { return peak_gflops > 0 ? flops / (peak_gflops * 1e9) / secs : 0.0; };

  if (o.json) {
    json j;
    j["model"] = {{"source", source},
                  {"layers", cfg.num_hidden_layers},
                  {"hidden_size", cfg.hidden_size},
                  {"n_routed_experts", cfg.n_routed_experts},
                  {"vocab_size", cfg.vocab_size},
                  {"checkpoint_bytes", model->checkpoint.total_bytes()},
                  {"load_seconds", load_s}};
    if (tmp) j["model"]["generate_seconds"] = gen_s;
    j["threads"] = threads;
    j["tile_tokens"] = o.tile_tokens;
    j["chunk_tokens"] = o.chunk_tokens;
    j["kernel_isa"] = isa_name(kernel_isa());
    j["peak_gflops"] = peak_gflops;
    j["peak"] = {{"method", peak.method},
                 {"gflops", peak.gflops},
                 {"gflops_start", peak_start},
                 {"gflops_end", peak_end},
                 {"gflops_1thread", peak.gflops_1thread},
                 {"fma_gflops", peak.fma_gflops},
                 {"bf16_dot_gflops", peak.bf16_dot_gflops},
                 {"bf16_insn_gflops", peak.bf16_insn_gflops},
                 {"threads", peak.threads}};
    j["openblas"] = openblas_routine();
    json ga = json::array();
    for (const GemmResult& r : gemms) {
      json e = {{"m", r.shape.m}, {"k", r.shape.k}, {"n", r.shape.n}, {"seconds", r.seconds}, {"gflops", r.gflops},
                {"fraction_of_peak", peak_gflops > 0 ? r.gflops / peak_gflops : 0.0}};
#ifdef DSV4_HAVE_OPENBLAS
      e["openblas_seconds"] = r.openblas_seconds;
      e["openblas_gflops"] = r.openblas_gflops;
      e["vs_openblas"] = r.gflops / r.openblas_gflops;
      e["max_rel_diff"] = r.max_rel_diff;
#else
      e["openblas_gflops"] = nullptr;
#endif
      ga.push_back(e);
    }
    j["gemm"] = ga;
    json ca = json::array();
    for (const ConversionTiming& t : conversions)
      ca.push_back({{"name", t.name},
                    {"ns_per_value", t.ns_per_value},
                    {"reference_ns_per_value", t.reference_ns_per_value},
                    {"speedup", t.reference_ns_per_value / t.ns_per_value}});
    j["conversions"] = ca;
    json pa = json::array();
    for (const PrefillRun& r : runs) {
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
                    {"flop_limited_fraction", fraction(r.flops.total(), r.seconds)},
                    {"logits_checksum", hex16(r.checksum)},
                    {"next_token", r.next_token},
                    {"stage_seconds", stages},
                    {"stage_gflop", stage_gflop}});
    }
    j["prefill"] = pa;
    j["total_seconds"] = total_s;
    std::cout << j.dump() << std::endl;
    return 0;
  }

  std::printf("model: %s\n  %d layers, hidden %d, %d routed experts, vocab %d; %.2f GB; loaded in %.2f s\n",
              source.c_str(), cfg.num_hidden_layers, cfg.hidden_size, cfg.n_routed_experts, cfg.vocab_size,
              double(model->checkpoint.total_bytes()) / 1e9, load_s);
  std::printf("threads: %d, tile_tokens: %lld, chunk_tokens: %lld, GEMM kernels: %s\n\n", threads,
              (long long)o.tile_tokens, (long long)o.chunk_tokens, isa_name(kernel_isa()));
  std::printf("peak: %.1f GFLOP/s on %d threads (start %.1f, end %.1f; %.1f on one thread)\n  %s\n",
              peak.gflops, peak.threads, peak_start, peak_end, peak.gflops_1thread, peak.method.c_str());
  std::printf("  fp32 FMA: %.1f GFLOP/s", peak.fma_gflops);
  if (peak.bf16_insn_gflops > 0) std::printf("; BF16 dot instructions (vdpbf16ps): %.1f GFLOP/s", peak.bf16_insn_gflops);
  std::printf("\n  bf16 dot product (convert + FMA, L1 data): %.1f GFLOP/s\n\n", peak.bf16_dot_gflops);
  if (!gemms.empty()) {
    std::printf("GEMM, BF16 weight and activations, fp32 out: engine linear() vs OpenBLAS\n  OpenBLAS: %s\n",
                openblas_routine().c_str());
    std::printf("  %6s %6s %6s  %10s %7s  %10s %8s  %9s\n", "M", "K", "N", "GFLOP/s", "%peak", "OpenBLAS", "ratio",
                "max rel");
    for (const GemmResult& r : gemms)
      std::printf("  %6lld %6lld %6lld  %10.1f %6.1f%%  %10.1f %7.2fx  %9.2g\n", (long long)r.shape.m,
                  (long long)r.shape.k, (long long)r.shape.n, r.gflops, 100 * r.gflops / peak_gflops,
                  r.openblas_gflops, r.openblas_gflops > 0 ? r.gflops / r.openblas_gflops : 0.0, r.max_rel_diff);
    std::printf("\n");
  }
  std::printf("conversions, one thread, ns per value: vectorised / plain reference\n");
  for (const ConversionTiming& t : conversions)
    std::printf("  %-24s %7.3f / %7.3f = %5.1fx faster\n", t.name.c_str(), t.ns_per_value, t.reference_ns_per_value,
                t.reference_ns_per_value / t.ns_per_value);
  std::printf("\n");
  std::printf("prefill\n  %6s %9s %9s %10s %9s %8s  %-16s %6s\n", "N", "seconds", "tokens/s", "model GF", "GFLOP/s",
              "%peak", "logits checksum", "next");
  for (const PrefillRun& r : runs)
    std::printf("  %6lld %9.3f %9.1f %10.1f %9.2f %7.2f%%  %-16s %6d\n", (long long)r.n_tokens, r.seconds,
                double(r.n_tokens) / r.seconds, r.flops.total() / 1e9, r.flops.total() / r.seconds / 1e9,
                100 * fraction(r.flops.total(), r.seconds), hex16(r.checksum).c_str(), r.next_token);
  std::printf("\nseconds per stage (model GFLOP in brackets)\n  %6s", "N");
  for (int s = 0; s < int(Stage::kCount); ++s) std::printf(" %17s", stage_name(Stage(s)));
  std::printf(" %8s\n", "other");
  for (const PrefillRun& r : runs) {
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
  std::printf("\ntotal %.1f s\n", total_s);
  return 0;
}

}  // namespace dsv4
