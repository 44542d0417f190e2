// The kernels' per-thread scratch (ARCHITECTURE.md: one arena per lifetime). A kernel that needs
// working memory (the GEMM's packed panels, the SSD's chunk matrices, a transposed state block)
// takes it from the calling thread's arena for the length of the call, in a ScratchFrame. The
// arenas are sized once, when the engine is built, from the model's largest shapes at the engine's
// tokens per step (KernelLimits, KernelTable::scratch_floats): thread 0 (the one that calls
// parallel_for, which also holds the per-call buffers shared by all threads) and every worker.
#pragma once

#include <cstddef>
#include <vector>

#include "base/arena.h"
#include "base/huge_alloc.h"
#include "base/thread_pool.h"
#include "kernels/kernels.h"

namespace hybridlm {

class KernelScratch {
 public:
  // Arenas for `threads` threads of need.caller (thread 0) and need.worker floats; only grows.
  void reserve(int threads, ScratchNeed need) {
    if (threads <= threads_ && need.caller <= need_.caller && need.worker <= need_.worker) return;
    threads_ = std::max(threads, threads_);
    need_ = {std::max(need.caller, need_.caller), std::max(need.worker, need_.worker)};
    buf_.assign(need_.caller + static_cast<size_t>(threads_ - 1) * need_.worker, 0.0f);
    slots_.assign(static_cast<size_t>(threads_), Slot{});
    for (int t = 0; t < threads_; ++t)
      slots_[t].arena = t == 0 ? FloatArena(buf_.data(), need_.caller)
                               : FloatArena(buf_.data() + need_.caller + (t - 1) * need_.worker, need_.worker);
  }
  // The calling thread's arena.
  FloatArena& local() {
    const int t = ThreadPool::thread_index();
    check(t < threads_, "kernel scratch reserved for ", threads_, " threads, used by thread ", t);
    return slots_[t].arena;
  }
  ScratchNeed reserved() const { return need_; }

 private:
  struct alignas(64) Slot {  // a cache line each: threads bump their own counters
    FloatArena arena;
  };
  int threads_ = 0;
  ScratchNeed need_;
  HugeVector<float> buf_;
  std::vector<Slot> slots_;
};

// Floats from the calling thread's arena for one kernel call, given back when the frame ends.
// Frames nest (a kernel's frame, then the frame of the parallel body on the same thread). With no
// scratch in the context (a kernel test or a tool calling one kernel), each take allocates.
class ScratchFrame {
 public:
  explicit ScratchFrame(const KernelContext& ctx)
      : arena_(ctx.scratch ? &ctx.scratch->local() : nullptr), mark_(arena_ ? arena_->used() : 0) {}
  ~ScratchFrame() {
    if (arena_) arena_->rewind(mark_);
  }
  ScratchFrame(const ScratchFrame&) = delete;
  ScratchFrame& operator=(const ScratchFrame&) = delete;

  float* take(size_t n) {
    if (arena_) return arena_->take(n);
    owned_.emplace_back(n);
    return owned_.back().data();
  }
  // n values of a 4-byte or smaller type T (q8 codes, int32 sums), in float slots.
  template <class T>
  T* take_as(size_t n) {
    static_assert(sizeof(T) <= sizeof(float) && alignof(T) <= alignof(float));
    return reinterpret_cast<T*>(take(floats_for<T>(n)));
  }
  template <class T>
  static constexpr size_t floats_for(size_t n) {
    return (n * sizeof(T) + sizeof(float) - 1) / sizeof(float);
  }

 private:
  FloatArena* arena_;
  size_t mark_;
  std::vector<std::vector<float>> owned_;
};

}  // namespace hybridlm
