// Causal attention over the paged KV cache on AVX-512. At long context this is the decode step:
// every query reads all of its sequence's keys and values, and a hybrid with a few attention
// layers spends most of a 16K-context step here unless the kernel runs near memory speed.
//
// A work item is a block of up to kQb consecutive queries (one in decode) and the query heads of
// one KV head (up to kMaxRep of them), so each key and value row comes from memory once per item,
// not once per query and head. Rows are read in place, 32 elements at a time as their even and
// odd elements (load32: for bf16 a shift and a mask, no widened copy). Keys go in tiles of kTile
// with an online softmax (one rescale per tile, query and head):
//   scores  16 dot products in 16 registers (in decode 4 keys of up to 4 query heads, or 16 keys
//           of a head alone; in a block 4 keys of 4 queries), then summed across lanes together
//           (sum16x16), scaled: each key row widened once for the heads or queries it serves;
//   softmax per query: masked past its last key, the tile's maximum, exp16 of the shifted
//           scores, a running sum per lane;
//   values  acc += p_j v_j over the tile, each value row widened once for the block (prefill)
//           or for up to 8 / 4 / 2 of the item's query heads (decode: a pass over 32 / 64 /
//           96-128 of the head's dims, head_dim in passes of 128 and a remainder).
// Sharing the widening and the loads among heads made decode 1.3x faster from L2
// (bench_attention -c) at 64K-128K keys on the granite, Llama-3-8B and qwen3-next shapes.
// Over bf16 pages the query is rounded to bf16 (ops.inc) and, where the CPU has AVX512-BF16, the
// scores are vdpbf16ps dot products over the rows as stored (scores_dot_tile): half the
// instructions, 1.3-1.7x faster decode from L2 at 16K-128K keys on the granite 12:4x64,
// qwen3-next-750m 8:2x128 and qwen3-next 16:2x256 shapes; without it the rounded query goes
// through the f32 path.
// Rows are found by walking the page table (no division per key), and the next tile's rows are
// prefetched. A (query, head)'s arithmetic does not depend on which other queries or heads share
// its item, call or thread, so one call for T queries gives bitwise what T single-query calls
// give, at any thread count; f32 and f16 rows are put in the same even/odd order, so f32 and f16
// pages that hold the same values give bitwise the same result (bf16 pages too, on the rounded
// query, without the dot products).
#include "kernels/cpu/intrinsics.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/attention_avx512.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/vec_math.h"

namespace hybridlm::cpu {

namespace {

constexpr int kTile = 64;    // keys per online-softmax tile
constexpr int kMaxRep = 8;   // query heads per work item
constexpr int kQb = 4;       // queries per work item (prefill)
constexpr int kMaxHd = 256;  // the largest head_dim this kernel takes (buffers on the stack)

// 32 stored elements of a row as two f32 vectors, the even-indexed elements and the odd ones.
// For bf16 that is free: a 32-bit lane holds elements 2i (low half) and 2i + 1 (high half), so
// a shift and a mask widen both in register. f32 and f16 rows are put in the same order by a
// permute, so every dtype feeds the same arithmetic the same values.
HYBRIDLM_AVX512 HYBRIDLM_INLINE void split_even_odd(__m512 lo, __m512 hi, __m512& even, __m512& odd) {
  const __m512i ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i io = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  even = _mm512_permutex2var_ps(lo, ie, hi);
  odd = _mm512_permutex2var_ps(lo, io, hi);
}

struct RowsF32 {
  using Elem = float;
  static constexpr bool kRoundQ = false;
  static HYBRIDLM_AVX512 HYBRIDLM_INLINE void load32(const float* p, __m512& even, __m512& odd) {
    split_even_odd(_mm512_loadu_ps(p), _mm512_loadu_ps(p + 16), even, odd);
  }
};
struct RowsBf16 {
  using Elem = uint16_t;
  static constexpr bool kRoundQ = true;  // the query rounded to bf16 before its dot products
  static HYBRIDLM_AVX512 HYBRIDLM_INLINE void load32(const uint16_t* p, __m512& even, __m512& odd) {
    const __m512i x = _mm512_loadu_si512(p);
    even = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
    odd = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
  }
};
struct RowsF16 {
  using Elem = uint16_t;
  static constexpr bool kRoundQ = false;
  static HYBRIDLM_AVX512 HYBRIDLM_INLINE void load32(const uint16_t* p, __m512& even, __m512& odd) {
    split_even_odd(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))),
                   _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16))), even, odd);
  }
};

// Zero bits: 0 in every dtype; the row of the keys that pad a tile's last 16 to full width.
alignas(64) constexpr float kZeroRow[kMaxHd] = {};

// The offsets of successive keys' rows of KV head g (key 0 first), walking the page table: no
// division per key.
struct RowWalk {
  RowWalk(const PagedKv& kv, int g)
      : kv(kv), head_off(static_cast<size_t>(g) * kv.head_stride), token_stride(kv.token_stride) {}
  size_t next() {
    const size_t off =
        static_cast<size_t>(kv.pages[page]) * kv.page_stride + static_cast<size_t>(in_page) * token_stride + head_off;
    if (++in_page == kv.block_size) {
      in_page = 0;
      ++page;
    }
    return off;
  }
  const PagedKv& kv;
  size_t head_off, token_stride;
  int page = 0, in_page = 0;
};

// acc (NC groups of 32 in even/odd order, 2 NC registers) += sum_j p[j] v_j over nb value rows
// (the rows at vr[j] + off), for G query heads of one query (decode) at once: each value row is
// loaded and widened once for all of them (head g takes p[g], acc[g]).
template <class Rows, int NC, int G>
HYBRIDLM_AVX512 HYBRIDLM_INLINE void add_values_heads(const typename Rows::Elem* const* vr, int off,
                                                      const float* const* p, int nb, float* const* acc) {
  __m512 a[G][2 * NC];
  for (int g = 0; g < G; ++g)
    for (int i = 0; i < 2 * NC; ++i) a[g][i] = _mm512_load_ps(acc[g] + 16 * i);
  for (int j = 0; j < nb; ++j) {
    __m512 e[NC], o[NC];
    for (int w = 0; w < NC; ++w) Rows::load32(vr[j] + off + 32 * w, e[w], o[w]);
    for (int g = 0; g < G; ++g) {
      const __m512 pj = _mm512_set1_ps(p[g][j]);
      for (int w = 0; w < NC; ++w) {
        a[g][2 * w] = _mm512_fmadd_ps(pj, e[w], a[g][2 * w]);
        a[g][2 * w + 1] = _mm512_fmadd_ps(pj, o[w], a[g][2 * w + 1]);
      }
    }
  }
  for (int g = 0; g < G; ++g)
    for (int i = 0; i < 2 * NC; ++i) _mm512_store_ps(acc[g] + 16 * i, a[g][i]);
}

// add_values_heads over nh heads of one query in groups of up to 8 / NC heads (2 NC accumulators
// each: at most 16, beside the 2 NC widened halves of the row, in registers).
template <class Rows, int NC>
HYBRIDLM_AVX512 HYBRIDLM_INLINE void add_values_all_heads(const typename Rows::Elem* const* vr, int off,
                                                          const float* const* p, int nb, float* const* acc, int nh) {
  constexpr int kG = 8 / NC > 0 ? 8 / NC : 1;
  for (int h = 0; h < nh; h += kG) {
    switch (std::min(kG, nh - h)) {
      case 1: add_values_heads<Rows, NC, 1>(vr, off, p + h, nb, acc + h); break;
      case 2: add_values_heads<Rows, NC, std::min(2, kG)>(vr, off, p + h, nb, acc + h); break;
      case 3: add_values_heads<Rows, NC, std::min(3, kG)>(vr, off, p + h, nb, acc + h); break;
      case 4: add_values_heads<Rows, NC, std::min(4, kG)>(vr, off, p + h, nb, acc + h); break;
      case 5: add_values_heads<Rows, NC, std::min(5, kG)>(vr, off, p + h, nb, acc + h); break;
      case 6: add_values_heads<Rows, NC, std::min(6, kG)>(vr, off, p + h, nb, acc + h); break;
      case 7: add_values_heads<Rows, NC, std::min(7, kG)>(vr, off, p + h, nb, acc + h); break;
      default: add_values_heads<Rows, NC, std::min(8, kG)>(vr, off, p + h, nb, acc + h); break;
    }
  }
}

// The same for the kQb queries of a block at once (one head): each value row is widened once for
// all of them, and query u takes rows j < nb[u] only (its own keys: the next queries' keys are
// past its end; n_max is the largest nb). Per query, the same FMAs in the same order as
// add_values_heads per head.
template <class Rows, int NC>
HYBRIDLM_AVX512 HYBRIDLM_INLINE void add_values_block(const typename Rows::Elem* const* vr, int off,
                                                      const float* const* p, const int* nb, int n_max,
                                                      float* const* acc) {
  __m512 a[kQb][2 * NC];
  for (int u = 0; u < kQb; ++u)
    for (int i = 0; i < 2 * NC; ++i) a[u][i] = _mm512_load_ps(acc[u] + 16 * i);
  for (int j = 0; j < n_max; ++j) {
    __m512 e[NC], o[NC];
    for (int w = 0; w < NC; ++w) Rows::load32(vr[j] + off + 32 * w, e[w], o[w]);
    for (int u = 0; u < kQb; ++u) {
      if (j >= nb[u]) continue;
      const __m512 pj = _mm512_set1_ps(p[u][j]);
      for (int w = 0; w < NC; ++w) {
        a[u][2 * w] = _mm512_fmadd_ps(pj, e[w], a[u][2 * w]);
        a[u][2 * w + 1] = _mm512_fmadd_ps(pj, o[w], a[u][2 * w + 1]);
      }
    }
  }
  for (int u = 0; u < kQb; ++u)
    for (int i = 0; i < 2 * NC; ++i) _mm512_store_ps(acc[u] + 16 * i, a[u][i]);
}

// Decode scores of G query heads (2 to 4) of one query over 16 keys kb[0 .. 15], scaled, into
// out[g][0 .. 15]: per 4 keys, slot 4 g + k of one sum16x16 holds head g's dot product with key
// 4 c + k, each key row widened once for the G heads. The same FMAs in the same order per (head,
// key) as the one-head path, and sum16x16 sums each slot by the same tree, so the same scores.
template <class Rows, int G>
HYBRIDLM_AVX512 HYBRIDLM_INLINE void scores_heads(const typename Rows::Elem* const* kb, int ng, const float* const* q,
                                                  __m512 scale_v, float* const* out) {
  for (int c = 0; c < 4; ++c) {
    __m512 d[16];
    for (int k = 0; k < 16; ++k) d[k] = _mm512_setzero_ps();
    for (int w = 0; w < ng; ++w) {
      __m512 qe[G], qo[G];
      for (int g = 0; g < G; ++g) {
        qe[g] = _mm512_load_ps(q[g] + 32 * w);
        qo[g] = _mm512_load_ps(q[g] + 32 * w + 16);
      }
      for (int k = 0; k < 4; ++k) {
        __m512 e, o;
        Rows::load32(kb[4 * c + k] + 32 * w, e, o);
        for (int g = 0; g < G; ++g) d[4 * g + k] = _mm512_fmadd_ps(qo[g], o, _mm512_fmadd_ps(qe[g], e, d[4 * g + k]));
      }
    }
    const __m512 s4 = _mm512_mul_ps(sum16x16(d), scale_v);
    _mm_store_ps(out[0] + 4 * c, _mm512_extractf32x4_ps(s4, 0));
    _mm_store_ps(out[1] + 4 * c, _mm512_extractf32x4_ps(s4, 1));
    if constexpr (G > 2) _mm_store_ps(out[2] + 4 * c, _mm512_extractf32x4_ps(s4, 2));
    if constexpr (G > 3) _mm_store_ps(out[3] + 4 * c, _mm512_extractf32x4_ps(s4, 3));
  }
}

// bf16 dot products (AVX512-BF16): vdpbf16ps adds q[2i] k[2i] + q[2i + 1] k[2i + 1] (exact
// products of bf16 values) to lane i, so a row of 32 keys' elements is one instruction per query
// head, read as stored: no widening, half the arithmetic of the f32 path. The query is rounded to
// bf16 (kept as stored pairs in q); only the accumulation's rounding differs from the f32 path on
// the rounded query. Slot 4 g + k of one sum16x16 holds head (or query) g's score with key 4 c + k,
// as in scores_heads, by the same instructions for a head in decode and a query in a block, so
// decode and prefill give the same scores. Out of line (its own target): called per tile.
// G = 1 takes 16 keys per sum16x16 (each vector summed by the same tree wherever it sits).
template <int G>
HYBRIDLM_AVX512_BF16 HYBRIDLM_INLINE void scores_dot_heads(const uint16_t* const* kb, int ng, const uint16_t* const* q,
                                                           __m512 scale_v, float* const* out) {
  if constexpr (G == 1) {
    __m512 d[16];
    for (int k = 0; k < 16; ++k) d[k] = _mm512_setzero_ps();
    for (int w = 0; w < ng; ++w) {
      const __m512bh qv = (__m512bh)_mm512_load_si512(q[0] + 32 * w);
      for (int k = 0; k < 16; ++k) d[k] = _mm512_dpbf16_ps(d[k], qv, (__m512bh)_mm512_loadu_si512(kb[k] + 32 * w));
    }
    _mm512_store_ps(out[0], _mm512_mul_ps(sum16x16(d), scale_v));
  } else {
    for (int c = 0; c < 4; ++c) {
      __m512 d[16];
      for (int k = 0; k < 16; ++k) d[k] = _mm512_setzero_ps();
      for (int w = 0; w < ng; ++w) {
        __m512i qv[G];
        for (int g = 0; g < G; ++g) qv[g] = _mm512_load_si512(q[g] + 32 * w);
        for (int k = 0; k < 4; ++k) {
          const __m512bh kk = (__m512bh)_mm512_loadu_si512(kb[4 * c + k] + 32 * w);
          for (int g = 0; g < G; ++g) d[4 * g + k] = _mm512_dpbf16_ps(d[4 * g + k], (__m512bh)qv[g], kk);
        }
      }
      const __m512 s4 = _mm512_mul_ps(sum16x16(d), scale_v);
      _mm_store_ps(out[0] + 4 * c, _mm512_extractf32x4_ps(s4, 0));
      _mm_store_ps(out[1] + 4 * c, _mm512_extractf32x4_ps(s4, 1));
      if constexpr (G > 2) _mm_store_ps(out[2] + 4 * c, _mm512_extractf32x4_ps(s4, 2));
      if constexpr (G > 3) _mm_store_ps(out[3] + 4 * c, _mm512_extractf32x4_ps(s4, 3));
    }
  }
}

// Scores of a tile's nb16 keys (kr, padded with zero rows to a multiple of 16) for n query rows
// q[i] (a prefill block's 4 queries of one head, or one query's n heads in decode), scaled, into
// out[i * kTile + key].
__attribute__((noinline)) HYBRIDLM_AVX512_BF16 void scores_dot_tile(const uint16_t* const* kr, int nb16, int ng,
                                                                   const uint16_t* const* q, int n, float scale,
                                                                   float* out) {
  const __m512 scale_v = _mm512_set1_ps(scale);
  for (int b = 0; b < nb16 / 16; ++b)
    for (int r = 0; r < n; r += 4) {
      float* o[4];
      for (int i = 0; i < 4; ++i) o[i] = out + (r + std::min(i, n - 1 - r)) * kTile + 16 * b;
      switch (std::min(4, n - r)) {
        case 1: scores_dot_heads<1>(kr + 16 * b, ng, q + r, scale_v, o); break;
        case 2: scores_dot_heads<2>(kr + 16 * b, ng, q + r, scale_v, o); break;
        case 3: scores_dot_heads<3>(kr + 16 * b, ng, q + r, scale_v, o); break;
        default: scores_dot_heads<4>(kr + 16 * b, ng, q + r, scale_v, o); break;
      }
    }
}

// A work item is a block of up to kQb consecutive queries and up to kMaxRep query heads of one KV
// head. Every (query, head) is computed as if alone: its own keys, tiles from key 0, and scores,
// probabilities and value sums by the same operations in the same order whether the block holds
// one query (decode) or four (prefill), so the result does not depend on T or the thread count.
template <class Rows, bool Dot>
HYBRIDLM_AVX512 void attend(const float* q, int ld_q, const PagedKv& kv, int pos0, int T, int n_heads, float scale,
                            float* out, size_t ib, size_t ie) {
  using Elem = typename Rows::Elem;
  const int hd = kv.head_dim, ng = hd / 32, rep = n_heads / kv.n_kv_heads;
  const int subs = (rep + kMaxRep - 1) / kMaxRep;
  const size_t per_block = static_cast<size_t>(kv.n_kv_heads) * subs, n_blocks = (T + kQb - 1) / kQb;
  const Elem* k_base = static_cast<const Elem*>(kv.k);
  const Elem* v_base = static_cast<const Elem*>(kv.v);
  const Elem* zero_row = reinterpret_cast<const Elem*>(kZeroRow);
  // Per (query, head): the query and the accumulators in even/odd order (per 32 elements: the 16
  // even ones, then the 16 odd ones), the probabilities over the tile; the scores of one head
  // over the tile; the tile's K and V rows.
  alignas(64) float qs[kQb * kMaxRep * kMaxHd], acc[kQb * kMaxRep * kMaxHd], p[kQb * kMaxRep * kTile];
  alignas(64) float sc[kQb * kTile], sch[kMaxRep * kTile];
  alignas(64) uint16_t qbits[Dot ? kQb * kMaxRep * kMaxHd : 1];  // the rounded queries, as bf16
  const Elem* kr[kTile];
  const Elem* vr[kTile];
  for (size_t i = ib; i < ie; ++i) {
    // Blocks in the order first, last, second, second to last, ...: under causal masking a late
    // block has more keys, and the pool hands each thread a contiguous range of items.
    const size_t pos = i / per_block, blk = pos % 2 == 0 ? pos / 2 : n_blocks - 1 - pos / 2;
    const int g = static_cast<int>(i % per_block) / subs, sub = static_cast<int>(i % per_block) % subs;
    const int h0 = g * rep + sub * kMaxRep, nh = std::min(kMaxRep, rep - sub * kMaxRep);
    const int t0 = static_cast<int>(blk) * kQb, nq = std::min(kQb, T - t0);
    const int n_last = pos0 + t0 + nq;  // keys of the block's last query
    float m[kQb][kMaxRep];
    __m512 lsum[kQb][kMaxRep];
    auto qsp = [&](int u, int r) { return qs + (u * kMaxRep + r) * hd; };
    auto qbp = [&](int u, int r) { return qbits + (u * kMaxRep + r) * hd; };
    auto accp = [&](int u, int r) { return acc + (u * kMaxRep + r) * hd; };
    auto pp = [&](int u, int r) { return p + (u * kMaxRep + r) * kTile; };
    for (int u = 0; u < kQb; ++u)
      for (int r = 0; r < nh; ++r) {
        m[u][r] = -INFINITY;
        lsum[u][r] = _mm512_setzero_ps();
        // Slots past the block's queries repeat its last one (computed, never used).
        const float* qh = q + static_cast<size_t>(t0 + std::min(u, nq - 1)) * ld_q + static_cast<size_t>(h0 + r) * hd;
        if constexpr (Dot) {  // bf16 pairs as stored, for vdpbf16ps
          for (int i = 0; i < hd; ++i) qbp(u, r)[i] = f32_to_bf16(qh[i]);
        } else {
          alignas(64) float qr[kMaxHd];
          if constexpr (Rows::kRoundQ) {  // the same rounded query, in f32 (exact)
            for (int i = 0; i < hd; ++i) qr[i] = bf16_to_f32(f32_to_bf16(qh[i]));
            qh = qr;
          }
          for (int w = 0; w < ng; ++w) {
            __m512 e, o;
            RowsF32::load32(qh + 32 * w, e, o);
            _mm512_store_ps(qsp(u, r) + 32 * w, e);
            _mm512_store_ps(qsp(u, r) + 32 * w + 16, o);
          }
        }
        std::memset(accp(u, r), 0, sizeof(float) * hd);
      }
    // `walk` gives the rows of the tile at hand, `ahead` those of the next one, which are
    // prefetched while this one is computed: pages can lie anywhere in the pool, and the
    // hardware prefetcher loses the stream at each jump (decode at 64K over shuffled pages:
    // 1.4x faster with it).
    RowWalk walk(kv, g), ahead(kv, g);
    for (int j0 = 0; j0 < n_last; j0 += kTile) {
      const int nb_last = std::min(kTile, n_last - j0), nb16_last = (nb_last + 15) & ~15;
      int nb[kQb];  // keys of the tile per query (0 past the block's queries)
      for (int u = 0; u < kQb; ++u) nb[u] = u < nq ? std::clamp(pos0 + t0 + u + 1 - j0, 0, kTile) : 0;
      for (int j = 0; j < nb_last; ++j) {
        const size_t off = walk.next();
        kr[j] = k_base + off;
        vr[j] = v_base + off;
      }
      for (int j = nb_last; j < nb16_last; ++j) kr[j] = zero_row;
      if (j0 == 0)
        for (int j = 0; j < nb_last; ++j) ahead.next();
      for (int j = 0, n_next = std::min(kTile, n_last - j0 - nb_last); j < n_next; ++j) {
        const size_t off = ahead.next();
        for (size_t b = 0; b < sizeof(Elem) * hd; b += 64) {
          _mm_prefetch(reinterpret_cast<const char*>(k_base + off) + b, _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(v_base + off) + b, _MM_HINT_T0);
        }
      }
      // Scores, scaled: 16 dot products per lane sum (sum16x16 sums each vector by the same tree
      // wherever it sits). Decode: into sch[head * kTile + key], 4 keys of up to 4 heads per sum
      // (each key row widened once for them), a head alone 16 keys; a block of queries (below):
      // into sc[u * kTile + key], 4 keys of 4 queries (each key row widened once for the 4).
      const __m512 scale_v = _mm512_set1_ps(scale);
      if constexpr (Dot) {
        const uint16_t* qb[kMaxRep > kQb ? kMaxRep : kQb];
        if (nq == 1) {
          for (int r = 0; r < nh; ++r) qb[r] = qbp(0, r);
          scores_dot_tile(reinterpret_cast<const uint16_t* const*>(kr), nb16_last, ng, qb, nh, scale, sch);
        }
      } else if (nq == 1)
        for (int b = 0; b < nb16_last / 16; ++b) {
          const Elem* const* kb = kr + 16 * b;
          for (int r = 0; r < nh;) {
            const int heads = std::min(4, nh - r);
            const float* qg[4];
            float* og[4];
            for (int h = 0; h < heads; ++h) {
              qg[h] = qsp(0, r + h);
              og[h] = sch + (r + h) * kTile + 16 * b;
            }
            if (heads == 4) scores_heads<Rows, 4>(kb, ng, qg, scale_v, og);
            else if (heads == 3) scores_heads<Rows, 3>(kb, ng, qg, scale_v, og);
            else if (heads == 2) scores_heads<Rows, 2>(kb, ng, qg, scale_v, og);
            else {
              __m512 d[16];
              for (int k = 0; k < 16; ++k) d[k] = _mm512_setzero_ps();
              for (int w = 0; w < ng; ++w) {
                const __m512 qe = _mm512_load_ps(qg[0] + 32 * w), qo = _mm512_load_ps(qg[0] + 32 * w + 16);
                for (int k = 0; k < 16; ++k) {
                  __m512 e, o;
                  Rows::load32(kb[k] + 32 * w, e, o);
                  d[k] = _mm512_fmadd_ps(qo, o, _mm512_fmadd_ps(qe, e, d[k]));
                }
              }
              _mm512_store_ps(og[0], _mm512_mul_ps(sum16x16(d), scale_v));
            }
            r += heads;
          }
        }
      for (int r = 0; r < nh; ++r) {
        if constexpr (Dot) {
          if (nq > 1) {
            const uint16_t* qb[kQb];
            for (int u = 0; u < kQb; ++u) qb[u] = qbp(u, r);
            scores_dot_tile(reinterpret_cast<const uint16_t* const*>(kr), nb16_last, ng, qb, kQb, scale, sc);
          }
        } else {
          for (int b = 0; b < nb16_last / 16 && nq > 1; ++b) {
            const Elem* const* kb = kr + 16 * b;
            for (int c = 0; c < 4; ++c) {
              __m512 d[16];  // d[4 u + k]: query u, key 4 c + k
              for (int k = 0; k < 16; ++k) d[k] = _mm512_setzero_ps();
              for (int w = 0; w < ng; ++w) {
                __m512 qe[kQb], qo[kQb];
                for (int u = 0; u < kQb; ++u) {
                  qe[u] = _mm512_load_ps(qsp(u, r) + 32 * w);
                  qo[u] = _mm512_load_ps(qsp(u, r) + 32 * w + 16);
                }
                for (int k = 0; k < 4; ++k) {
                  __m512 e, o;
                  Rows::load32(kb[4 * c + k] + 32 * w, e, o);
                  for (int u = 0; u < kQb; ++u)
                    d[4 * u + k] = _mm512_fmadd_ps(qo[u], o, _mm512_fmadd_ps(qe[u], e, d[4 * u + k]));
                }
              }
              const __m512 s4 = _mm512_mul_ps(sum16x16(d), scale_v);
              _mm_store_ps(sc + 0 * kTile + 16 * b + 4 * c, _mm512_extractf32x4_ps(s4, 0));
              _mm_store_ps(sc + 1 * kTile + 16 * b + 4 * c, _mm512_extractf32x4_ps(s4, 1));
              _mm_store_ps(sc + 2 * kTile + 16 * b + 4 * c, _mm512_extractf32x4_ps(s4, 2));
              _mm_store_ps(sc + 3 * kTile + 16 * b + 4 * c, _mm512_extractf32x4_ps(s4, 3));
            }
          }
        }
        // Online softmax per query over its own keys of the tile.
        for (int u = 0; u < nq; ++u) {
          if (nb[u] == 0) continue;
          __m512 s[kTile / 16];
          __m512 mx = _mm512_set1_ps(-INFINITY);
          for (int b = 0; b < (nb[u] + 15) / 16; ++b) {
            const int valid = std::min(16, nb[u] - 16 * b);
            const __mmask16 live = static_cast<__mmask16>((1u << valid) - 1);
            const float* su = nq == 1 ? sch + r * kTile : sc + u * kTile;
            s[b] = _mm512_mask_blend_ps(live, _mm512_set1_ps(-INFINITY), _mm512_load_ps(su + 16 * b));
            mx = _mm512_max_ps(mx, s[b]);
          }
          const float tile_max = _mm512_reduce_max_ps(mx);
          if (tile_max > m[u][r]) {  // rescale what was accumulated against the old maximum
            const float f = m[u][r] == -INFINITY ? 0.0f : vexp(m[u][r] - tile_max);
            const __m512 fv = _mm512_set1_ps(f);
            lsum[u][r] = _mm512_mul_ps(lsum[u][r], fv);
            float* a = accp(u, r);
            for (int v = 0; v < 2 * ng; ++v) _mm512_store_ps(a + 16 * v, _mm512_mul_ps(_mm512_load_ps(a + 16 * v), fv));
            m[u][r] = tile_max;
          }
          const __m512 mv = _mm512_set1_ps(m[u][r]);
          for (int b = 0; b < (nb[u] + 15) / 16; ++b) {
            const int valid = std::min(16, nb[u] - 16 * b);
            const __mmask16 live = static_cast<__mmask16>((1u << valid) - 1);
            const __m512 e = _mm512_maskz_mov_ps(live, exp16(_mm512_sub_ps(s[b], mv)));
            lsum[u][r] = _mm512_add_ps(lsum[u][r], e);
            _mm512_store_ps(pp(u, r) + 16 * b, e);
          }
        }
      }
      if (nq == 1) {  // decode: all heads of the item per value row
        const float* ph[kMaxRep];
        float* ah[kMaxRep];
        for (int c = 0; c < ng; c += 4) {
          for (int r = 0; r < nh; ++r) {
            ph[r] = pp(0, r);
            ah[r] = accp(0, r) + 32 * c;
          }
          switch (std::min(4, ng - c)) {
            case 1: add_values_all_heads<Rows, 1>(vr, 32 * c, ph, nb[0], ah, nh); break;
            case 2: add_values_all_heads<Rows, 2>(vr, 32 * c, ph, nb[0], ah, nh); break;
            case 3: add_values_all_heads<Rows, 3>(vr, 32 * c, ph, nb[0], ah, nh); break;
            default: add_values_all_heads<Rows, 4>(vr, 32 * c, ph, nb[0], ah, nh); break;
          }
        }
      }
      for (int r = 0; r < nh && nq > 1; ++r) {
        const float* pu[kQb];
        float* au[kQb];
        for (int c = 0; c < ng; c += 2) {
          for (int u = 0; u < kQb; ++u) {
            pu[u] = pp(std::min(u, nq - 1), r);
            au[u] = accp(u, r) + 32 * c;  // slots past nq: scratch, never read
          }
          if (ng - c == 1) add_values_block<Rows, 1>(vr, 32 * c, pu, nb, nb_last, au);
          else add_values_block<Rows, 2>(vr, 32 * c, pu, nb, nb_last, au);
        }
      }
    }
    // Back to natural order: element 2i of a group of 32 is even lane i, 2i + 1 odd lane i.
    const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    for (int u = 0; u < nq; ++u) {
      float* o = out + static_cast<size_t>(t0 + u) * n_heads * hd + static_cast<size_t>(h0) * hd;
      for (int r = 0; r < nh; ++r) {
        const __m512 inv = _mm512_set1_ps(1.0f / reduce16(lsum[u][r]));
        for (int w = 0; w < ng; ++w) {
          const __m512 e = _mm512_mul_ps(_mm512_load_ps(accp(u, r) + 32 * w), inv);
          const __m512 od = _mm512_mul_ps(_mm512_load_ps(accp(u, r) + 32 * w + 16), inv);
          float* dst = o + static_cast<size_t>(r) * hd + 32 * w;
          _mm512_storeu_ps(dst, _mm512_permutex2var_ps(e, lo, od));
          _mm512_storeu_ps(dst + 16, _mm512_permutex2var_ps(e, hi, od));
        }
      }
    }
  }
}

std::atomic<bool> bf16_dot{true};

}  // namespace

void attention_avx512_bf16_dot(bool on) { bf16_dot.store(on, std::memory_order_relaxed); }

bool attention_avx512(const KernelContext& ctx, const float* q, int ld_q, const PagedKv& kv, int pos0, int T,
                      int n_heads, float scale, float* out) {
  if (kv.head_dim % 32 != 0 || kv.head_dim > kMaxHd) return false;
  const int rep = n_heads / kv.n_kv_heads;
  const size_t items = static_cast<size_t>((T + kQb - 1) / kQb) * kv.n_kv_heads * ((rep + kMaxRep - 1) / kMaxRep);
  const bool dot = bf16_dot.load(std::memory_order_relaxed) && has_avx512_bf16();
  parallel(ctx, items, 1, [&](size_t b, size_t e) {
    switch (kv.dtype) {
      case DType::BF16:
        if (dot) attend<RowsBf16, true>(q, ld_q, kv, pos0, T, n_heads, scale, out, b, e);
        else attend<RowsBf16, false>(q, ld_q, kv, pos0, T, n_heads, scale, out, b, e);
        break;
      case DType::F16: attend<RowsF16, false>(q, ld_q, kv, pos0, T, n_heads, scale, out, b, e); break;
      default: attend<RowsF32, false>(q, ld_q, kv, pos0, T, n_heads, scale, out, b, e); break;
    }
  });
  return true;
}

}  // namespace hybridlm::cpu
