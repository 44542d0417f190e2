#include "io/npy.h"

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "base/error.h"

namespace hybridlm {

static_assert(std::endian::native == std::endian::little, "'<f4' data is written straight from memory");

void write_npy_f32(const std::filesystem::path& path, const float* data,
                   const std::vector<int64_t>& shape) {
  const std::string fname = path.string();
  // The header dict is a Python literal; a 1-tuple needs its trailing comma: (3,).
  std::string dims;
  size_t numel = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    check(shape[i] >= 0, fname, ": negative dimension ", shape[i], " in shape");
    numel *= static_cast<size_t>(shape[i]);
    if (i) dims += ", ";
    dims += std::to_string(shape[i]);
  }
  if (shape.size() == 1) dims += ",";
  std::string header =
      "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";

  // Layout: magic "\x93NUMPY" (6), version 1.0 (2), u16 LE header length (2), header. The header
  // is padded with spaces and terminated by '\n' so that 10 + len is a multiple of 64.
  constexpr size_t kPrefix = 10, kAlign = 64;
  const size_t total = (kPrefix + header.size() + 1 + kAlign - 1) / kAlign * kAlign;
  header.append(total - kPrefix - header.size() - 1, ' ');
  header.push_back('\n');
  check(header.size() <= 0xffff, fname, ": shape has too many dimensions for .npy version 1.0");

  unsigned char prefix[kPrefix] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0,
                                   static_cast<unsigned char>(header.size() & 0xff),
                                   static_cast<unsigned char>(header.size() >> 8)};
  std::FILE* f = std::fopen(fname.c_str(), "wb");
  if (!f) throw Error(fname + ": cannot create: " + std::strerror(errno));
  bool ok = std::fwrite(prefix, 1, kPrefix, f) == kPrefix &&
            std::fwrite(header.data(), 1, header.size(), f) == header.size();
  if (ok && numel) ok = std::fwrite(data, sizeof(float), numel, f) == numel;
  ok = std::fflush(f) == 0 && ok;
  const int err = errno;
  ok = std::fclose(f) == 0 && ok;
  if (!ok) throw Error(fname + ": write failed: " + std::strerror(err));
}

}  // namespace hybridlm
