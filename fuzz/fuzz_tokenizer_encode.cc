// Tokenizer encode on arbitrary bytes (invalid UTF-8 included) with the real GPT-NeoX, Llama-3 and
// Llama-2 (SentencePiece-style) tokenizer.json files and the Mistral tokenizer.model (where the
// build has libsentencepiece); the first byte picks one. Every id must be in the vocabulary,
// decode must not fail, and the streaming decoder must produce exactly what decode produces.
#include <cstdlib>
#include <memory>

#include "base/error.h"
#include "fuzz_util.h"
#include "io/tokenizer.h"

namespace {
std::unique_ptr<hybridlm::Tokenizer> toks[4];
}

// Loading the real files takes seconds under the sanitizers: do it before the per-input timeout.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  using namespace hybridlm;
  toks[0] = std::make_unique<Tokenizer>(Tokenizer::load(fuzz::test_data() / "tokenizers/gpt-neox-20b/tokenizer.json"));
  toks[1] = std::make_unique<Tokenizer>(Tokenizer::load(fuzz::test_data() / "tokenizers/llama3/tokenizer.json"));
  toks[2] = std::make_unique<Tokenizer>(Tokenizer::load(fuzz::test_data() / "tokenizers/llama2"));
  try {
    toks[3] = std::make_unique<Tokenizer>(Tokenizer::load(fuzz::test_data() / "tokenizers/mistral-v1"));
  } catch (const Error&) {  // a build without libsentencepiece: inputs for it are skipped
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hybridlm;
  if (size == 0) return 0;
  if (!toks[data[0] & 3]) return 0;
  const Tokenizer& t = *toks[data[0] & 3];
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  const std::vector<int32_t> ids = t.encode(text);
  for (int32_t id : ids)
    if (id < 0 || id >= t.vocab_size()) std::abort();
  const std::string whole = t.decode(ids, /*skip_special_tokens=*/true);
  StreamDecoder s(t, /*skip_special_tokens=*/true);
  std::string streamed;
  for (int32_t id : ids) streamed += s.push(id);
  streamed += s.flush();
  if (streamed != whole) std::abort();
  return 0;
}
