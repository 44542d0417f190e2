// Causal attention over the paged KV cache on AVX-512. At long context this is the decode step:
// every query reads all of its sequence's keys and values, and a hybrid with a few attention
// layers spends most of a 16K-context step here unless the kernel runs near memory speed.
//
// A work item is one query and the query heads of one KV head (up to kMaxRep of them), so each
// key and value row comes from memory once per item, not once per query head. Rows are read in
// place, 32 elements at a time as their even and odd elements (load32: for bf16 a shift and a
// mask, no widened copy). Keys go in tiles of kTile with an online softmax (one rescale per tile
// and head):
//   scores  16 keys at a time: 16 dot products accumulated in 16 registers, then summed across
//           lanes together (sum16x16), scaled, masked past the last key;
//   softmax the tile's maximum, exp16 of the shifted scores, a running sum per lane;
//   values  acc += p_j v_j over the tile, up to 128 accumulators (8 registers) at a time.
// Rows are found by walking the page table (no division per key), and the next tile's rows are
// prefetched. An item's arithmetic does not depend on which other queries or heads share its call
// or thread, so one call for T queries gives bitwise what T single-query calls give, at any
// thread count; f32 and f16 rows are put in the same even/odd order, so pages of any dtype that
// hold the same values give bitwise the same result.
#include "kernels/cpu/intrinsics.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/attention_avx512.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/vec_math.h"

namespace hybridlm::cpu {

namespace {

constexpr int kTile = 64;    // keys per online-softmax tile
constexpr int kMaxRep = 8;   // query heads per work item
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
  static HYBRIDLM_AVX512 HYBRIDLM_INLINE void load32(const float* p, __m512& even, __m512& odd) {
    split_even_odd(_mm512_loadu_ps(p), _mm512_loadu_ps(p + 16), even, odd);
  }
};
struct RowsBf16 {
  using Elem = uint16_t;
  static HYBRIDLM_AVX512 HYBRIDLM_INLINE void load32(const uint16_t* p, __m512& even, __m512& odd) {
    const __m512i x = _mm512_loadu_si512(p);
    even = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
    odd = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
  }
};
struct RowsF16 {
  using Elem = uint16_t;
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
  RowWalk(const PagedKv& kv, int g) : kv(kv), head_off(static_cast<size_t>(g) * kv.head_dim) {}
  size_t next() {
    const size_t off = static_cast<size_t>(kv.pages[page]) * kv.page_stride +
                       static_cast<size_t>(in_page) * kv.row_elems() + head_off;
    if (++in_page == kv.block_size) {
      in_page = 0;
      ++page;
    }
    return off;
  }
  const PagedKv& kv;
  size_t head_off;
  int page = 0, in_page = 0;
};

// acc (NC groups of 32 in even/odd order, 2 NC registers) += sum_j p[j] v_j over nb value rows.
template <class Rows, int NC>
HYBRIDLM_AVX512 HYBRIDLM_INLINE void add_values(const typename Rows::Elem* const* vr, const float* p, int nb,
                                                float* acc) {
  __m512 a[2 * NC];
  for (int i = 0; i < 2 * NC; ++i) a[i] = _mm512_load_ps(acc + 16 * i);
  for (int j = 0; j < nb; ++j) {
    const __m512 pj = _mm512_set1_ps(p[j]);
    for (int w = 0; w < NC; ++w) {
      __m512 e, o;
      Rows::load32(vr[j] + 32 * w, e, o);
      a[2 * w] = _mm512_fmadd_ps(pj, e, a[2 * w]);
      a[2 * w + 1] = _mm512_fmadd_ps(pj, o, a[2 * w + 1]);
    }
  }
  for (int i = 0; i < 2 * NC; ++i) _mm512_store_ps(acc + 16 * i, a[i]);
}

template <class Rows>
HYBRIDLM_AVX512 void attend(const float* q, int ld_q, const PagedKv& kv, int pos0, int n_heads, float scale,
                            float* out, size_t ib, size_t ie) {
  using Elem = typename Rows::Elem;
  const int hd = kv.head_dim, ng = hd / 32, rep = n_heads / kv.n_kv_heads;
  const int subs = (rep + kMaxRep - 1) / kMaxRep;
  const size_t per_query = static_cast<size_t>(kv.n_kv_heads) * subs;
  const Elem* k_base = static_cast<const Elem*>(kv.k);
  const Elem* v_base = static_cast<const Elem*>(kv.v);
  const Elem* zero_row = reinterpret_cast<const Elem*>(kZeroRow);
  // The item's queries and accumulators in even/odd order (per 32: the 16 even elements, then the
  // 16 odd ones), the heads' probabilities over the tile, and the tile's K and V rows.
  alignas(64) float qs[kMaxRep * kMaxHd], acc[kMaxRep * kMaxHd], p[kMaxRep * kTile];
  const Elem* kr[kTile];
  const Elem* vr[kTile];
  for (size_t item = ib; item < ie; ++item) {
    const int t = static_cast<int>(item / per_query), g = static_cast<int>(item % per_query) / subs;
    const int sub = static_cast<int>(item % per_query) % subs;
    const int h0 = g * rep + sub * kMaxRep, nh = std::min(kMaxRep, rep - sub * kMaxRep);
    const int n_keys = pos0 + t + 1;
    const float* qt = q + static_cast<size_t>(t) * ld_q + static_cast<size_t>(h0) * hd;
    float m[kMaxRep];
    __m512 lsum[kMaxRep];
    for (int r = 0; r < nh; ++r) {
      m[r] = -INFINITY;
      lsum[r] = _mm512_setzero_ps();
      for (int w = 0; w < ng; ++w) {
        __m512 e, o;
        RowsF32::load32(qt + static_cast<size_t>(r) * hd + 32 * w, e, o);
        _mm512_store_ps(qs + r * hd + 32 * w, e);
        _mm512_store_ps(qs + r * hd + 32 * w + 16, o);
      }
    }
    std::memset(acc, 0, sizeof(float) * nh * hd);
    // `walk` gives the rows of the tile at hand, `ahead` those of the next one, which are
    // prefetched while this one is computed: pages lie anywhere in the pool, and the hardware
    // prefetcher loses the stream at each page (decode at 64K: 1.4x faster with it).
    RowWalk walk(kv, g), ahead(kv, g);
    for (int j0 = 0; j0 < n_keys; j0 += kTile) {
      const int nb = std::min(kTile, n_keys - j0), nb16 = (nb + 15) & ~15;
      for (int j = 0; j < nb; ++j) {
        const size_t off = walk.next();
        kr[j] = k_base + off;
        vr[j] = v_base + off;
      }
      if (j0 == 0)
        for (int j = 0; j < nb; ++j) ahead.next();
      for (int j = 0, n_next = std::min(kTile, n_keys - j0 - nb); j < n_next; ++j) {
        const size_t off = ahead.next();
        for (size_t b = 0; b < sizeof(Elem) * hd; b += 64) {
          _mm_prefetch(reinterpret_cast<const char*>(k_base + off) + b, _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(v_base + off) + b, _MM_HINT_T0);
        }
      }
      for (int j = nb; j < nb16; ++j) kr[j] = zero_row;
      for (int r = 0; r < nh; ++r) {
        const float* qh = qs + r * hd;
        __m512 s[kTile / 16];
        __m512 mx = _mm512_set1_ps(-INFINITY);
        for (int b = 0; b < nb16 / 16; ++b) {
          __m512 d[16];
          for (int k = 0; k < 16; ++k) d[k] = _mm512_setzero_ps();
          const Elem* const* kb = kr + 16 * b;
          for (int w = 0; w < ng; ++w) {
            const __m512 qe = _mm512_load_ps(qh + 32 * w), qo = _mm512_load_ps(qh + 32 * w + 16);
            for (int k = 0; k < 16; ++k) {
              __m512 e, o;
              Rows::load32(kb[k] + 32 * w, e, o);
              d[k] = _mm512_fmadd_ps(qo, o, _mm512_fmadd_ps(qe, e, d[k]));
            }
          }
          const int valid = std::min(16, nb - 16 * b);
          const __mmask16 live = static_cast<__mmask16>((1u << valid) - 1);
          s[b] = _mm512_mask_blend_ps(live, _mm512_set1_ps(-INFINITY),
                                      _mm512_mul_ps(sum16x16(d), _mm512_set1_ps(scale)));
          mx = _mm512_max_ps(mx, s[b]);
        }
        const float tile_max = _mm512_reduce_max_ps(mx);
        if (tile_max > m[r]) {  // rescale what was accumulated against the old maximum
          const float f = m[r] == -INFINITY ? 0.0f : vexp(m[r] - tile_max);
          const __m512 fv = _mm512_set1_ps(f);
          lsum[r] = _mm512_mul_ps(lsum[r], fv);
          float* a = acc + r * hd;
          for (int i = 0; i < 2 * ng; ++i) _mm512_store_ps(a + 16 * i, _mm512_mul_ps(_mm512_load_ps(a + 16 * i), fv));
          m[r] = tile_max;
        }
        const __m512 mv = _mm512_set1_ps(m[r]);
        for (int b = 0; b < nb16 / 16; ++b) {
          const int valid = std::min(16, nb - 16 * b);
          const __mmask16 live = static_cast<__mmask16>((1u << valid) - 1);
          const __m512 e = _mm512_maskz_mov_ps(live, exp16(_mm512_sub_ps(s[b], mv)));
          lsum[r] = _mm512_add_ps(lsum[r], e);
          _mm512_store_ps(p + r * kTile + 16 * b, e);
        }
      }
      for (int r = 0; r < nh; ++r)
        for (int c = 0; c < ng; c += 4) {
          float* a = acc + r * hd + 32 * c;
          const Elem* vc[kTile];
          for (int j = 0; j < nb; ++j) vc[j] = vr[j] + 32 * c;
          switch (std::min(4, ng - c)) {
            case 1: add_values<Rows, 1>(vc, p + r * kTile, nb, a); break;
            case 2: add_values<Rows, 2>(vc, p + r * kTile, nb, a); break;
            case 3: add_values<Rows, 3>(vc, p + r * kTile, nb, a); break;
            default: add_values<Rows, 4>(vc, p + r * kTile, nb, a); break;
          }
        }
    }
    // Back to natural order: element 2i of a group of 32 is even lane i, 2i + 1 odd lane i.
    const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    float* o = out + static_cast<size_t>(t) * n_heads * hd + static_cast<size_t>(h0) * hd;
    for (int r = 0; r < nh; ++r) {
      const __m512 inv = _mm512_set1_ps(1.0f / reduce16(lsum[r]));
      for (int w = 0; w < ng; ++w) {
        const __m512 e = _mm512_mul_ps(_mm512_load_ps(acc + r * hd + 32 * w), inv);
        const __m512 od = _mm512_mul_ps(_mm512_load_ps(acc + r * hd + 32 * w + 16), inv);
        float* dst = o + static_cast<size_t>(r) * hd + 32 * w;
        _mm512_storeu_ps(dst, _mm512_permutex2var_ps(e, lo, od));
        _mm512_storeu_ps(dst + 16, _mm512_permutex2var_ps(e, hi, od));
      }
    }
  }
}

}  // namespace

bool attention_avx512(const KernelContext& ctx, const float* q, int ld_q, const PagedKv& kv, int pos0, int T,
                      int n_heads, float scale, float* out) {
  if (kv.head_dim % 32 != 0 || kv.head_dim > kMaxHd) return false;
  const int rep = n_heads / kv.n_kv_heads;
  const size_t items = static_cast<size_t>(T) * kv.n_kv_heads * ((rep + kMaxRep - 1) / kMaxRep);
  parallel(ctx, items, 1, [&](size_t b, size_t e) {
    switch (kv.dtype) {
      case DType::BF16: attend<RowsBf16>(q, ld_q, kv, pos0, n_heads, scale, out, b, e); break;
      case DType::F16: attend<RowsF16>(q, ld_q, kv, pos0, n_heads, scale, out, b, e); break;
      default: attend<RowsF32>(q, ld_q, kv, pos0, n_heads, scale, out, b, e); break;
    }
  });
  return true;
}

}  // namespace hybridlm::cpu
