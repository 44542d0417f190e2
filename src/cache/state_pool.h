// Per-sequence SSM state slots: the recurrent half of the hybrid cache (ARCHITECTURE.md section 4).
// A slot holds, for every layer with recurrent state, the conv state (K-1 rows of the conv's input
// channels, oldest first) and the SSM state (Mamba-1: (d_inner, d_state); Mamba-2: (n_heads,
// head_dim, d_state)) in one contiguous block. The storage type is f32 (default) or bf16 / f16
// (half the memory; the model computes on f32 copies of one layer at a time). Slots are fixed at
// construction, zeroed on acquire, never paged or evicted, and copied as whole units.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tensor/dtype.h"

namespace hybridlm {

struct LayerStateSpec {
  int conv_rows = 0;      // K - 1
  int conv_channels = 0;  // channels the conv runs over
  size_t ssm_elems = 0;   // elements of the SSM state
  size_t conv_elems() const { return static_cast<size_t>(conv_rows) * conv_channels; }
  size_t elems() const { return conv_elems() + ssm_elems; }
  size_t bytes(size_t elem_bytes = sizeof(float)) const { return elems() * elem_bytes; }
};

class StatePool {
 public:
  // dtype: F32, BF16 or F16.
  StatePool(std::vector<LayerStateSpec> layers, int n_slots, DType dtype = DType::F32);

  // A free slot, zeroed. Throws Error when every slot is in use.
  int acquire();
  void release(int slot);
  void reset(int slot);                   // zero it
  void copy(int src_slot, int dst_slot);  // fork: dst becomes a copy of src

  // f32 storage only: views into a slot.
  float* conv_state(int slot, int layer);
  float* ssm_state(int slot, int layer);
  // bf16 storage only: the SSM state of a slot's layer, in place (decode kernels update it directly).
  uint16_t* ssm_state_bf16(int slot, int layer);
  // Any storage: one layer's state as f32 (conv then SSM, layer.elems() floats), and back
  // (rounded to the storage type).
  void read_layer(int slot, int layer, float* out) const;
  void write_layer(int slot, int layer, const float* in);
  // Elements [begin, end) of a layer's state (out / in point at element begin).
  void read_layer_range(int slot, int layer, size_t begin, size_t end, float* out) const;
  void write_layer_range(int slot, int layer, size_t begin, size_t end, const float* in);

  // The whole slot as raw bytes (snapshot / restore).
  uint8_t* slot_bytes(int slot);
  const uint8_t* slot_bytes(int slot) const;
  size_t bytes_per_slot() const { return slot_elems_ * elem_bytes_; }

  DType dtype() const { return dtype_; }
  int capacity() const { return static_cast<int>(in_use_.size()); }
  int in_use() const;
  bool is_live(int slot) const;
  const std::vector<LayerStateSpec>& layers() const { return layers_; }

 private:
  void check_live(int slot) const;
  std::vector<LayerStateSpec> layers_;
  DType dtype_;
  size_t elem_bytes_;
  std::vector<size_t> offset_;  // per layer, in elements: conv state, then SSM state
  size_t slot_elems_ = 0;
  std::vector<float> f32_;      // F32 storage
  std::vector<uint16_t> h16_;   // BF16 / F16 storage
  std::vector<uint8_t> in_use_;
};

}  // namespace hybridlm
