#include "base/huge_alloc.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace hybridlm {
namespace {

uintptr_t addr(const void* p) { return reinterpret_cast<uintptr_t>(p); }

TEST(SlabPool, BlocksAreAlignedDisjointAndKeepTheirBytes) {
  const SlabStats before = slab_stats();
  // Sizes across the slab range, odd ones included; more than one slab's worth in all.
  std::vector<size_t> sizes;
  for (int i = 0; i < 60; ++i) sizes.push_back(kSlabMin + (static_cast<size_t>(i) * 37813 + 1) % (kSlabMax - kSlabMin));
  std::vector<uint8_t*> blocks;
  size_t total = 0;
  for (size_t n : sizes) {
    auto* p = static_cast<uint8_t*>(slab_allocate(n));
    ASSERT_EQ(addr(p) % 64, 0u);
    std::memset(p, static_cast<int>(blocks.size() + 1), n);
    blocks.push_back(p);
    total += n;
  }
  for (size_t i = 0; i < blocks.size(); ++i) {
    for (size_t j = 0; j < blocks.size(); ++j) {
      if (i == j) continue;
      const bool apart = addr(blocks[i]) + sizes[i] <= addr(blocks[j]) || addr(blocks[j]) + sizes[j] <= addr(blocks[i]);
      ASSERT_TRUE(apart) << "blocks " << i << " and " << j << " overlap";
    }
  }
  // Every block still holds its own pattern after all the others were written.
  for (size_t i = 0; i < blocks.size(); ++i)
    for (size_t k = 0; k < sizes[i]; k += 4093) ASSERT_EQ(blocks[i][k], static_cast<uint8_t>(i + 1)) << i;
  const SlabStats during = slab_stats();
  EXPECT_EQ(during.blocks - before.blocks, blocks.size());
  EXPECT_EQ(during.block_bytes - before.block_bytes, total);
  const size_t min_slabs = (total + kSlabBytes - 1) / kSlabBytes;
  EXPECT_GE(during.slabs - before.slabs, min_slabs);
  EXPECT_LE(during.slabs - before.slabs, 2 * min_slabs) << "a slab is filled before the next is mapped";
  for (size_t i = 0; i < blocks.size(); ++i) slab_deallocate(blocks[i], sizes[i]);
  const SlabStats after = slab_stats();
  EXPECT_EQ(after.slabs, before.slabs) << "slabs are unmapped once empty";
  EXPECT_EQ(after.blocks, before.blocks);
  EXPECT_EQ(after.block_bytes, before.block_bytes);
}

TEST(SlabPool, ASlabStaysUntilItsLastBlockIsFreed) {
  const size_t base = slab_stats().slabs;
  void* a = slab_allocate(kSlabMax - 1);
  void* b = slab_allocate(kSlabMin);
  EXPECT_EQ(slab_stats().slabs, base + 1) << "both blocks share one slab";
  slab_deallocate(a, kSlabMax - 1);
  EXPECT_EQ(slab_stats().slabs, base + 1);
  std::memset(b, 7, kSlabMin);  // still ours to write
  slab_deallocate(b, kSlabMin);
  EXPECT_EQ(slab_stats().slabs, base);
}

// The smaps entry of the mapping that holds `p`: its "THPeligible:" value, or -1 if not found.
int thp_eligible(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    unsigned long lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-') {
      inside = addr(p) >= lo && addr(p) < hi;
      continue;
    }
    if (inside && line.rfind("THPeligible:", 0) == 0) return std::stoi(line.substr(12));
  }
  return -1;
}

TEST(SlabPool, SlabsAreHugePageAlignedAndMarked) {
  std::ifstream mode("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string modes;
  std::getline(mode, modes);
  if (modes.empty() || modes.find("[never]") != std::string::npos)
    GTEST_SKIP() << "transparent huge pages are off or absent here";
  // The control: a mapping this test marks itself. Where even that is not eligible (qemu-user,
  // which runs the aarch64 suite, does not pass the advice on), there is nothing to compare with.
  const size_t span = size_t{4} << 20;
  void* m = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  auto* aligned = reinterpret_cast<uint8_t*>((addr(m) + kSlabMax - 1) / kSlabMax * kSlabMax);
  madvise(aligned, kSlabMax, MADV_HUGEPAGE);
  aligned[0] = 1;
  const int control = thp_eligible(aligned);
  munmap(m, span);
  if (control != 1) GTEST_SKIP() << "madvise(MADV_HUGEPAGE) does not take here (smaps says " << control << ")";
  void* p = slab_allocate(kSlabMin);
  std::memset(p, 1, kSlabMin);
  EXPECT_EQ(thp_eligible(p), 1) << "the slab is marked MADV_HUGEPAGE";
  slab_deallocate(p, kSlabMin);
}

TEST(SlabPool, WeightVectorTakesSlabsOnlyForMidSizedBlocks) {
  const SlabStats before = slab_stats();
  WeightVector<float> tiny(1000), mid(256 << 10), big(1 << 20);  // 4 KB, 1 MiB, 4 MiB
  const SlabStats during = slab_stats();
  EXPECT_EQ(during.blocks - before.blocks, 1u);
  EXPECT_EQ(during.block_bytes - before.block_bytes, mid.size() * sizeof(float));
  EXPECT_EQ(addr(big.data()) % kSlabMax, 0u) << "2 MiB and up: a 2 MiB-aligned block of its own";
  mid[0] = 1.0f;
  WeightVector<float> moved = std::move(mid);
  EXPECT_EQ(moved[0], 1.0f);
  moved.clear();
  moved.shrink_to_fit();
  EXPECT_EQ(slab_stats().blocks, before.blocks);
}

TEST(SlabPool, ThreadsAllocateAndFreeConcurrently) {
  const SlabStats before = slab_stats();
  auto work = [](int seed) {
    std::vector<std::pair<uint8_t*, size_t>> live;
    for (int i = 0; i < 400; ++i) {
      const size_t n = kSlabMin + static_cast<size_t>((i * 7919 + seed * 104729) % 500000);
      auto* p = static_cast<uint8_t*>(slab_allocate(n));
      p[0] = p[n - 1] = static_cast<uint8_t>(seed);
      live.emplace_back(p, n);
      if (i % 3 == 2) {  // free an older one now and then
        auto [q, m] = live[live.size() / 2];
        EXPECT_EQ(q[0], static_cast<uint8_t>(seed));
        EXPECT_EQ(q[m - 1], static_cast<uint8_t>(seed));
        slab_deallocate(q, m);
        live.erase(live.begin() + static_cast<long>(live.size() / 2));
      }
    }
    for (auto [q, m] : live) slab_deallocate(q, m);
  };
  std::thread t1(work, 1), t2(work, 2);
  t1.join();
  t2.join();
  const SlabStats after = slab_stats();
  EXPECT_EQ(after.slabs, before.slabs);
  EXPECT_EQ(after.blocks, before.blocks);
}

// Under AddressSanitizer the bytes between and after blocks, and freed blocks, are poisoned: an
// overrun of one matrix into the next, or a read of a freed one, is reported.
TEST(SlabPoolDeathTest, AsanReportsOverrunsAndUseAfterFree) {
  if (!slab_poisons()) GTEST_SKIP() << "not an AddressSanitizer build";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto* a = static_cast<volatile uint8_t*>(slab_allocate(kSlabMin + 3));
  void* b = slab_allocate(kSlabMin);  // the next block: an overrun of `a` must not land in it unseen
  EXPECT_DEATH(a[kSlabMin + 3] = 1, "use-after-poison");
  slab_deallocate(const_cast<uint8_t*>(a), kSlabMin + 3);
  EXPECT_DEATH((void)a[0], "use-after-poison");
  slab_deallocate(b, kSlabMin);
}

}  // namespace
}  // namespace hybridlm
