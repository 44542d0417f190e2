// The slab pool behind WeightAllocator (huge_alloc.h).
#include "base/huge_alloc.h"

#include <sys/mman.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <new>

#if defined(__SANITIZE_ADDRESS__)
#define HYBRIDLM_SLAB_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HYBRIDLM_SLAB_ASAN 1
#endif
#endif
#ifdef HYBRIDLM_SLAB_ASAN
#include <sanitizer/asan_interface.h>
#endif

namespace hybridlm {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kAlign = 64;
#ifdef HYBRIDLM_SLAB_ASAN
// Under AddressSanitizer every byte of a slab outside a live block is poisoned, and blocks are
// kept apart by a poisoned gap, so an overrun into the next matrix or a use after free is
// reported as it is between separate allocations.
constexpr size_t kGap = 64;
void poison(void* p, size_t n) { ASAN_POISON_MEMORY_REGION(p, n); }
void unpoison(void* p, size_t n) { ASAN_UNPOISON_MEMORY_REGION(p, n); }
#else
constexpr size_t kGap = 0;
void poison(void*, size_t) {}
void unpoison(void*, size_t) {}
#endif

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

struct Slab {
  uint8_t* base = nullptr;
  size_t used = 0;    // bytes handed out so far, from base (blocks are never moved or reused)
  size_t blocks = 0;  // live blocks
  size_t bytes = 0;   // their sizes, summed
};

class SlabPool {
 public:
  void* allocate(size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    const size_t step = round_up(bytes + kGap, kAlign);
    if (!current_ || current_->used + step > kSlabBytes) current_ = &map_slab();
    Slab& s = *current_;
    uint8_t* p = s.base + s.used;
    s.used += step;
    ++s.blocks;
    s.bytes += bytes;
    unpoison(p, bytes);
    return p;
  }

  void deallocate(void* ptr, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto at = reinterpret_cast<uintptr_t>(ptr);
    auto it = slabs_.upper_bound(at);
    // A pointer that is not ours is a bug in the caller; leave it alone rather than corrupt a slab.
    if (it == slabs_.begin()) return;
    --it;
    if (at >= it->first + kSlabBytes) return;
    Slab& s = it->second;
    poison(ptr, bytes);
    --s.blocks;
    s.bytes -= bytes;
    if (s.blocks > 0) return;
    if (current_ == &s) current_ = nullptr;
    unpoison(s.base, kSlabBytes);  // the range may be mapped again by anyone
    munmap(s.base, kSlabBytes);
    slabs_.erase(it);
  }

  SlabStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    SlabStats st;
    st.slabs = slabs_.size();
    for (const auto& [base, s] : slabs_) {
      st.blocks += s.blocks;
      st.block_bytes += s.bytes;
    }
    return st;
  }

 private:
  // A fresh slab of kSlabBytes on a 2 MiB boundary: map 2 MiB more and give back the ends.
  Slab& map_slab() {
    const size_t span = kSlabBytes + kHugePage;
    void* m = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) throw std::bad_alloc();
    auto* raw = static_cast<uint8_t*>(m);
    const size_t head = (kHugePage - reinterpret_cast<uintptr_t>(raw) % kHugePage) % kHugePage;
    if (head > 0) munmap(raw, head);
    munmap(raw + head + kSlabBytes, kHugePage - head);
    uint8_t* base = raw + head;
    madvise(base, kSlabBytes, MADV_HUGEPAGE);  // a hint: failure (no THP support) only costs speed
    poison(base, kSlabBytes);
    Slab& s = slabs_[reinterpret_cast<uintptr_t>(base)];
    s.base = base;
    return s;
  }

  std::mutex mu_;
  std::map<uintptr_t, Slab> slabs_;  // by base address
  Slab* current_ = nullptr;          // the slab new blocks are carved from
};

// Never destroyed: a static object's weights may be freed after this file's statics are gone.
SlabPool& pool() {
  static SlabPool* p = new SlabPool;
  return *p;
}

}  // namespace

void* slab_allocate(size_t bytes) { return pool().allocate(bytes); }
void slab_deallocate(void* p, size_t bytes) { pool().deallocate(p, bytes); }
SlabStats slab_stats() { return pool().stats(); }
#ifdef HYBRIDLM_SLAB_ASAN
bool slab_poisons() { return true; }
#else
bool slab_poisons() { return false; }
#endif

}  // namespace hybridlm
