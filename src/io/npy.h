// NumPy .npy writer (format version 1.0), for dumping activations and test vectors that Python
// tooling reads with numpy.load. Spec: numpy/lib/format.py ("NPY format" docstring).
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

namespace hybridlm {

// Writes `data` (row-major, product(shape) floats) as dtype '<f4', fortran_order False. The header
// is padded with spaces and ends in '\n' so the data starts at a multiple of 64 bytes.
// Throws Error if a dimension is negative or the file cannot be written.
void write_npy_f32(const std::filesystem::path& path, const float* data,
                   const std::vector<int64_t>& shape);

}  // namespace hybridlm
