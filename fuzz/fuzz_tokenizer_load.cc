// tokenizer.json loading: any bytes as the file; a tokenizer that loads must encode and decode.
// The same bytes as a tokenizer.model (alone in its directory: the libsentencepiece path, or in a
// build without it the one-line refusal) must load or fail with an Error just the same.
#include "base/error.h"
#include "fuzz_util.h"
#include "io/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hybridlm;
  const auto dir = fuzz::scratch_dir() / "tok";
  const auto spm_dir = fuzz::scratch_dir() / "tok_spm";
  std::filesystem::create_directories(dir);
  std::filesystem::create_directories(spm_dir);
  fuzz::write_file(dir / "tokenizer.json", data, size);
  fuzz::write_file(spm_dir / "tokenizer.model", data, size);
  for (const auto& d : {dir, spm_dir}) {
    try {
      const Tokenizer t = Tokenizer::load(d);
      const std::vector<int32_t> ids = t.encode("Hello world! 123 \xc3\xa9t\xc3\xa9 <|endoftext|>\n\n  x");
      (void)t.decode(ids);
    } catch (const Error&) {
    }
  }
  return 0;
}
