// tokenizer.json loading: any bytes as the file; a tokenizer that loads must encode and decode.
#include "base/error.h"
#include "fuzz_util.h"
#include "io/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hybridlm;
  const auto dir = fuzz::scratch_dir() / "tok";
  std::filesystem::create_directories(dir);
  fuzz::write_file(dir / "tokenizer.json", data, size);
  try {
    const Tokenizer t = Tokenizer::load(dir);
    const std::vector<int32_t> ids = t.encode("Hello world! 123 \xc3\xa9t\xc3\xa9 <|endoftext|>\n\n  x");
    (void)t.decode(ids);
  } catch (const Error&) {
  }
  return 0;
}
