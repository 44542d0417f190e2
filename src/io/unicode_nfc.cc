// NFC: canonical decomposition, canonical ordering, canonical composition (UAX #15,
// https://www.unicode.org/reports/tr15/#Description_Norm). The data tables are generated from
// Python's unicodedata by tools/gen_nfc_table.py; Hangul is done algorithmically (Unicode core
// spec section 3.12, "Conjoining Jamo Behavior").
//
// The JavaScript reference calls String.prototype.normalize("NFC"), whose Unicode version is that
// of the ICU inside Node (newer than the table's). The two agree except on characters whose
// normalization data changed after the table's version: in practice none, since composition
// data for existing characters is frozen; only scripts added later can differ.
#include <algorithm>

#include "io/tokenizer_internal.h"

namespace hybridlm::tokenizer_detail {
namespace {

struct CccRange {
  char32_t first, last;
  uint8_t ccc;
};
struct Decomposition {
  char32_t cp;
  uint16_t offset, length;  // into kDecompData
};
struct Composition {
  char32_t first, second, composite;
};

#include "io/unicode_nfc_table.inc"

// Hangul syllable arithmetic: S = SBase + (L * VCount + V) * TCount + T.
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28;
constexpr char32_t kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

uint8_t combining_class(char32_t cp) {
  if (cp < 0x300) return 0;  // the first combining mark is U+0300
  const CccRange* end = std::end(kCccRanges);
  const CccRange* it = std::upper_bound(std::begin(kCccRanges), end, cp,
                                        [](char32_t c, const CccRange& r) { return c < r.first; });
  if (it == std::begin(kCccRanges)) return 0;
  --it;
  return cp <= it->last ? it->ccc : 0;
}

void decompose(char32_t cp, std::u32string& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const char32_t s = cp - kSBase;
    out += kLBase + s / kNCount;
    out += kVBase + (s % kNCount) / kTCount;
    if (s % kTCount != 0) out += kTBase + s % kTCount;
    return;
  }
  if (cp >= 0xC0) {  // the first decomposable code point is U+00C0
    const Decomposition* end = std::end(kDecompositions);
    const Decomposition* it = std::lower_bound(std::begin(kDecompositions), end, cp,
                                               [](const Decomposition& d, char32_t c) { return d.cp < c; });
    if (it != end && it->cp == cp) {
      out.append(kDecompData + it->offset, it->length);
      return;
    }
  }
  out += cp;
}

// The primary composite of (a, b), or 0 when there is none.
char32_t compose(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  }
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount) {
    return a + (b - kTBase);
  }
  const Composition* end = std::end(kCompositions);
  const Composition* it =
      std::lower_bound(std::begin(kCompositions), end, std::pair{a, b},
                       [](const Composition& c, const std::pair<char32_t, char32_t>& k) {
                         return c.first != k.first ? c.first < k.first : c.second < k.second;
                       });
  return it != end && it->first == a && it->second == b ? it->composite : 0;
}

}  // namespace

const char* nfc_unicode_version() { return kUnicodeVersion; }

std::string nfc(std::string_view s) {
  if (std::all_of(s.begin(), s.end(), [](char c) { return static_cast<uint8_t>(c) < 0x80; })) {
    return std::string(s);  // ASCII is always NFC
  }
  // 1. Full canonical decomposition.
  std::u32string d;
  d.reserve(s.size());
  for (char32_t cp : utf8_to_u32(s)) decompose(cp, d);

  // 2. Canonical ordering: within each run of non-starters, a stable sort by combining class.
  std::vector<uint8_t> ccc(d.size());
  for (size_t i = 0; i < d.size(); ++i) ccc[i] = combining_class(d[i]);
  for (size_t i = 1; i < d.size(); ++i) {  // insertion sort; runs are short
    for (size_t j = i; j > 0 && ccc[j] != 0 && ccc[j - 1] > ccc[j]; --j) {
      std::swap(d[j], d[j - 1]);
      std::swap(ccc[j], ccc[j - 1]);
    }
  }

  // 3. Canonical composition. A character combines with the last starter unless it is blocked:
  // some character between them has class 0 or a class >= its own.
  std::u32string out;
  out.reserve(d.size());
  size_t starter = std::u32string::npos;
  int last_ccc = -1;  // class of the last character kept after the starter; -1: none (adjacent)
  for (size_t i = 0; i < d.size(); ++i) {
    const char32_t c = d[i];
    const int cc = ccc[i];
    if (starter != std::u32string::npos && (last_ccc == -1 || (last_ccc != 0 && last_ccc < cc))) {
      if (const char32_t composite = compose(out[starter], c)) {
        out[starter] = composite;
        continue;
      }
    }
    if (cc == 0) {
      starter = out.size();
      last_ccc = -1;
    } else {
      last_ccc = cc;
    }
    out += c;
  }

  std::string result;
  result.reserve(s.size());
  for (char32_t cp : out) utf8_append(result, cp);
  return result;
}

}  // namespace hybridlm::tokenizer_detail
