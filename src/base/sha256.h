// SHA-256 (FIPS 180-4), for naming the exact file a derived artifact came from (prepare-data's
// index.json records its tokenizer's hash). Not for anything security-sensitive.
#pragma once

#include <string>
#include <string_view>

namespace hybridlm {

// The digest of `data` as 64 lowercase hex digits.
std::string sha256_hex(std::string_view data);

}  // namespace hybridlm
