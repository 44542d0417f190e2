#include "cache/state_pool.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "base/error.h"

namespace hybridlm {

StatePool::StatePool(std::vector<LayerStateSpec> layers, int n_slots, DType dtype)
    : layers_(std::move(layers)), dtype_(dtype), in_use_(std::max(0, n_slots), 0) {
  check(dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16,
        "state dtype must be f32, bf16 or f16");
  elem_bytes_ = dtype_size(dtype);
  size_t off = 0;
  for (const auto& l : layers_) {
    offset_.push_back(off);
    off += l.elems();
  }
  // Round each slot up to a 64-byte multiple so slots start on cache lines.
  const size_t per_line = 64 / elem_bytes_;
  slot_elems_ = (off + per_line - 1) / per_line * per_line;
  if (dtype == DType::F32) f32_.assign(slot_elems_ * in_use_.size(), 0.0f);
  else h16_.assign(slot_elems_ * in_use_.size(), 0);
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
  if (bytes_per_slot() > 0) std::memset(slot_bytes(slot), 0, bytes_per_slot());  // zero bits = 0.0 in every dtype
}

void StatePool::copy(int src, int dst) {
  check_live(src);
  check_live(dst);
  if (src != dst && bytes_per_slot() > 0) std::memcpy(slot_bytes(dst), slot_bytes(src), bytes_per_slot());
}

uint8_t* StatePool::slot_bytes(int slot) {
  return dtype_ == DType::F32 ? reinterpret_cast<uint8_t*>(f32_.data() + static_cast<size_t>(slot) * slot_elems_)
                              : reinterpret_cast<uint8_t*>(h16_.data() + static_cast<size_t>(slot) * slot_elems_);
}
const uint8_t* StatePool::slot_bytes(int slot) const { return const_cast<StatePool*>(this)->slot_bytes(slot); }

float* StatePool::conv_state(int slot, int layer) {
  check(dtype_ == DType::F32, "direct state views need f32 storage");
  return f32_.data() + static_cast<size_t>(slot) * slot_elems_ + offset_[layer];
}
float* StatePool::ssm_state(int slot, int layer) { return conv_state(slot, layer) + layers_[layer].conv_elems(); }

uint16_t* StatePool::ssm_state_bf16(int slot, int layer) {
  check(dtype_ == DType::BF16, "bf16 state views need bf16 storage");
  return h16_.data() + static_cast<size_t>(slot) * slot_elems_ + offset_[layer] + layers_[layer].conv_elems();
}

void StatePool::read_layer(int slot, int layer, float* out) const {
  read_layer_range(slot, layer, 0, layers_[layer].elems(), out);
}

void StatePool::write_layer(int slot, int layer, const float* in) {
  write_layer_range(slot, layer, 0, layers_[layer].elems(), in);
}

void StatePool::read_layer_range(int slot, int layer, size_t begin, size_t end, float* out) const {
  const size_t n = end - begin, at = static_cast<size_t>(slot) * slot_elems_ + offset_[layer] + begin;
  if (dtype_ == DType::F32) std::memcpy(out, f32_.data() + at, n * sizeof(float));
  else if (dtype_ == DType::BF16) for (size_t i = 0; i < n; ++i) out[i] = bf16_to_f32(h16_[at + i]);
  else for (size_t i = 0; i < n; ++i) out[i] = f16_to_f32(h16_[at + i]);
}

void StatePool::write_layer_range(int slot, int layer, size_t begin, size_t end, const float* in) {
  const size_t n = end - begin, at = static_cast<size_t>(slot) * slot_elems_ + offset_[layer] + begin;
  if (dtype_ == DType::F32) std::memcpy(f32_.data() + at, in, n * sizeof(float));
  else if (dtype_ == DType::BF16) for (size_t i = 0; i < n; ++i) h16_[at + i] = f32_to_bf16(in[i]);
  else for (size_t i = 0; i < n; ++i) h16_[at + i] = f32_to_f16(in[i]);
}

int StatePool::in_use() const {
  return static_cast<int>(std::count(in_use_.begin(), in_use_.end(), 1));
}

}  // namespace hybridlm
