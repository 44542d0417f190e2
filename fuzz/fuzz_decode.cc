// Decode of arbitrary ids (in and out of the vocabulary), whole and streamed.
#include <cstring>
#include <memory>

#include "base/error.h"
#include "fuzz_util.h"
#include "io/tokenizer.h"

namespace {
std::unique_ptr<hybridlm::Tokenizer> tok;
}

// Loading the real file takes seconds under the sanitizers: do it before the per-input timeout.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tok = std::make_unique<hybridlm::Tokenizer>(
      hybridlm::Tokenizer::load(hybridlm::fuzz::test_data() / "tokenizers/llama3/tokenizer.json"));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hybridlm;
  std::vector<int32_t> ids(size / 4);
  if (!ids.empty()) std::memcpy(ids.data(), data, ids.size() * 4);
  for (int32_t& id : ids) id %= tok->vocab_size() + 16;  // mostly valid, some beyond, some negative
  for (bool skip : {false, true}) {
    try {
      (void)tok->decode(ids, skip);
    } catch (const Error&) {
    }
    StreamDecoder s(*tok, skip);
    try {
      for (int32_t id : ids) (void)s.push(id);
      (void)s.flush();
    } catch (const Error&) {
    }
  }
  return 0;
}
