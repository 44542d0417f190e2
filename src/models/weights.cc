#include "models/weights.h"

#include <map>
#include <sstream>

#include "base/error.h"

namespace hybridlm {

WeightDType parse_weight_dtype(const std::string& s) {
  if (s == "f32") return WeightDType::F32;
  if (s == "bf16") return WeightDType::BF16;
  if (s == "q8_0") return WeightDType::Q8_0;
  if (s == "q4_0") return WeightDType::Q4_0;
  throw Error("--dtype " + s + ": unsupported (use auto, f32, bf16, q8_0 or q4_0)");
}

const char* weight_dtype_name(WeightDType t) {
  switch (t) {
    case WeightDType::F32: return "f32";
    case WeightDType::BF16: return "bf16";
    case WeightDType::Q8_0: return "q8_0";
    case WeightDType::Q4_0: return "q4_0";
  }
  return "?";
}

WeightDType auto_weight_dtype(DType stored) {
  return stored == DType::BF16 || stored == DType::F16 ? WeightDType::BF16 : WeightDType::F32;
}

DType checkpoint_weight_dtype(const Checkpoint& ckpt) {
  std::map<DType, int64_t> elements;
  for (const auto& [name, t] : ckpt.all()) elements[t->dtype] += t->numel();
  DType best = DType::F32;
  int64_t most = -1;
  for (const auto& [dtype, n] : elements)
    if (n > most || (n == most && dtype_size(dtype) > dtype_size(best))) {
      best = dtype;
      most = n;
    }
  return best;
}

DType torch_dtype_of(const std::string& torch_dtype) {
  if (torch_dtype == "bfloat16") return DType::BF16;
  if (torch_dtype == "float16") return DType::F16;
  return DType::F32;
}

static std::string shape_str(const std::vector<int64_t>& s) {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << (s.size() == 1 ? ",)" : ")");
  return os.str();
}

WeightReader::WeightReader(const Checkpoint& ckpt, WeightDType dtype, bool zero_copy, TensorLoadedFn on_tensor)
    : ckpt_(ckpt), dtype_(dtype), zero_copy_(zero_copy), on_tensor_(std::move(on_tensor)) {
  for (const auto& [name, t] : ckpt_.all()) total_ += t->nbytes;
}

// m: the (first) matrix it became, or null for an f32 vector.
void WeightReader::report(const TensorInfo& t, const Matrix* m, size_t bytes) const {
  read_ += t.nbytes;
  if (!on_tensor_) return;
  std::string held = "f32";
  if (m) {
    held = m->dtype == DType::I8   ? "q8_0"
           : m->dtype == DType::U8 ? "q4_0"
           : m->dtype == DType::BF16 ? "bf16"
                                     : "f32";
    held += m->mapped ? " mapped" : m->panels ? " panels" : "";
  }
  on_tensor_({t, held, bytes, read_, total_});
}

const TensorInfo& WeightReader::checked(const std::string& name, const std::vector<int64_t>& shape) const {
  const TensorInfo& t = ckpt_.get(name);
  if (t.shape != shape)
    throw Error(t.file + ": tensor '" + name + "' has shape " + shape_str(t.shape) + ", expected " + shape_str(shape));
  params_ += static_cast<size_t>(t.numel());
  return t;
}

// Row-major (rows, cols) into the lane panels of WeightView::panels (`out` zeroed, panel_count
// long: the padding stays zero).
template <class T, class Convert>
static void to_panels(const float* f, int rows, int cols, T* out, Convert convert) {
  for (int r = 0; r < rows; ++r) {
    const float* src = f + static_cast<size_t>(r) * cols;
    for_panel_row(r, cols, [&](int c, size_t i) { out[i] = convert(src[c]); });
  }
}

MatrixStorage matrix_storage(int rows, int cols, WeightDType dtype) {
  const size_t n = static_cast<size_t>(rows) * cols;
  // q8_0 only where a row is whole 64-code steps and the codes and scales, rows padded to whole
  // 16-row panels, take less memory than f32: a narrow or very short matrix (Mamba-1's dt_proj at
  // dt_rank 48, a one-row adapter) would grow with the padding, and is too small to matter; it
  // stays f32. q4_0 quantizes exactly the matrices q8_0 does (the same rule), 4 bits a code.
  const size_t q8_bytes = q8_code_count(rows, cols) + q8_scale_count(rows, cols) * sizeof(float);
  const bool quantize = cols % 64 == 0 && q8_bytes < n * sizeof(float);
  if (dtype == WeightDType::Q8_0 && quantize) return {DType::I8, false, q8_bytes};
  if (dtype == WeightDType::Q4_0 && quantize)
    return {DType::U8, false, q4_code_bytes(rows, cols) + q4_scale_count(rows, cols) * sizeof(float)};
  // Lane panels for whole 16-column chunks and at least 8 panels of rows. Narrower matrices
  // (Mamba-1's x_proj: 80 or 160 rows) stay row-major: split over 2 threads, 3 or 5 panels
  // leave one idle a third of the time, and the dot-product tiles ran them 1.5x faster at 1
  // and 32 tokens (bench_gemm).
  const bool panels = cols % kPanelLanes == 0 && rows >= 8 * kPanelRows;
  const DType t = dtype == WeightDType::BF16 ? DType::BF16 : DType::F32;
  return {t, panels, (panels ? panel_count(rows, cols) : n) * dtype_size(t)};
}

Matrix WeightReader::slice(const TensorInfo& t, int64_t row0, int rows, int cols) const {
  Matrix m;
  m.rows = rows;
  m.cols = cols;
  const DType want = dtype_ == WeightDType::BF16   ? DType::BF16
                     : dtype_ == WeightDType::Q8_0 ? DType::I8
                     : dtype_ == WeightDType::Q4_0 ? DType::U8
                                                   : DType::F32;
  const size_t first = static_cast<size_t>(row0) * cols, n = static_cast<size_t>(rows) * cols;
  const uint8_t* at = t.data + first * dtype_size(t.dtype);
  if (zero_copy_ && (want == DType::F32 || want == DType::BF16) && t.dtype == want &&
      reinterpret_cast<uintptr_t>(at) % dtype_size(want) == 0) {
    m.dtype = want;
    m.mapped = at;
    mapped_ += n * dtype_size(want);
    held_ += m.bytes();
    return m;
  }
  std::vector<float> f(n);
  t.to_f32(f.data(), first, n);  // only this slice (an expert of a stacked tensor)
  t.release(first, n);           // copied: the file's pages need not stay resident beside the copy
  const MatrixStorage st = matrix_storage(rows, cols, dtype_);
  m.dtype = st.dtype;
  if (st.dtype == DType::I8) {
    m.codes.resize(q8_code_count(rows, cols));
    m.scales.resize(q8_scale_count(rows, cols));
    quantize_q8_0_matrix(f.data(), rows, cols, m.codes.data(), m.scales.data());
  } else if (st.dtype == DType::U8) {
    m.codes.resize(q4_code_bytes(rows, cols));
    m.scales.resize(q4_scale_count(rows, cols));
    quantize_q4_0_matrix(f.data(), rows, cols, m.codes.data(), m.scales.data());
  } else {
    m.panels = st.panels;
    auto store = [&](auto& out, auto convert) {
      out.resize(m.panels ? panel_count(rows, cols) : n);
      if (m.panels) to_panels(f.data(), rows, cols, out.data(), convert);
      else for (size_t i = 0; i < n; ++i) out[i] = convert(f[i]);
    };
    if (st.dtype == DType::BF16) store(m.bf16, f32_to_bf16);
    else store(m.f32, [](float v) { return v; });
  }
  held_ += m.bytes();
  return m;
}

Matrix WeightReader::matrix(const std::string& name, std::vector<int64_t> shape) const {
  const TensorInfo& t = checked(name, shape);
  Matrix m = slice(t, 0, static_cast<int>(shape.front()), static_cast<int>(t.numel() / shape.front()));
  report(t, &m, m.bytes());
  return m;
}

std::vector<Matrix> WeightReader::stacked(const std::string& name, std::vector<int64_t> shape) const {
  const TensorInfo& t = checked(name, shape);
  check(shape.size() == 3, "stacked tensor '", name, "' must be 3-D");
  std::vector<Matrix> out;
  for (int64_t e = 0; e < shape[0]; ++e)
    out.push_back(slice(t, e * shape[1], static_cast<int>(shape[1]), static_cast<int>(shape[2])));
  size_t bytes = 0;
  for (const Matrix& m : out) bytes += m.bytes();
  report(t, out.empty() ? nullptr : &out.front(), bytes);
  return out;
}

std::vector<float> WeightReader::vector(const std::string& name, std::vector<int64_t> shape) const {
  const TensorInfo& t = checked(name, shape);
  std::vector<float> f(static_cast<size_t>(t.numel()));
  t.to_f32(f.data());
  held_ += f.size() * sizeof(float);
  report(t, nullptr, f.size() * sizeof(float));
  return f;
}

int64_t TensorEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

size_t TensorEntry::bytes(WeightDType dtype) const {
  if (kind == Vector) return static_cast<size_t>(numel()) * sizeof(float);
  const int64_t copies = kind == Stacked ? shape.front() : 1;
  const int64_t rows = shape[kind == Stacked ? 1 : 0];
  return static_cast<size_t>(copies) *
         matrix_storage(static_cast<int>(rows), static_cast<int>(numel() / copies / rows), dtype).bytes;
}

Matrix TensorCatalog::matrix(const std::string& name, std::vector<int64_t> shape) const {
  entries_.push_back({name, std::move(shape), TensorEntry::Matrix});
  return {};
}

std::vector<float> TensorCatalog::vector(const std::string& name, std::vector<int64_t> shape) const {
  entries_.push_back({name, std::move(shape), TensorEntry::Vector});
  return {};
}

std::vector<Matrix> TensorCatalog::stacked(const std::string& name, std::vector<int64_t> shape) const {
  const size_t experts = shape.empty() ? 0 : static_cast<size_t>(shape.front());
  entries_.push_back({name, std::move(shape), TensorEntry::Stacked});
  return std::vector<Matrix>(experts);
}

}  // namespace hybridlm
