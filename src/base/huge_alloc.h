// An allocator for large, long-lived buffers (weights in memory): blocks of 2 MiB or more start
// on a 2 MiB boundary and are marked MADV_HUGEPAGE, so a decode step that streams hundreds of MB
// through the matmuls takes few TLB misses (many systems set transparent huge pages to
// "madvise", where plain allocations never get them). The size is not rounded up (no 2 MiB of
// slack per matrix). Smaller blocks come from operator new.
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
