#include "cache/state_pool.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "base/error.h"

namespace hybridlm {

StatePool::StatePool(std::vector<LayerStateSpec> layers, int n_slots)
    : layers_(std::move(layers)), in_use_(std::max(0, n_slots), 0) {
  size_t off = 0;
  for (const auto& l : layers_) {
    conv_offset_.push_back(off);
    off += l.conv_elems();
    ssm_offset_.push_back(off);
    off += l.ssm_elems;
  }
  // Round each slot up to a 64-byte multiple so slots start on cache lines.
  slot_floats_ = (off + 15) / 16 * 16;
  data_.assign(slot_floats_ * in_use_.size(), 0.0f);
}

int StatePool::acquire() {
  for (size_t i = 0; i < in_use_.size(); ++i) {
    if (!in_use_[i]) {
      in_use_[i] = 1;
      reset(static_cast<int>(i));
      return static_cast<int>(i);
    }
  }
  throw Error("state pool full: all " + std::to_string(in_use_.size()) + " sequence slots are in use");
}

void StatePool::check_live(int slot) const {
  if (!is_live(slot)) throw Error("state slot " + std::to_string(slot) + " is not in use");
}

bool StatePool::is_live(int slot) const {
  return slot >= 0 && static_cast<size_t>(slot) < in_use_.size() && in_use_[slot];
}

void StatePool::release(int slot) {
  check_live(slot);
  in_use_[slot] = 0;
}

void StatePool::reset(int slot) {
  check_live(slot);
  std::fill_n(slot_data(slot), slot_floats_, 0.0f);
}

void StatePool::copy(int src, int dst) {
  check_live(src);
  check_live(dst);
  if (src != dst) std::memcpy(slot_data(dst), slot_data(src), slot_floats_ * sizeof(float));
}

float* StatePool::slot_data(int slot) { return data_.data() + static_cast<size_t>(slot) * slot_floats_; }
const float* StatePool::slot_data(int slot) const {
  return data_.data() + static_cast<size_t>(slot) * slot_floats_;
}
float* StatePool::conv_state(int slot, int layer) { return slot_data(slot) + conv_offset_[layer]; }
float* StatePool::ssm_state(int slot, int layer) { return slot_data(slot) + ssm_offset_[layer]; }

int StatePool::in_use() const {
  return static_cast<int>(std::count(in_use_.begin(), in_use_.end(), 1));
}

}  // namespace hybridlm
