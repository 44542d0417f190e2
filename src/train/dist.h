// Data parallelism over MPI: the communication layer the trainer calls. Every rank holds the whole
// model and computes the gradient of its shard of the global batch; one sum all-reduce of the flat
// gradient buffer per step makes every rank's gradient the global batch's (docs/training.md).
//
// MPI is an optional build component (CMake option HYBRIDLM_MPI, on when an MPI is found). It is
// started only when the process was launched by an MPI launcher (mpirun / mpiexec), so a plain
// `hybridlm train` neither needs mpirun nor prints anything from MPI. Without MPI (built without,
// or not launched by mpirun) there is one rank and every call below is the identity.
//
// Every call except rank() / size() / is_root() / using_mpi() / abort_all() is collective: all
// ranks make it, in the same order, with buffers of the same size. A rank that leaves the
// sequence (an Error thrown on one rank only) leaves the others waiting: call abort_all() then.
#pragma once

#include <cstddef>
#include <span>
#include <string>

namespace hybridlm {

// The world size an MPI launcher announced in the environment (OMPI_COMM_WORLD_SIZE of Open MPI's
// mpirun, PMI_SIZE of MPICH's mpiexec / Slurm), or 0 when the process was not started by one.
int launcher_world_size();

class Dist {
 public:
  // Starts MPI (MPI_Init_thread, main thread only: MPI_THREAD_FUNNELED) when built with MPI and
  // launched by an MPI launcher; otherwise one rank. Throws Error when launched with several ranks
  // by a launcher but built without MPI (every rank would train alone and write the checkpoint),
  // or when MPI was already started in this process. argc / argv may be null.
  Dist(int* argc, char*** argv);
  // MPI_Finalize. When the destructor runs while an exception unwinds the stack and there are
  // several ranks, the others may be blocked in a collective: it calls MPI_Abort instead.
  ~Dist();
  Dist(const Dist&) = delete;
  Dist& operator=(const Dist&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // Rank 0: the one rank that writes checkpoints, metrics and the progress line.
  bool is_root() const { return rank_ == 0; }
  // Whether this Dist started MPI (false for a plain run, even in an MPI build).
  bool using_mpi() const { return mpi_; }
  // Whether this binary was built with MPI (HYBRIDLM_HAVE_MPI).
  static bool built_with_mpi();

  // x[i] = sum over ranks of x[i], in place, on every rank. One MPI_Allreduce over the whole
  // buffer (a buffer over 2^30 floats goes in 2^30-float pieces, MPI counts being int): pass the
  // flat gradient buffer, one bucket per step, never one call per tensor. The order of the sum is
  // MPI's; the standard advises, and Open MPI does, that every rank get the same bits
  // (dist_mpi_test checks it), so ranks that step the same optimizer keep equal parameters.
  void allreduce_sum(std::span<float> x);
  // The same for doubles (loss sums, token counts: several scalars in one message).
  void allreduce_sum(std::span<double> x);
  void allreduce_sum(double& x) { allreduce_sum(std::span<double>(&x, 1)); }
  // x = rank 0's x on every rank (parameters at start-up, a resumed run's state). Every rank passes
  // a buffer of the same size; throws Error (on every rank) when a size differs from rank 0's.
  void broadcast(std::span<float> x);
  // s = rank 0's s on every rank, of whatever length (a config file's text).
  void broadcast(std::string& s);
  void barrier();

  // Prints "error: MSG" (with "rank R: " before MSG when there are several ranks) on stderr and
  // ends the run with exit code 1: MPI_Abort on every rank under MPI (so no rank waits forever in
  // a collective for one that failed), std::exit(1) otherwise.
  [[noreturn]] void abort_all(const std::string& msg) const;

 private:
  int rank_ = 0, size_ = 1;
  bool mpi_ = false;
};

}  // namespace hybridlm
