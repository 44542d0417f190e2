// Dist in one process (no mpirun): one rank, every collective the identity, MPI never started; the
// launcher detection from the environment; abort_all's one line and exit code. The collectives
// over several ranks are dist_mpi_test (run under mpirun when the build has MPI).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "train/dist.h"

namespace hybridlm {
namespace {

// Sets (or, with nullopt, unsets) an environment variable for one scope, restoring it after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) setenv(name, value->c_str(), 1);
    else unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_) setenv(name_, old_->c_str(), 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// No launcher in the environment (as if this test were not itself run under mpirun).
struct NoLauncher {
  ScopedEnv ompi{"OMPI_COMM_WORLD_SIZE", std::nullopt};
  ScopedEnv pmi{"PMI_SIZE", std::nullopt};
};

TEST(Dist, LauncherWorldSizeFromTheEnvironment) {
  NoLauncher none;
  EXPECT_EQ(launcher_world_size(), 0);
  {
    ScopedEnv ompi("OMPI_COMM_WORLD_SIZE", "3");
    EXPECT_EQ(launcher_world_size(), 3);
  }
  {
    ScopedEnv pmi("PMI_SIZE", "4");
    EXPECT_EQ(launcher_world_size(), 4);
  }
  for (const char* bad : {"", "0", "-2", "2x", "two"}) {
    ScopedEnv ompi("OMPI_COMM_WORLD_SIZE", bad);
    EXPECT_EQ(launcher_world_size(), 0) << "OMPI_COMM_WORLD_SIZE=" << bad;
  }
}

TEST(Dist, APlainRunIsOneRankAndEveryCollectiveIsTheIdentity) {
  NoLauncher none;
  Dist d(nullptr, nullptr);
  EXPECT_EQ(d.rank(), 0);
  EXPECT_EQ(d.size(), 1);
  EXPECT_TRUE(d.is_root());
  EXPECT_FALSE(d.using_mpi());

  const std::vector<float> want = {1.5f, -2.0f, 0.0f, 3e-38f, INFINITY};
  std::vector<float> x = want;
  d.allreduce_sum(std::span<float>(x));
  EXPECT_EQ(x, want);
  d.broadcast(std::span<float>(x));
  EXPECT_EQ(x, want);
  d.allreduce_sum(std::span<float>());
  double s = 0.1;
  d.allreduce_sum(s);
  EXPECT_EQ(s, 0.1);
  std::vector<double> v = {1.0, 2.5};
  d.allreduce_sum(std::span<double>(v));
  EXPECT_EQ(v, (std::vector<double>{1.0, 2.5}));
  std::string text = "steps = 10\n";
  d.broadcast(text);
  EXPECT_EQ(text, "steps = 10\n");
  d.barrier();
}

TEST(Dist, OneRankOfALauncherIsAPlainRunWithoutMpi) {
  if (Dist::built_with_mpi()) GTEST_SKIP() << "built with MPI: a launcher's rank starts MPI (dist_mpi_test)";
  NoLauncher none;
  ScopedEnv ompi("OMPI_COMM_WORLD_SIZE", "1");
  Dist d(nullptr, nullptr);
  EXPECT_EQ(d.size(), 1);
  EXPECT_FALSE(d.using_mpi());
}

TEST(Dist, SeveralRanksWithoutMpiIsRefused) {
  if (Dist::built_with_mpi()) GTEST_SKIP() << "built with MPI: several ranks are dist_mpi_test";
  NoLauncher none;
  ScopedEnv ompi("OMPI_COMM_WORLD_SIZE", "2");
  try {
    Dist d(nullptr, nullptr);
    FAIL() << "Dist started with 2 ranks in a build without MPI";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("built without MPI"), std::string::npos) << e.what();
  }
}

TEST(DistDeathTest, AbortAllPrintsOneLineAndExitsWithOne) {
  NoLauncher none;
  Dist d(nullptr, nullptr);
  EXPECT_EXIT(d.abort_all("data/train.bin: no such file"), testing::ExitedWithCode(1),
              "^error: data/train.bin: no such file\n$");
}

}  // namespace
}  // namespace hybridlm
