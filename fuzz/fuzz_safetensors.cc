// safetensors header + tensor table: any bytes as a file. Valid files have every tensor read
// (heap copy, not mmap, so ASan sees any out-of-bounds read).
#include "base/error.h"
#include "fuzz_util.h"
#include "io/safetensors.h"

#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hybridlm;
  const auto path = fuzz::scratch_dir() / "model.safetensors";
  fuzz::write_file(path, data, size);
  try {
    const SafetensorsFile f = SafetensorsFile::open(path, /*use_mmap=*/false);
    volatile uint8_t sink = 0;
    for (const auto& [name, t] : f.tensors()) {
      for (size_t i = 0; i < t.nbytes; ++i) sink = sink ^ t.data[i];
      if (t.numel() <= (1 << 20)) {
        std::vector<float> out(static_cast<size_t>(t.numel()));
        try {
          t.to_f32(out.data());
        } catch (const Error&) {
        }
      }
    }
  } catch (const Error&) {
  }
  return 0;
}
