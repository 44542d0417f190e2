#include "models/weights.h"

#include <sstream>

#include "base/error.h"

namespace hybridlm {

WeightDType parse_weight_dtype(const std::string& s) {
  if (s == "f32") return WeightDType::F32;
  if (s == "bf16") return WeightDType::BF16;
  throw Error("--dtype " + s + ": unsupported (use f32 or bf16)");
}

static std::string shape_str(const std::vector<int64_t>& s) {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << (s.size() == 1 ? ",)" : ")");
  return os.str();
}

const TensorInfo& WeightReader::checked(const std::string& name, const std::vector<int64_t>& shape) const {
  const TensorInfo& t = ckpt_.get(name);
  if (t.shape != shape)
    throw Error(t.file + ": tensor '" + name + "' has shape " + shape_str(t.shape) + ", expected " + shape_str(shape));
  params_ += static_cast<size_t>(t.numel());
  return t;
}

Matrix WeightReader::matrix(const std::string& name, std::vector<int64_t> shape) const {
  const TensorInfo& t = checked(name, shape);
  Matrix m;
  m.rows = static_cast<int>(shape.front());
  m.cols = static_cast<int>(t.numel() / shape.front());
  const DType want = dtype_ == WeightDType::BF16 ? DType::BF16 : DType::F32;
  if (zero_copy_ && t.dtype == want && reinterpret_cast<uintptr_t>(t.data) % dtype_size(want) == 0) {
    m.dtype = want;
    m.mapped = t.data;
    mapped_ += t.nbytes;
    return m;
  }
  std::vector<float> f(static_cast<size_t>(t.numel()));
  t.to_f32(f.data());
  if (dtype_ == WeightDType::BF16) {
    m.dtype = DType::BF16;
    m.bf16.resize(f.size());
    for (size_t i = 0; i < f.size(); ++i) m.bf16[i] = f32_to_bf16(f[i]);
  } else {
    m.f32 = std::move(f);
  }
  return m;
}

std::vector<float> WeightReader::vector(const std::string& name, std::vector<int64_t> shape) const {
  const TensorInfo& t = checked(name, shape);
  std::vector<float> f(static_cast<size_t>(t.numel()));
  t.to_f32(f.data());
  return f;
}

}  // namespace hybridlm
