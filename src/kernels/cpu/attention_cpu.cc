// CPU kernels for attention layers and feed-forwards: RoPE, causal attention over the paged KV
// cache (f32, bf16 or f16; online softmax over tiles of keys, so memory stays O(head_dim) per
// query), and the feed-forward activations. Work items are (query, head) pairs or rows, each
// computed whole by one thread, so results do not depend on the thread count or on the other
// sequences of a batch. On AVX-512 attention runs attention_avx512.cc's kernel instead (one item
// per query and KV head), where head_dim allows.
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
  static HYBRIDLM_INLINE float widen(float x) { return x; }
};
struct KvBf16 {
  using Elem = uint16_t;
  static HYBRIDLM_INLINE float widen(uint16_t x) { return bf16_to_f32(x); }
};
struct KvF16 {
  using Elem = uint16_t;
  static HYBRIDLM_INLINE float widen(uint16_t x) { return vf16_to_f32(x); }
};

// q . k for one key row: vdot for f32; for 16-bit rows the same 16 lane sums and reduction tree
// with each key element widened as it is loaded.
template <class Kv>
HYBRIDLM_INLINE float dot_key(const float* q, const typename Kv::Elem* k, int n) {
  if constexpr (std::is_same_v<Kv, KvF32>) {
    return vdot(q, k, n);
  } else {
    float acc[16] = {};
    int i = 0;
    for (; i + 16 <= n; i += 16)
      for (int l = 0; l < 16; ++l) acc[l] += q[i + l] * Kv::widen(k[i + l]);
    for (int l = 0; i < n; ++i, ++l) acc[l] += q[i] * Kv::widen(k[i]);
    for (int w = 8; w >= 1; w /= 2)
      for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
    return acc[0];
  }
}

template <class Kv>
HYBRIDLM_INLINE void attention_items(Kv, const float* q, int ld_q, const PagedKv& kv, int pos0, int n_heads,
                                     float scale, float* out, size_t ib, size_t ie) {
  using Elem = typename Kv::Elem;
  const int hd = kv.head_dim, rep = n_heads / kv.n_kv_heads;
  float acc[kMaxHeadDim];
  float sc[kKeyTile];
  for (size_t item = ib; item < ie; ++item) {
    const int t = static_cast<int>(item / n_heads), h = static_cast<int>(item % n_heads);
    const float* qh = q + static_cast<size_t>(t) * ld_q + static_cast<size_t>(h) * hd;
    const size_t kv_off = static_cast<size_t>(h / rep) * hd;
    const int n_keys = pos0 + t + 1;
    float m = -INFINITY, l = 0.0f;
    for (int i = 0; i < hd; ++i) acc[i] = 0.0f;
    for (int j0 = 0; j0 < n_keys; j0 += kKeyTile) {
      const int nb = std::min(kKeyTile, n_keys - j0);
      float tile_max = -INFINITY;
      for (int j = 0; j < nb; ++j) {
        sc[j] = dot_key<Kv>(qh, kv.k_row<Elem>(j0 + j) + kv_off, hd) * scale;
        tile_max = std::max(tile_max, sc[j]);
      }
      if (tile_max > m) {  // rescale what was accumulated against the old maximum
        const float r = m == -INFINITY ? 0.0f : vexp(m - tile_max);
        l *= r;
        for (int i = 0; i < hd; ++i) acc[i] *= r;
        m = tile_max;
      }
      for (int j = 0; j < nb; ++j) {
        const float p = vexp(sc[j] - m);
        l += p;
        const Elem* v = kv.v_row<Elem>(j0 + j) + kv_off;
        for (int i = 0; i < hd; ++i) acc[i] += p * Kv::widen(v[i]);
      }
    }
    float* o = out + static_cast<size_t>(t) * n_heads * hd + static_cast<size_t>(h) * hd;
    const float inv = 1.0f / l;
    for (int i = 0; i < hd; ++i) o[i] = acc[i] * inv;
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
  check(kv.head_dim <= kMaxHeadDim, "attention head_dim above ", kMaxHeadDim);
  check(kv.dtype == DType::F32 || kv.dtype == DType::BF16 || kv.dtype == DType::F16,
        "attention: KV cache of dtype ", dtype_name(kv.dtype), " (F32, BF16 or F16 expected)");
  if (simd_path() == SimdPath::Avx512 && attention_avx512(ctx, q, ld_q, kv, pos0, T, n_heads, scale, out)) return;
  parallel(ctx, static_cast<size_t>(T) * n_heads, 2, [&](size_t b, size_t e) {
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
