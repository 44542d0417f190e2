#include <gtest/gtest.h>

#include "base/error.h"
#include "cache/state_pool.h"

namespace hybridlm {
namespace {

TEST(StatePool, AcquireZeroesReleaseFreesAndFullIsAnError) {
  StatePool pool({{3, 10, 40}, {3, 6, 8}}, 2);
  EXPECT_EQ(pool.bytes_per_slot() % 64, 0u);
  EXPECT_GE(pool.bytes_per_slot(), (30 + 40 + 18 + 8) * sizeof(float));
  const int a = pool.acquire();
  pool.ssm_state(a, 1)[3] = 5.0f;
  pool.conv_state(a, 0)[29] = 7.0f;
  const int b = pool.acquire();
  EXPECT_EQ(pool.in_use(), 2);
  EXPECT_THROW(pool.acquire(), Error);
  pool.copy(a, b);
  EXPECT_EQ(pool.ssm_state(b, 1)[3], 5.0f);
  EXPECT_EQ(pool.conv_state(b, 0)[29], 7.0f);
  pool.release(a);
  EXPECT_EQ(pool.in_use(), 1);
  const int c = pool.acquire();
  EXPECT_EQ(c, a);
  EXPECT_EQ(pool.ssm_state(c, 1)[3], 0.0f) << "a reacquired slot must be zeroed";
  EXPECT_EQ(pool.conv_state(c, 0)[29], 0.0f);
  pool.release(b);
  pool.release(c);
  EXPECT_EQ(pool.in_use(), 0);
  EXPECT_THROW(pool.release(c), Error);
  // Layers do not overlap: the end of layer 0's SSM state is right before layer 1's conv state.
  EXPECT_EQ(pool.conv_state(0, 1), pool.ssm_state(0, 0) + 40);
}

}  // namespace
}  // namespace hybridlm
