// Weights in memory, converted once at load from the checkpoint's dtype (f32/bf16/f16 on disk) to
// the compute-side storage: big matrices in the requested --dtype (f32, bf16 or q8_0), small
// vectors f32.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/huge_alloc.h"
#include "io/safetensors.h"
#include "kernels/kernels.h"

namespace hybridlm {

enum class WeightDType { F32, BF16, Q8_0 };
// "f32" / "bf16" / "q8_0"; throws Error otherwise.
WeightDType parse_weight_dtype(const std::string& s);

struct Matrix {
  DType dtype = DType::F32;
  int rows = 0, cols = 0;
  // Copied f32/bf16 weights of whole 16-column chunks and at least 256 rows (every real model's
  // big projections) are stored in lane panels of 32 rows (WeightView::panels, padded with zero
  // rows); others row-major.
  bool panels = false;
  HugeVector<float> f32;
  HugeVector<uint16_t> bf16;
  HugeVector<uint8_t> q8;       // dtype I8: q8_0 codes and scales in the panel layout of
  HugeVector<float> q8_scales;  // quantize_q8_0_matrix (tensor/quant.h)
  // Zero-copy: the weights inside the mapped checkpoint (the model keeps the mapping alive).
  const void* mapped = nullptr;
  WeightView view() const {
    if (dtype == DType::I8) return {dtype, q8.data(), rows, cols, q8_scales.data()};
    if (mapped) return {dtype, mapped, rows, cols};
    const void* data = dtype == DType::BF16 ? static_cast<const void*>(bf16.data()) : f32.data();
    return {dtype, data, rows, cols, nullptr, panels};
  }
  size_t bytes() const {
    if (mapped) return static_cast<size_t>(rows) * cols * (dtype == DType::BF16 ? 2 : 4);
    return f32.size() * 4 + bf16.size() * 2 + q8.size() + q8_scales.size() * sizeof(float);
  }
};

// An optional vector (bias, norm weight) as a kernel argument: nullptr when the layer has none.
inline const float* data_or_null(const std::vector<float>& b) { return b.empty() ? nullptr : b.data(); }

// Reads tensors from a checkpoint with shape checks whose errors name the tensor.
class WeightReader {
 public:
  // zero_copy: matrices whose on-disk dtype is the requested one point into the checkpoint's
  // mapping instead of being copied (the caller keeps the Checkpoint alive).
  WeightReader(const Checkpoint& ckpt, WeightDType dtype, bool zero_copy = false)
      : ckpt_(ckpt), dtype_(dtype), zero_copy_(zero_copy) {}
  // A (rows, cols) matrix; `shape` may carry extra unit dims (conv1d (C, 1, K) is read as (C, K)).
  Matrix matrix(const std::string& name, std::vector<int64_t> shape) const;
  std::vector<float> vector(const std::string& name, std::vector<int64_t> shape) const;
  // A stacked (E, rows, cols) tensor (Granite's experts) as E matrices of (rows, cols).
  std::vector<Matrix> stacked(const std::string& name, std::vector<int64_t> shape) const;
  bool has(const std::string& name) const { return ckpt_.find(name) != nullptr; }
  const TensorInfo* find(const std::string& name) const { return ckpt_.find(name); }
  size_t params_read() const { return params_; }
  size_t bytes_mapped() const { return mapped_; }

 private:
  const TensorInfo& checked(const std::string& name, const std::vector<int64_t>& shape) const;
  // Rows [row0, row0 + rows) of a tensor viewed as (*, cols), in the requested dtype.
  Matrix slice(const TensorInfo& t, int64_t row0, int rows, int cols) const;
  const Checkpoint& ckpt_;
  WeightDType dtype_;
  bool zero_copy_;
  mutable size_t params_ = 0, mapped_ = 0;
};

}  // namespace hybridlm
