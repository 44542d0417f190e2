// JSON from untrusted files: a nesting limit at parse time, and short descriptions of values for
// error messages. nlohmann-json parses iteratively, but dump() recurses, so a value nested a
// million deep would overflow the stack when an error message prints it.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace hybridlm {

// Real configs, tokenizers and headers nest less than 10 deep.
constexpr int kMaxJsonDepth = 128;

// Parses text; throws Error("<where>: malformed JSON: ...") on bad syntax or nesting beyond
// kMaxJsonDepth.
nlohmann::json parse_json(std::string_view text, const std::string& where);

// Throws Error if depth exceeds kMaxJsonDepth; for parsers that install their own callback.
void check_json_depth(int depth, const std::string& where);

// At most ~max_len characters describing v, on one line: scalars as JSON, containers by type and
// size ("an array of 3"), so it never recurses.
std::string json_brief(const nlohmann::json& v, size_t max_len = 80);

}  // namespace hybridlm
