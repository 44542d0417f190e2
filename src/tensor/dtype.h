// Element types of tensors on disk and in memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace hybridlm {

enum class DType : uint8_t { F32, F16, BF16, F64, I8, U8, I32, I64, kCount };

size_t dtype_size(DType t);
// Safetensors spelling ("F32", "BF16", ...).
std::string_view dtype_name(DType t);
// Returns false if `name` is not a known safetensors dtype.
bool dtype_from_name(std::string_view name, DType* out);

// bf16 = the upper 16 bits of an IEEE f32.
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Round to nearest even; NaN stays NaN (made quiet). Branch-free, so loops over it vectorise.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : rounded);
}
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

}  // namespace hybridlm
