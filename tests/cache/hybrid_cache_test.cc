// The hybrid cache's sequence operations, checked on the values they move: every KV row and
// every state float written here encodes (sequence history, position), so a wrong page, a missed
// copy-on-write or a stale state shows up as a wrong number.
#include <gtest/gtest.h>

#include <map>

#include "base/error.h"
#include "cache/hybrid_cache.h"
#include "tensor/dtype.h"

namespace hybridlm {
namespace {

// Layer 0: Mamba (conv 3x4 + 10 state floats); layer 1: attention (2 KV heads x 4); layer 2:
// both (Zamba2-style); layer 3: attention (1 KV head x 8).
std::vector<LayerCacheSpec> hybrid_layers() {
  return {{LayerCacheKind::Mamba, {3, 4, 10}, {}},
          {LayerCacheKind::Attention, {}, {2, 4}},
          {LayerCacheKind::MambaAndAttention, {3, 4, 6}, {2, 4}},
          {LayerCacheKind::Attention, {}, {1, 8}}};
}
std::vector<LayerCacheSpec> attention_layers() {
  return {{LayerCacheKind::Attention, {}, {2, 4}}, {LayerCacheKind::Attention, {}, {1, 8}}};
}

// Element e of the K (is_v false) or V row of token `tok` at position p, exactly representable in
// the KV dtype, so that storing it is lossless and equal contents mean equal histories. f32: K =
// tok * 1000 + p (+ small per-element offsets), V = -(tok * 1000 + p). bf16 / f16 have too few
// mantissa bits to keep such values apart, so a hashed 16-bit pattern of (tok, p, e) (never inf
// or NaN) stands for them.
float kv_value(DType dt, int tok, int p, int e, bool is_v) {
  if (dt == DType::F32) return is_v ? -(tok * 1000.0f + p) : tok * 1000.0f + p + e * 1e-3f;
  uint32_t h = static_cast<uint32_t>(tok) * 2654435761u ^ static_cast<uint32_t>(p) * 40503u ^
               static_cast<uint32_t>(e) * 97u ^ (is_v ? 0x5bd1e995u : 0u);
  h ^= h >> 15;
  h *= 0x2c1b3c6du;
  h ^= h >> 12;
  uint16_t bits = static_cast<uint16_t>(h);
  const uint16_t exponent = dt == DType::BF16 ? 0x7f80u : 0x7c00u;
  if ((bits & exponent) == exponent) bits ^= 0x4000u;  // all-ones exponent: inf / NaN
  return dt == DType::BF16 ? bf16_to_f32(bits) : f16_to_f32(bits);
}

// What a step of a model would do: token `tok` at position p writes kv_value(tok, p, ...) into
// every attention layer, and folds tok into every recurrent state.
void append(HybridCache& c, int seq, const std::vector<int>& toks) {
  const BatchRun run{seq, static_cast<int>(toks.size())};
  c.prepare(std::span(&run, 1));
  const int p0 = c.seq_length(seq);
  for (size_t l = 0; l < c.layers().size(); ++l) {
    const LayerCacheSpec& spec = c.layers()[l];
    if (spec.has_kv()) {
      PagedKv kv = c.kv(seq, static_cast<int>(l));
      const int width = kv.n_kv_heads * kv.head_dim;
      std::vector<float> k(width), v(width);
      for (size_t i = 0; i < toks.size(); ++i) {
        const int p = p0 + static_cast<int>(i);
        for (int e = 0; e < width; ++e) {
          k[e] = kv_value(kv.dtype, toks[i], p, e, false);
          v[e] = kv_value(kv.dtype, toks[i], p, e, true);
        }
        kv.store(p, k.data(), v.data());
      }
    }
    if (spec.has_state())
      for (int t : toks) {
        float* s = c.ssm_state(seq, static_cast<int>(l));
        for (size_t e = 0; e < spec.state.ssm_elems; ++e) s[e] = s[e] * 0.5f + t + e;
        float* cs = c.conv_state(seq, static_cast<int>(l));
        for (size_t e = 0; e < spec.state.conv_elems(); ++e) cs[e] = cs[e] * 0.25f + t;
      }
  }
  c.commit(std::span(&run, 1));
}

// The full observable content of a sequence: KV rows of every layer for positions < length and
// every state float.
std::vector<float> contents(HybridCache& c, int seq) {
  std::vector<float> out;
  const int n = c.seq_length(seq);
  out.push_back(static_cast<float>(n));
  for (size_t l = 0; l < c.layers().size(); ++l) {
    const LayerCacheSpec& spec = c.layers()[l];
    if (spec.has_kv()) {
      PagedKv kv = c.kv(seq, static_cast<int>(l));
      std::vector<float> k(kv.row_elems()), v(kv.row_elems());
      for (int p = 0; p < n; ++p) {
        kv.load_k(p, k.data());
        kv.load_v(p, v.data());
        out.insert(out.end(), k.begin(), k.end());
        out.insert(out.end(), v.begin(), v.end());
      }
    }
    if (spec.has_state()) {
      const float* s = c.ssm_state(seq, static_cast<int>(l));
      out.insert(out.end(), s, s + spec.state.ssm_elems);
      const float* cs = c.conv_state(seq, static_cast<int>(l));
      out.insert(out.end(), cs, cs + spec.state.conv_elems());
    }
  }
  return out;
}

std::vector<int> range(int a, int b) {
  std::vector<int> v;
  for (int i = a; i < b; ++i) v.push_back(i);
  return v;
}

CacheOptions opts(int seqs, int block, int pages) {
  CacheOptions o;
  o.max_sequences = seqs;
  o.block_size = block;
  o.kv_pages = pages;
  return o;
}

// The sequence operations, once per KV storage dtype: they move pages as bytes, so every one of
// them must hold bitwise for bf16 and f16 pages as for f32.
class HybridCacheKv : public ::testing::TestWithParam<DType> {
 protected:
  CacheOptions opts(int seqs, int block, int pages) const {
    CacheOptions o = ::hybridlm::opts(seqs, block, pages);
    o.kv_dtype = GetParam();
    return o;
  }
};

TEST_P(HybridCacheKv, SpecsReportBytes) {
  HybridCache c(hybrid_layers(), opts(2, 4, 32));
  EXPECT_EQ(c.kv_dtype(), GetParam());
  EXPECT_EQ(c.kv_bytes_per_token(), (2 * 2 * 4 + 2 * 2 * 4 + 2 * 1 * 8) * dtype_size(GetParam()));
  EXPECT_GE(c.state_bytes_per_sequence(), (12 + 10 + 12 + 6) * sizeof(float));
  EXPECT_TRUE(c.has_kv());
  EXPECT_TRUE(c.has_state());
  EXPECT_STREQ(layer_cache_kind_name(c.layers()[2].kind), "mamba+attention");
}

TEST_P(HybridCacheKv, PagesAtEveryBlockOffsetHoldWhatWasWritten) {
  for (int block : {1, 3, 4, 16}) {
    SCOPED_TRACE("block " + std::to_string(block));
    HybridCache c(hybrid_layers(), opts(2, block, 64));
    const int a = c.add();
    std::vector<int> all;
    // Chunks of every length 1..7 cross block boundaries at every offset.
    for (int len = 1; len <= 7; ++len) {
      auto t = range(len * 10, len * 10 + len);
      append(c, a, t);
      all.insert(all.end(), t.begin(), t.end());
    }
    HybridCache fresh(hybrid_layers(), opts(2, block, 64));
    const int b = fresh.add();
    append(fresh, b, all);  // one chunk
    EXPECT_EQ(contents(c, a), contents(fresh, b));
    EXPECT_EQ(c.total_pages() - c.free_pages(), (static_cast<int>(all.size()) + block - 1) / block);
  }
}

TEST_P(HybridCacheKv, RemoveReturnsSlotAndPages) {
  HybridCache c(hybrid_layers(), opts(3, 4, 20));
  const int free0 = c.free_pages();
  const int a = c.add(), b = c.add();
  append(c, a, range(0, 9));
  append(c, b, range(0, 5));
  const int f = c.fork(a);
  append(c, f, range(50, 53));
  EXPECT_EQ(c.live_sequences(), 3);
  EXPECT_THROW(c.add(), Error);
  c.remove(a);
  c.remove(f);
  c.remove(b);
  EXPECT_EQ(c.live_sequences(), 0);
  EXPECT_EQ(c.free_pages(), free0);
  EXPECT_THROW(c.seq_length(a), Error);
  EXPECT_THROW(c.remove(a), Error);
  // A reused slot starts empty and zeroed.
  const int d = c.add();
  EXPECT_EQ(c.seq_length(d), 0);
  EXPECT_EQ(c.ssm_state(d, 0)[3], 0.0f);
}

TEST_P(HybridCacheKv, ForkSharesPagesCopyOnWriteAndContinuesIndependently) {
  HybridCache c(hybrid_layers(), opts(4, 4, 64));
  const int a = c.add();
  append(c, a, range(1, 7));  // 6 tokens: page 2 half full
  const int used_before = c.total_pages() - c.free_pages();
  const int f = c.fork(a);
  EXPECT_EQ(c.total_pages() - c.free_pages(), used_before) << "fork shares pages";
  EXPECT_EQ(contents(c, a), contents(c, f));
  append(c, f, {100, 101, 102});
  append(c, a, {200});
  // Two independent runs of the same histories.
  HybridCache ref(hybrid_layers(), opts(4, 4, 64));
  const int r1 = ref.add(), r2 = ref.add();
  append(ref, r1, {1, 2, 3, 4, 5, 6, 100, 101, 102});
  append(ref, r2, {1, 2, 3, 4, 5, 6, 200});
  EXPECT_EQ(contents(c, f), contents(ref, r1));
  EXPECT_EQ(contents(c, a), contents(ref, r2)) << "the parent must be intact after the child wrote";
  c.remove(f);
  EXPECT_EQ(contents(c, a), contents(ref, r2));
}

TEST_P(HybridCacheKv, SnapshotRestoreReturnsToTheSameStateAndSurvivesReuse) {
  HybridCache c(hybrid_layers(), opts(2, 4, 64));
  const int a = c.add();
  append(c, a, range(1, 6));
  const std::vector<float> at5 = contents(c, a);
  Snapshot s = c.snapshot(a);
  EXPECT_EQ(s.length(), 5);
  append(c, a, {7, 8, 9, 10});
  const std::vector<float> at9 = contents(c, a);
  c.restore(a, s);
  EXPECT_EQ(contents(c, a), at5);
  append(c, a, {7, 8, 9, 10});
  EXPECT_EQ(contents(c, a), at9) << "decode after restore repeats the original continuation";
  c.restore(a, s);  // a snapshot can be restored many times, into another sequence too
  const int b = c.add();
  c.restore(b, s);
  EXPECT_EQ(contents(c, b), at5);
  const int free_with_snapshot = c.free_pages();
  c.remove(a);
  c.remove(b);
  s = Snapshot{};
  EXPECT_GT(c.free_pages(), free_with_snapshot);
  EXPECT_EQ(c.free_pages(), c.total_pages()) << "dropping the last snapshot frees its pages";
}

TEST_P(HybridCacheKv, CropNeedsAKeptSnapshotForRecurrentLayers) {
  HybridCache c(hybrid_layers(), opts(2, 4, 64));
  const int a = c.add();
  append(c, a, range(1, 6));
  c.keep_snapshot(a);
  const auto at5 = contents(c, a);
  append(c, a, {6, 7, 8});
  c.keep_snapshot(a);
  append(c, a, {9});
  EXPECT_EQ(c.kept_lengths(a), (std::vector<int>{5, 8}));
  try {
    c.crop(a, 7);
    FAIL() << "crop to an unkept length must fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("kept: 5, 8"), std::string::npos) << e.what();
  }
  EXPECT_EQ(c.seq_length(a), 9) << "a refused crop changes nothing";
  c.crop(a, 5);
  EXPECT_EQ(contents(c, a), at5);
  EXPECT_EQ(c.kept_lengths(a), (std::vector<int>{5})) << "snapshots past the crop are dropped";
  append(c, a, {6, 7, 8, 9});
  HybridCache ref(hybrid_layers(), opts(2, 4, 64));
  const int r = ref.add();
  append(ref, r, range(1, 10));
  EXPECT_EQ(contents(c, a), contents(ref, r)) << "re-decoding after crop repeats the original";
  EXPECT_THROW(c.crop(a, 10), Error);
  EXPECT_THROW(c.crop(a, -1), Error);
}

TEST_P(HybridCacheKv, CropOfAttentionOnlyTruncatesPages) {
  HybridCache c(attention_layers(), opts(2, 4, 16));
  const int a = c.add();
  append(c, a, range(1, 12));
  const int f = c.fork(a);
  c.crop(a, 5);
  EXPECT_EQ(c.seq_length(a), 5);
  EXPECT_EQ(c.total_pages() - c.free_pages(), 3) << "the fork still holds all three pages";
  append(c, a, {60, 70});  // writes into page 1, shared with the fork: copied first
  HybridCache ref(attention_layers(), opts(2, 4, 16));
  const int r = ref.add(), r2 = ref.add();
  append(ref, r, {1, 2, 3, 4, 5, 60, 70});
  append(ref, r2, range(1, 12));
  EXPECT_EQ(contents(c, a), contents(ref, r));
  EXPECT_EQ(contents(c, f), contents(ref, r2));
  c.crop(f, 0);
  EXPECT_EQ(c.seq_length(f), 0);
}

TEST_P(HybridCacheKv, ReorderIsAGatherOverStatesAndPages) {
  HybridCache c(hybrid_layers(), opts(4, 4, 64));
  const int s0 = c.add(), s1 = c.add(), s2 = c.add();
  append(c, s0, {1, 2, 3});
  append(c, s1, {4, 5, 6, 7, 8});
  append(c, s2, {9});
  const auto c0 = contents(c, s0), c1 = contents(c, s1);
  const std::vector<int> seqs{s0, s1, s2}, src{1, 1, 0};
  c.reorder(seqs, src);
  EXPECT_EQ(contents(c, s0), c1);
  EXPECT_EQ(contents(c, s1), c1);
  EXPECT_EQ(contents(c, s2), c0);
  // The beams continue independently.
  append(c, s0, {10});
  append(c, s1, {11});
  HybridCache ref(hybrid_layers(), opts(4, 4, 64));
  const int r = ref.add();
  append(ref, r, {4, 5, 6, 7, 8, 11});
  EXPECT_EQ(contents(c, s1), contents(ref, r));
  const std::vector<int> bad{5};
  EXPECT_THROW(c.reorder(seqs, bad), Error);
}

TEST_P(HybridCacheKv, PrepareIsAllOrNothingWhenThePoolIsFull) {
  HybridCache c(attention_layers(), opts(2, 4, 3));
  const int a = c.add(), b = c.add();
  append(c, a, range(0, 6));  // 2 pages
  const auto before = contents(c, a);
  const BatchRun runs[] = {{a, 1}, {b, 5}};  // a fits in its page; b needs 2, only 1 free
  try {
    c.prepare(runs);
    FAIL() << "expected KV cache full";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KV cache full"), std::string::npos) << e.what();
  }
  EXPECT_EQ(c.free_pages(), 1);
  EXPECT_EQ(contents(c, a), before);
  const BatchRun dead[] = {{a, 1}, {7, 1}};
  EXPECT_THROW(c.prepare(dead), Error);
  EXPECT_EQ(c.free_pages(), 1);
}

TEST_P(HybridCacheKv, BeamsSharingOnePageNeedOneCopyLess) {
  // Review finding: 4 beams gathered from one sequence share its half-filled page (refcount 4);
  // writing one token each takes 3 copies (the last writer keeps the page), not 4.
  HybridCache c(attention_layers(), opts(4, 16, 4));
  std::vector<int> seqs;
  for (int i = 0; i < 4; ++i) seqs.push_back(c.add());
  append(c, seqs[0], range(1, 11));
  const std::vector<int> src{0, 0, 0, 0};
  c.reorder(seqs, src);
  EXPECT_EQ(c.free_pages(), 3);
  std::vector<BatchRun> runs;
  for (int q : seqs) runs.push_back({q, 1});
  c.prepare(runs);
  EXPECT_EQ(c.free_pages(), 0);
  c.commit(runs);
  for (int q : seqs) EXPECT_EQ(c.seq_length(q), 11);
}

TEST_P(HybridCacheKv, AFailedStepReturnsItsPagesAndBlocksTheSequenceUntilRestored) {
  HybridCache c(hybrid_layers(), opts(2, 4, 16));
  const int a = c.add();
  append(c, a, range(1, 6));  // 5 tokens: 2 pages
  const Snapshot snap = c.snapshot(a);
  const int free_before = c.free_pages();
  const BatchRun run{a, 8};
  c.prepare(std::span(&run, 1));  // 13 tokens: 4 pages
  c.fail_step(std::span(&run, 1));
  // The two new pages are returned; the copy of the half-filled page (shared with the snapshot)
  // stays in the table: same content, now unshared.
  EXPECT_EQ(c.free_pages(), free_before - 1) << "the step's new pages are returned";
  EXPECT_EQ(c.seq_length(a), 5);
  try {
    c.prepare(std::span(&run, 1));
    FAIL() << "a failed sequence must not run";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("left inconsistent by a failed step"), std::string::npos) << e.what();
  }
  c.restore(a, snap);
  append(c, a, {6});
  EXPECT_EQ(c.seq_length(a), 6);
  // After the failure, a fork writes into the right (shared, partly filled) page: copy-on-write
  // uses the page of the next token, never a stale trailing one.
  const int f = c.fork(a);
  append(c, f, {100});
  append(c, a, {7});
  HybridCache ref(hybrid_layers(), opts(2, 4, 16));
  const int r = ref.add();
  append(ref, r, {1, 2, 3, 4, 5, 6, 7});
  EXPECT_EQ(contents(c, a), contents(ref, r));
}

TEST(HybridCache, PureSsmCountsTokensWithoutPages) {
  HybridCache c({{LayerCacheKind::Mamba, {3, 4, 10}, {}}}, opts(2, 16, 0));
  const int a = c.add();
  append(c, a, range(0, 40));
  EXPECT_EQ(c.seq_length(a), 40);
  EXPECT_EQ(c.total_pages(), 0);
  EXPECT_FALSE(c.has_kv());
}

// bf16 storage: a step of single-token runs loaded with bf16_in_place stages only the conv states
// and hands out the stored bf16 SSM states; a step with a longer run stages everything.
TEST(HybridCache, Bf16DecodeStepsLeaveTheSsmStateInPlace) {
  CacheOptions o = opts(3, 4, 32);
  o.state_dtype = DType::BF16;
  HybridCache c(hybrid_layers(), o);
  const int a = c.add(), b = c.add();
  const BatchRun decode[2] = {{b, 1}, {a, 1}};
  c.load_state(decode, 0, nullptr, true);
  EXPECT_EQ(c.ssm_state(a, 0), nullptr);
  uint16_t* sa = c.ssm_state_bf16(a, 0);
  ASSERT_NE(sa, nullptr);
  EXPECT_NE(sa, c.ssm_state_bf16(b, 0));
  sa[3] = f32_to_bf16(2.5f);               // the kernel's in-place update
  c.conv_state(a, 0)[11] = 1.25f;          // staged, rounded back by store_state
  c.store_state(decode, 0);
  const BatchRun mixed[2] = {{a, 1}, {b, 2}};
  c.load_state(mixed, 0, nullptr, true);  // a longer run: everything staged
  EXPECT_EQ(c.ssm_state_bf16(a, 0), nullptr);
  ASSERT_NE(c.ssm_state(a, 0), nullptr);
  EXPECT_EQ(c.ssm_state(a, 0)[3], 2.5f);
  EXPECT_EQ(c.conv_state(a, 0)[11], 1.25f);
  EXPECT_EQ(c.ssm_state(b, 0)[3], 0.0f);
  c.store_state(mixed, 0);
  c.load_state(decode, 0, nullptr, false);  // not asked for: staged
  EXPECT_EQ(c.ssm_state_bf16(a, 0), nullptr);
  EXPECT_EQ(c.ssm_state(a, 0)[3], 2.5f);
  EXPECT_THROW(c.store_state(decode, 2), Error) << "a store without its load";
  c.store_state(decode, 0);
}

INSTANTIATE_TEST_SUITE_P(KvDtypes, HybridCacheKv, ::testing::Values(DType::F32, DType::BF16, DType::F16),
                         [](const ::testing::TestParamInfo<DType>& i) { return std::string(dtype_name(i.param)); });

TEST(HybridCache, KvDtypeOtherThanF32Bf16F16IsRefused) {
  CacheOptions o = opts(2, 4, 8);
  o.kv_dtype = DType::I8;
  EXPECT_THROW(HybridCache(attention_layers(), o), Error);
}

}  // namespace
}  // namespace hybridlm
