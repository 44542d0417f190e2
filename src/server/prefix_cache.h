// Prefix reuse for hybrid models (ARCHITECTURE.md section 7): whole-sequence snapshots (the
// recurrent state copied, the attention KV pages shared by reference count) kept under the token
// prefix they hold, found again by a hash chain over a new prompt, evicted least recently used
// within a byte budget. The scheduler's thread is its only user.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

#include "cache/hybrid_cache.h"

namespace hybridlm {

// h(t1..tn) = mix(h(t1..tn-1), tn): the hash of every prefix of a prompt in one pass.
uint64_t prefix_hash_step(uint64_t h, int32_t token);
constexpr uint64_t kPrefixHashSeed = 0x9e3779b97f4a7c15ULL;

class PrefixCache {
 public:
  // budget_bytes: what the snapshots may hold, their state bytes plus their KV pages counted at
  // full size (shared pages are counted by every snapshot that holds them: an upper bound).
  PrefixCache(HybridCache& cache, size_t budget_bytes) : cache_(cache), budget_(budget_bytes) {}

  // Keeps a snapshot of `seq`, whose cache holds exactly `tokens`. A prefix already kept is only
  // marked as used. Entries are evicted (oldest use first) to stay within the budget; a snapshot
  // larger than the whole budget is not kept.
  void insert(int seq, std::span<const int32_t> tokens);
  // The longest kept prefix of `prompt` with at most `max_len` tokens, restored into `seq`;
  // returns its length (0: nothing kept matched, seq untouched).
  int restore_longest(int seq, std::span<const int32_t> prompt, int max_len);
  // The length restore_longest would restore, without restoring (and without marking it used).
  int longest(std::span<const int32_t> prompt, int max_len) const;
  // The longest common prefix of `prompt` (at most `max_len` tokens) with the tokens of any kept
  // snapshot, whether or not a snapshot ends there: where the prompt branches off text seen
  // before. A snapshot kept at that point serves every later prompt on the same branch.
  int shared_length(std::span<const int32_t> prompt, int max_len) const;
  // Drops the least recently used entry; false when there is none. For the scheduler when the KV
  // pool runs short (snapshots hold pages).
  bool evict_one();

  size_t entries() const { return lru_.size(); }
  size_t bytes() const { return bytes_; }
  size_t budget() const { return budget_; }

 private:
  struct Entry {
    uint64_t hash = 0;
    std::vector<int32_t> tokens;
    Snapshot snap;
    size_t bytes = 0;
  };
  size_t entry_bytes(int length) const;
  std::list<Entry>::const_iterator find_longest(std::span<const int32_t> prompt, int max_len) const;
  void erase(std::list<Entry>::iterator it);

  HybridCache& cache_;
  size_t budget_;
  size_t bytes_ = 0;
  std::list<Entry> lru_;  // most recently used first
  std::unordered_multimap<uint64_t, std::list<Entry>::iterator> by_hash_;
};

}  // namespace hybridlm
