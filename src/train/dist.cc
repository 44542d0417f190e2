#include "train/dist.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include "base/error.h"

#if HYBRIDLM_HAVE_MPI
// Only MPI's C API is used; the C++ bindings (removed in MPI-3) stay out.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace hybridlm {

int launcher_world_size() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    const char* v = std::getenv(var);
    if (!v) continue;
    int n = 0;
    const char* end = v + std::strlen(v);
    if (auto [p, ec] = std::from_chars(v, end, n); ec == std::errc() && p == end && n > 0) return n;
  }
  return 0;
}

bool Dist::built_with_mpi() {
#if HYBRIDLM_HAVE_MPI
  return true;
#else
  return false;
#endif
}

#if HYBRIDLM_HAVE_MPI

namespace {

// MPI counts are int: larger buffers go in pieces of this many elements (4 GiB of floats each, so
// a piece is still one large bucket).
constexpr size_t kMaxCount = size_t{1} << 30;

// Throws Error "MPI_Allreduce failed: <MPI's message>" for an error code (MPI_COMM_WORLD returns
// them instead of aborting: Dist sets MPI_ERRORS_RETURN).
void mpi_check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) len = 0;
  const std::string what = len > 0 ? std::string(msg, static_cast<size_t>(len)) : "MPI error " + std::to_string(rc);
  throw_error(call, " failed: ", what);
}

template <class T>
void allreduce_sum_pieces(std::span<T> x, MPI_Datatype type) {
  for (size_t at = 0; at < x.size(); at += kMaxCount) {
    const int n = static_cast<int>(std::min(kMaxCount, x.size() - at));
    mpi_check(MPI_Allreduce(MPI_IN_PLACE, x.data() + at, n, type, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
  }
}

template <class T>
void broadcast_pieces(T* x, size_t count, MPI_Datatype type) {
  for (size_t at = 0; at < count; at += kMaxCount) {
    const int n = static_cast<int>(std::min(kMaxCount, count - at));
    mpi_check(MPI_Bcast(x + at, n, type, 0, MPI_COMM_WORLD), "MPI_Bcast");
  }
}

// Rank 0's count on every rank.
uint64_t broadcast_count(size_t count) {
  uint64_t n = count;
  mpi_check(MPI_Bcast(&n, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD), "MPI_Bcast");
  return n;
}

}  // namespace

Dist::Dist(int* argc, char*** argv) {
  if (launcher_world_size() == 0) return;
  int started = 0;
  MPI_Initialized(&started);
  check(!started, "MPI is already started in this process: make one Dist, in main");
  int provided = 0;
  mpi_check(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  try {  // a constructor that throws runs no destructor: finalize here
    // From here on a failing call returns its code (turned into an Error) instead of aborting the job.
    mpi_check(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check(provided >= MPI_THREAD_FUNNELED, "MPI provides thread level ", provided,
          ", hybridlm needs MPI_THREAD_FUNNELED");
    mpi_check(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "MPI_Comm_rank");
    mpi_check(MPI_Comm_size(MPI_COMM_WORLD, &size_), "MPI_Comm_size");
  } catch (...) {
    MPI_Finalize();
    throw;
  }
  mpi_ = true;
}

Dist::~Dist() {
  if (!mpi_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (std::uncaught_exceptions() > 0 && size_ > 1) MPI_Abort(MPI_COMM_WORLD, 1);
  MPI_Finalize();
}

void Dist::allreduce_sum(std::span<float> x) {
  if (mpi_ && size_ > 1) allreduce_sum_pieces(x, MPI_FLOAT);
}

void Dist::allreduce_sum(std::span<double> x) {
  if (mpi_ && size_ > 1) allreduce_sum_pieces(x, MPI_DOUBLE);
}

void Dist::broadcast(std::span<float> x) {
  if (!mpi_ || size_ == 1) return;
  // Every rank learns whether any size differs, so that all of them throw (none waits in the Bcast).
  const uint64_t root_n = broadcast_count(x.size());
  int differs = root_n != x.size() ? 1 : 0;
  mpi_check(MPI_Allreduce(MPI_IN_PLACE, &differs, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce");
  check(!differs, "broadcast of ", x.size(), " floats on rank ", rank_, ": rank 0 sends ", root_n,
        " (a rank's buffer size differs)");
  broadcast_pieces(x.data(), x.size(), MPI_FLOAT);
}

void Dist::broadcast(std::string& s) {
  if (!mpi_ || size_ == 1) return;
  s.resize(broadcast_count(s.size()));
  broadcast_pieces(s.data(), s.size(), MPI_CHAR);
}

void Dist::barrier() {
  if (mpi_ && size_ > 1) mpi_check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
}

void Dist::abort_all(const std::string& msg) const {
  if (size_ > 1) std::fprintf(stderr, "error: rank %d: %s\n", rank_, msg.c_str());
  else std::fprintf(stderr, "error: %s\n", msg.c_str());
  std::fflush(stderr);
  if (mpi_) MPI_Abort(MPI_COMM_WORLD, 1);
  std::exit(1);
}

#else  // built without MPI: one rank, every collective the identity

Dist::Dist(int*, char***) {
  const int n = launcher_world_size();
  check(n <= 1, "launched by mpirun with ", n, " ranks, but this hybridlm was built without MPI ",
        "(install libopenmpi-dev and rebuild, see docs/training.md)");
}

Dist::~Dist() = default;
void Dist::allreduce_sum(std::span<float>) {}
void Dist::allreduce_sum(std::span<double>) {}
void Dist::broadcast(std::span<float>) {}
void Dist::broadcast(std::string&) {}
void Dist::barrier() {}

void Dist::abort_all(const std::string& msg) const {
  std::fprintf(stderr, "error: %s\n", msg.c_str());
  std::fflush(stderr);
  std::exit(1);
}

#endif

}  // namespace hybridlm
