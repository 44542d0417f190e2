// BPE model: vocabulary, merge ranks, and the merge loop for one pre-token.
// Format: https://huggingface.co/docs/tokenizers/api/models#tokenizers.models.BPE
#include <queue>

#include "base/error.h"
#include "io/tokenizer_internal.h"

namespace hybridlm::tokenizer_detail {
namespace {

using nlohmann::json;

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

// Words longer than this (in bytes) are not memoized, like the reference's cache.
constexpr size_t kMaxCachedWordBytes = 256;
constexpr size_t kMaxCacheEntries = 10000;

}  // namespace

BpeModel BpeModel::from_json(const json& m, const std::string& where) {
  BpeModel bpe;
  bpe.where_ = where;
  const auto fail = [&](const std::string& what) { throw Error(where + ": BPE model: " + what); };
  if (!m.contains("vocab") || !m["vocab"].is_object()) fail("\"vocab\" must be an object");
  if (!m.contains("merges") || !m["merges"].is_array()) fail("\"merges\" must be an array");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (m.contains(key) && !m[key].is_null() && m[key] != "") {
      fail(std::string("unsupported \"") + key + "\" (only null is supported)");
    }
  }
  if (m.contains("dropout") && !m["dropout"].is_null() &&
      (!m["dropout"].is_number() || m["dropout"].get<double>() != 0.0)) {
    fail("unsupported \"dropout\" (encoding must be deterministic)");
  }

  int32_t max_id = -1;
  bpe.vocab_.reserve(m["vocab"].size());
  for (const auto& [token, value] : m["vocab"].items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 || value.get<int64_t>() > kMaxTokenId) {
      fail("vocab entry \"" + token + "\" has an invalid id (ids must be in [0, " + std::to_string(kMaxTokenId) + "])");
    }
    const auto id = value.get<int32_t>();
    bpe.vocab_[token] = id;
    max_id = std::max(max_id, id);
  }
  bpe.id_to_token_.assign(static_cast<size_t>(max_id + 1), std::string());
  for (const auto& [token, id] : bpe.vocab_) bpe.id_to_token_[id] = token;

  // Merges come as "left right" strings (older files) or ["left", "right"] pairs (newer files).
  const json& merges = m["merges"];
  bpe.merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const json& item = merges[rank];
    std::string left, right;
    if (item.is_string()) {
      const std::string s = item.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos) fail("merge " + std::to_string(rank) + " \"" + s + "\" has no space");
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (item.is_array() && item.size() == 2 && item[0].is_string() && item[1].is_string()) {
      left = item[0].get<std::string>();
      right = item[1].get<std::string>();
    } else {
      fail("merge " + std::to_string(rank) + " is neither \"a b\" nor [\"a\", \"b\"]");
    }
    const auto find = [&](const std::string& token) {
      const auto it = bpe.vocab_.find(token);
      if (it == bpe.vocab_.end()) {
        fail("merge " + std::to_string(rank) + " references unknown token \"" + token + "\"");
      }
      return it->second;
    };
    const int32_t a = find(left), b = find(right), merged = find(left + right);
    // A repeated pair takes its last rank, as in the reference (a map built in file order).
    bpe.merges_.insert_or_assign(pair_key(a, b), std::pair{static_cast<int32_t>(rank), merged});
  }

  if (m.contains("unk_token") && m["unk_token"].is_string()) {
    const std::string unk = m["unk_token"].get<std::string>();
    const auto it = bpe.vocab_.find(unk);
    if (it == bpe.vocab_.end()) fail("unk_token \"" + unk + "\" is not in the vocabulary");
    bpe.unk_id_ = it->second;
  }
  const auto flag = [&](const char* key) {
    if (!m.contains(key) || m[key].is_null()) return false;
    if (!m[key].is_boolean()) fail(std::string("\"") + key + "\" must be true or false");
    return m[key].get<bool>();
  };
  bpe.fuse_unk_ = flag("fuse_unk");
  bpe.byte_fallback_ = flag("byte_fallback");
  bpe.ignore_merges_ = flag("ignore_merges");
  bpe.set_added_tokens({}, {});
  return bpe;
}

void BpeModel::set_added_tokens(const std::unordered_map<std::string, int32_t>& added,
                                const std::unordered_map<std::string, int32_t>& raw_added) {
  added_ = added;
  raw_added_ = raw_added;
  final_of_vocab_.assign(id_to_token_.size(), -1);
  for (const auto& [token, id] : vocab_) final_of_vocab_[id] = *final_id(token);
}

std::optional<int32_t> BpeModel::final_id(std::string_view token) const {
  const std::string key(token);
  if (const auto it = added_.find(key); it != added_.end()) return it->second;
  if (const auto it = raw_added_.find(key); it != raw_added_.end()) return it->second;
  if (const auto it = vocab_.find(key); it != vocab_.end()) return it->second;
  return std::nullopt;
}

// A symbol that is no vocabulary entry: its bytes as <0xXX> tokens when byte_fallback is on
// and they all exist, else the unknown token, else nothing (the reference drops it).
void BpeModel::emit_unknown(std::string_view symbol, std::vector<int32_t>& out) const {
  if (byte_fallback_) {
    std::vector<int32_t> bytes;
    static const char* kHex = "0123456789ABCDEF";
    for (char c : symbol) {
      const auto u = static_cast<uint8_t>(c);
      const std::string name = std::string("<0x") + kHex[u >> 4] + kHex[u & 15] + ">";
      const auto id = final_id(name);
      if (!id) break;
      bytes.push_back(*id);
    }
    if (bytes.size() == symbol.size()) {
      out.insert(out.end(), bytes.begin(), bytes.end());
      return;
    }
  }
  if (unk_id_) out.push_back(final_of_vocab_[*unk_id_]);
}

void BpeModel::merge_word(const std::string& word, std::vector<int32_t>& out) const {
  // Symbols form a doubly linked list over the word's characters; id -1 marks a character that
  // is no vocabulary entry (it can take part in no merge).
  struct Symbol {
    int32_t id;
    int32_t prev, next;  // -1 at the ends
    size_t begin, len;   // bytes of the word
  };
  std::vector<Symbol> sym;
  for (size_t i = 0; i < word.size();) {
    const size_t len = utf8_read(word, i).len;
    const auto it = vocab_.find(word.substr(i, len));
    const auto n = static_cast<int32_t>(sym.size());
    sym.push_back({it == vocab_.end() ? -1 : it->second, n - 1, n + 1, i, len});
    i += len;
  }
  if (sym.empty()) return;
  sym.back().next = -1;

  // Candidate merges ordered by (rank, position of the left symbol): the lowest rank first and,
  // among equal ranks, the leftmost. Entries go stale when a neighbour merges; they are checked
  // against the current symbols when popped.
  struct Candidate {
    int32_t rank, left, left_id, right_id, merged;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  const auto consider = [&](int32_t left) {
    const int32_t right = sym[left].next;
    if (right < 0 || sym[left].id < 0 || sym[right].id < 0) return;
    const auto it = merges_.find(pair_key(sym[left].id, sym[right].id));
    if (it != merges_.end()) {
      queue.push({it->second.first, left, sym[left].id, sym[right].id, it->second.second});
    }
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(sym.size()); ++i) consider(i);

  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& left = sym[c.left];
    if (left.len == 0 || left.id != c.left_id || left.next < 0) continue;
    Symbol& right = sym[left.next];
    if (right.id != c.right_id) continue;
    left.id = c.merged;
    left.len += right.len;
    left.next = right.next;
    if (right.next >= 0) sym[right.next].prev = c.left;
    right.len = 0;  // dead
    if (left.prev >= 0) consider(left.prev);
    consider(c.left);
  }
  for (int32_t i = 0; i >= 0; i = sym[i].next) {
    if (sym[i].id >= 0) {
      out.push_back(final_of_vocab_[sym[i].id]);
    } else if (const auto it = raw_added_.find(word.substr(sym[i].begin, sym[i].len));
               it != raw_added_.end()) {
      out.push_back(*final_id(it->first));  // an added token's content that is no vocab entry
    } else {
      emit_unknown(std::string_view(word).substr(sym[i].begin, sym[i].len), out);
    }
  }
}

void BpeModel::encode_word(const std::string& word, std::vector<int32_t>& out, Cache& cache) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    // A pre-token that is itself a token (in the vocabulary or an added token) is emitted whole.
    const bool known = vocab_.count(word) != 0 || raw_added_.count(word) != 0;
    if (known) {
      out.push_back(*final_id(word));
      return;
    }
  }
  if (const auto it = cache.find(word); it != cache.end()) {
    out.insert(out.end(), it->second.begin(), it->second.end());
    return;
  }
  const size_t start = out.size();
  merge_word(word, out);
  if (word.size() < kMaxCachedWordBytes) {
    if (cache.size() >= kMaxCacheEntries) cache.clear();
    cache.emplace(word, std::vector<int32_t>(out.begin() + static_cast<std::ptrdiff_t>(start), out.end()));
  }
}

}  // namespace hybridlm::tokenizer_detail
