#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

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

TEST(StatePool, SixteenBitStorageHalvesTheSlotAndRoundsOnWrite) {
  StatePool f32({{3, 10, 40}, {3, 6, 8}}, 2);
  for (DType dt : {DType::BF16, DType::F16}) {
    StatePool pool({{3, 10, 40}, {3, 6, 8}}, 2, dt);
    EXPECT_EQ(pool.bytes_per_slot() % 64, 0u);
    EXPECT_LE(pool.bytes_per_slot(), f32.bytes_per_slot() / 2 + 64);
    EXPECT_THROW(pool.conv_state(0, 0), Error) << "no direct f32 views of 16-bit storage";
    const int a = pool.acquire(), b = pool.acquire();
    std::vector<float> in(70), out(70, -1.0f);
    for (size_t i = 0; i < in.size(); ++i) in[i] = 0.1f * static_cast<float>(i) - 2.0f;
    // The pool stores through the dtype conversions (their bits, ties included, are pinned in
    // kernels_test's Dtype test): ties, NaN, infinities, the largest float.
    in[3] = 1.0f + 0x1p-8f, in[4] = 1.0f + 3 * 0x1p-8f, in[5] = std::nanf(""), in[6] = -INFINITY, in[7] = 3.4e38f;
    pool.write_layer(a, 0, in.data());
    pool.read_layer(a, 0, out.data());
    for (size_t i = 0; i < in.size(); ++i) {
      const float want = dt == DType::BF16 ? bf16_to_f32(f32_to_bf16(in[i])) : f16_to_f32(f32_to_f16(in[i]));
      EXPECT_EQ(std::memcmp(&out[i], &want, sizeof want), 0) << i << ": " << out[i] << " vs " << want;
    }
    // A range of a layer reads and writes just those elements.
    std::vector<float> part(10, 7.0f), back(10);
    pool.write_layer_range(a, 0, 20, 30, part.data());
    pool.read_layer_range(a, 0, 20, 30, back.data());
    EXPECT_EQ(back, part);
    pool.read_layer(a, 0, out.data());
    EXPECT_EQ(out[19], dt == DType::BF16 ? bf16_to_f32(f32_to_bf16(in[19])) : f16_to_f32(f32_to_f16(in[19])));
    EXPECT_EQ(out[30], dt == DType::BF16 ? bf16_to_f32(f32_to_bf16(in[30])) : f16_to_f32(f32_to_f16(in[30])));
    pool.write_layer(a, 0, in.data());
    pool.read_layer(a, 0, out.data());
    pool.copy(a, b);
    std::vector<float> copied(70);
    pool.read_layer(b, 0, copied.data());
    EXPECT_EQ(std::memcmp(copied.data(), out.data(), out.size() * sizeof(float)), 0);  // NaN included
    pool.read_layer(a, 1, out.data());  // layer 1 untouched: zero
    for (size_t i = 0; i < 26; ++i) EXPECT_EQ(out[i], 0.0f);
  }
  EXPECT_THROW(StatePool({{3, 10, 40}}, 1, DType::I8), Error);
}

}  // namespace
}  // namespace hybridlm
