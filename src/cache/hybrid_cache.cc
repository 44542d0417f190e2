#include "cache/hybrid_cache.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "base/error.h"
#include "base/huge_alloc.h"

namespace hybridlm {

const char* layer_cache_kind_name(LayerCacheKind k) {
  switch (k) {
    case LayerCacheKind::None: return "none";
    case LayerCacheKind::Attention: return "attention";
    case LayerCacheKind::Mamba: return "mamba";
    case LayerCacheKind::MambaAndAttention: return "mamba+attention";
    case LayerCacheKind::Conv: return "conv";
  }
  return "?";
}

// The KV pages of every attention layer. Layer l's storage is K then V, each n_kv_heads regions
// of n_pages pages of (block_size, head_dim): each KV head has its own region, so a head's keys
// are one run of memory per page, and one long run over consecutive pages (see PagedKv). The
// elements are `dtype` (F32, BF16 or F16). One page id names the same token range in every layer,
// so a sequence needs one block table for all layers. Storage is a LazyHugeBuffer: pages are
// zero, the OS backs them with memory only when first written, and in 2 MiB pages where it can
// (attention at long context reads rows from pages all over the pool). Writing a page touches
// 2 x n_kv_heads places per layer, so a pool of regions over 2 MiB holds up to that many 2 MiB
// pages per layer from its first token on (never more than the pool).
class KvPagePool {
 public:
  KvPagePool(const std::vector<KvLayerSpec>& layers, int block_size, int n_pages, DType dtype)
      : dtype_(dtype), elem_bytes_(dtype_size(dtype)), refs_(static_cast<size_t>(n_pages), 0) {
    for (const KvLayerSpec& l : layers) {
      Layer L;
      L.n_heads = l.n_kv_heads;
      L.head_page = static_cast<size_t>(block_size) * l.head_dim;
      check(n_pages == 0 || 2 * L.head_page * l.n_kv_heads <= (size_t{1} << 40) / static_cast<size_t>(n_pages),
            "KV cache of ", n_pages, " pages x ", 2 * L.head_page * l.n_kv_heads, " values is too large");
      L.region = L.head_page * n_pages;
      L.v_offset = L.region * l.n_kv_heads;
      L.data = LazyHugeBuffer(2 * L.v_offset * elem_bytes_);
      check(L.data.data() != nullptr, "cannot allocate the KV cache (", n_pages, " pages)");
      layers_.push_back(std::move(L));
    }
    for (int p = n_pages - 1; p >= 0; --p) free_.push_back(p);
  }
  int alloc() {
    check(!free_.empty(), "KV cache full");
    const int p = free_.back();
    free_.pop_back();
    refs_[p] = 1;
    return p;
  }
  void ref(int p) { ++refs_[p]; }
  void unref(int p) {
    if (--refs_[p] == 0) free_.push_back(p);
  }
  int refcount(int p) const { return refs_[p]; }
  int free_count() const { return static_cast<int>(free_.size()); }
  int total() const { return static_cast<int>(refs_.size()); }
  void copy(int src, int dst) {
    for (Layer& L : layers_) {
      const size_t bytes = L.head_page * elem_bytes_;
      for (int h = 0; h < 2 * L.n_heads; ++h) {  // K's heads, then V's
        uint8_t* region = L.data.data() + static_cast<size_t>(h) * L.region * elem_bytes_;
        std::memcpy(region + static_cast<size_t>(dst) * bytes, region + static_cast<size_t>(src) * bytes, bytes);
      }
    }
  }
  PagedKv view(int layer, int block_size, const KvLayerSpec& spec, const int32_t* pages) {
    Layer& L = layers_[layer];
    PagedKv kv{L.data.data(), L.data.data() + L.v_offset * elem_bytes_, pages, block_size, spec.n_kv_heads,
               spec.head_dim, L.head_page, dtype_};
    kv.token_stride = static_cast<size_t>(spec.head_dim);
    kv.head_stride = L.region;
    return kv;
  }

 private:
  struct Layer {
    LazyHugeBuffer data;
    int n_heads = 0;
    size_t head_page = 0, region = 0, v_offset = 0;  // in elements: a head's page, a head's region, V's start
  };
  DType dtype_;
  size_t elem_bytes_;
  std::vector<Layer> layers_;
  std::vector<int> refs_;
  std::vector<int32_t> free_;
};

// ---- Snapshot ---------------------------------------------------------------------------------

Snapshot::Snapshot(Snapshot&& o) noexcept { *this = std::move(o); }
Snapshot& Snapshot::operator=(Snapshot&& o) noexcept {
  if (this != &o) {
    drop();
    pages_owner_ = std::move(o.pages_owner_);
    state_ = std::move(o.state_);
    pages_ = std::move(o.pages_);
    length_ = o.length_;
    o.pages_owner_.reset();
    o.pages_.clear();
  }
  return *this;
}
Snapshot::~Snapshot() { drop(); }
void Snapshot::drop() {
  if (pages_owner_)
    for (int32_t p : pages_) pages_owner_->unref(p);
  pages_owner_.reset();
  pages_.clear();
  state_.clear();
}

// ---- HybridCache --------------------------------------------------------------------------------

static std::vector<LayerStateSpec> state_layers(const std::vector<LayerCacheSpec>& layers) {
  std::vector<LayerStateSpec> out;
  for (const LayerCacheSpec& l : layers) out.push_back(l.state);
  return out;
}

HybridCache::HybridCache(std::vector<LayerCacheSpec> layers, const CacheOptions& opt)
    : layers_(std::move(layers)),
      block_size_(opt.block_size),
      kv_dtype_(opt.kv_dtype),
      states_(state_layers(layers_), opt.max_sequences, opt.state_dtype),
      staged_at_(static_cast<size_t>(std::max(0, opt.max_sequences)), -1) {
  check(opt.max_sequences > 0, "the cache needs at least one sequence (max sequences = ", opt.max_sequences, ")");
  check(opt.block_size > 0 && opt.block_size <= 4096, "KV block size must be in [1, 4096], got ", opt.block_size);
  check(opt.kv_dtype == DType::F32 || opt.kv_dtype == DType::BF16 || opt.kv_dtype == DType::F16,
        "KV cache dtype ", dtype_name(opt.kv_dtype), ": use F32, BF16 or F16");
  std::vector<KvLayerSpec> kv_layers;
  for (const LayerCacheSpec& l : layers_) {
    kv_index_.push_back(l.has_kv() ? static_cast<int>(kv_layers.size()) : -1);
    if (l.has_kv()) kv_layers.push_back(l.kv);
    has_state_ = has_state_ || l.has_state();
  }
  has_kv_ = !kv_layers.empty();
  int n_pages = 0;
  if (has_kv_) {
    check(opt.context > 0 && opt.kv_pages >= 0, "context and KV pages must be positive");
    const int64_t per_seq = (static_cast<int64_t>(opt.context) + opt.block_size - 1) / opt.block_size;
    const int64_t want = opt.kv_pages > 0 ? opt.kv_pages : per_seq * opt.max_sequences;
    check(want <= (int64_t{1} << 30), "KV cache of ", want, " pages is too large");
    n_pages = static_cast<int>(want);
  }
  pages_ = std::make_shared<KvPagePool>(kv_layers, block_size_, n_pages, kv_dtype_);
  seqs_.resize(static_cast<size_t>(opt.max_sequences));
  // Block tables and the step's scratch at their working size now, so that a step never allocates
  // (a sequence past `context` tokens may still grow its table).
  if (has_kv_) {
    const int64_t per_seq = (static_cast<int64_t>(opt.context) + opt.block_size - 1) / opt.block_size;
    for (Seq& q : seqs_) q.pages.reserve(static_cast<size_t>(std::min<int64_t>(per_seq, n_pages)));
    writers_.reserve(seqs_.size());
  }
}

void HybridCache::clear(Seq& s) {
  release_pages(s);
  s.length = 0;
  s.kept.clear();
  s.failed = false;
}

HybridCache::~HybridCache() = default;

void HybridCache::check_live(int seq) const {
  check(states_.is_live(seq), "sequence ", seq, " is not in the cache");
}
bool HybridCache::is_live(int seq) const { return states_.is_live(seq); }

int HybridCache::add() {
  const int s = states_.acquire();
  clear(seqs_[s]);
  return s;
}

void HybridCache::release_pages(Seq& s) {
  for (int32_t p : s.pages) pages_->unref(p);
  s.pages.clear();
}

void HybridCache::remove(int seq) {
  check_live(seq);
  clear(seqs_[seq]);
  states_.release(seq);
}

void HybridCache::reset(int seq) {
  check_live(seq);
  clear(seqs_[seq]);
  states_.reset(seq);
}

int HybridCache::fork(int seq) {
  check_live(seq);
  const int child = states_.acquire();
  states_.copy(seq, child);
  Seq& c = seqs_[child];
  clear(c);
  c.pages = seqs_[seq].pages;
  for (int32_t p : c.pages) pages_->ref(p);
  c.length = seqs_[seq].length;
  return child;
}

Snapshot HybridCache::snapshot(int seq) const {
  check_live(seq);
  Snapshot s;
  s.pages_owner_ = pages_;
  s.state_.assign(states_.slot_bytes(seq), states_.slot_bytes(seq) + states_.bytes_per_slot());
  s.pages_ = seqs_[seq].pages;
  for (int32_t p : s.pages_) pages_->ref(p);
  s.length_ = seqs_[seq].length;
  return s;
}

void HybridCache::restore(int seq, const Snapshot& snap) {
  check_live(seq);
  check(snap.pages_owner_ == pages_, "snapshot restored into a different cache (or an empty snapshot)");
  Seq& s = seqs_[seq];
  for (int32_t p : snap.pages_) pages_->ref(p);  // before releasing: snap may share s's pages
  release_pages(s);
  s.pages = snap.pages_;
  s.length = snap.length_;
  s.kept.clear();
  s.failed = false;
  std::copy(snap.state_.begin(), snap.state_.end(), states_.slot_bytes(seq));
}

void HybridCache::reorder(std::span<const int> seqs, std::span<const int> src) {
  check(seqs.size() == src.size(), "reorder: ", seqs.size(), " sequences but ", src.size(), " source indices");
  for (int s : seqs) check_live(s);
  for (int i : src)
    check(i >= 0 && static_cast<size_t>(i) < seqs.size(), "reorder: source index ", i, " outside the ", seqs.size(),
        " sequences");
  // Only moved sequences are copied: first snapshot every source that feeds another position,
  // then overwrite the destinations (a beam that keeps its own history is not touched).
  std::vector<Snapshot> from(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i)
    if (static_cast<size_t>(src[i]) != i && from[src[i]].empty()) from[src[i]] = snapshot(seqs[src[i]]);
  for (size_t i = 0; i < seqs.size(); ++i)
    if (static_cast<size_t>(src[i]) != i) restore(seqs[i], from[src[i]]);
}

void HybridCache::keep_snapshot(int seq) {
  check_live(seq);
  std::vector<Snapshot>& kept = seqs_[seq].kept;
  const int len = seqs_[seq].length;
  std::erase_if(kept, [&](const Snapshot& k) { return k.length() == len; });
  kept.push_back(snapshot(seq));
}

std::vector<int> HybridCache::kept_lengths(int seq) const {
  check_live(seq);
  std::vector<int> out;
  for (const Snapshot& k : seqs_[seq].kept) out.push_back(k.length());
  std::sort(out.begin(), out.end());
  return out;
}

void HybridCache::crop(int seq, int n) {
  check_live(seq);
  Seq& s = seqs_[seq];
  check(n >= 0 && n <= s.length, "cannot crop sequence ", seq, " of ", s.length, " tokens to ", n);
  if (n == s.length) return;
  if (has_state_) {
    auto it = std::find_if(s.kept.begin(), s.kept.end(), [&](const Snapshot& k) { return k.length() == n; });
    if (it == s.kept.end()) {
      std::string have;
      for (int l : kept_lengths(seq)) have += (have.empty() ? "" : ", ") + std::to_string(l);
      throw Error("cannot crop sequence " + std::to_string(seq) + " to " + std::to_string(n) +
                  " tokens: its recurrent state at " + std::to_string(n) + " tokens was not kept (kept: " +
                  (have.empty() ? "none" : have) + ")");
    }
    std::vector<Snapshot> kept = std::move(s.kept);
    std::erase_if(kept, [&](const Snapshot& k) { return k.length() > n; });
    const Snapshot& at = *std::find_if(kept.begin(), kept.end(), [&](const Snapshot& k) { return k.length() == n; });
    restore(seq, at);
    s.kept = std::move(kept);
    return;
  }
  const size_t keep_pages = (static_cast<size_t>(n) + block_size_ - 1) / block_size_;
  for (size_t i = keep_pages; i < s.pages.size(); ++i) pages_->unref(s.pages[i]);
  s.pages.resize(keep_pages);
  s.length = n;
  std::erase_if(s.kept, [&](const Snapshot& k) { return k.length() > n; });
}

int HybridCache::seq_length(int seq) const {
  check_live(seq);
  return seqs_[seq].length;
}

// The page that receives a sequence's next token, if it is a partly filled one.
static int32_t write_page(const std::vector<int32_t>& pages, int length, int block) {
  if (length % block == 0) return -1;
  return pages[static_cast<size_t>(length / block)];
}

void HybridCache::prepare(std::span<const BatchRun> runs) {
  for (const BatchRun& r : runs) {
    check_live(r.seq);
    check(!seqs_[r.seq].failed, "sequence ", r.seq,
        " was left inconsistent by a failed step; reset or restore it first");
    check(r.len >= 0, "batch run of ", r.len, " tokens");
  }
  if (!has_kv_) return;
  // New pages, plus copies of shared partly filled pages: m runs writing into a page with r
  // references copy it min(m, r - 1) times (the last holder in the batch keeps the original).
  int64_t need = 0;
  std::vector<std::pair<int32_t, int>>& writers = writers_;  // (page, runs writing into it)
  writers.clear();
  for (const BatchRun& r : runs) {
    if (r.len == 0) continue;
    const Seq& s = seqs_[r.seq];
    const int64_t pages_after = (static_cast<int64_t>(s.length) + r.len + block_size_ - 1) / block_size_;
    need += std::max<int64_t>(0, pages_after - static_cast<int64_t>(s.pages.size()));
    const int32_t p = write_page(s.pages, s.length, block_size_);
    if (p < 0 || pages_->refcount(p) < 2) continue;
    auto it = std::find_if(writers.begin(), writers.end(), [&](const auto& w) { return w.first == p; });
    if (it == writers.end()) writers.push_back({p, 1});
    else ++it->second;
  }
  for (const auto& [p, m] : writers) need += std::min(m, pages_->refcount(p) - 1);
  if (need > pages_->free_count())
    throw Error("KV cache full: this step needs " + std::to_string(need) + " more pages of " +
                std::to_string(block_size_) + " tokens, " + std::to_string(pages_->free_count()) + " of " +
                std::to_string(pages_->total()) + " are free (raise the context or KV pages)");
  for (const BatchRun& r : runs) {
    if (r.len == 0) continue;
    Seq& s = seqs_[r.seq];
    if (const int32_t p = write_page(s.pages, s.length, block_size_); p >= 0 && pages_->refcount(p) > 1) {
      const int fresh = pages_->alloc();
      pages_->copy(p, fresh);
      pages_->unref(p);
      s.pages[static_cast<size_t>(s.length / block_size_)] = fresh;
    }
    const size_t pages_after = (static_cast<size_t>(s.length) + r.len + block_size_ - 1) / block_size_;
    while (s.pages.size() < pages_after) s.pages.push_back(pages_->alloc());
  }
}

void HybridCache::fail_step(std::span<const BatchRun> runs) {
  for (const BatchRun& r : runs) {
    if (!states_.is_live(r.seq)) continue;
    Seq& s = seqs_[r.seq];
    const size_t keep = (static_cast<size_t>(s.length) + block_size_ - 1) / block_size_;
    for (size_t i = keep; i < s.pages.size(); ++i) pages_->unref(s.pages[i]);
    if (s.pages.size() > keep) s.pages.resize(keep);
    s.failed = true;
  }
}

int64_t HybridCache::pages_needed(int seq, int64_t more) const {
  check_live(seq);
  if (!has_kv_ || more <= 0) return 0;
  const Seq& s = seqs_[seq];
  const int64_t pages_after = (static_cast<int64_t>(s.length) + more + block_size_ - 1) / block_size_;
  int64_t need = std::max<int64_t>(0, pages_after - static_cast<int64_t>(s.pages.size()));
  // The page that receives the next token is written: a shared one is copied first.
  if (const int32_t p = write_page(s.pages, s.length, block_size_); p >= 0 && pages_->refcount(p) > 1) ++need;
  return need;
}

void HybridCache::commit(std::span<const BatchRun> runs) {
  for (const BatchRun& r : runs) seqs_[r.seq].length += r.len;
}

namespace {
// fn(run index, begin, end) over the elements of every run's state, split over the pool in pieces
// of at least 64K elements.
template <class Fn>
void for_state_elements(ThreadPool* pool, size_t runs, size_t n, Fn&& fn) {
  auto part = [&](size_t b, size_t e) {
    for (size_t g = b; g < e;) {
      const size_t i = g / n, begin = g % n, end = std::min(n, begin + (e - g));
      fn(i, begin, end);
      g += end - begin;
    }
  };
  if (pool) pool->parallel_for(runs * n, part, size_t{1} << 16);
  else part(0, runs * n);
}
}  // namespace

void HybridCache::load_state(std::span<const BatchRun> runs, int layer, ThreadPool* pool, bool bf16_in_place) {
  if (states_.dtype() == DType::F32 || !layers_[layer].has_state()) return;
  const LayerStateSpec& spec = layers_[layer].state;
  ssm_in_place_ = bf16_in_place && states_.dtype() == DType::BF16 && spec.ssm_elems > 0 &&
                  std::all_of(runs.begin(), runs.end(), [](const BatchRun& r) { return r.len == 1; });
  const size_t n = staged_elems(layer);
  staging_.resize(runs.size() * n);
  std::fill(staged_at_.begin(), staged_at_.end(), -1);
  for (size_t i = 0; i < runs.size(); ++i) staged_at_[runs[i].seq] = static_cast<int>(i);
  for_state_elements(pool, runs.size(), n, [&](size_t i, size_t b, size_t e) {
    states_.read_layer_range(runs[i].seq, layer, b, e, staging_.data() + i * n + b);
  });
  staged_layer_ = layer;
}

size_t HybridCache::staged_elems(int layer) const {
  const LayerStateSpec& spec = layers_[layer].state;
  return ssm_in_place_ ? spec.conv_elems() : spec.elems();
}

void HybridCache::store_state(std::span<const BatchRun> runs, int layer, ThreadPool* pool) {
  if (states_.dtype() == DType::F32 || !layers_[layer].has_state()) return;
  check(staged_layer_ == layer, "store_state of layer ", layer, " without its load_state");
  const size_t n = staged_elems(layer);
  for_state_elements(pool, runs.size(), n, [&](size_t i, size_t b, size_t e) {
    const BatchRun& r = runs[i];
    states_.write_layer_range(r.seq, layer, b, e, staging_.data() + static_cast<size_t>(staged_at_[r.seq]) * n + b);
  });
  staged_layer_ = -1;
  ssm_in_place_ = false;
}

float* HybridCache::conv_state(int seq, int layer) {
  if (states_.dtype() == DType::F32) return states_.conv_state(seq, layer);
  check(staged_layer_ == layer && staged_at_.at(static_cast<size_t>(seq)) >= 0,
        "state of layer ", layer, " was not loaded for sequence ", seq);
  return staging_.data() + static_cast<size_t>(staged_at_[seq]) * staged_elems(layer);
}

float* HybridCache::ssm_state(int seq, int layer) {
  float* conv = conv_state(seq, layer);
  return ssm_in_place_ ? nullptr : conv + layers_[layer].state.conv_elems();
}

uint16_t* HybridCache::ssm_state_bf16(int seq, int layer) {
  if (!ssm_in_place_) return nullptr;
  conv_state(seq, layer);  // checks that the layer is loaded for seq
  return states_.ssm_state_bf16(seq, layer);
}

PagedKv HybridCache::kv(int seq, int layer) {
  const int k = kv_index_.at(static_cast<size_t>(layer));
  check(k >= 0, "layer ", layer, " has no KV cache");
  return pages_->view(k, block_size_, layers_[layer].kv, seqs_[seq].pages.data());
}

int HybridCache::total_pages() const { return pages_->total(); }
int HybridCache::free_pages() const { return pages_->free_count(); }

size_t HybridCache::kv_bytes_per_token() const {
  return cache_footprint(layers_, states_.dtype(), kv_dtype_).kv_per_token;
}

CacheFootprint cache_footprint(std::span<const LayerCacheSpec> layers, DType state_dtype, DType kv_dtype) {
  CacheFootprint f;
  const size_t sb = dtype_size(state_dtype);
  for (const LayerCacheSpec& l : layers) {
    f.conv_per_sequence += l.state.conv_elems() * sb;
    f.ssm_per_sequence += l.state.ssm_elems * sb;
    if (l.has_kv()) f.kv_per_token += l.kv.bytes_per_token(kv_dtype);
  }
  return f;
}

}  // namespace hybridlm
