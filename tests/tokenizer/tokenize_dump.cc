// tokenize_dump: encodes a JSON array of strings with a tokenizer and prints, for each string,
// its ids (add_special_tokens on), the round trip decode(encode(s, no specials)) and the decode of
// the ids with their special tokens. With --decode, reads a JSON array of id lists instead and
// prints each list decoded, with and without special tokens, both by decode() and by a
// StreamDecoder fed one id at a time. Used by compare.mjs and spm_oracle_test.py to check us
// against the references.
//
// usage: tokenize_dump [--decode] <tokenizer.json, tokenizer.model or their directory> <cases.json>
// output: [{"ids": [..], "decoded": "..", "decoded_ids": ".."}, ...] on stdout, or with --decode
//         [{"decoded": "..", "decoded_skip": "..", "streamed": "..", "streamed_skip": ".."}, ...]
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/error.h"
#include "io/tokenizer.h"

namespace {

std::string streamed(const hybridlm::Tokenizer& tok, const std::vector<int32_t>& ids, bool skip_special) {
  hybridlm::StreamDecoder stream(tok, skip_special);
  std::string text;
  for (int32_t id : ids) text += stream.push(id);
  return text + stream.flush();
}

}  // namespace

int main(int argc, char** argv) {
  const bool decode_mode = argc == 4 && std::strcmp(argv[1], "--decode") == 0;
  if (argc != 3 && !decode_mode) {
    std::fprintf(stderr, "usage: %s [--decode] <tokenizer file or directory> <cases.json>\n", argv[0]);
    return 2;
  }
  const char* tok_path = argv[argc - 2];
  const char* cases_path = argv[argc - 1];
  try {
    const hybridlm::Tokenizer tok = hybridlm::Tokenizer::load(tok_path);
    std::ifstream in(cases_path, std::ios::binary);
    if (!in) throw hybridlm::Error(std::string(cases_path) + ": cannot open file");
    std::stringstream ss;
    ss << in.rdbuf();
    const nlohmann::json cases = nlohmann::json::parse(ss.str());
    nlohmann::json out = nlohmann::json::array();
    for (const auto& c : cases) {
      if (decode_mode) {
        const std::vector<int32_t> ids = c.get<std::vector<int32_t>>();
        out.push_back({{"decoded", tok.decode(ids)},
                       {"decoded_skip", tok.decode(ids, /*skip_special_tokens=*/true)},
                       {"streamed", streamed(tok, ids, false)},
                       {"streamed_skip", streamed(tok, ids, true)}});
        continue;
      }
      const std::string text = c.get<std::string>();
      const std::vector<int32_t> ids = tok.encode(text);
      const std::vector<int32_t> plain = tok.encode(text, /*add_special_tokens=*/false);
      out.push_back({{"ids", ids}, {"decoded", tok.decode(plain)}, {"decoded_ids", tok.decode(ids)}});
    }
    std::cout << out.dump() << "\n";
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tokenize_dump: %s\n", e.what());
    return 1;
  }
  return 0;
}
