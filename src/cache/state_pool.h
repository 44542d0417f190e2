// Per-sequence SSM state slots: the recurrent half of the hybrid cache (ARCHITECTURE.md section 4).
// A slot holds, for every SSM layer, the conv state (K-1 rows of the conv's input channels, oldest
// first) and the SSM state (Mamba-1: (d_inner, d_state); Mamba-2: (n_heads, head_dim, d_state)),
// all f32, in one contiguous block. Slots are fixed at construction, zeroed on acquire, never paged
// or evicted, and copied as whole units (fork, snapshot). Attention layers will get a paged KV
// store beside this pool; layers without recurrent state have an empty spec here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace hybridlm {

struct LayerStateSpec {
  int conv_rows = 0;      // K - 1
  int conv_channels = 0;  // channels the conv runs over
  size_t ssm_elems = 0;   // elements of the SSM state
  size_t conv_elems() const { return static_cast<size_t>(conv_rows) * conv_channels; }
  size_t bytes() const { return (conv_elems() + ssm_elems) * sizeof(float); }
};

class StatePool {
 public:
  StatePool(std::vector<LayerStateSpec> layers, int n_slots);

  // A free slot, zeroed. Throws Error when every slot is in use.
  int acquire();
  void release(int slot);
  void reset(int slot);                // zero it
  void copy(int src_slot, int dst_slot);  // fork: dst becomes a copy of src

  // Views into a slot (nullptr-free for layers with state).
  float* conv_state(int slot, int layer);
  float* ssm_state(int slot, int layer);
  // The whole slot as one block (snapshot / restore).
  float* slot_data(int slot);
  const float* slot_data(int slot) const;
  size_t slot_floats() const { return slot_floats_; }

  size_t bytes_per_slot() const { return slot_floats_ * sizeof(float); }
  int capacity() const { return static_cast<int>(in_use_.size()); }
  int in_use() const;
  bool is_live(int slot) const;
  const std::vector<LayerStateSpec>& layers() const { return layers_; }

 private:
  void check_live(int slot) const;
  std::vector<LayerStateSpec> layers_;
  std::vector<size_t> conv_offset_, ssm_offset_;
  size_t slot_floats_ = 0;
  std::vector<float> data_;
  std::vector<uint8_t> in_use_;
};

}  // namespace hybridlm
