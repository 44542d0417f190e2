// Allocators for large, long-lived buffers (weights in memory), so that a decode step streaming
// hundreds of MB through the matmuls takes few TLB misses: many systems set transparent huge pages
// to "madvise", where plain allocations never get them.
// - HugePageAllocator: blocks of 2 MiB or more start on a 2 MiB boundary and are marked
//   MADV_HUGEPAGE. The size is not rounded up (no 2 MiB of slack per matrix). Smaller blocks come
//   from operator new. For buffers that grow and shrink (scratch arenas).
// - WeightAllocator: the same for blocks of 2 MiB or more; blocks from 64 KiB up to 2 MiB are
//   carved from shared huge-page slabs (slab_allocate below), so a model's many small matrices
//   (a MoE model's experts, Mamba-1's x_proj, a q8_0 out_proj) share huge pages instead of
//   taking 4 KB ones. For the model's weights only: a slab's memory returns to the system when
//   its last block is freed, not before (blocks freed early leave holes that are not reused).
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <utility>
#include <vector>

namespace hybridlm {

template <class T>
struct HugePageAllocator {
  using value_type = T;
  static constexpr size_t kHuge = size_t{2} << 20;

  HugePageAllocator() = default;
  template <class U>
  HugePageAllocator(const HugePageAllocator<U>&) {}

  T* allocate(size_t n) {
    const size_t bytes = n * sizeof(T);
    if (bytes < kHuge) return static_cast<T*>(::operator new(bytes));
    void* p = nullptr;
    if (posix_memalign(&p, kHuge, bytes) != 0) throw std::bad_alloc();
    madvise(p, bytes, MADV_HUGEPAGE);  // a hint: failure (no THP support) only costs speed
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t n) {
    if (n * sizeof(T) < kHuge) ::operator delete(p);
    else std::free(p);
  }
  template <class U>
  bool operator==(const HugePageAllocator<U>&) const { return true; }
};

template <class T>
using HugeVector = std::vector<T, HugePageAllocator<T>>;

// The slab pool behind WeightAllocator. slab_allocate takes bytes in [kSlabMin, kSlabMax): the
// block starts on a 64-byte boundary inside a 2 MiB-aligned, MADV_HUGEPAGE slab of kSlabBytes,
// after the previous block; slab_deallocate gets the same size back. Thread-safe. A slab is
// unmapped when its last block is freed. Failing to map a slab throws std::bad_alloc.
inline constexpr size_t kSlabMin = size_t{64} << 10;
inline constexpr size_t kSlabMax = size_t{2} << 20;
inline constexpr size_t kSlabBytes = size_t{32} << 20;
void* slab_allocate(size_t bytes);
void slab_deallocate(void* p, size_t bytes);
// What the pool holds now (tests, diagnostics): slabs mapped, blocks live, and their bytes.
struct SlabStats {
  size_t slabs = 0, blocks = 0, block_bytes = 0;
};
SlabStats slab_stats();
// Whether the pool poisons what is not a live block (AddressSanitizer builds).
bool slab_poisons();

template <class T>
struct WeightAllocator {
  using value_type = T;

  WeightAllocator() = default;
  template <class U>
  WeightAllocator(const WeightAllocator<U>&) {}

  T* allocate(size_t n) {
    const size_t bytes = n * sizeof(T);
    if (bytes >= kSlabMin && bytes < kSlabMax) return static_cast<T*>(slab_allocate(bytes));
    return HugePageAllocator<T>().allocate(n);
  }
  void deallocate(T* p, size_t n) {
    const size_t bytes = n * sizeof(T);
    if (bytes >= kSlabMin && bytes < kSlabMax) slab_deallocate(p, bytes);
    else HugePageAllocator<T>().deallocate(p, n);
  }
  template <class U>
  bool operator==(const WeightAllocator<U>&) const { return true; }
};

template <class T>
using WeightVector = std::vector<T, WeightAllocator<T>>;

// A large zero-filled buffer that the OS backs with memory only where it is written (as calloc's
// is; in 2 MiB pieces where huge pages apply), on a 2 MiB boundary and marked MADV_HUGEPAGE: for
// pools sized for the worst case and filled as they are used (the KV cache), which a decode step
// reads rows of at random pages.
// data() is null when the mapping fails.
class LazyHugeBuffer {
 public:
  LazyHugeBuffer() = default;
  explicit LazyHugeBuffer(size_t bytes) {
    constexpr size_t kHuge = size_t{2} << 20;
    if (bytes == 0) bytes = 1;
    size_ = bytes + kHuge;  // room to start on a 2 MiB boundary
    void* p = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      size_ = 0;
      return;
    }
    base_ = static_cast<uint8_t*>(p);
    data_ = base_ + (kHuge - reinterpret_cast<uintptr_t>(base_) % kHuge) % kHuge;
    madvise(data_, bytes, MADV_HUGEPAGE);  // a hint: failure (no THP support) only costs speed
  }
  LazyHugeBuffer(LazyHugeBuffer&& o) noexcept { *this = std::move(o); }
  LazyHugeBuffer& operator=(LazyHugeBuffer&& o) noexcept {
    std::swap(base_, o.base_);
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    return *this;
  }
  LazyHugeBuffer(const LazyHugeBuffer&) = delete;
  LazyHugeBuffer& operator=(const LazyHugeBuffer&) = delete;
  ~LazyHugeBuffer() {
    if (base_) munmap(base_, size_);
  }
  uint8_t* data() const { return data_; }

 private:
  uint8_t* base_ = nullptr;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace hybridlm
