// tokenize_dump: encodes a JSON array of strings with a tokenizer.json and prints, for each
// string, its ids (add_special_tokens on) and the round trip decode(encode(s, no specials)).
// Used by compare.mjs to check our ids against the JavaScript reference.
//
// usage: tokenize_dump <tokenizer.json or its directory> <cases.json>
// output: [{"ids": [..], "decoded": ".."}, ...] on stdout
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/error.h"
#include "io/tokenizer.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s <tokenizer.json or directory> <cases.json>\n", argv[0]);
    return 2;
  }
  try {
    const hybridlm::Tokenizer tok = hybridlm::Tokenizer::load(argv[1]);
    std::ifstream in(argv[2], std::ios::binary);
    if (!in) throw hybridlm::Error(std::string(argv[2]) + ": cannot open file");
    std::stringstream ss;
    ss << in.rdbuf();
    const nlohmann::json cases = nlohmann::json::parse(ss.str());
    nlohmann::json out = nlohmann::json::array();
    for (const auto& c : cases) {
      const std::string text = c.get<std::string>();
      const std::vector<int32_t> ids = tok.encode(text);
      const std::vector<int32_t> plain = tok.encode(text, /*add_special_tokens=*/false);
      out.push_back({{"ids", ids}, {"decoded", tok.decode(plain)}});
    }
    std::cout << out.dump() << "\n";
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tokenize_dump: %s\n", e.what());
    return 1;
  }
  return 0;
}
