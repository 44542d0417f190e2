// CPU kernels for attention layers and feed-forwards: RoPE, causal attention over the paged KV
// cache (f32, bf16 or f16; online softmax over tiles of keys, so memory stays O(head_dim) per
// query), and the feed-forward activations. Work items (a query with the query heads of one KV
// head; rows) are each computed whole by one thread, so results do not depend on the thread count
// or on the other sequences of a batch. On AVX-512 attention runs attention_avx512.cc's kernel
// instead (blocks of up to 4 queries of one KV head), where head_dim allows.
#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "base/error.h"
#include "kernels/cpu/attention_avx512.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/vec_math.h"

namespace hybridlm::cpu {

namespace {

// The largest head_dim the attention kernel keeps on its stack (configs are capped to it).
constexpr int kMaxHeadDim = 1024;
// Keys per online-softmax tile: scores of a tile are computed first, then one rescale per tile.
constexpr int kKeyTile = 64;

// How the kernel reads a stored K or V element: f32 as is, bf16 and f16 bit patterns widened to
// f32 in registers as the row is read (no copy of the cache; the arithmetic is the f32 kernel's).
struct KvF32 {
  using Elem = float;
  static constexpr bool kRoundQ = false;
  static HYBRIDLM_INLINE float widen(float x) { return x; }
};
struct KvBf16 {
  using Elem = uint16_t;
  // The query is rounded to bf16 before its dot products with bf16 keys (as the AVX-512 kernel's
  // vdpbf16ps needs it; ops.inc).
  static constexpr bool kRoundQ = true;
  static HYBRIDLM_INLINE float widen(uint16_t x) { return bf16_to_f32(x); }
};
struct KvF16 {
  using Elem = uint16_t;
  static constexpr bool kRoundQ = false;
  static HYBRIDLM_INLINE float widen(uint16_t x) { return vf16_to_f32(x); }
};

// Query heads per work item: they share each key and value row as it is read (GQA).
constexpr int kRepMax = 8;
// Floats of a tile's widened K (and as many of V) rows: a tile has min(kKeyTile, this / head_dim)
// keys.
constexpr int kWideFloats = 16384;

// An item is one query and up to kRepMax query heads of one KV head. Per tile of keys, the rows
// are found by walking the page table and 16-bit rows widened once into f32 (f32 rows are used
// where they lie); then per head the scores (vdot), one rescale, the exps (a loop the compiler
// vectorises), and the value sum. Each (query, head) runs over the same tiles from key 0 whatever
// else is in the call, so one call for T queries gives bitwise what T single-query calls give,
// and 16-bit pages give bitwise the f32 result on the widened values (bf16: and the query rounded
// to bf16, ops.inc).
template <class Kv>
HYBRIDLM_INLINE void attention_items(Kv, const float* q, int ld_q, const PagedKv& kv, int pos0, int n_heads,
                                     float scale, float* out, size_t ib, size_t ie) {
  using Elem = typename Kv::Elem;
  const int hd = kv.head_dim, rep = n_heads / kv.n_kv_heads, subs = (rep + kRepMax - 1) / kRepMax;
  const size_t per_query = static_cast<size_t>(kv.n_kv_heads) * subs, row = kv.token_stride;
  const int tile = std::min(kKeyTile, kWideFloats / hd);
  const Elem* k_base = static_cast<const Elem*>(kv.k);
  const Elem* v_base = static_cast<const Elem*>(kv.v);
  float kw[kWideFloats], vw[kWideFloats], acc[kRepMax * kMaxHeadDim], sc[kKeyTile];
  float qr[Kv::kRoundQ ? kRepMax * kMaxHeadDim : 1];
  const float* kr[kKeyTile];
  const float* vr[kKeyTile];
  for (size_t item = ib; item < ie; ++item) {
    const int t = static_cast<int>(item / per_query), g = static_cast<int>(item % per_query) / subs;
    const int h0 = g * rep + (static_cast<int>(item % per_query) % subs) * kRepMax;
    const int nh = std::min(kRepMax, g * rep + rep - h0), n_keys = pos0 + t + 1;
    float m[kRepMax], l[kRepMax];
    for (int r = 0; r < nh; ++r) {
      m[r] = -INFINITY;
      l[r] = 0.0f;
    }
    std::fill(acc, acc + static_cast<size_t>(nh) * hd, 0.0f);
    if constexpr (Kv::kRoundQ)
      for (int r = 0; r < nh; ++r) {
        const float* qh = q + static_cast<size_t>(t) * ld_q + static_cast<size_t>(h0 + r) * hd;
        for (int i = 0; i < hd; ++i) qr[static_cast<size_t>(r) * hd + i] = bf16_to_f32(f32_to_bf16(qh[i]));
      }
    int page = 0, in_page = 0;
    for (int j0 = 0; j0 < n_keys; j0 += tile) {
      const int nb = std::min(tile, n_keys - j0);
      for (int j = 0; j < nb; ++j) {
        const size_t off = static_cast<size_t>(kv.pages[page]) * kv.page_stride + static_cast<size_t>(in_page) * row +
                           static_cast<size_t>(g) * kv.head_stride;
        if (++in_page == kv.block_size) {
          in_page = 0;
          ++page;
        }
        if constexpr (std::is_same_v<Kv, KvF32>) {
          kr[j] = k_base + off;
          vr[j] = v_base + off;
        } else {
          float* kd = kw + static_cast<size_t>(j) * hd;
          float* vd = vw + static_cast<size_t>(j) * hd;
          for (int i = 0; i < hd; ++i) kd[i] = Kv::widen(k_base[off + i]);
          for (int i = 0; i < hd; ++i) vd[i] = Kv::widen(v_base[off + i]);
          kr[j] = kd;
          vr[j] = vd;
        }
      }
      for (int r = 0; r < nh; ++r) {
        const float* qh = Kv::kRoundQ ? qr + static_cast<size_t>(r) * hd
                                      : q + static_cast<size_t>(t) * ld_q + static_cast<size_t>(h0 + r) * hd;
        float* a = acc + static_cast<size_t>(r) * hd;
        float tile_max = -INFINITY;
        for (int j = 0; j < nb; ++j) {
          sc[j] = vdot(qh, kr[j], hd) * scale;
          tile_max = std::max(tile_max, sc[j]);
        }
        if (tile_max > m[r]) {  // rescale what was accumulated against the old maximum
          const float f = m[r] == -INFINITY ? 0.0f : vexp(m[r] - tile_max);
          l[r] *= f;
          for (int i = 0; i < hd; ++i) a[i] *= f;
          m[r] = tile_max;
        }
        const float mr = m[r];
        for (int j = 0; j < nb; ++j) sc[j] = vexp(sc[j] - mr);
        for (int j = 0; j < nb; ++j) {
          const float p = sc[j];
          const float* v = vr[j];
          l[r] += p;
          for (int i = 0; i < hd; ++i) a[i] += p * v[i];
        }
      }
    }
    for (int r = 0; r < nh; ++r) {
      float* o = out + static_cast<size_t>(t) * n_heads * hd + static_cast<size_t>(h0 + r) * hd;
      const float inv = 1.0f / l[r];
      for (int i = 0; i < hd; ++i) o[i] = acc[static_cast<size_t>(r) * hd + i] * inv;
    }
  }
}
HYBRIDLM_SIMD_VARIANTS(attention, attention_items)

HYBRIDLM_INLINE void activation_rows(Activation act, const float* a, const float* b, int ld, int d, float* out,
                                     size_t tb, size_t te) {
  for (size_t t = tb; t < te; ++t) {
    const float* ar = a + t * ld;
    float* o = out + t * d;
    switch (act) {
      case Activation::Silu:
        for (int i = 0; i < d; ++i) o[i] = vsilu(ar[i]);
        break;
      case Activation::Gelu:
        for (int i = 0; i < d; ++i) o[i] = 0.5f * ar[i] * (1.0f + std::erf(ar[i] * 0.70710678118654752f));
        break;
      case Activation::Relu2:
        for (int i = 0; i < d; ++i) o[i] = ar[i] > 0.0f ? ar[i] * ar[i] : 0.0f;
        break;
    }
    if (b) {
      const float* br = b + t * ld;
      for (int i = 0; i < d; ++i) o[i] *= br[i];
    }
  }
}
HYBRIDLM_SIMD_VARIANTS(activation, activation_rows)

}  // namespace

void rope(const KernelContext& ctx, float* x, int ld_x, int T, int pos0, int n_heads, int head_dim, int rot_dim,
          float theta) {
  const int half = rot_dim / 2;
  if (half == 0) return;
  check(rot_dim <= kMaxHeadDim, "rotary dims above ", kMaxHeadDim);
  // Angles in double: positions reach 10^5-10^6, where an f32 angle would be off by ~0.01 rad.
  // Stack buffers: no allocation per decode step.
  double inv_freq[kMaxHeadDim / 2];
  for (int j = 0; j < half; ++j) inv_freq[j] = std::pow(static_cast<double>(theta), -2.0 * j / rot_dim);
  parallel(ctx, T, 4, [&](size_t tb, size_t te) {
    float cs[kMaxHeadDim / 2], sn[kMaxHeadDim / 2];
    for (size_t t = tb; t < te; ++t) {
      for (int j = 0; j < half; ++j) {
        const double angle = static_cast<double>(pos0 + static_cast<int>(t)) * inv_freq[j];
        cs[j] = static_cast<float>(std::cos(angle));
        sn[j] = static_cast<float>(std::sin(angle));
      }
      for (int h = 0; h < n_heads; ++h) {
        float* v = x + t * ld_x + static_cast<size_t>(h) * head_dim;
        for (int j = 0; j < half; ++j) {
          const float a = v[j], b = v[j + half];
          v[j] = a * cs[j] - b * sn[j];
          v[j + half] = b * cs[j] + a * sn[j];
        }
      }
    }
  });
}

void attention(const KernelContext& ctx, const float* q, int ld_q, const PagedKv& kv, int pos0, int T, int n_heads,
               float scale, float* out) {
  check(kv.head_dim > 0 && kv.head_dim <= kMaxHeadDim, "attention head_dim ", kv.head_dim, " outside 1..", kMaxHeadDim);
  check(kv.n_kv_heads > 0 && n_heads % kv.n_kv_heads == 0, "attention: ", n_heads, " heads over ", kv.n_kv_heads,
        " KV heads");
  check(kv.dtype == DType::F32 || kv.dtype == DType::BF16 || kv.dtype == DType::F16,
        "attention: KV cache of dtype ", dtype_name(kv.dtype), " (F32, BF16 or F16 expected)");
  check(kv.token_stride > 0 && kv.head_stride > 0, "attention: KV layout unset (token stride ", kv.token_stride,
        ", head stride ", kv.head_stride, ")");
  if (simd_path() == SimdPath::Avx512 && attention_avx512(ctx, q, ld_q, kv, pos0, T, n_heads, scale, out)) return;
  const int rep = n_heads / kv.n_kv_heads;
  const size_t items = static_cast<size_t>(T) * kv.n_kv_heads * ((rep + kRepMax - 1) / kRepMax);
  parallel(ctx, items, 1, [&](size_t b, size_t e) {
    switch (kv.dtype) {
      case DType::BF16: attention_dispatch(KvBf16{}, q, ld_q, kv, pos0, n_heads, scale, out, b, e); break;
      case DType::F16: attention_dispatch(KvF16{}, q, ld_q, kv, pos0, n_heads, scale, out, b, e); break;
      default: attention_dispatch(KvF32{}, q, ld_q, kv, pos0, n_heads, scale, out, b, e); break;
    }
  });
}

void activation(const KernelContext& ctx, Activation act, const float* a, const float* b, int ld, int T, int d,
                float* out) {
  parallel(ctx, T, 4, [&](size_t tb, size_t te) {
    activation_dispatch(act, a, b, ld, d, out, tb, te);
  });
}

}  // namespace hybridlm::cpu
