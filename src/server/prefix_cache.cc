#include "server/prefix_cache.h"

#include <algorithm>

#include "base/error.h"

namespace hybridlm {

uint64_t prefix_hash_step(uint64_t h, int32_t token) {
  // splitmix64's finalizer over the running hash and the token: every prefix gets a well-mixed
  // 64-bit key; equal keys are confirmed by comparing the tokens.
  uint64_t x = h ^ (static_cast<uint64_t>(static_cast<uint32_t>(token)) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2));
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

size_t PrefixCache::entry_bytes(int length) const {
  const size_t pages = (static_cast<size_t>(length) + cache_.block_size() - 1) / cache_.block_size();
  return cache_.state_bytes_per_sequence() + pages * cache_.block_size() * cache_.kv_bytes_per_token() +
         static_cast<size_t>(length) * sizeof(int32_t);
}

void PrefixCache::erase(std::list<Entry>::iterator it) {
  auto [lo, hi] = by_hash_.equal_range(it->hash);
  for (auto h = lo; h != hi; ++h)
    if (h->second == it) {
      by_hash_.erase(h);
      break;
    }
  bytes_ -= it->bytes;
  lru_.erase(it);  // the Snapshot gives its pages back
}

bool PrefixCache::evict_one() {
  if (lru_.empty()) return false;
  erase(std::prev(lru_.end()));
  return true;
}

void PrefixCache::insert(int seq, std::span<const int32_t> tokens) {
  if (tokens.empty() || budget_ == 0) return;
  check(cache_.seq_length(seq) == static_cast<int>(tokens.size()), "prefix cache: sequence ", seq, " holds ",
        cache_.seq_length(seq), " tokens, not ", tokens.size());
  uint64_t h = kPrefixHashSeed;
  for (int32_t t : tokens) h = prefix_hash_step(h, t);
  auto [lo, hi] = by_hash_.equal_range(h);
  for (auto it = lo; it != hi; ++it)
    if (std::ranges::equal(it->second->tokens, tokens)) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return;
    }
  const size_t need = entry_bytes(static_cast<int>(tokens.size()));
  if (need > budget_) return;
  while (bytes_ + need > budget_ && evict_one()) {
  }
  Entry e;
  e.hash = h;
  e.tokens.assign(tokens.begin(), tokens.end());
  e.snap = cache_.snapshot(seq);
  e.bytes = need;
  lru_.push_front(std::move(e));
  by_hash_.emplace(h, lru_.begin());
  bytes_ += need;
}

std::list<PrefixCache::Entry>::const_iterator PrefixCache::find_longest(std::span<const int32_t> prompt,
                                                                        int max_len) const {
  const size_t n = std::min<size_t>(prompt.size(), static_cast<size_t>(std::max(max_len, 0)));
  uint64_t h = kPrefixHashSeed;
  auto best = lru_.end();
  for (size_t i = 0; i < n && !lru_.empty(); ++i) {
    h = prefix_hash_step(h, prompt[i]);
    auto [lo, hi] = by_hash_.equal_range(h);
    for (auto it = lo; it != hi; ++it)
      if (it->second->tokens.size() == i + 1 &&
          std::equal(prompt.begin(), prompt.begin() + i + 1, it->second->tokens.begin()))
        best = it->second;
  }
  return best;
}

int PrefixCache::longest(std::span<const int32_t> prompt, int max_len) const {
  const auto best = find_longest(prompt, max_len);
  return best == lru_.end() ? 0 : static_cast<int>(best->tokens.size());
}

int PrefixCache::shared_length(std::span<const int32_t> prompt, int max_len) const {
  const size_t n = std::min<size_t>(prompt.size(), static_cast<size_t>(std::max(max_len, 0)));
  size_t best = 0;
  for (const Entry& e : lru_) {
    const size_t m = std::min(n, e.tokens.size());
    if (m <= best) continue;
    const auto diverge = std::mismatch(prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(m), e.tokens.begin());
    best = std::max(best, static_cast<size_t>(diverge.first - prompt.begin()));
    if (best == n) break;
  }
  return static_cast<int>(best);
}

int PrefixCache::restore_longest(int seq, std::span<const int32_t> prompt, int max_len) {
  const auto found = find_longest(prompt, max_len);
  if (found == lru_.end()) return 0;
  const auto best = lru_.erase(found, found);  // the same element, as a mutable iterator
  cache_.restore(seq, best->snap);
  lru_.splice(lru_.begin(), lru_, best);
  return static_cast<int>(best->tokens.size());
}

}  // namespace hybridlm
