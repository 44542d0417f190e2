// The .npy writer's inputs: any shape (rank 0-6, negative dims included); a file that is written
// must have a well-formed header of the promised layout.
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "base/error.h"
#include "fuzz_util.h"
#include "io/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hybridlm;
  if (size < 1) return 0;
  const size_t rank = data[0] % 7;
  std::vector<int64_t> shape;
  int64_t numel = 1;
  for (size_t i = 0; i < rank && 1 + i < size; ++i) {
    const int64_t d = static_cast<int8_t>(data[1 + i]) % 9;  // -8 .. 8
    shape.push_back(d);
    numel *= d;
  }
  std::vector<float> values(numel > 0 ? static_cast<size_t>(numel) : 0, 1.5f);
  const auto path = fuzz::scratch_dir() / "out.npy";
  try {
    write_npy_f32(path, values.data(), shape);
  } catch (const Error&) {
    for (int64_t d : shape)
      if (d < 0) return 0;
    std::abort();  // only negative dims may be refused
  }
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.size() < 10 || std::memcmp(bytes.data(), "\x93NUMPY\x01\x00", 8) != 0) std::abort();
  const size_t header_len = static_cast<uint8_t>(bytes[8]) | (static_cast<size_t>(static_cast<uint8_t>(bytes[9])) << 8);
  if ((10 + header_len) % 64 != 0 || bytes.size() != 10 + header_len + values.size() * 4) std::abort();
  return 0;
}
