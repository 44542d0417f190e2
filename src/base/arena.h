// A bump allocator of floats over one buffer: the forward step's scratch (ARCHITECTURE.md: one
// arena per lifetime). A block takes its buffers in order and the model rewinds between layers;
// nothing is freed one by one. An arena over no buffer counts instead: it hands out nulls and adds
// up what the same takes would use, so a block writes its list of buffers once and sizes the
// arena from it (see Mixer::scratch_floats).
#pragma once

#include <cstddef>

#include "base/error.h"

namespace hybridlm {

class FloatArena {
 public:
  FloatArena() = default;  // counting: take() returns nullptr
  FloatArena(float* base, size_t size) : base_(base), size_(size) {}

  // n floats, 64-byte aligned relative to the base (whole cache lines for the SIMD kernels).
  float* take(size_t n) {
    const size_t at = used_;
    used_ += rounded(n);
    if (!base_) return nullptr;
    check(used_ <= size_, "scratch arena of ", size_, " floats overrun (", used_, " taken): a block or kernel "
          "took more than its scratch_floats() declared");
    return base_ + at;
  }
  size_t used() const { return used_; }
  // What take(n) uses of the arena (n rounded up to whole cache lines): for sizing one by hand.
  static constexpr size_t rounded(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
  // Give back everything taken after `mark` (a value of used()).
  void rewind(size_t mark) { used_ = mark; }

 private:
  static constexpr size_t kAlign = 16;
  float* base_ = nullptr;
  size_t size_ = 0, used_ = 0;
};

}  // namespace hybridlm
