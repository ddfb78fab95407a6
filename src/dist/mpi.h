// The MPI world as the front ends see it (PREFILL.md §4): joining the job,
// rank and size, which rank runs which request, gathering results on rank 0,
// and the expert-parallel traffic totals. No model types: the runner that
// moves expert rows is in dist/ep.h, behind the engine.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

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

// ---- Expert-parallel traffic ------------------------------------------------

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

}  // namespace dsv4::dist
