// The hybrid cache (ARCHITECTURE.md section 4): per sequence, one state slot for every recurrent
// layer (conv + SSM state, fixed size, never paged) and one block table of KV pages shared by all
// attention layers (paged, refcounted, copy-on-write). It owns every sequence operation: add,
// remove, reset, fork, reorder, snapshot / restore and crop. The runtime is its only writer; a
// forward step calls prepare() (all-or-nothing page allocation) before it writes anything and
// commit() after it succeeded.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/thread_pool.h"
#include "cache/state_pool.h"
#include "kernels/kernels.h"

namespace hybridlm {

// What a layer keeps per sequence. Zamba2's hybrid layers are MambaAndAttention; LFM2's short
// conv layers are Conv (a conv state and no SSM state).
enum class LayerCacheKind { None, Attention, Mamba, MambaAndAttention, Conv };
const char* layer_cache_kind_name(LayerCacheKind k);

struct KvLayerSpec {
  int n_kv_heads = 0, head_dim = 0;
  // K and V of one token, stored as `dtype` (F32, BF16 or F16: the cache's kv_dtype).
  size_t elems_per_token() const { return 2 * static_cast<size_t>(n_kv_heads) * head_dim; }
  size_t bytes_per_token(DType dtype) const { return elems_per_token() * dtype_size(dtype); }
};

struct LayerCacheSpec {
  LayerCacheKind kind = LayerCacheKind::None;
  LayerStateSpec state;  // recurrent part (Mamba, MambaAndAttention, Conv)
  KvLayerSpec kv;        // attention part (Attention, MambaAndAttention)
  bool has_state() const { return state.bytes() > 0; }
  bool has_kv() const { return kind == LayerCacheKind::Attention || kind == LayerCacheKind::MambaAndAttention; }
};

// What layers keep, in bytes, at the given storage dtypes: the one derivation of the cache's
// sizes, which the cache's accounting, the engine's memory check, `plan` and `inspect` all read.
struct CacheFootprint {
  size_t conv_per_sequence = 0;  // conv states, all layers
  size_t ssm_per_sequence = 0;   // SSM states, all layers
  size_t kv_per_token = 0;       // K and V of one token, all attention layers
  size_t state_per_sequence() const { return conv_per_sequence + ssm_per_sequence; }
};
CacheFootprint cache_footprint(std::span<const LayerCacheSpec> layers, DType state_dtype, DType kv_dtype);

struct CacheOptions {
  int max_sequences = 8;
  int block_size = 16;  // tokens per KV page
  // KV pages in the pool; 0 = enough for every sequence to reach `context` tokens.
  int kv_pages = 0;
  int context = 4096;
  DType state_dtype = DType::F32;  // recurrent state storage: F32, BF16 or F16
  // KV page storage: F32, BF16 or F16 (rows rounded to nearest even when written). F32 here, the
  // exact storage; the engine defaults to BF16 (EngineOptions::kv_dtype).
  DType kv_dtype = DType::F32;
};

// One run of a varlen batch: `len` tokens continuing sequence `seq`.
struct BatchRun {
  int seq = 0;
  int len = 0;
};

class KvPagePool;

// A sequence's whole cache at one moment: its recurrent state (copied) and its KV pages (shared:
// the pages are held by reference count and never written while shared). A value: keep it as
// long as needed, restore it into any sequence of the same cache, drop it to free its pages.
class Snapshot {
 public:
  Snapshot() = default;
  Snapshot(Snapshot&&) noexcept;
  Snapshot& operator=(Snapshot&&) noexcept;
  Snapshot(const Snapshot&) = delete;
  Snapshot& operator=(const Snapshot&) = delete;
  ~Snapshot();
  int length() const { return length_; }
  bool empty() const { return pages_owner_ == nullptr; }
  const std::vector<uint8_t>& state() const { return state_; }  // the slot's bytes (all layers)

 private:
  friend class HybridCache;
  void drop();
  std::shared_ptr<KvPagePool> pages_owner_;
  std::vector<uint8_t> state_;
  std::vector<int32_t> pages_;
  int length_ = 0;
};

class HybridCache {
 public:
  HybridCache(std::vector<LayerCacheSpec> layers, const CacheOptions& opt);
  ~HybridCache();
  HybridCache(const HybridCache&) = delete;
  HybridCache& operator=(const HybridCache&) = delete;

  // ---- sequence operations ----
  int add();                 // a new empty sequence; Error when max_sequences are live
  void remove(int seq);      // frees its slot and its pages
  void reset(int seq);       // back to empty: state zeroed, pages released
  int fork(int seq);         // a new sequence equal to seq (state copied, KV pages shared)
  // Beam-search gather: afterwards seqs[i] holds what seqs[src[i]] held before (src indexes seqs).
  void reorder(std::span<const int> seqs, std::span<const int> src);
  Snapshot snapshot(int seq) const;
  void restore(int seq, const Snapshot& snap);  // also forgets the snapshots kept for crop()
  // Keeps a snapshot of seq at its current length, for crop() to return to.
  void keep_snapshot(int seq);
  // Back to the first n tokens. Attention pages are truncated; recurrent layers need a kept
  // snapshot at exactly n tokens (Error naming the lengths kept otherwise). Kept snapshots past n
  // are dropped.
  void crop(int seq, int n);
  int seq_length(int seq) const;  // tokens in the attention layers (a counter for pure SSMs)
  bool is_live(int seq) const;
  std::vector<int> kept_lengths(int seq) const;

  // ---- forward-step interface ----
  // Makes room for every run's tokens: allocates pages and un-shares a shared last page. Checks
  // everything first and changes nothing when it throws (KV pool exhausted, dead sequence).
  void prepare(std::span<const BatchRun> runs);
  void commit(std::span<const BatchRun> runs);  // lengths += len
  // A step that threw after prepare (out of memory mid-layer): give back the pages it took and
  // mark its sequences failed (their recurrent state may be part-advanced) until reset / restore.
  void fail_step(std::span<const BatchRun> runs);
  // Free pages that `more` further tokens of seq would take (including un-sharing its last page).
  int64_t pages_needed(int seq, int64_t more) const;
  // One layer's recurrent state of the runs' sequences, as f32 the model can update in place:
  // with f32 storage the slots themselves; with bf16 / f16 storage, staging copies that
  // load_state fills and store_state rounds back into the slots.
  // The conversions are split over `pool` when given (a sequence's state is megabytes).
  // bf16_in_place: with bf16 storage and a step of single-token runs (decode), only the conv
  // states are staged; the SSM states stay bf16 and the decode kernels update them in place
  // (ssm_state_bf16), which halves their traffic and skips two copies. ssm_state() is then null.
  void load_state(std::span<const BatchRun> runs, int layer, ThreadPool* pool = nullptr, bool bf16_in_place = false);
  void store_state(std::span<const BatchRun> runs, int layer, ThreadPool* pool = nullptr);
  float* conv_state(int seq, int layer);
  float* ssm_state(int seq, int layer);
  uint16_t* ssm_state_bf16(int seq, int layer);  // null unless load_state kept this layer's SSM states bf16
  PagedKv kv(int seq, int layer);  // layer must have KV

  // ---- accounting ----
  const std::vector<LayerCacheSpec>& layers() const { return layers_; }
  int max_sequences() const { return states_.capacity(); }
  int live_sequences() const { return states_.in_use(); }
  int block_size() const { return block_size_; }
  int total_pages() const;
  int free_pages() const;
  size_t state_bytes_per_sequence() const { return states_.bytes_per_slot(); }
  size_t kv_bytes_per_token() const;  // all attention layers, at kv_dtype()
  DType kv_dtype() const { return kv_dtype_; }
  DType state_dtype() const { return states_.dtype(); }
  bool has_state() const { return has_state_; }
  bool has_kv() const { return has_kv_; }

 private:
  struct Seq {
    std::vector<int32_t> pages;
    int length = 0;
    std::vector<Snapshot> kept;
    bool failed = false;
  };
  void check_live(int seq) const;
  void release_pages(Seq& s);
  void clear(Seq& s);  // empty, keeping the block table's capacity
  std::vector<LayerCacheSpec> layers_;
  std::vector<int> kv_index_;  // model layer -> index into the page pool's layers, or -1
  int block_size_;
  DType kv_dtype_;
  bool has_state_ = false, has_kv_ = false;
  StatePool states_;
  std::vector<float> staging_;       // 16-bit storage: one layer of the loaded sequences, f32
  std::vector<int> staged_at_;       // per seq: index into staging_ (in layer states), or -1
  int staged_layer_ = -1;
  // Floats staged per sequence for the staged layer: its whole state, or its conv state only.
  size_t staged_elems(int layer) const;
  bool ssm_in_place_ = false;        // the staged layer's SSM states were left in bf16 storage
  std::shared_ptr<KvPagePool> pages_;
  std::vector<Seq> seqs_;  // indexed by seq id (= state slot)
  std::vector<std::pair<int32_t, int>> writers_;  // prepare(): shared pages a step writes into
};

}  // namespace hybridlm
