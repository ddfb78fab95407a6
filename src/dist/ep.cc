#include "dist/ep.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <exception>

#include "core/error.h"
#include "core/formats.h"

namespace dsv4::dist {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A value sent as bf16 must be one already (its low 16 bits zero); anything
// else would be rounded on the way and change the result with R.
uint16_t exact_bf16(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  if (b & 0xFFFFu)
    throw Error("expert parallelism: a MoE value is not bf16-representable, so sending it as bf16 would change "
                "results (an engine bug)");
  return uint16_t(b >> 16);
}

int to_int(int64_t v, const char* what) {
  if (v < 0 || v > INT_MAX) throw Error(std::string("expert parallelism: ") + what + " too large for one MPI call");
  return int(v);
}

// Byte-level writer / reader for the results gather.
struct Packer {
  std::vector<uint8_t> b;
  template <class T>
  void put(const T& v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof(T));
  }
  void put_bytes(const void* p, size_t n) {
    const auto* q = static_cast<const uint8_t*>(p);
    b.insert(b.end(), q, q + n);
  }
};
struct Unpacker {
  const uint8_t* p;
  const uint8_t* end;
  void need(size_t n) const {
    if (size_t(end - p) < n) throw Error("expert parallelism: truncated result record from a rank");
  }
  template <class T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, p, sizeof(T));
    p += sizeof(T);
    return v;
  }
  void get_bytes(void* dst, size_t n) {
    need(n);
    if (n) std::memcpy(dst, p, n);
    p += n;
  }
};

}  // namespace

// ---- World --------------------------------------------------------------------

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK"})
    if (std::getenv(v)) return true;
  return false;
}

void init() {
  int inited = 0;
  MPI_Initialized(&inited);
  if (inited) return;
  int provided = 0;
  // Only the main thread calls MPI (the thread pool's workers never do).
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
}

bool active() {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  return inited && !finalized;
}

int rank() {
  if (!active()) return 0;
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int size() {
  if (!active()) return 1;
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

void finalize() {
  if (active()) MPI_Finalize();
}

void barrier() {
  if (active()) MPI_Barrier(MPI_COMM_WORLD);
}

void abort_job(int code) {
  if (active()) MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);
}

ExpertRange expert_range(int64_t n_experts, int rank, int ranks) {
  if (ranks < 1 || rank < 0 || rank >= ranks) throw Error("expert parallelism: bad rank " + std::to_string(rank));
  if (n_experts % ranks != 0)
    throw Error("expert parallelism: the model has " + std::to_string(n_experts) +
                " routed experts, which is not divisible by the " + std::to_string(ranks) +
                " MPI ranks (use a rank count that divides it)");
  const int64_t per = n_experts / ranks;
  return {rank * per, (rank + 1) * per};
}

bool holds_tensor(const std::string& name, ExpertRange held) {
  if (name.rfind("layers.", 0) != 0) return true;
  const size_t at = name.find(".ffn.experts.");
  if (at == std::string::npos) return true;
  const char* p = name.c_str() + at + std::strlen(".ffn.experts.");
  char* end = nullptr;
  const long long e = std::strtoll(p, &end, 10);
  if (end == p || *end != '.') return true;
  return e >= held.begin && (held.end < 0 || e < held.end);
}

std::vector<int64_t> requests_of_rank(int64_t n_requests, int rank, int ranks) {
  std::vector<int64_t> out;
  for (int64_t i = rank; i < n_requests; i += ranks) out.push_back(i);
  return out;
}

std::vector<RequestOutcome> gather_outcomes(const std::vector<RequestOutcome>& local) {
  Packer pk;
  pk.put(uint64_t(local.size()));
  for (const RequestOutcome& o : local) {
    pk.put(o.index);
    pk.put(o.n_tokens);
    pk.put(o.next_token);
    pk.put(o.cache_bytes);
    pk.put(o.cache_checksum);
    pk.put(o.seconds);
    pk.put(uint64_t(o.error.size()));
    pk.put_bytes(o.error.data(), o.error.size());
    pk.put(uint64_t(o.logits.size()));
    pk.put_bytes(o.logits.data(), o.logits.size() * sizeof(float));
  }
  const int me = rank(), R = size();
  int my_bytes = to_int(int64_t(pk.b.size()), "result record");
  std::vector<int> counts(static_cast<size_t>(R)), displs(static_cast<size_t>(R));
  std::vector<uint8_t> all;
  if (active()) {
    MPI_Gather(&my_bytes, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
    int64_t total = 0;
    if (me == 0)
      for (int s = 0; s < R; ++s) {
        displs[size_t(s)] = to_int(total, "gathered results");
        total += counts[size_t(s)];
      }
    if (me == 0) all.resize(size_t(to_int(total, "gathered results")));
    MPI_Gatherv(pk.b.data(), my_bytes, MPI_BYTE, all.data(), counts.data(), displs.data(), MPI_BYTE, 0, MPI_COMM_WORLD);
  } else {
    all = pk.b;
    counts[0] = my_bytes;
  }
  std::vector<RequestOutcome> out;
  if (me != 0) return out;
  for (int s = 0; s < R; ++s) {
    Unpacker u{all.data() + displs[size_t(s)], all.data() + displs[size_t(s)] + counts[size_t(s)]};
    const uint64_t n = u.get<uint64_t>();
    for (uint64_t i = 0; i < n; ++i) {
      RequestOutcome o;
      o.index = u.get<int64_t>();
      o.n_tokens = u.get<int64_t>();
      o.next_token = u.get<int32_t>();
      o.cache_bytes = u.get<uint64_t>();
      o.cache_checksum = u.get<uint64_t>();
      o.seconds = u.get<double>();
      const uint64_t ne = u.get<uint64_t>();
      u.need(ne);
      o.error.resize(size_t(ne));
      u.get_bytes(o.error.data(), o.error.size());
      const uint64_t nl = u.get<uint64_t>();
      u.need(nl * sizeof(float));
      o.logits.resize(size_t(nl));
      u.get_bytes(o.logits.data(), o.logits.size() * sizeof(float));
      out.push_back(std::move(o));
    }
  }
  std::sort(out.begin(), out.end(), [](const RequestOutcome& a, const RequestOutcome& b) { return a.index < b.index; });
  return out;
}

// ---- Runner -------------------------------------------------------------------

struct MpiExpertRunner::Comm {
  MPI_Comm comm = MPI_COMM_NULL;
  int64_t pair_dt_width = -1, out_dt_width = -1;  // D the datatypes were made for
  MPI_Datatype pair_dt = MPI_DATATYPE_NULL;       // one (expert, weight, bf16 row)
  MPI_Datatype out_dt = MPI_DATATYPE_NULL;        // one bf16 output row
  int uncaught_at_start = 0;

  void ensure_types(int64_t D) {
    if (pair_dt_width == D) return;
    if (pair_dt != MPI_DATATYPE_NULL) MPI_Type_free(&pair_dt);
    if (out_dt != MPI_DATATYPE_NULL) MPI_Type_free(&out_dt);
    MPI_Type_contiguous(to_int(8 + 2 * D, "row"), MPI_BYTE, &pair_dt);
    MPI_Type_commit(&pair_dt);
    MPI_Type_contiguous(to_int(2 * D, "row"), MPI_BYTE, &out_dt);
    MPI_Type_commit(&out_dt);
    pair_dt_width = out_dt_width = D;
  }
};

MpiExpertRunner::MpiExpertRunner(int64_t n_experts) : comm_(std::make_unique<Comm>()), n_experts_(n_experts) {
  if (!active()) throw Error("expert parallelism: MPI is not initialised");
  rank_ = dist::rank();
  ranks_ = dist::size();
  const ExpertRange r = expert_range(n_experts, rank_, ranks_);
  e0_ = r.begin;
  e1_ = r.end;
  per_rank_ = n_experts / ranks_;
  comm_->uncaught_at_start = std::uncaught_exceptions();
  MPI_Comm_dup(MPI_COMM_WORLD, &comm_->comm);
}

MpiExpertRunner::~MpiExpertRunner() {
  // While an exception unwinds, the job is about to be aborted: do not risk
  // a call that might wait for the other ranks.
  if (!active() || std::uncaught_exceptions() > comm_->uncaught_at_start) return;
  if (comm_->pair_dt != MPI_DATATYPE_NULL) MPI_Type_free(&comm_->pair_dt);
  if (comm_->out_dt != MPI_DATATYPE_NULL) MPI_Type_free(&comm_->out_dt);
  if (comm_->comm != MPI_COMM_NULL) MPI_Comm_free(&comm_->comm);
}

int64_t MpiExpertRunner::agree_rounds(int64_t local) {
  int64_t all = 0;
  MPI_Allreduce(&local, &all, 1, MPI_INT64_T, MPI_MAX, comm_->comm);
  return all;
}

// One MoE step's traffic plan: where each routed pair goes and, per rank,
// how many pairs go there and come from there, with their offsets.
struct ExchangePlan {
  std::vector<int> dest, send_n, recv_n, send_off, recv_off;
  int64_t n_send = 0, n_recv = 0;
};

namespace {

// Lays out offsets for the counts already in the plan.
void lay_out(ExchangePlan& p) {
  const size_t R = p.send_n.size();
  p.send_off.assign(R, 0);
  p.recv_off.assign(R, 0);
  for (size_t d = 0; d < R; ++d) {
    p.send_off[d] = to_int(p.n_send, "pairs per step");
    p.recv_off[d] = to_int(p.n_recv, "pairs per step");
    p.n_send += p.send_n[d];
    p.n_recv += p.recv_n[d];
  }
}

// Writes the pairs by destination, in ascending pair index: (int32 expert,
// fp32 weight, bf16 row [D]) each.
std::vector<uint8_t> pack_pairs(const ExchangePlan& p, const Routing& r, const float* x, int64_t P, int64_t k,
                                int64_t D) {
  const int64_t pair_bytes = 8 + 2 * D;
  std::vector<uint8_t> sbuf(static_cast<size_t>(p.n_send * pair_bytes));
  std::vector<int64_t> cur(p.send_off.begin(), p.send_off.end());
  for (int64_t i = 0; i < P; ++i) {
    uint8_t* q = sbuf.data() + cur[size_t(p.dest[size_t(i)])]++ * pair_bytes;
    const int32_t e = r.expert[size_t(i)];
    const float wt = r.weight[size_t(i)];
    std::memcpy(q, &e, 4);
    std::memcpy(q + 4, &wt, 4);
    const float* row = x + (i / k) * D;
    for (int64_t ch = 0; ch < D; ++ch) {
      const uint16_t h = exact_bf16(row[ch]);
      std::memcpy(q + 8 + 2 * ch, &h, 2);
    }
  }
  return sbuf;
}

// bf16 rows [n][D] back to fp32.
void unpack_rows(const uint8_t* src, int64_t n, int64_t D, size_t stride, size_t offset, float* dst) {
  for (int64_t j = 0; j < n; ++j)
    for (int64_t ch = 0; ch < D; ++ch) {
      uint16_t h;
      std::memcpy(&h, src + size_t(j) * stride + offset + 2 * size_t(ch), 2);
      dst[j * D + ch] = bf16_to_f32(h);
    }
}

}  // namespace

// Steps 1-2 of the header comment: where each pair goes, and the (step,
// count) header exchange that checks every rank is at the same step.
void MpiExpertRunner::plan_exchange(const Routing& r, int64_t P, ExchangePlan& plan, double& comm_s) {
  const int R = ranks_;
  plan.dest.resize(size_t(P));
  plan.send_n.assign(size_t(R), 0);
  plan.recv_n.assign(size_t(R), 0);
  for (int64_t i = 0; i < P; ++i) {
    const int32_t e = r.expert[size_t(i)];
    if (e < 0 || e >= n_experts_) throw Error("expert parallelism: routed to expert " + std::to_string(e));
    plan.dest[size_t(i)] = int(e / per_rank_);
    ++plan.send_n[size_t(plan.dest[size_t(i)])];
  }
  std::vector<int64_t> hdr_out(static_cast<size_t>(2 * R)), hdr_in(static_cast<size_t>(2 * R));
  for (int d = 0; d < R; ++d) {
    hdr_out[size_t(2 * d)] = step_;
    hdr_out[size_t(2 * d + 1)] = plan.send_n[size_t(d)];
  }
  const double t0 = now_s();
  MPI_Alltoall(hdr_out.data(), 2, MPI_INT64_T, hdr_in.data(), 2, MPI_INT64_T, comm_->comm);
  comm_s += now_s() - t0;
  for (int s = 0; s < R; ++s) {
    if (hdr_in[size_t(2 * s)] != step_)
      throw Error("expert parallelism: rank " + std::to_string(s) + " is at MoE step " +
                  std::to_string(hdr_in[size_t(2 * s)]) + " while rank " + std::to_string(rank_) + " is at step " +
                  std::to_string(step_) + " (ranks out of lockstep)");
    plan.recv_n[size_t(s)] = to_int(hdr_in[size_t(2 * s + 1)], "pair count");
  }
  lay_out(plan);
}

// Step 4: the held experts on the received pairs (source rank order, then
// pair order); returns their bf16 outputs, one row per pair.
std::vector<uint8_t> MpiExpertRunner::run_received(const MoeWeights& w, const ModelConfig& c,
                                                   const std::vector<uint8_t>& rbuf, int64_t n_recv,
                                                   MoeActivations& act) {
  const int64_t D = c.hidden_size, pair_bytes = 8 + 2 * D;
  std::vector<float> xr(static_cast<size_t>(n_recv * D)), yr(static_cast<size_t>(n_recv * D));
  std::vector<float> wr(static_cast<size_t>(n_recv));
  std::vector<int32_t> er(static_cast<size_t>(n_recv));
  std::vector<const float*> rows(static_cast<size_t>(n_recv));
  for (int64_t j = 0; j < n_recv; ++j) {
    const uint8_t* p = rbuf.data() + j * pair_bytes;
    std::memcpy(&er[size_t(j)], p, 4);
    std::memcpy(&wr[size_t(j)], p + 4, 4);
    if (er[size_t(j)] < e0_ || er[size_t(j)] >= e1_ || !w.experts[size_t(er[size_t(j)])].w1.data)
      throw Error("expert parallelism: rank " + std::to_string(rank_) + " received a pair for expert " +
                  std::to_string(er[size_t(j)]) + ", which it does not hold");
    rows[size_t(j)] = xr.data() + j * D;
  }
  unpack_rows(rbuf.data(), n_recv, D, size_t(pair_bytes), 8, xr.data());
  if (n_recv > 0) run_experts_local(w, c, rows.data(), er.data(), wr.data(), n_recv, act, yr.data());
  std::vector<uint8_t> obuf(static_cast<size_t>(n_recv * 2 * D));
  for (int64_t j = 0; j < n_recv * D; ++j) {
    const uint16_t h = exact_bf16(yr[size_t(j)]);
    std::memcpy(obuf.data() + 2 * j, &h, 2);
  }
  return obuf;
}

void MpiExpertRunner::record_step(const ExchangePlan& plan, int64_t D, double comm_s, double t_start) {
  const uint64_t pair_bytes = uint64_t(8 + 2 * D), out_bytes = uint64_t(2 * D);
  const uint64_t hdr_bytes = uint64_t(ranks_ - 1) * 16;
  const uint64_t sent_away = uint64_t(plan.n_send - plan.send_n[size_t(rank_)]);
  const uint64_t received_from_others = uint64_t(plan.n_recv - plan.recv_n[size_t(rank_)]);
  StepStats st;
  st.pairs_sent = plan.n_send;
  st.pairs_received = plan.n_recv;
  st.bytes_sent = hdr_bytes + sent_away * pair_bytes + received_from_others * out_bytes;
  st.bytes_received = hdr_bytes + received_from_others * pair_bytes + sent_away * out_bytes;
  st.comm_seconds = comm_s;
  st.total_seconds = now_s() - t_start;
  steps_.push_back(st);
  ++step_;
}

void MpiExpertRunner::run_routed(const MoeWeights& w, const ModelConfig& c, const float* x, int64_t n,
                                 const Routing& r, MoeActivations& act, float* y) {
  const double t_start = now_s();
  double comm_s = 0;
  const int64_t D = c.hidden_size, k = c.num_experts_per_tok, P = n * k;
  if (c.n_routed_experts != n_experts_)
    throw Error("expert parallelism: runner made for " + std::to_string(n_experts_) + " experts, model has " +
                std::to_string(c.n_routed_experts));
  comm_->ensure_types(D);
  ExchangePlan plan;
  plan_exchange(r, P, plan, comm_s);
  // Step 3: the pairs to the experts' owners.
  const std::vector<uint8_t> sbuf = pack_pairs(plan, r, x, P, k, D);
  std::vector<uint8_t> rbuf(static_cast<size_t>(plan.n_recv * (8 + 2 * D)));
  double t0 = now_s();
  MPI_Alltoallv(sbuf.data(), plan.send_n.data(), plan.send_off.data(), comm_->pair_dt, rbuf.data(),
                plan.recv_n.data(), plan.recv_off.data(), comm_->pair_dt, comm_->comm);
  comm_s += now_s() - t0;
  const std::vector<uint8_t> obuf = run_received(w, c, rbuf, plan.n_recv, act);
  // Step 5: the outputs back in the order they came, then into y by pair.
  std::vector<uint8_t> bbuf(static_cast<size_t>(plan.n_send * 2 * D));
  t0 = now_s();
  MPI_Alltoallv(obuf.data(), plan.recv_n.data(), plan.recv_off.data(), comm_->out_dt, bbuf.data(),
                plan.send_n.data(), plan.send_off.data(), comm_->out_dt, comm_->comm);
  comm_s += now_s() - t0;
  std::vector<int64_t> cur(plan.send_off.begin(), plan.send_off.end());
  for (int64_t i = 0; i < P; ++i)
    unpack_rows(bbuf.data() + cur[size_t(plan.dest[size_t(i)])]++ * 2 * D, 1, D, 0, 0, y + i * D);
  record_step(plan, D, comm_s, t_start);
}

EpTotals MpiExpertRunner::totals() const {
  EpTotals t;
  t.steps = int64_t(steps_.size());
  for (const StepStats& s : steps_) {
    t.bytes_sent += s.bytes_sent;
    t.bytes_received += s.bytes_received;
    t.comm_seconds += s.comm_seconds;
    t.total_seconds += s.total_seconds;
  }
  return t;
}

EpTotals MpiExpertRunner::reduce_totals(double wall_seconds) const {
  EpTotals mine = totals();
  mine.wall_seconds = wall_seconds;
  uint64_t bytes_in[2] = {mine.bytes_sent, mine.bytes_received}, bytes_out[2] = {0, 0};
  double secs_in[3] = {mine.comm_seconds, mine.total_seconds, wall_seconds}, secs_out[3] = {0, 0, 0};
  int64_t steps_in = mine.steps, steps_out = 0;
  MPI_Reduce(bytes_in, bytes_out, 2, MPI_UINT64_T, MPI_SUM, 0, comm_->comm);
  MPI_Reduce(secs_in, secs_out, 3, MPI_DOUBLE, MPI_MAX, 0, comm_->comm);
  MPI_Reduce(&steps_in, &steps_out, 1, MPI_INT64_T, MPI_MAX, 0, comm_->comm);
  // Every rank took the same steps (checked at each step), so the per-step
  // arrays have the same length everywhere.
  const int n = to_int(int64_t(steps_.size()), "step count");
  std::vector<uint64_t> sb(static_cast<size_t>(n)), sb_all(static_cast<size_t>(n));
  std::vector<double> ss(static_cast<size_t>(n)), ss_all(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    sb[size_t(i)] = steps_[size_t(i)].bytes_sent;
    ss[size_t(i)] = steps_[size_t(i)].comm_seconds;
  }
  MPI_Reduce(sb.data(), sb_all.data(), n, MPI_UINT64_T, MPI_SUM, 0, comm_->comm);
  MPI_Reduce(ss.data(), ss_all.data(), n, MPI_DOUBLE, MPI_MAX, 0, comm_->comm);
  if (rank_ != 0) return mine;
  EpTotals t;
  t.step_bytes = std::move(sb_all);
  t.step_comm_seconds = std::move(ss_all);
  t.steps = steps_out;
  t.bytes_sent = bytes_out[0];
  t.bytes_received = bytes_out[1];
  t.comm_seconds = secs_out[0];
  t.total_seconds = secs_out[1];
  t.wall_seconds = secs_out[2];
  return t;
}

}  // namespace dsv4::dist
