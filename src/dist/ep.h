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
#include <vector>

#include "dist/mpi.h"
#include "model/moe.h"
#include "model/weights.h"

namespace dsv4::dist {

// The routed experts rank `k` of `R` holds; throws dsv4::Error naming both
// numbers when E is not divisible by R.
ExpertRange expert_range(int64_t n_experts, int rank, int ranks);

// False for the tensors of routed experts outside `held`
// ("layers.L.ffn.experts.E.…" with E not in [begin, end)), true otherwise:
// what a rank maps and checks.
bool holds_tensor(const std::string& name, ExpertRange held);

// ---- The runner -------------------------------------------------------------

struct ExchangePlan;  // one MoE step's traffic (ep.cc)

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
  // Forgets the per-step statistics (the step count that keeps the ranks in
  // lockstep goes on).
  void clear_stats() { steps_.clear(); }

  int rank() const { return rank_; }
  int ranks() const { return ranks_; }
  ExpertRange held() const { return {e0_, e1_}; }
  const std::vector<StepStats>& steps() const { return steps_; }
  EpTotals totals() const;
  // Collective: on rank 0, the totals of every rank summed (bytes) or
  // maximised (seconds, steps, `wall_seconds`); on the others, their own.
  EpTotals reduce_totals(double wall_seconds = 0) const;

 private:
  void plan_exchange(const Routing& r, int64_t pairs, ExchangePlan& plan, double& comm_s);
  std::vector<uint8_t> run_received(const MoeWeights& w, const ModelConfig& c, const std::vector<uint8_t>& rbuf,
                                    int64_t n_recv, MoeActivations& act);
  void record_step(const ExchangePlan& plan, int64_t D, double comm_s, double t_start);
  struct Comm;
  std::unique_ptr<Comm> comm_;
  int rank_ = 0, ranks_ = 1;
  int64_t n_experts_ = 0, per_rank_ = 0, e0_ = 0, e1_ = 0;
  int64_t step_ = 0;
  std::vector<StepStats> steps_;
};

}  // namespace dsv4::dist
