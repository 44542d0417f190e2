// Dist under mpirun with N >= 2 ranks (ctest: `mpiexec -n 2`, tests/train/CMakeLists.txt): the
// collectives against their definition, data parallelism against one process, and (with
// --abort-from-rank-1) abort_all ending every rank. Every rank
// runs every test; each test makes the same collective calls on every rank, in the same order,
// and checks only with EXPECT (an ASSERT returning early on one rank would leave the others
// waiting in the next collective until ctest's timeout).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "numerics.h"
#include "train/dist.h"

namespace hybridlm {
namespace {

Dist* g_dist = nullptr;  // made in main, before any MPI call of a test

TEST(DistMpi, RanksAreDistinctAndCountedOnce) {
  Dist& d = *g_dist;
  EXPECT_TRUE(d.using_mpi());
  EXPECT_EQ(d.is_root(), d.rank() == 0);
  // sum of 1 = size; sum of ranks = 0 + 1 + ... + (size - 1).
  std::vector<double> v = {1.0, static_cast<double>(d.rank())};
  d.allreduce_sum(std::span<double>(v));
  const double n = d.size();
  EXPECT_EQ(v[0], n);
  EXPECT_EQ(v[1], n * (n - 1) / 2);
}

TEST(DistMpi, AllreduceSumsRankDependentFloats) {
  Dist& d = *g_dist;
  // Integers below 2^24 (exact in f32, so any order of the sum is exact): x[i] = (i mod 1024) (r + 1)
  // + r on rank r sums to (i mod 1024) n (n + 1) / 2 + n (n - 1) / 2. 256K floats (1 MiB) take
  // MPI's large-message path, not only the eager one.
  const size_t len = size_t{1} << 18;
  const float r = static_cast<float>(d.rank()), n = static_cast<float>(d.size());
  std::vector<float> x(len);
  for (size_t i = 0; i < len; ++i) x[i] = static_cast<float>(i % 1024) * (r + 1) + r;
  d.allreduce_sum(std::span<float>(x));
  size_t wrong = 0;
  for (size_t i = 0; i < len; ++i)
    if (x[i] != static_cast<float>(i % 1024) * n * (n + 1) / 2 + n * (n - 1) / 2) ++wrong;
  EXPECT_EQ(wrong, 0u);

  double s = 0.25 * (d.rank() + 1);
  d.allreduce_sum(s);
  EXPECT_EQ(s, 0.25 * n * (n + 1) / 2);
}

TEST(DistMpi, AllreduceLeavesEveryRankBitwiseEqual) {
  Dist& d = *g_dist;
  // Inexact sums (random floats of mixed scale): whatever MPI's order, every rank gets the same bits.
  std::mt19937 rng(100 + d.rank());
  std::normal_distribution<float> nd;
  std::vector<float> x(4099);
  for (float& v : x) v = nd(rng) * std::exp(nd(rng) * 4);
  d.allreduce_sum(std::span<float>(x));
  std::vector<float> root = x;
  d.broadcast(std::span<float>(root));
  EXPECT_EQ(std::memcmp(x.data(), root.data(), x.size() * sizeof(float)), 0);
}

TEST(DistMpi, BroadcastGivesEveryRankRankZerosValues) {
  Dist& d = *g_dist;
  std::vector<float> x(1000, -1.0f);
  if (d.is_root())
    for (size_t i = 0; i < x.size(); ++i) x[i] = 0.5f * static_cast<float>(i);
  d.broadcast(std::span<float>(x));
  size_t wrong = 0;
  for (size_t i = 0; i < x.size(); ++i) wrong += x[i] != 0.5f * static_cast<float>(i);
  EXPECT_EQ(wrong, 0u);

  // Strings of any length, rank 0's replacing longer, shorter and empty ones.
  const std::string text = "model = \"mamba2\"\nsteps = 10\n";
  std::string s = d.is_root() ? text : std::string(static_cast<size_t>(d.rank()) * 40, 'x');
  d.broadcast(s);
  EXPECT_EQ(s, text);
  std::string empty = d.is_root() ? "" : "not empty";
  d.broadcast(empty);
  EXPECT_EQ(empty, "");
  d.barrier();
}

TEST(DistMpi, BroadcastOfDifferentSizesThrowsOnEveryRank) {
  Dist& d = *g_dist;
  std::vector<float> x(d.is_root() ? 4 : 5, 1.0f);
  EXPECT_THROW(d.broadcast(std::span<float>(x)), Error);
  // The ranks still agree on what comes next.
  double one = 1;
  d.allreduce_sum(one);
  EXPECT_EQ(one, d.size());
}

// The toy model: least squares, loss = 1/(2B) sum_b (w . x_b - y_b)^2 over a global batch of B
// rows, gradient dL/dw = 1/B sum_b (w . x_b - y_b) x_b. `rows` [lo, hi) of the batch, in f32 as a
// trainer sums, each row's term scaled by 1/B (the global count): the shard's share of the mean.
struct LeastSquares {
  int B, D;
  std::vector<float> x, y, w;  // x: (B, D), y: (B), w: (D)
  LeastSquares(int B_, int D_, uint32_t seed) : B(B_), D(D_), x(size_t(B_) * D_), y(B_), w(D_) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd;
    for (float& v : x) v = nd(rng);
    for (float& v : y) v = nd(rng);
    for (float& v : w) v = nd(rng) * 0.3f;
  }
  // Adds the rows' gradient share to g (D floats) and returns their loss share.
  float accumulate(int lo, int hi, std::span<float> g) const {
    const float inv_b = 1.0f / static_cast<float>(B);
    float loss = 0;
    for (int b = lo; b < hi; ++b) {
      const float* xb = &x[size_t(b) * D];
      float pred = 0;
      for (int j = 0; j < D; ++j) pred += w[j] * xb[j];
      const float r = pred - y[b];
      loss += 0.5f * r * r * inv_b;
      for (int j = 0; j < D; ++j) g[j] += r * xb[j] * inv_b;
    }
    return loss;
  }
};

TEST(DistMpi, DataParallelGradientEqualsOneProcessOnTheGlobalBatch) {
  Dist& d = *g_dist;
  // B = 37 rows (prime: the shards are uneven for any N) of D = 64 features, the same on every rank.
  const LeastSquares p(37, 64, 7);
  // One process: the whole batch.
  std::vector<float> g_one(p.D, 0.0f);
  const float loss_one = p.accumulate(0, p.B, g_one);
  // Rank r: rows [r B / N, (r + 1) B / N), then one all-reduce of the gradient and of the loss.
  const int lo = d.rank() * p.B / d.size(), hi = (d.rank() + 1) * p.B / d.size();
  std::vector<float> g(p.D, 0.0f);
  double loss = p.accumulate(lo, hi, g);
  d.allreduce_sum(std::span<float>(g));
  d.allreduce_sum(loss);
  // Only the f32 summation order differs (B terms per value): relative to the largest value.
  double scale = 0, err = 0;
  for (int j = 0; j < p.D; ++j) {
    scale = std::max(scale, std::fabs(static_cast<double>(g_one[j])));
    err = std::max(err, std::fabs(static_cast<double>(g[j]) - g_one[j]));
  }
  EXPECT_LE(err / scale, tol::kDataParallelF32) << "gradient, largest value " << scale;
  EXPECT_LE(std::fabs(loss - loss_one) / loss_one, tol::kDataParallelF32) << "loss " << loss << " vs " << loss_one;
  if (d.is_root())
    std::printf("data parallel vs one process, %d ranks: gradient %.2e, loss %.2e (relative)\n", d.size(),
                err / scale, std::fabs(loss - loss_one) / loss_one);
}

}  // namespace
}  // namespace hybridlm

int main(int argc, char** argv) {
  hybridlm::Dist dist(&argc, &argv);
  if (dist.size() < 2) {
    std::fprintf(stderr, "error: dist_mpi_test runs under mpirun with 2 or more ranks (it has %d)\n", dist.size());
    return 1;
  }
  // dist_mpi_abort (ctest): rank 1 fails while the others wait in a collective; abort_all must end
  // them all (the test fails on a timeout or on a rank that gets past the barrier).
  if (argc == 2 && std::string(argv[1]) == "--abort-from-rank-1") {
    if (dist.rank() == 1) dist.abort_all("stopping on purpose (dist_mpi_abort)");
    dist.barrier();
    std::printf("rank %d got past the barrier\n", dist.rank());
    return 1;
  }
  hybridlm::g_dist = &dist;
  // Rank 0 prints the usual report; the others print their failures only (set before InitGoogleTest,
  // which picks the printer).
  if (!dist.is_root()) GTEST_FLAG_SET(brief, true);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
