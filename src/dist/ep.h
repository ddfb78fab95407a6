// Expert parallelism over MPI (PREFILL.md §4).
//
// Under `mpirun -np R`, rank k holds the routed experts [k·E/R, (k+1)·E/R)
// and everything else (attention, shared expert, gate, head) is replicated.
// Requests are dealt round-robin: request i runs on rank i % R. Every rank
// walks its own requests with extend_batch, and all ranks take the same MoE
// steps (a rank with shorter, finished or no requests joins with zero rows):
//
//   1. route locally (moe_forward), giving (row, expert, weight) pairs;
//   2. MPI_Alltoall of (step, pair count) per destination: each rank checks
//      that every peer is at the same step;
//   3. MPI_Alltoallv of the pairs to the experts' owners, each record
//      (int32 expert, fp32 weight, bf16 row [D]), in ascending pair index;
//   4. the owner runs its experts over everything it received, in source
//      rank order then pair order (run_experts_local groups by expert; each
//      output row is independent of the grouping);
//   5. MPI_Alltoallv of the bf16 outputs back, in the same order;
//   6. moe_forward sums the routed outputs in ascending expert id and adds
//      the shared expert, exactly as in one process.
//
// The rows and expert outputs are bf16 values, so sending them as bf16 is
// exact: a request's logits and caches do not depend on R. The collectives
// run on a communicator duplicated for the runner, so no other traffic can
// interleave with them; MPI orders collectives on one communicator, and the
// step numbers exchanged in (2) turn any divergence into an error.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/moe.h"
#include "model/weights.h"

namespace dsv4::dist {

// ---- The MPI world ---------------------------------------------------------

// True when this process was started by mpirun/mpiexec (Open MPI, MPICH or
// PMIx environment variables), so that the CLI should join the MPI job.
bool launched_by_mpi();
// MPI_Init_thread (funneled) once; a no-op when already initialised.
void init();
// True between init() and finalize().
bool active();
int rank();  // 0 when not active
int size();  // 1 when not active
// MPI_Finalize when active.
void finalize();
// MPI_Barrier on MPI_COMM_WORLD (nothing when not active).
void barrier();
// Ends the whole job with `code` (MPI_Abort on MPI_COMM_WORLD when active,
// else std::exit).
[[noreturn]] void abort_job(int code);

// The routed experts rank `k` of `R` holds; throws dsv4::Error naming both
// numbers when E is not divisible by R.
ExpertRange expert_range(int64_t n_experts, int rank, int ranks);

// False for the tensors of routed experts outside `held`
// ("layers.L.ffn.experts.E.…" with E not in [begin, end)), true otherwise:
// what a rank maps and checks.
bool holds_tensor(const std::string& name, ExpertRange held);

// Round-robin assignment: request i runs on rank i % R.
inline int owner_of_request(int64_t i, int ranks) { return int(i % ranks); }
// The indices of the requests rank `k` runs, ascending.
std::vector<int64_t> requests_of_rank(int64_t n_requests, int rank, int ranks);

// ---- Results gathered on rank 0 --------------------------------------------

struct RequestOutcome {
  int64_t index = 0;        // position in the request list
  int64_t n_tokens = 0;
  int32_t next_token = -1;
  uint64_t cache_bytes = 0;
  uint64_t cache_checksum = 0;
  double seconds = 0;
  std::string error;        // empty: it succeeded
  std::vector<float> logits;  // [vocab] (empty on error)
};

// Collective over MPI_COMM_WORLD: every rank passes its own outcomes; rank 0
// gets all of them sorted by index, the other ranks an empty list.
std::vector<RequestOutcome> gather_outcomes(const std::vector<RequestOutcome>& local);

// ---- The runner -------------------------------------------------------------

// One MoE step as seen by this rank.
struct StepStats {
  int64_t pairs_sent = 0, pairs_received = 0;  // (row, expert) pairs, self included
  uint64_t bytes_sent = 0, bytes_received = 0;  // both all-to-alls, other ranks only
  double comm_seconds = 0;   // inside the collectives (waiting for peers included)
  double total_seconds = 0;  // the whole run_routed call
};

// Totals over steps, for reporting.
struct EpTotals {
  int64_t steps = 0;
  uint64_t bytes_sent = 0, bytes_received = 0;
  double comm_seconds = 0, total_seconds = 0;
  double wall_seconds = 0;  // reduce_totals: the slowest rank's prefill time
  // Per MoE step (reduce_totals only): bytes sent by all ranks together, and
  // the slowest rank's seconds inside the collectives.
  std::vector<uint64_t> step_bytes;
  std::vector<double> step_comm_seconds;
};

class MpiExpertRunner : public ExpertRunner {
 public:
  // Collective over MPI_COMM_WORLD (duplicates it). `n_experts` must be
  // divisible by the number of ranks.
  explicit MpiExpertRunner(int64_t n_experts);
  ~MpiExpertRunner() override;
  MpiExpertRunner(const MpiExpertRunner&) = delete;
  MpiExpertRunner& operator=(const MpiExpertRunner&) = delete;

  void run_routed(const MoeWeights& w, const ModelConfig& c, const float* x, int64_t n, const Routing& r,
                  MoeActivations& act, float* y) override;
  int64_t agree_rounds(int64_t local) override;

  int rank() const { return rank_; }
  int ranks() const { return ranks_; }
  ExpertRange held() const { return {e0_, e1_}; }
  const std::vector<StepStats>& steps() const { return steps_; }
  EpTotals totals() const;
  // Collective: on rank 0, the totals of every rank summed (bytes) or
  // maximised (seconds, steps, `wall_seconds`); on the others, their own.
  EpTotals reduce_totals(double wall_seconds = 0) const;

 private:
  struct Comm;
  std::unique_ptr<Comm> comm_;
  int rank_ = 0, ranks_ = 1;
  int64_t n_experts_ = 0, per_rank_ = 0, e0_ = 0, e1_ = 0;
  int64_t step_ = 0;
  std::vector<StepStats> steps_;
};

}  // namespace dsv4::dist
