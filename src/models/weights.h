// Weights in memory, converted once at load from the checkpoint's dtype (f32/bf16/f16 on disk) to
// the compute-side storage: big matrices in the requested --dtype (f32, bf16, q8_0 or q4_0), small
// vectors f32.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/huge_alloc.h"
#include "io/safetensors.h"
#include "kernels/kernels.h"

namespace hybridlm {

enum class WeightDType { F32, BF16, Q8_0, Q4_0 };
// "f32" / "bf16" / "q8_0" / "q4_0"; throws Error otherwise.
WeightDType parse_weight_dtype(const std::string& s);
const char* weight_dtype_name(WeightDType t);

// --dtype auto: the checkpoint's own dtype where the CPU path computes it at full speed. bf16
// stays bf16 (mapped in place); f16, which no kernel takes, loads as bf16: the same two bytes a
// weight, rounded from f16's 10 mantissa bits to bf16's 7 (a relative change <= 2^-9, what every
// bf16 checkpoint already has; --dtype f32 keeps f16 weights exact at twice the memory). f32,
// and anything else (f64), loads as f32.
WeightDType auto_weight_dtype(DType stored);
// The dtype a checkpoint's weights are stored in: the dtype holding most of its parameters
// (elements; a tie goes to the wider dtype). Checkpoints are rarely mixed; when they are, the big
// matrices decide (bf16 projections with f32 norms and A_log are a bf16 checkpoint).
DType checkpoint_weight_dtype(const Checkpoint& ckpt);
// config.json's torch_dtype ("float32", "bfloat16", "float16"; absent or other: f32, transformers'
// own default), for sizing a model from its config alone.
DType torch_dtype_of(const std::string& torch_dtype);

struct Matrix {
  DType dtype = DType::F32;
  int rows = 0, cols = 0;
  // Copied f32/bf16 weights of whole 16-column chunks and at least 256 rows (every real model's
  // big projections) are stored in lane panels of 32 rows (WeightView::panels, padded with zero
  // rows); others row-major.
  bool panels = false;
  WeightVector<float> f32;
  WeightVector<uint16_t> bf16;
  // dtype I8 (q8_0) or U8 (q4_0): codes and scales in the panel layout of quantize_q8_0_matrix or
  // quantize_q4_0_matrix (tensor/quant.h).
  WeightVector<uint8_t> codes;
  WeightVector<float> scales;
  // Zero-copy: the weights inside the mapped checkpoint (the model keeps the mapping alive).
  const void* mapped = nullptr;
  WeightView view() const {
    if (dtype == DType::I8 || dtype == DType::U8) return {dtype, codes.data(), rows, cols, scales.data()};
    if (mapped) return {dtype, mapped, rows, cols};
    const void* data = dtype == DType::BF16 ? static_cast<const void*>(bf16.data()) : f32.data();
    return {dtype, data, rows, cols, nullptr, panels};
  }
  size_t bytes() const {
    if (mapped) return static_cast<size_t>(rows) * cols * (dtype == DType::BF16 ? 2 : 4);
    return f32.size() * 4 + bf16.size() * 2 + codes.size() + scales.size() * sizeof(float);
  }
};

// An optional vector (bias, norm weight) as a kernel argument: nullptr when the layer has none.
inline const float* data_or_null(const std::vector<float>& b) { return b.empty() ? nullptr : b.data(); }

// How a matrix of (rows, cols) is stored when copied at --dtype: its element type, whether in lane
// panels, and its bytes (codes, scales and panel padding included). The one rule that loading and
// the config-only plan share.
struct MatrixStorage {
  DType dtype = DType::F32;
  bool panels = false;
  size_t bytes = 0;
};
MatrixStorage matrix_storage(int rows, int cols, WeightDType dtype);

// Where a block's loader gets its tensors. Each loader (load_mamba2, load_attention, ...) declares
// every tensor of its block once: its name, its shape as stored, and the field it fills. What that
// means is the source's: WeightReader reads and converts each tensor from a checkpoint;
// TensorCatalog records it from the config alone (parameter counts, `plan`, and later the
// optimizer's parameter list). Two kinds of tensor, and their dtype rules:
// - matrix(): a large weight, stored at --dtype (f32, bf16, or q8_0 / q4_0 where matrix_storage
//   allows);
// - vector(): a small parameter (norm weight, bias, conv taps, A_log, D, dt_bias), always f32.
// All are trainable parameters.
class TensorSource {
 public:
  virtual ~TensorSource() = default;
  // A (rows, cols) matrix; `shape` may carry extra unit dims (conv1d (C, 1, K) is read as (C, K)).
  virtual Matrix matrix(const std::string& name, std::vector<int64_t> shape) const = 0;
  virtual std::vector<float> vector(const std::string& name, std::vector<int64_t> shape) const = 0;
  // A stacked (E, rows, cols) tensor (Granite's experts) as E matrices of (rows, cols).
  virtual std::vector<Matrix> stacked(const std::string& name, std::vector<int64_t> shape) const = 0;
  // For family quirks that probe the checkpoint (an alternative name, a refused layout): whether a
  // tensor exists, and its info. A catalog has no checkpoint: has() is true, find() null.
  virtual bool has(const std::string& name) const = 0;
  virtual const TensorInfo* find(const std::string& name) const = 0;
};

// What the loader reports after each tensor it read (LoadOptions::on_tensor): progress lines and
// --verbose's per-tensor lines.
struct TensorLoaded {
  const TensorInfo& tensor;  // the checkpoint's entry (name, dtype, shape, file)
  std::string held;          // how memory holds it: "bf16 mapped", "bf16 panels", "q8_0", "f32", ...
  size_t bytes_held = 0;     // its bytes in memory
  size_t bytes_read = 0, bytes_total = 0;  // checkpoint bytes read so far, of all its tensors'
};
using TensorLoadedFn = std::function<void(const TensorLoaded&)>;

// Reads tensors from a checkpoint with shape checks whose errors name the tensor.
class WeightReader final : public TensorSource {
 public:
  // zero_copy: matrices whose on-disk dtype is the requested one point into the checkpoint's
  // mapping instead of being copied (the caller keeps the Checkpoint alive). on_tensor, if set,
  // hears of every tensor once it is read.
  WeightReader(const Checkpoint& ckpt, WeightDType dtype, bool zero_copy = false, TensorLoadedFn on_tensor = {});
  Matrix matrix(const std::string& name, std::vector<int64_t> shape) const override;
  std::vector<float> vector(const std::string& name, std::vector<int64_t> shape) const override;
  std::vector<Matrix> stacked(const std::string& name, std::vector<int64_t> shape) const override;
  bool has(const std::string& name) const override { return ckpt_.find(name) != nullptr; }
  const TensorInfo* find(const std::string& name) const override { return ckpt_.find(name); }
  size_t params_read() const { return params_; }
  size_t bytes_mapped() const { return mapped_; }
  size_t bytes_held() const { return held_; }  // every tensor returned, as stored (mapped included)

 private:
  const TensorInfo& checked(const std::string& name, const std::vector<int64_t>& shape) const;
  // Rows [row0, row0 + rows) of a tensor viewed as (*, cols), in the requested dtype.
  Matrix slice(const TensorInfo& t, int64_t row0, int rows, int cols) const;
  void report(const TensorInfo& t, const Matrix* m, size_t bytes) const;
  const Checkpoint& ckpt_;
  WeightDType dtype_;
  bool zero_copy_;
  TensorLoadedFn on_tensor_;
  size_t total_ = 0;  // bytes of every tensor in the checkpoint
  mutable size_t params_ = 0, mapped_ = 0, held_ = 0, read_ = 0;
};

// One tensor a model declares, from its config alone.
struct TensorEntry {
  enum Kind { Vector, Matrix, Stacked };  // which TensorSource call declared it
  std::string name;
  std::vector<int64_t> shape;  // as stored in the checkpoint
  Kind kind = Vector;
  int64_t numel() const;
  // Bytes in memory when loaded (copied) at `dtype`: matrix_storage per matrix, f32 for vectors.
  size_t bytes(WeightDType dtype) const;
};

// Records every tensor a loader declares, returning empty matrices and vectors.
class TensorCatalog final : public TensorSource {
 public:
  Matrix matrix(const std::string& name, std::vector<int64_t> shape) const override;
  std::vector<float> vector(const std::string& name, std::vector<int64_t> shape) const override;
  std::vector<Matrix> stacked(const std::string& name, std::vector<int64_t> shape) const override;
  bool has(const std::string&) const override { return true; }
  const TensorInfo* find(const std::string&) const override { return nullptr; }
  const std::vector<TensorEntry>& entries() const { return entries_; }

 private:
  mutable std::vector<TensorEntry> entries_;
};

}  // namespace hybridlm
