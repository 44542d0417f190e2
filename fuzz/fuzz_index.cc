// model.safetensors.index.json: any bytes as the index of a directory that holds one valid shard.
#include "base/error.h"
#include "fuzz_util.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hybridlm;
  static const std::filesystem::path dir = [] {
    const auto d = fuzz::scratch_dir() / "ckpt";
    std::filesystem::create_directories(d);
    static const float w[4] = {1, 2, 3, 4};
    static const uint16_t b[2] = {0x3f80, 0x4000};
    write_safetensors(d / "model-00001-of-00002.safetensors",
                      {{"a.weight", DType::F32, {2, 2}, {reinterpret_cast<const uint8_t*>(w), sizeof w}}});
    write_safetensors(d / "model-00002-of-00002.safetensors",
                      {{"b.bias", DType::BF16, {2}, {reinterpret_cast<const uint8_t*>(b), sizeof b}}});
    return d;
  }();
  fuzz::write_file(dir / "model.safetensors.index.json", data, size);
  try {
    const Checkpoint c = Checkpoint::open(dir, /*use_mmap=*/false);
    for (const auto& [name, t] : c.all()) (void)t->numel();
  } catch (const Error&) {
  }
  return 0;
}
