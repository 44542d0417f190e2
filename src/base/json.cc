#include "base/json.h"

#include "base/error.h"

namespace hybridlm {

void check_json_depth(int depth, const std::string& where) {
  if (depth > kMaxJsonDepth)
    throw Error(where + ": malformed JSON: nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
}

nlohmann::json parse_json(std::string_view text, const std::string& where) {
  try {
    return nlohmann::json::parse(text.begin(), text.end(),
                                 [&](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
                                   check_json_depth(depth, where);
                                   return true;
                                 });
  } catch (const nlohmann::json::exception& e) {
    std::string msg = e.what();
    for (char& c : msg)
      if (c == '\n' || c == '\r') c = ' ';
    if (msg.size() > 200) msg = msg.substr(0, 200) + "...";
    throw Error(where + ": malformed JSON: " + msg);
  }
}

std::string json_brief(const nlohmann::json& v, size_t max_len) {
  std::string s;
  if (v.is_array()) {
    s = "an array of " + std::to_string(v.size());
  } else if (v.is_object()) {
    s = "an object of " + std::to_string(v.size()) + " keys";
  } else {
    s = v.dump();  // a scalar: no recursion
  }
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  if (s.size() > max_len) s = s.substr(0, max_len) + "...";
  return s;
}

}  // namespace hybridlm
