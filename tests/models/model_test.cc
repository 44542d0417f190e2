// Model-level invariants on random-weight HF-layout checkpoints (tests/models/make_fixtures.sh):
// full forward == prefill(k) + decode(rest) for every k == any chunking; a sequence's logits are
// identical alone and inside a varlen batch; a failed step leaves the state as it was.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>
#include <unistd.h>

#include "io/safetensors.h"
#include "kernels/profile.h"
#include "models/model.h"
#include "tensor/quant.h"

#include "base/error.h"
#include "numerics.h"
#include "runtime/engine.h"

namespace hybridlm {
namespace {

std::filesystem::path fixtures() {
  const char* d = std::getenv("HYBRIDLM_TEST_MODELS");
  if (!d) throw std::runtime_error("HYBRIDLM_TEST_MODELS is not set (run through ctest)");
  return d;
}

const char* kModels[] = {"mamba1", "falcon_mamba", "mamba2_g2", "mamba2_bf16", "hybridlm", "hybridlm_var", "jamba", "bamba", "lfm2", "nemotron_h", "granite", "falcon_h1", "zamba2", "hybridlm_attn", "llamba", "hybridlm_m2d",
                           "lfm2_moe", "zamba", "hybridlm_gdn", "qwen3_next", "qwen3_5", "qwen3_5_moe"};
// The fixtures with attention layers (a KV cache): every family that has one.
const char* kAttentionModels[] = {"hybridlm", "hybridlm_var", "jamba", "bamba", "lfm2", "nemotron_h", "granite", "falcon_h1", "zamba2", "hybridlm_attn", "hybridlm_m2d",
                                   "lfm2_moe", "zamba", "hybridlm_gdn", "qwen3_next", "qwen3_5", "qwen3_5_moe"};

std::vector<int32_t> random_ids(int n, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> ids(n);
  for (auto& v : ids) v = static_cast<int32_t>(rng() % vocab);
  return ids;
}

double rel_err(const float* a, const float* b, size_t n) {
  double mx = 1, err = 0;
  for (size_t i = 0; i < n; ++i) {
    mx = std::max(mx, std::fabs(static_cast<double>(b[i])));
    err = std::max(err, std::fabs(static_cast<double>(a[i]) - b[i]));
  }
  return err / mx;
}

// f32 KV unless a test says otherwise: the exact storage (the engine's default is bf16).
EngineOptions opts(int max_seqs = 4) {
  EngineOptions o;
  o.threads = 2;
  o.max_sequences = max_seqs;
  o.kv_dtype = DType::F32;
  return o;
}

// Everything the cache holds for a sequence: its length, recurrent state and KV rows.
std::vector<float> cache_contents(Engine& e, int s) {
  HybridCache& c = e.cache();
  const Snapshot snap = c.snapshot(s);
  std::vector<float> out(snap.state().begin(), snap.state().end());  // bytes, compared as values
  out.push_back(static_cast<float>(c.seq_length(s)));
  for (size_t l = 0; l < c.layers().size(); ++l) {
    if (!c.layers()[l].has_kv()) continue;
    const PagedKv kv = c.kv(s, static_cast<int>(l));
    std::vector<float> k(kv.row_elems()), v(kv.row_elems());
    for (int p = 0; p < c.seq_length(s); ++p) {
      kv.load_k(p, k.data());
      kv.load_v(p, v.data());
      out.insert(out.end(), k.begin(), k.end());
      out.insert(out.end(), v.begin(), v.end());
    }
  }
  return out;
}

// Logits of a fresh sequence: prefill of ids[0, k), then one decode step per remaining id.
std::vector<float> prefill_then_decode(Engine& e, std::span<const int32_t> ids, int k) {
  const int s = e.new_sequence();
  std::vector<float> got = e.prefill(s, ids.first(k), true);
  for (size_t t = k; t < ids.size(); ++t) {
    const BatchRun run{s, 1};
    const int row = 0;
    std::span<const float> l = e.step(ids.subspan(t, 1), std::span(&run, 1), std::span(&row, 1));
    got.insert(got.end(), l.begin(), l.end());
  }
  e.free_sequence(s);
  return got;
}

// Three sequences of lens 13, 1 and 22 prefilled together in one varlen step (logits of every
// token), then three decode steps with all three in one batch: the logits of all four steps.
std::vector<float> varlen_then_decode(Engine& e, uint64_t seed) {
  const int V = e.vocab_size(), lens[3] = {13, 1, 22};
  std::vector<int32_t> toks;
  std::vector<BatchRun> runs;
  std::vector<int> rows;
  std::vector<std::vector<int32_t>> ids;
  for (int i = 0; i < 3; ++i) {
    ids.push_back(random_ids(lens[i] + 3, V, seed + i));
    for (int t = 0; t < lens[i]; ++t) rows.push_back(static_cast<int>(toks.size()) + t);
    toks.insert(toks.end(), ids[i].begin(), ids[i].begin() + lens[i]);
    runs.push_back({e.new_sequence(), lens[i]});
  }
  std::span<const float> l = e.step(toks, runs, rows);
  std::vector<float> out(l.begin(), l.end());
  for (int step = 0; step < 3; ++step) {
    toks.clear();
    rows = {0, 1, 2};
    for (int i = 0; i < 3; ++i) {
      toks.push_back(ids[i][lens[i] + step]);
      runs[i].len = 1;
    }
    l = e.step(toks, runs, rows);
    out.insert(out.end(), l.begin(), l.end());
  }
  for (const BatchRun& r : runs) e.free_sequence(r.seq);
  return out;
}

// Every invariant per (fixture, KV dtype): f32 KV on every fixture, bf16 KV (the runtime default)
// on every fixture with attention layers. A K or V row is rounded to bf16 once, when it is
// stored, the same way whichever step stores it, so every bitwise invariant (batch, fork,
// snapshot, crop, reorder, and decode == prefill without recurrent layers) holds at bf16 as at
// f32. Only where f32 itself is not bitwise (decode vs a chunked scan) is the bound wider.
class ModelInvariants : public ::testing::TestWithParam<std::tuple<const char*, DType>> {
 protected:
  const char* model() const { return std::get<0>(GetParam()); }
  DType kv_dtype() const { return std::get<1>(GetParam()); }
  std::filesystem::path dir() const { return fixtures() / model(); }
  EngineOptions opts(int max_seqs = 4) const {
    EngineOptions o = ::hybridlm::opts(max_seqs);
    o.kv_dtype = kv_dtype();
    return o;
  }
  // Decode (or any chunking) vs one prefill step, relative to the logits' scale.
  double decode_tol() const { return kv_dtype() == DType::F32 ? tol::kDecodeVsPrefill : tol::kDecodeVsPrefillKvBf16; }
};

TEST_P(ModelInvariants, DecodeEqualsPrefillAtEverySplit) {
  Engine e(dir(), opts());
  const int T = 29, V = e.vocab_size();
  const auto ids = random_ids(T, V, 7);
  const int s0 = e.new_sequence();
  const std::vector<float> full = e.prefill(s0, ids, true);
  e.free_sequence(s0);
  for (int k = 1; k < T; ++k) {
    SCOPED_TRACE("k=" + std::to_string(k));
    const std::vector<float> got = prefill_then_decode(e, ids, k);
    ASSERT_LT(rel_err(got.data(), full.data(), full.size()), decode_tol());
    // Without recurrent layers nothing depends on how the tokens are split into steps: every
    // matmul is batch-invariant and each (query, head) of attention runs over the same key tiles.
    if (!e.cache().has_state()) {
      ASSERT_EQ(got, full) << "attention-only: decode must equal prefill bitwise";
    }
  }
}

// The whole model on the scalar reference kernels (ref_kernels(): double accumulation, no SIMD, no
// threads) against the CPU kernels, on a varlen prefill and batched decode steps: every op of
// every family through the kernel table on both sides, with f32 and with bf16 state storage.
TEST_P(ModelInvariants, CpuKernelsMatchReferenceKernels) {
  for (DType state : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(std::string("state ") + std::string(dtype_name(state)));
    EngineOptions o = opts();
    o.state_dtype = state;
    Engine cpu(dir(), o);
    o.kernels = &ref_kernels();
    Engine ref(dir(), o);
    ASSERT_STREQ(cpu.kernels().name, "cpu");
    ASSERT_STREQ(ref.kernels().name, "ref");
    const std::vector<float> a = varlen_then_decode(cpu, 300), b = varlen_then_decode(ref, 300);
    ASSERT_EQ(a.size(), b.size());
    const double err = rel_err(a.data(), b.data(), a.size());
    // 16-bit storage of the state or the KV rounds both sides' slightly different values.
    const bool exact_storage = state == DType::F32 && kv_dtype() == DType::F32;
    EXPECT_LT(err, exact_storage ? tol::kModelCpuVsRef : tol::kModelCpuVsRef16BitCache);
    EXPECT_GT(err, 0.0) << "bitwise equal: did both engines run the same kernels?";
  }
}

// `hybridlm bench --profile`'s table forwards every op unchanged (bitwise the same logits) and
// counts each outermost call: one decode step of one sequence calls attention once per layer that
// keeps KV (the cache's layer kinds) and the embedding once.
TEST_P(ModelInvariants, ProfilingKernelsForwardEveryCallAndCountIt) {
  Engine cpu(dir(), opts());
  EngineOptions o = opts();
  o.kernels = &profiling_kernels(cpu_kernels());
  Engine prof(dir(), o);
  ASSERT_EQ(varlen_then_decode(prof, 300), varlen_then_decode(cpu, 300));
  const int s = prof.new_sequence(), V = prof.vocab_size();
  prof.prefill(s, random_ids(5, V, 3), false);
  reset_kernel_profile();
  prof.prefill(s, random_ids(1, V, 4), true);
  std::map<std::string, int64_t> calls;
  for (const OpTime& t : kernel_profile()) {
    calls[t.op] = t.calls;
    EXPECT_GE(t.seconds, 0.0) << t.op;
  }
  int kv_layers = 0;
  for (const LayerCacheSpec& l : prof.cache().layers()) kv_layers += l.has_kv() ? 1 : 0;
  EXPECT_EQ(calls["attention"], kv_layers);
  EXPECT_EQ(calls["embedding"], 1);
  EXPECT_GT(calls["matmul"], 0);
  EXPECT_GT(calls["rmsnorm"], 0);
}

TEST_P(ModelInvariants, RandomChunkingsEqualFullForward) {
  Engine e(dir(), opts());
  const int T = 41, V = e.vocab_size();
  const auto ids = random_ids(T, V, 8);
  const int s0 = e.new_sequence();
  const std::vector<float> full = e.prefill(s0, ids, true);
  e.free_sequence(s0);
  std::mt19937 rng(9);
  for (int trial = 0; trial < 6; ++trial) {
    const int s = e.new_sequence();
    std::vector<float> got;
    for (int t = 0; t < T;) {
      const int n = std::min(T - t, 1 + static_cast<int>(rng() % 13));
      std::vector<float> l = e.prefill(s, std::span(ids).subspan(t, n), true);
      got.insert(got.end(), l.begin(), l.end());
      t += n;
    }
    e.free_sequence(s);
    ASSERT_LT(rel_err(got.data(), full.data(), full.size()), decode_tol()) << "trial " << trial;
    if (!e.cache().has_state()) {
      ASSERT_EQ(got, full) << "attention-only: any chunking must equal one step bitwise";
    }
  }
}

TEST_P(ModelInvariants, SequenceAloneEqualsInsideVarlenBatch) {
  Engine e(dir(), opts());
  const int V = e.vocab_size();
  const int lens[3] = {13, 1, 22};
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::vector<float>> alone;
  // Alone: the same runs as in the batch below (prefill of lens[i] tokens, then 3 decode steps),
  // one sequence per step.
  for (int i = 0; i < 3; ++i) {
    ids.push_back(random_ids(lens[i] + 3, V, 100 + i));
    const int s = e.new_sequence();
    alone.push_back(e.prefill(s, std::span(ids[i]).first(lens[i]), true));
    for (int t = lens[i]; t < lens[i] + 3; ++t) {
      const BatchRun run{s, 1};
      const int row = 0;
      std::span<const float> l = e.step(std::span(ids[i]).subspan(t, 1), std::span(&run, 1), std::span(&row, 1));
      alone[i].insert(alone[i].end(), l.begin(), l.end());
    }
    e.free_sequence(s);
  }
  // Batched: step 1 prefills the first lens[i] tokens of all three at once; then 3 decode steps
  // with all three sequences in one batch.
  int slots[3];
  for (int& s : slots) s = e.new_sequence();
  std::vector<int32_t> toks;
  std::vector<BatchRun> runs;
  std::vector<int> rows;
  for (int i = 0; i < 3; ++i) {
    for (int t = 0; t < lens[i]; ++t) rows.push_back(static_cast<int>(toks.size()) + t);
    toks.insert(toks.end(), ids[i].begin(), ids[i].begin() + lens[i]);
    runs.push_back({slots[i], lens[i]});
  }
  const std::vector<float> batched = [&] { auto l = e.step(toks, runs, rows); return std::vector<float>(l.begin(), l.end()); }();
  size_t off = 0;
  for (int i = 0; i < 3; ++i) {
    for (size_t j = 0; j < static_cast<size_t>(lens[i]) * V; ++j)
      ASSERT_EQ(batched[off + j], alone[i][j]) << "sequence " << i << " prefill inside a batch";
    off += static_cast<size_t>(lens[i]) * V;
  }
  for (int step = 0; step < 3; ++step) {
    toks.clear();
    runs.clear();
    rows = {0, 1, 2};
    for (int i = 0; i < 3; ++i) {
      toks.push_back(ids[i][lens[i] + step]);
      runs.push_back({slots[i], 1});
    }
    std::span<const float> l = e.step(toks, runs, rows);
    for (int i = 0; i < 3; ++i)
      for (int v = 0; v < V; ++v)
        ASSERT_EQ(l[static_cast<size_t>(i) * V + v], alone[i][static_cast<size_t>(lens[i] + step) * V + v])
            << "sequence " << i << " decode step " << step;
  }
}

TEST_P(ModelInvariants, ForkedSequencesContinueIndependently) {
  Engine e(dir(), opts());
  const int V = e.vocab_size();
  const auto prefix = random_ids(11, V, 11), a = random_ids(5, V, 12), b = random_ids(5, V, 13);
  auto run_alone = [&](const std::vector<int32_t>& tail) {
    const int s = e.new_sequence();
    e.prefill(s, prefix, false);
    std::vector<float> l = e.prefill(s, tail, true);
    e.free_sequence(s);
    return l;
  };
  const auto ra = run_alone(a), rb = run_alone(b);
  const int parent = e.new_sequence();
  e.prefill(parent, prefix, false);
  const int child = e.cache().fork(parent);
  const auto fa = e.prefill(parent, a, true), fb = e.prefill(child, b, true);
  for (size_t i = 0; i < ra.size(); ++i) ASSERT_EQ(fa[i], ra[i]);
  for (size_t i = 0; i < rb.size(); ++i) ASSERT_EQ(fb[i], rb[i]);
}

TEST_P(ModelInvariants, BadTokenFailsAndLeavesStateUntouched) {
  Engine e(dir(), opts());
  const int V = e.vocab_size();
  const int s = e.new_sequence();
  e.prefill(s, random_ids(5, V, 14), false);
  const std::vector<float> before = cache_contents(e, s);
  const std::vector<int32_t> bad = {1, 2, V};
  try {
    e.prefill(s, bad, false);
    FAIL() << "expected an error";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("token id " + std::to_string(V) + " is outside the vocabulary"),
              std::string::npos)
        << err.what();
  }
  const std::vector<float> after = cache_contents(e, s);
  EXPECT_EQ(before, after);
}

TEST_P(ModelInvariants, BadTokenLateInALongPromptFailsBeforeAnyChunkRuns) {
  // prefill() runs 512-token chunks: an id at position 550 must be refused before chunk 1 runs.
  Engine e(dir(), opts());
  const int V = e.vocab_size();
  const int s = e.new_sequence();
  e.prefill(s, random_ids(5, V, 15), false);
  const std::vector<float> before = cache_contents(e, s);
  std::vector<int32_t> ids = random_ids(600, V, 16);
  ids[550] = V + 3;
  EXPECT_THROW(e.prefill(s, ids, false), Error);
  const std::vector<float> after = cache_contents(e, s);
  EXPECT_EQ(before, after);
}

// One decode step of sequence s: logits of token `id`.
std::vector<float> decode(Engine& e, int s, int32_t id) {
  const BatchRun run{s, 1};
  const int row = 0;
  std::span<const float> l = e.step(std::span(&id, 1), std::span(&run, 1), std::span(&row, 1));
  return {l.begin(), l.end()};
}

std::vector<float> decode_all(Engine& e, int s, const std::vector<int32_t>& ids) {
  std::vector<float> out;
  for (int32_t id : ids) {
    const auto l = decode(e, s, id);
    out.insert(out.end(), l.begin(), l.end());
  }
  return out;
}

// A fresh sequence's logits: every prompt position (one prefill), then one decode step per id of
// `cont`.
std::vector<float> prefill_then_decode_all(Engine& e, const std::vector<int32_t>& prompt,
                                           const std::vector<int32_t>& cont) {
  const int s = e.new_sequence();
  std::vector<float> l = e.prefill(s, prompt, true);
  const auto d = decode_all(e, s, cont);
  l.insert(l.end(), d.begin(), d.end());
  e.free_sequence(s);
  return l;
}

TEST_P(ModelInvariants, SnapshotDecodeRestoreDecodeAgainGivesTheSameLogits) {
  Engine e(dir(), opts());
  const int V = e.vocab_size();
  const auto prompt = random_ids(19, V, 21), cont = random_ids(6, V, 22);
  const int s = e.new_sequence();
  e.prefill(s, prompt, false);
  const Snapshot snap = e.cache().snapshot(s);
  const auto first = decode_all(e, s, cont);
  e.cache().restore(s, snap);
  EXPECT_EQ(e.cache().seq_length(s), 19);
  const auto second = decode_all(e, s, cont);
  EXPECT_EQ(first, second);
  // Restored into another sequence, too.
  const int t = e.new_sequence();
  e.cache().restore(t, snap);
  EXPECT_EQ(decode_all(e, t, cont), first);
}

TEST_P(ModelInvariants, CropThenRedecodeRepeatsTheOriginalContinuation) {
  Engine e(dir(), opts());
  const int V = e.vocab_size();
  const auto prompt = random_ids(21, V, 23), cont = random_ids(9, V, 24);
  const int s = e.new_sequence();
  e.prefill(s, prompt, false);
  e.cache().keep_snapshot(s);  // at 21 tokens
  const auto original = decode_all(e, s, cont);
  decode_all(e, s, random_ids(4, V, 25));  // wander off
  if (e.cache().has_state()) {
    EXPECT_THROW(e.cache().crop(s, 20), Error) << "no snapshot covers 20 tokens";
  }
  e.cache().crop(s, 21);
  EXPECT_EQ(e.cache().seq_length(s), 21);
  EXPECT_EQ(decode_all(e, s, cont), original);
}

TEST_P(ModelInvariants, ReorderGathersWholeSequencesLikeBeamSearch) {
  Engine e(dir(), opts());
  const int V = e.vocab_size();
  std::vector<std::vector<int32_t>> prompts = {random_ids(7, V, 31), random_ids(12, V, 32), random_ids(3, V, 33)};
  std::vector<int> seqs;
  for (const auto& p : prompts) {
    seqs.push_back(e.new_sequence());
    e.prefill(seqs.back(), p, false);
  }
  const std::vector<int> src = {2, 0, 0};
  e.cache().reorder(seqs, src);
  const int32_t next[3] = {5, 6, 7};
  std::vector<std::vector<float>> got;
  for (int i = 0; i < 3; ++i) got.push_back(decode(e, seqs[i], next[i]));
  for (int s : seqs) e.free_sequence(s);
  for (int i = 0; i < 3; ++i) {
    const int s = e.new_sequence();
    e.prefill(s, prompts[src[i]], false);
    EXPECT_EQ(decode(e, s, next[i]), got[i]) << "beam " << i;
    e.free_sequence(s);
  }
}

TEST_P(ModelInvariants, RemoveReturnsEverySlotAndPage) {
  Engine e(dir(), opts());
  const int V = e.vocab_size();
  const int free0 = e.cache().free_pages();
  const int a = e.new_sequence();
  e.prefill(a, random_ids(40, V, 41), false);
  const int b = e.cache().fork(a);
  decode_all(e, b, random_ids(3, V, 42));
  const int c = e.new_sequence();
  e.prefill(c, random_ids(5, V, 43), false);
  e.cache().keep_snapshot(c);
  for (int s : {a, b, c}) e.free_sequence(s);
  EXPECT_EQ(e.cache().live_sequences(), 0);
  EXPECT_EQ(e.cache().free_pages(), free0);
}

TEST_P(ModelInvariants, FullKvCacheFailsTheStepAndChangesNothing) {
  EngineOptions o = opts(2);
  o.context = 24;
  o.block_size = 4;
  Engine e(dir(), o);
  const int V = e.vocab_size();
  const int a = e.new_sequence(), b = e.new_sequence();
  e.prefill(a, random_ids(10, V, 51), false);
  const auto before = cache_contents(e, a);
  // b asks for 40 tokens: more than the 48-token pool has left once a holds 12.
  if (e.cache().has_kv()) {
    const std::vector<int32_t> toks = random_ids(41, V, 52);
    const BatchRun runs[] = {{a, 1}, {b, 40}};
    const int rows[] = {0};
    try {
      e.step(toks, runs, rows);
      FAIL() << "expected the KV cache to be full";
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find("KV cache full"), std::string::npos) << err.what();
    }
    EXPECT_EQ(cache_contents(e, a), before);
    EXPECT_EQ(e.cache().seq_length(b), 0);
    try {
      e.prefill(b, random_ids(60, V, 53), false);
      FAIL() << "expected the prompt to be refused";
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find("does not fit the KV cache"), std::string::npos) << err.what();
    }
    EXPECT_EQ(e.cache().seq_length(b), 0);
  }
}

TEST_P(ModelInvariants, SixteenBitStateStorageTracksF32) {
  Engine f32(dir(), opts());
  if (!f32.cache().has_state()) GTEST_SKIP() << "no recurrent state";
  const int V = f32.vocab_size();
  const auto prompt = random_ids(23, V, 61), cont = random_ids(8, V, 62);
  auto run = [&](Engine& e) { return prefill_then_decode_all(e, prompt, cont); };
  const std::vector<float> want = run(f32);
  for (DType dt : {DType::BF16, DType::F16}) {
    EngineOptions o = opts();
    o.state_dtype = dt;
    Engine e(dir(), o);
    EXPECT_LE(e.cache().state_bytes_per_sequence(), f32.cache().state_bytes_per_sequence() / 2 + 64);
    const std::vector<float> got = run(e);
    const size_t prompt_logits = prompt.size() * static_cast<size_t>(V);
    // One prefill step reads only zero state: identical. Decoding reads the rounded state.
    EXPECT_EQ(std::vector<float>(got.begin(), got.begin() + prompt_logits),
              std::vector<float>(want.begin(), want.begin() + prompt_logits));
    EXPECT_LT(rel_err(got.data() + prompt_logits, want.data() + prompt_logits, want.size() - prompt_logits),
              tol::kStateBf16)
        << (dt == DType::BF16 ? "bf16" : "f16");
    EXPECT_NE(got, want) << "16-bit storage should round something";
  }
}

// With bf16 storage a step of single-token runs updates the SSM states in place (no f32 staging);
// a step that also holds a longer run stages every state. Both must give bitwise the same logits
// and the same stored state, for several sequences in one step (in place: split over the pool by
// sequence), listed out of slot order.
TEST_P(ModelInvariants, Bf16StateDecodedInPlaceEqualsStaged) {
  EngineOptions o = opts(5);
  o.state_dtype = DType::BF16;
  Engine e(dir(), o);
  if (!e.cache().has_state()) GTEST_SKIP() << "no recurrent state";
  const int V = e.vocab_size();
  const auto pa = random_ids(11, V, 63), pb = random_ids(9, V, 64);
  const auto ca = random_ids(4, V, 65), cb = random_ids(4, V, 66), other = random_ids(8, V, 67);
  const int a = e.new_sequence(), b = e.new_sequence();
  e.prefill(a, pa, false);
  e.prefill(b, pb, false);
  const int a2 = e.cache().fork(a), b2 = e.cache().fork(b), c = e.new_sequence();
  for (size_t t = 0; t < ca.size(); ++t) {
    // In place: b and a decode together.
    const std::vector<int32_t> toks = {cb[t], ca[t]};
    const BatchRun decode[2] = {{b, 1}, {a, 1}};
    const int rows[2] = {0, 1};
    const std::span<const float> l = e.step(toks, decode, rows);
    const std::vector<float> want_b(l.begin(), l.begin() + V), want_a(l.begin() + V, l.end());
    // Staged: the copies decode the same tokens around a 2-token run of c.
    const std::vector<int32_t> toks2 = {ca[t], other[2 * t], other[2 * t + 1], cb[t]};
    const BatchRun mixed[3] = {{a2, 1}, {c, 2}, {b2, 1}};
    const int rows2[2] = {0, 3};
    const std::span<const float> l2 = e.step(toks2, mixed, rows2);
    ASSERT_EQ(std::vector<float>(l2.begin(), l2.begin() + V), want_a) << "decode step " << t;
    ASSERT_EQ(std::vector<float>(l2.begin() + V, l2.end()), want_b) << "decode step " << t;
  }
  EXPECT_EQ(cache_contents(e, a), cache_contents(e, a2));
  EXPECT_EQ(cache_contents(e, b), cache_contents(e, b2));
}

// A quantized --dtype's invariants: its tolerances against f32 weights (plain, discrete Mamba-2 and
// routed-MoE fixtures; see tests/numerics.h) and for prefill + decode against its own forward.
struct QuantTols {
  double model, discrete, routed, gdn, split, correlation;
};

// --dtype q8_0 / q4_0: every weight matrix quantized at load. Logits track the f32 model within the
// quantization error, and prefill + decode still agree with one full forward.
void quantized_tracks_f32(const std::filesystem::path& dir, const EngineOptions& base, const char* model,
                          WeightDType dtype, const QuantTols& tols) {
  const char* name = weight_dtype_name(dtype);
  Engine f32(dir, base);
  EngineOptions o = base;
  o.load.dtype = dtype;
  Engine q(dir, o);
  std::printf("%s: weight bytes %s %zu, f32 %zu\n", model, name, q.model().weight_bytes(), f32.model().weight_bytes());
  // Matrices whose rows are whole 64-code steps are stored as int8 (4-bit) codes. The zamba2
  // fixture (hidden size 32: most matrices have 32 columns and stay f32; its 8-row adapters pad to
  // a 16-row panel) saves the least, ~25% at q8_0; every other fixture more.
  EXPECT_LT(q.model().weight_bytes(), f32.model().weight_bytes() * 4 / 5) << "matrices should be stored quantized";
  const int T = 19, V = f32.vocab_size();
  const auto ids = random_ids(T, V, 71);
  auto full = [&](Engine& e) {
    const int s = e.new_sequence();
    std::vector<float> l = e.prefill(s, ids, true);
    e.free_sequence(s);
    return l;
  };
  const std::vector<float> want = full(f32), got = full(q);
  const double err = rel_err(got.data(), want.data(), want.size());
  // The logits' correlation (centred, over all tokens and the vocabulary) with f32's.
  double mg = 0, mw = 0, sgw = 0, sgg = 0, sww = 0;
  for (size_t i = 0; i < got.size(); ++i) mg += got[i], mw += want[i];
  mg /= static_cast<double>(got.size()), mw /= static_cast<double>(got.size());
  for (size_t i = 0; i < got.size(); ++i) {
    sgw += (got[i] - mg) * (want[i] - mw), sgg += (got[i] - mg) * (got[i] - mg), sww += (want[i] - mw) * (want[i] - mw);
  }
  const double corr = sgw / std::sqrt(sgg * sww);
  std::printf("%s: %s vs f32 logits %.2e, correlation %.4f\n", model, name, err, corr);
  EXPECT_GT(corr, tols.correlation);
  const bool discrete = std::string(model) == "llamba" || std::string(model) == "hybridlm_m2d";
  const bool routed = std::string(model) == "lfm2_moe";
  const bool gdn = std::string(model) == "hybridlm_gdn" || std::string(model).rfind("qwen3", 0) == 0;
  EXPECT_LT(err, discrete ? tols.discrete : routed ? tols.routed : gdn ? tols.gdn : tols.model);
  EXPECT_NE(got, want) << name << " should round something";
  const std::vector<float> split = prefill_then_decode(q, ids, 11);
  const double split_err = rel_err(split.data(), got.data(), got.size());
  std::printf("%s: %s prefill+decode vs full %.2e\n", model, name, split_err);
  EXPECT_LT(split_err, tols.split);
}

TEST_P(ModelInvariants, Q8WeightsTrackF32) {
  quantized_tracks_f32(dir(), opts(), model(), WeightDType::Q8_0,
                       {tol::kQ8Model, tol::kQ8ModelDiscreteMamba2, tol::kQ8ModelRoutedMoe, tol::kQ8ModelGatedDeltaNet,
                        tol::kQ8DecodeVsPrefill,
                        tol::kQ8ModelCorrelation});
}

TEST_P(ModelInvariants, Q4WeightsTrackF32) {
  quantized_tracks_f32(dir(), opts(), model(), WeightDType::Q4_0,
                       {tol::kQ4Model, tol::kQ4ModelDiscreteMamba2, tol::kQ4ModelRoutedMoe, tol::kQ4ModelGatedDeltaNet,
                        tol::kQ4DecodeVsPrefill,
                        tol::kQ4ModelCorrelation});
  // The same matrices as q8_0, in fewer bytes.
  EngineOptions o = opts();
  o.load.dtype = WeightDType::Q8_0;
  const size_t q8 = Engine(dir(), o).model().weight_bytes();
  o.load.dtype = WeightDType::Q4_0;
  EXPECT_LT(Engine(dir(), o).model().weight_bytes(), q8);
}

std::string invariant_name(const ::testing::TestParamInfo<std::tuple<const char*, DType>>& i) {
  return std::string(std::get<0>(i.param)) + "_kv_" + std::string(dtype_name(std::get<1>(i.param)));
}
INSTANTIATE_TEST_SUITE_P(Fixtures, ModelInvariants,
                         ::testing::Combine(::testing::ValuesIn(kModels), ::testing::Values(DType::F32)), invariant_name);
INSTANTIATE_TEST_SUITE_P(Bf16Kv, ModelInvariants,
                         ::testing::Combine(::testing::ValuesIn(kAttentionModels), ::testing::Values(DType::BF16)),
                         invariant_name);

// 16-bit KV storage against f32 KV on every attention fixture: a prompt in one prefill step, then
// decode steps, all logits compared (relative to their scale, as everywhere in this file).
class KvStorage : public ::testing::TestWithParam<const char*> {};

TEST_P(KvStorage, SixteenBitKvTracksF32) {
  Engine f32(fixtures() / GetParam(), opts());
  ASSERT_TRUE(f32.cache().has_kv()) << "kAttentionModels lists a fixture without attention layers";
  ASSERT_EQ(f32.cache().kv_dtype(), DType::F32);
  const int V = f32.vocab_size();
  const auto prompt = random_ids(23, V, 81), cont = random_ids(8, V, 82);
  auto run = [&](Engine& e) { return prefill_then_decode_all(e, prompt, cont); };
  const std::vector<float> want = run(f32);
  for (DType dt : {DType::BF16, DType::F16}) {
    EngineOptions o = opts();
    o.kv_dtype = dt;
    Engine e(fixtures() / GetParam(), o);
    EXPECT_EQ(e.cache().kv_dtype(), dt);
    EXPECT_EQ(2 * e.cache().kv_bytes_per_token(), f32.cache().kv_bytes_per_token());
    const std::vector<float> got = run(e);
    const double err = rel_err(got.data(), want.data(), want.size());
    double abs_err = 0;
    for (size_t i = 0; i < want.size(); ++i) abs_err = std::max(abs_err, std::fabs(double(got[i]) - want[i]));
    std::printf("%s: %s KV vs f32 KV logits: %.2e of their scale (max abs %.2e)\n", GetParam(),
                dtype_name(dt).data(), err, abs_err);
    EXPECT_LT(err, dt == DType::BF16 ? tol::kKvBf16Model : tol::kKvF16Model) << dtype_name(dt);
    EXPECT_NE(got, want) << "16-bit KV should round something";
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, KvStorage, ::testing::ValuesIn(kAttentionModels));

// The engine stores KV in bf16 unless told otherwise (as llama.cpp and vLLM default to 16-bit KV).
TEST(KvStorageDefault, EngineDefaultsToBf16Kv) {
  EXPECT_EQ(EngineOptions{}.kv_dtype, DType::BF16);
  EngineOptions o;
  o.threads = 1;
  Engine e(fixtures() / "jamba", o);
  EXPECT_EQ(e.cache().kv_dtype(), DType::BF16);
}

}  // namespace
}  // namespace hybridlm

namespace hybridlm {
namespace {

// Copies a fixture, rewriting its model.safetensors through `edit` (drop or reshape a tensor).
std::filesystem::path edited_fixture(const std::string& name, const std::string& tag,
                                     const std::function<void(std::vector<TensorToWrite>&)>& edit) {
  const auto src = fixtures() / name;
  const auto dst = std::filesystem::temp_directory_path() / ("hybridlm_test_" + tag + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dst);
  std::filesystem::create_directories(dst);
  std::filesystem::copy_file(src / "config.json", dst / "config.json");
  const SafetensorsFile f = SafetensorsFile::open(src / "model.safetensors");
  std::vector<TensorToWrite> ts;
  for (const auto& [n, t] : f.tensors()) ts.push_back({n, t.dtype, t.shape, {t.data, t.nbytes}});
  edit(ts);
  write_safetensors(dst / "model.safetensors", ts);
  return dst;
}

// q4_0 computes the model of the values it holds: the engine at --dtype q4_0 against the engine at
// f32 on a copy of the checkpoint whose quantized matrices (those matrix_storage stores as q4_0,
// cut as the loader cuts them: a stacked tensor per expert) hold dequantize(quantize(w)). Only the
// activations' q8_0 rounding separates the two, so this holds q4_0 to a q8_0-size tolerance where
// the comparison with the f32 weights cannot (Q4WeightsTrackF32).
class Q4Values : public ::testing::TestWithParam<const char*> {};

TEST_P(Q4Values, Q4IsTheModelOfItsValues) {
  const std::string model = GetParam();
  EngineOptions o = opts();
  o.load.dtype = WeightDType::Q4_0;
  Engine q4(fixtures() / model, o);
  std::map<std::string, std::vector<float>> values;  // the rewritten tensors, f32
  for (const TensorEntry& e : Model::tensors(q4.model().config())) {
    if (e.kind == TensorEntry::Vector) continue;
    const bool stacked = e.kind == TensorEntry::Stacked;
    const int64_t copies = stacked ? e.shape[0] : 1;
    const int rows = static_cast<int>(e.shape[stacked ? 1 : 0]);
    const int cols = static_cast<int>(e.numel() / copies / rows);
    if (matrix_storage(rows, cols, WeightDType::Q4_0).dtype != DType::U8) continue;
    const SafetensorsFile f = SafetensorsFile::open(fixtures() / model / "model.safetensors");
    ASSERT_TRUE(f.tensors().count(e.name)) << e.name;
    std::vector<float>& w = values[e.name];
    w.resize(static_cast<size_t>(e.numel()));
    f.tensors().at(e.name).to_f32(w.data());
    std::vector<uint8_t> codes(q4_code_bytes(rows, cols));
    std::vector<float> scales(q4_scale_count(rows, cols));
    for (int64_t k = 0; k < copies; ++k) {
      float* m = w.data() + static_cast<size_t>(k) * rows * cols;
      quantize_q4_0_matrix(m, rows, cols, codes.data(), scales.data());
      for (int r = 0; r < rows; ++r)
        dequantize_q4_0_matrix_row(codes.data(), scales.data(), r, cols, m + static_cast<size_t>(r) * cols);
    }
  }
  ASSERT_FALSE(values.empty());
  const auto dir = edited_fixture(model, "q4values_" + model, [&](std::vector<TensorToWrite>& ts) {
    for (TensorToWrite& t : ts) {
      const auto it = values.find(t.name);
      if (it == values.end()) continue;
      t.dtype = DType::F32;
      t.bytes = {reinterpret_cast<const uint8_t*>(it->second.data()), it->second.size() * sizeof(float)};
    }
  });
  Engine f32(dir, opts());
  const int T = 19;
  const auto ids = random_ids(T, f32.vocab_size(), 71);
  auto full = [&](Engine& e) {
    const int s = e.new_sequence();
    std::vector<float> l = e.prefill(s, ids, true);
    e.free_sequence(s);
    return l;
  };
  const std::vector<float> want = full(f32), got = full(q4);
  const double err = rel_err(got.data(), want.data(), want.size());
  std::printf("%s: q4_0 vs f32 on its values %.2e\n", model.c_str(), err);
  EXPECT_LT(err, tol::kQ4VsItsValues);
  std::filesystem::remove_all(dir);
}
INSTANTIATE_TEST_SUITE_P(Fixtures, Q4Values, ::testing::ValuesIn(kModels));

// Mamba-1's batch-1 decode step runs dt_proj, softplus and the scan in one region over blocks of
// 32 channels, dt_proj's rows as views of their own; a batch runs the three ops. The same tokens
// decoded alone and beside another sequence must agree bitwise, with dt_proj in lane panels
// (weights copied: 256 rows of 16) and row-major (mapped), with f32 and bf16 state.
TEST(Mamba1Decode, FusedBatchOneStepEqualsTheBatchPath) {
  for (bool mmap : {false, true})
    for (DType state : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(std::string(mmap ? "mapped" : "copied") + " weights, state " + std::string(dtype_name(state)));
      EngineOptions o = opts();
      o.load.use_mmap = mmap;
      o.state_dtype = state;
      Engine e(fixtures() / "mamba1_wide", o);
      const int V = e.vocab_size(), steps = 4;
      const auto a = random_ids(9 + steps, V, 31), b = random_ids(5 + steps, V, 32);
      // Alone: every decode step is one token of one sequence (the fused path).
      std::vector<float> alone;
      const int s = e.new_sequence();
      e.prefill(s, std::span(a).first(9), false);
      for (int t = 9; t < 9 + steps; ++t) {
        const BatchRun run{s, 1};
        const int row = 0;
        std::span<const float> l = e.step(std::span(a).subspan(t, 1), std::span(&run, 1), std::span(&row, 1));
        alone.insert(alone.end(), l.begin(), l.end());
      }
      e.free_sequence(s);
      // Beside b: two tokens a step (the separate ops).
      const int sa = e.new_sequence(), sb = e.new_sequence();
      e.prefill(sa, std::span(a).first(9), false);
      e.prefill(sb, std::span(b).first(5), false);
      for (int k = 0; k < steps; ++k) {
        const int32_t toks[2] = {a[9 + k], b[5 + k]};
        const BatchRun runs[2] = {{sa, 1}, {sb, 1}};
        const int rows[2] = {0, 1};
        std::span<const float> l = e.step(toks, runs, rows);
        for (int v = 0; v < V; ++v)
          ASSERT_EQ(l[v], alone[static_cast<size_t>(k) * V + v]) << "decode step " << k << ", logit " << v;
      }
    }
}

std::string load_error(const std::filesystem::path& dir) {
  try {
    Engine e(dir, opts());
  } catch (const Error& err) {
    return err.what();
  }
  return "(no error)";
}

TEST(LoaderErrors, MissingTensorIsNamed) {
  const auto dir = edited_fixture("mamba2_g2", "missing", [](std::vector<TensorToWrite>& ts) {
    std::erase_if(ts, [](const TensorToWrite& t) { return t.name == "backbone.layers.1.mixer.dt_bias"; });
  });
  EXPECT_NE(load_error(dir).find("missing tensor 'backbone.layers.1.mixer.dt_bias'"), std::string::npos)
      << load_error(dir);
  std::filesystem::remove_all(dir);
}

TEST(LoaderErrors, WrongShapeIsNamed) {
  std::vector<uint8_t> junk(64 * 4 * 2, 0);
  const auto dir = edited_fixture("mamba1", "shape", [&](std::vector<TensorToWrite>& ts) {
    for (auto& t : ts)
      if (t.name == "backbone.norm_f.weight") {
        t.shape = {2, 64};
        t.dtype = DType::F32;
        t.bytes = {junk.data(), junk.size()};
      }
  });
  const std::string e = load_error(dir);
  EXPECT_NE(e.find("tensor 'backbone.norm_f.weight' has shape (2, 64), expected (64,)"), std::string::npos) << e;
  std::filesystem::remove_all(dir);
}

TEST(LoaderErrors, Mamba2InProjWithAnMlpBranchIsRefusedByName) {
  const SafetensorsFile f = SafetensorsFile::open(fixtures() / "mamba2_g2" / "model.safetensors");
  const TensorInfo& t = f.tensors().at("backbone.layers.0.mixer.in_proj.weight");
  std::vector<uint8_t> bigger(static_cast<size_t>((t.shape[0] + 8) * t.shape[1]) * 4, 0);
  const auto dir = edited_fixture("mamba2_g2", "dmlp", [&](std::vector<TensorToWrite>& ts) {
    for (auto& w : ts)
      if (w.name == "backbone.layers.0.mixer.in_proj.weight") {
        w.dtype = DType::F32;
        w.shape = {t.shape[0] + 8, t.shape[1]};
        w.bytes = {bigger.data(), bigger.size()};
      }
  });
  const std::string e = load_error(dir);
  EXPECT_NE(e.find("'backbone.layers.0.mixer.in_proj.weight' has"), std::string::npos) << e;
  EXPECT_NE(e.find("MLP branch"), std::string::npos) << e;
  std::filesystem::remove_all(dir);
}

TEST(LoaderErrors, NotAModelDirectory) {
  EXPECT_NE(load_error("/nonexistent/dir").find("config.json: cannot open"), std::string::npos);
}

}  // namespace
}  // namespace hybridlm
